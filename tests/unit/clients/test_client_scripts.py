"""The HTTP and gRPC client scripts load by file path and fail cleanly without a server.

Lookups against a real server are covered by the integration tests.
"""

from __future__ import annotations

import socket
import sys

import pytest

SCRIPTS = ["hps_http_client", "hps_grpc_client"]


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_lists_the_documented_flags(load_client, name, capsys):
    module = load_client(name)
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--url", "--model", "--keys", "--random", "--verbose", "--dims", "--table-rows"):
        assert flag in text
    assert "hps_embedding" in text


@pytest.mark.parametrize("name", SCRIPTS)
def test_unreachable_server_exits_1_with_the_error(load_client, name, capsys):
    module = load_client(name)
    url = f"127.0.0.1:{unused_port()}"
    assert module.main(["--url", url, "--keys", "0,1,2", "--keys", "5,6"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and url in err and "refused" in err.lower()


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "one of the arguments --keys --random is required"),
        (["--keys", "1", "--random", "3"], "not allowed with argument"),
        (["--keys", "1,a"], "'a' is not an integer"),
        (["--random", "0"], "must be >= 1"),
        (["--random", "2", "--values", "-1"], "must be >= 0"),
    ],
)
def test_bad_arguments_exit_2(load_client, name, argv, message, capsys):
    module = load_client(name)
    with pytest.raises(SystemExit) as exc:
        module.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_protocols_default_to_the_standard_ports(load_client):
    http = load_client("hps_http_client").PROTOCOL
    grpc = load_client("hps_grpc_client").PROTOCOL
    assert (http.name, http.default_url, http.client_module.__name__) == (
        "HTTP",
        "localhost:8000",
        "tritonclient.http",
    )
    assert (grpc.name, grpc.default_url, grpc.client_module.__name__) == (
        "gRPC",
        "localhost:8001",
        "tritonclient.grpc",
    )


def test_cuda_shm_client_without_cupy_says_what_to_install(load_client, monkeypatch, capsys):
    """Without CuPy (a CPU machine) the CUDA shared-memory client names what to install
    instead of an import traceback."""
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    client = load_client("hps_cuda_shm_client")
    assert client.main(["--keys", "1,2"]) == 1
    err = capsys.readouterr().err
    assert "pip install cupy-cuda12x cuda-python" in err and "Traceback" not in err
