"""``hps serve`` end to end against the stand-in tritonserver (see conftest.py)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hps_core.cli import serve
from hps_core.server.process import process_group_members

PORT_ARGS = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]


def _hps_serve(fake_triton, mode: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hps_core.cli.main", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=fake_triton.environ(mode),
    )


def _read_until(proc: subprocess.Popen[str], marker: str, timeout: float = 20.0) -> str:
    """Read the child's stdout until a line contains ``marker``; fail after ``timeout``."""
    seen = []
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=0.2):
                continue
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if marker in line:
                return "".join(seen)
    proc.kill()
    pytest.fail(f"{marker!r} not printed; stdout so far:\n{''.join(seen)}")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_serve_until_signal(fake_triton, model_repository, signum):
    proc = _hps_serve(
        fake_triton,
        "ok",
        "--model-repository",
        str(model_repository),
        *PORT_ARGS,
        "--",
        "--model-control-mode=explicit",
        "--load-model=m",
    )
    output = _read_until(proc, "hps serve: ready")
    assert "fake tritonserver starting" in output  # Triton's log goes to stdout
    assert "ready on HTTP http://127.0.0.1:" in output and "gRPC 127.0.0.1:" in output
    (launch,) = fake_triton.launches()
    assert launch["argv"][-2:] == ["--model-control-mode=explicit", "--load-model=m"]
    assert "--" not in launch["argv"]
    proc.send_signal(signum)
    assert proc.wait(timeout=20) == 0  # the server's own exit code after SIGTERM
    # Nothing on stderr but, maybe, the start-up sweep of segments that processes of other
    # tests (or runs) left in /dev/shm when they died: a shared folder, not this test's doing.
    errors = [
        line
        for line in proc.stderr.read().splitlines()
        if not line.startswith("removed stale shared-memory segments:")
    ]
    assert errors == []


def test_server_exit_code_is_returned(fake_triton, model_repository):
    proc = _hps_serve(
        fake_triton, "crash_later", "--model-repository", str(model_repository), *PORT_ARGS
    )
    _read_until(proc, "hps serve: ready")
    assert proc.wait(timeout=20) == 4


def test_startup_failure_reports_and_returns_server_code(fake_triton, model_repository):
    proc = _hps_serve(fake_triton, "exit", "--model-repository", str(model_repository), *PORT_ARGS)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3
    assert "No module named 'nothere'" in out  # the log itself, on stdout
    assert "error: tritonserver exited with code 3 before it was ready (its log is above)" in err


def test_missing_repository_is_a_usage_error(fake_triton, tmp_path):
    proc = _hps_serve(fake_triton, "ok", "--model-repository", str(tmp_path / "none"), *PORT_ARGS)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert f"error: {tmp_path / 'none'}: model repository is not a directory" in err
    assert fake_triton.launches() == []


def test_a_repository_without_models_stops_unless_the_user_controls_models(
    fake_triton, model_repository
):
    proc = _hps_serve(
        fake_triton, "no_models", "--model-repository", str(model_repository), *PORT_ARGS
    )
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "hps serve: ready" not in out
    assert f"hps serve: the repository {model_repository} holds no model" in err
    assert "; stopping the server" in err
    # Holding model control, the user may load models later: the server stays up.
    proc = _hps_serve(
        fake_triton, "no_models", "--model-repository", str(model_repository), *PORT_ARGS,
        "--", "--model-control-mode=explicit",
    )  # fmt: skip
    _read_until(proc, "hps serve: ready")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert "holds no model; load models through the repository API" in err


def test_in_process_stop_leaves_no_stub(fake_triton, model_repository):
    proc = _hps_serve(fake_triton, "ok", "--model-repository", str(model_repository), *PORT_ARGS)
    _read_until(proc, "hps serve: ready")
    server_pids = [child.pid for child in psutil.Process(proc.pid).children()]
    assert len(server_pids) == 1
    assert len(process_group_members(server_pids[0])) >= 2
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=20)
    assert process_group_members(server_pids[0]) == []


def test_the_server_dies_with_a_killed_launcher(
    fake_triton, model_repository, tmp_path, monkeypatch
):
    # A killed launcher cannot remove its control file: keep it in the test's folder.
    monkeypatch.setenv("HPS_RUNTIME_DIR", str(tmp_path / "runtime"))
    proc = _hps_serve(fake_triton, "ok", "--model-repository", str(model_repository), *PORT_ARGS)
    _read_until(proc, "hps serve: ready")
    (server,) = psutil.Process(proc.pid).children()
    # The launcher would remove the server's shared-memory regions; killed, it cannot.
    prefix = next(
        arg.partition("shm-region-prefix-name=")[2]
        for arg in server.cmdline()
        if "shm-region-prefix-name=" in arg
    )
    try:
        proc.kill()  # SIGKILL: no signal handler, no stop(), no atexit hook runs
        proc.wait(timeout=20)
        # The kernel sends the server SIGTERM (PR_SET_PDEATHSIG); the fake exits 0 on it.
        deadline = time.monotonic() + 10
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(server)
    finally:
        # The fake's "stub" ignores SIGTERM and does not watch its parent, as Triton's do.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        for region in Path("/dev/shm").glob(f"{prefix}*"):
            region.unlink(missing_ok=True)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_default_model_repository(tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.setattr(serve, "_CHECKOUT_ROOT", checkout)
    cwd = tmp_path / "cwd"
    assert serve.default_model_repository(cwd) == cwd / "model_repository"
    (checkout / "model_repository").mkdir()
    assert serve.default_model_repository(cwd) == cwd / "model_repository"  # not a checkout
    (checkout / "pyproject.toml").write_text("")
    assert serve.default_model_repository(cwd) == checkout / "model_repository"
