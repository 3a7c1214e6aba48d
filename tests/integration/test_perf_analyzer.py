"""A short perf_analyzer run against the default repository completes on both protocols, and
the README's quick-start load test runs as the README prints it."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hps_core.cli.main import main as hps_main
from hps_core.server.install import find_perf_analyzer
from hps_core.server.perf import run_perf_analyzer
from hps_core.server.process import TritonServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def default_server(tmp_path_factory: pytest.TempPathFactory, module_triton_server):
    repo = tmp_path_factory.mktemp("repo")
    assert hps_main(["prepare", str(repo)]) == 0
    return module_triton_server(repo)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_completes(default_server: TritonServer, tmp_path: Path, protocol: str):
    inputs = tmp_path / "perf_input.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "client_examples" / "make_perf_input.py"),
            "--out",
            str(inputs),
        ],
        check=True,
    )
    url = getattr(default_server, f"{protocol}_url").split("//")[-1]
    # Count windows keep the run short; loose stability: this checks function, not speed.
    # Three windows within 10x of each other: on 2 busy cores (the full suite beside it) a
    # run of three trials once found none, so it may try ten.
    results, output = run_perf_analyzer(
        "hps_embedding", url, protocol, inputs, concurrency=[2],
        measurement_ms=500, stability_percent=999, max_trials=10,
        extra_args=["--measurement-mode", "count_windows", "--measurement-request-count", "50"],
    )  # fmt: skip
    assert [r.concurrency for r in results] == [2]
    assert results[0].throughput > 0
    assert "error" not in output.lower(), output


def test_client_examples_print_embeddings(default_server: TritonServer) -> None:
    for script, url in (
        ("hps_http_client.py", default_server.http_url),
        ("hps_grpc_client.py", default_server.grpc_url),
    ):
        done = subprocess.run(
            [sys.executable, str(ROOT / "client_examples" / script), "--url",
             url.split("//")[-1], "--keys", "0,1,99999", "--keys", "7"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "99999" in done.stdout and "table" in done.stdout.lower(), done.stdout


def _readme_load_test() -> list[list[str]]:
    """The commands of the README's "A load test" section, split as a shell would."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### A load test") :]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "README.md: no bash block under '### A load test'"
    return [shlex.split(line) for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_load_test_runs_as_printed(default_server: TritonServer, tmp_path: Path):
    """The README's two commands, word for word but for where the programs and the server
    are: the input file is written, perf_analyzer sends its 2,000 requests at concurrency 2,
    every one succeeds and it exits 0; make_perf_input.py prints the same command."""
    make, perf = _readme_load_test()
    assert make[0] == ".venv/bin/python" and perf[0] == ".venv/bin/perf_analyzer", (make, perf)
    assert perf[perf.index("-u") + 1] == "localhost:8001"
    assert perf[-4:] == ["--concurrency-range", "2", "--request-count", "2000"], perf
    # Run from a folder of the test's own, so that perf_input.json lands there.
    script = str(ROOT / make[1])
    done = subprocess.run(
        [sys.executable, script, *make[2:]], cwd=tmp_path, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / make[make.index("--out") + 1]).is_file()
    use = done.stdout.strip().splitlines()[-1]
    assert use.startswith("use: ") and shlex.split(use[5:])[1:] == perf[1:], use

    pa = find_perf_analyzer()
    grpc = default_server.grpc_url.split("//")[-1]
    args = [grpc if word == "localhost:8001" else word for word in perf[1:]]
    ran = subprocess.run(
        pa.command(*args), env=pa.env, cwd=tmp_path, capture_output=True, text=True,
        check=False, timeout=300,
    )  # fmt: skip
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output
    client = output[output.index("Client:") : output.index("Server:")]
    server = output[output.index("Server:") :]
    assert re.search(r"Request count: 2000\b", client), output
    assert re.search(r"Successful request count: 2000\b", server), output
    assert re.search(r"Throughput: [0-9.]+ infer/sec", client), output
