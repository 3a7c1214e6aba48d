"""``hps serve`` on a port in use fails at once, naming the port and its flag (no Triton run)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from hps_core.cli.main import main
from hps_core.server.ports import busy_ports, pick_free_ports
from hps_core.server.process import ServerError, ServerStartError, TritonServer


def _in_use(port: int, service: str, flag: str, host: str = "127.0.0.1") -> str:
    return (
        f"{service} port {port} on {host} is already in use (another hps serve or "
        f"tritonserver?); choose another with {flag} (0 picks a free one)"
    )


@pytest.fixture
def listening() -> Iterator[int]:
    """A port this test listens on, as a running server would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def never_starts(monkeypatch: pytest.MonkeyPatch) -> list[TritonServer]:
    """Replace ``TritonServer.start``: record the call and fail like a server that exited."""
    started: list[TritonServer] = []

    def start(self: TritonServer) -> TritonServer:
        started.append(self)
        raise ServerStartError("stand-in: no tritonserver in this test")

    monkeypatch.setattr(TritonServer, "start", start)
    return started


def test_busy_ports_reports_only_ports_in_use(listening: int) -> None:
    (free,) = pick_free_ports(1)
    wanted = {"http": free, "grpc": listening, "metrics": 0}
    assert busy_ports(wanted) == {"grpc": listening}
    # A wildcard bind collides with a socket on one address.
    assert busy_ports(wanted, "0.0.0.0") == {"grpc": listening}


def test_serve_fails_before_starting_triton(
    tmp_path: Path,
    listening: int,
    never_starts: list[TritonServer],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ports = ["--http-port", "0", "--grpc-port", str(listening), "--metrics-port", "0"]
    assert main(["serve", "--model-repository", str(tmp_path), *ports]) == 2
    assert never_starts == []
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"error: {_in_use(listening, 'gRPC', '--grpc-port PORT')}\n"


def test_every_busy_port_is_named(
    tmp_path: Path,
    listening: int,
    never_starts: list[TritonServer],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        second = other.getsockname()[1]
        ports = ["--http-port", str(listening), "--grpc-port", "0", "--metrics-port", str(second)]
        assert main(["serve", "--model-repository", str(tmp_path), *ports]) == 2
    assert never_starts == []
    assert capsys.readouterr().err.splitlines() == [
        f"error: {_in_use(listening, 'HTTP', '--http-port PORT')}",
        f"error: {_in_use(second, 'metrics', '--metrics-port PORT')}",
    ]


def test_free_and_switched_off_ports_go_on_to_start(
    tmp_path: Path,
    listening: int,
    never_starts: list[TritonServer],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # gRPC turned off for tritonserver: its port is not bound, so it may be in use.
    ports = ["--http-port", "0", "--grpc-port", str(listening), "--metrics-port", "0"]
    argv = ["serve", "--model-repository", str(tmp_path), *ports, "--", "--allow-grpc=false"]
    assert main(argv) == 1  # the stand-in start's failure
    assert len(never_starts) == 1
    assert "stand-in: no tritonserver" in capsys.readouterr().err


def test_launcher_checks_its_ports_too(tmp_path: Path, listening: int) -> None:
    # The Python API fails the same way, naming its field; before Triton is even looked for.
    server = TritonServer(tmp_path, http_port=listening)
    with pytest.raises(ServerError) as err:
        server.start()
    assert not isinstance(err.value, ServerStartError)
    assert str(err.value) == _in_use(listening, "HTTP", "TritonServer.http_port")
    assert server.pid is None
