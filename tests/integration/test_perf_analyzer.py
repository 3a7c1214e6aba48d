"""A short perf_analyzer run against the default repository completes on both protocols."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hps_core.cli.main import main as hps_main
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
