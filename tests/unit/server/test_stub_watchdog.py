"""The stub watchdog's parts that need no tritonserver: finding stubs, its options, their
conflicts, the token kept out of the printed command and when an old version's stubs are idle
enough to end (the recovery itself: ``tests/integration/test_stub_recovery.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hps_core.load_record import is_restart, restart_marker
from hps_core.server import stub_watchdog
from hps_core.server.control import HEADER, VersionState, control_args, new_token
from hps_core.server.process import ServerError, TritonServer
from hps_core.server.stub_watchdog import (
    RetiredStub,
    StubWatchdog,
    cpu_ticks,
    died_on_their_own,
    idle_stubs,
    stub_processes,
)


def test_control_args_load_every_model_and_restrict_model_control_to_the_token() -> None:
    token = new_token()
    args = control_args(token)
    assert "--model-control-mode=explicit" in args and "--load-model=*" in args
    assert f"--http-restricted-api=model-repository:{HEADER}={token}" in args
    assert f"--grpc-restricted-protocol=model-repository:{HEADER}={token}" in args
    assert new_token() != token and len(token) == 32


def test_the_header_name_tells_a_refused_client_how_to_list_models() -> None:
    # Triton's refusal quotes the header's name only: it is the message a client reads.
    assert HEADER.endswith("to-list-models-use-model-statistics")
    assert set(HEADER) <= set("abcdefghijklmnopqrstuvwxyz-")  # HTTP header and gRPC metadata


def test_stub_processes_maps_each_child_stub_to_its_model(tmp_path: Path) -> None:
    stubs = []
    for model in ("dcn", "dcn_samples"):
        script = tmp_path / model / "1" / "model.py"
        script.parent.mkdir(parents=True)
        script.write_text("sleep 30\n")
        # A child whose argv is a stub's: the executable's name, then the model's model.py.
        stubs.append(
            subprocess.Popen(["triton_python_backend_stub", str(script)], executable="/bin/sh")
        )
    other = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while len(found := stub_processes(os.getpid())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert found == {stubs[0].pid: "dcn", stubs[1].pid: "dcn_samples"}
        assert stub_processes(other.pid) == {}
    finally:
        for process in (*stubs, other):
            process.kill()
            process.wait()
    assert stub_processes(os.getpid()) == {}


@pytest.mark.parametrize(
    "arg", ["--model-control-mode=poll", "--load-model=dcn", "--http-restricted-api=x:k=v"]
)
def test_the_watchdog_refuses_model_control_options_of_its_own(tmp_path: Path, arg: str) -> None:
    server = TritonServer(tmp_path, stub_watchdog=True, extra_args=[arg])
    with pytest.raises(ServerError, match="stub watchdog"):
        server.start()


def test_cpu_ticks_reads_the_cpu_time_the_kernel_reports() -> None:
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # use some CPU time
        pass
    start, cpu = cpu_ticks(os.getpid())
    times = os.times()
    assert abs(cpu - (times.user + times.system) * os.sysconf("SC_CLK_TCK")) <= 2
    assert cpu_ticks(os.getpid())[0] == start  # the start time does not move
    child = subprocess.Popen(["sleep", "30"])
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie: exited, not reaped
    assert cpu_ticks(child.pid) is None
    child.wait()
    assert cpu_ticks(child.pid) is None


def test_a_retired_stub_is_idle_after_the_grace_once_it_used_no_cpu_time() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    reused = subprocess.Popen(["sleep", "30"])
    try:
        now = time.monotonic()
        retired = {p.pid: RetiredStub("dcn", now, *cpu_ticks(p.pid)) for p in (sleeper, busy)}
        # A pid whose process started at another time is not the stub that was retired.
        start, cpu = cpu_ticks(reused.pid)
        retired[reused.pid] = RetiredStub("dcn", now, start - 1, cpu)
        assert idle_stubs(retired, now + 4.9, grace_s=5) == []  # within the grace
        assert set(retired) == {sleeper.pid, busy.pid}
        time.sleep(0.3)
        assert idle_stubs(retired, now + 5, grace_s=5) == [sleeper.pid]
        time.sleep(0.3)
        assert idle_stubs(retired, now + 6, grace_s=5) == [sleeper.pid]
        sleeper.kill()
        sleeper.wait()
        time.sleep(0.3)
        assert idle_stubs(retired, now + 7, grace_s=5) == []
        assert set(retired) == {busy.pid}  # an exited stub leaves
        # A stub that never pauses is released at the latest max_wait_s after the reload.
        time.sleep(0.3)
        assert idle_stubs(retired, now + 29.9, grace_s=5, max_wait_s=30) == []
        assert idle_stubs(retired, now + 30, grace_s=5, max_wait_s=30) == [busy.pid]
    finally:
        for process in (sleeper, busy, reused):
            process.kill()
            process.wait()


def test_idle_old_stubs_are_ended_only_while_the_server_is_ready(monkeypatch) -> None:
    stub = subprocess.Popen(["sleep", "30"])
    try:
        watchdog = StubWatchdog(os.getpid(), "http://127.0.0.1:1", "token", grace_s=0)
        releasing = {stub.pid: RetiredStub("dcn", time.monotonic(), *cpu_ticks(stub.pid))}
        monkeypatch.setattr(stub_watchdog, "server_ready", lambda url: False)  # shutting down
        for _ in range(3):
            watchdog._release(releasing)
        assert stub.poll() is None and watchdog.released == [] and stub.pid in releasing
        monkeypatch.setattr(stub_watchdog, "server_ready", lambda url: True)
        watchdog._release(releasing)
        assert stub.wait(timeout=5) == -9  # SIGKILL
        assert watchdog.released == [stub.pid] and releasing == {}
    finally:
        stub.kill()
        stub.wait()


def test_a_stub_left_a_zombie_died_on_its_own_one_waited_for_was_ended_by_the_server() -> None:
    ended, crashed = (subprocess.Popen(["sleep", "30"]) for _ in range(2))
    for process in (ended, crashed):
        process.kill()
    ended.wait()  # Triton waits for a stub it ends, at once
    os.waitid(os.P_PID, crashed.pid, os.WEXITED | os.WNOWAIT)  # exited, not waited for
    try:
        found = died_on_their_own(os.getpid(), [ended.pid, crashed.pid], wait_s=0.05)
        assert found == {crashed.pid}
        assert died_on_their_own(os.getppid(), [crashed.pid], wait_s=0.05) == set()  # not its
    finally:
        crashed.wait()


def test_the_watchdog_restarts_a_model_whose_stub_died_not_one_whose_stubs_were_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This process plays the server: its children are the stubs."""
    script = tmp_path / "emb" / "1" / "model.py"
    script.parent.mkdir(parents=True)
    script.write_text("sleep 30\n")

    def stub() -> subprocess.Popen:
        return subprocess.Popen(["triton_python_backend_stub", str(script)], executable="/bin/sh")

    reloads: list[tuple[str, str, list[int]]] = []
    monkeypatch.setattr(stub_watchdog, "server_ready", lambda url: True)
    monkeypatch.setattr(
        stub_watchdog, "version_states",
        lambda *args, **kwargs: [VersionState("emb", 1, "READY", "")],
    )  # fmt: skip
    monkeypatch.setattr(
        stub_watchdog, "reload_model",
        lambda url, token, model, marker, versions: reloads.append((model, marker, versions))
        or 0.5,  # seconds the load took
    )  # fmt: skip
    stubs = [stub(), stub()]
    watchdog = StubWatchdog(os.getpid(), "http://127.0.0.1:1", "token", interval_s=0.1)
    try:
        deadline = time.monotonic() + 5
        while len(stub_processes(os.getpid())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        watchdog.start()
        time.sleep(0.3)
        # A load of the same version again (hps reload): new stubs, the old ones ended and
        # waited for by the server. Nothing to bring back.
        stubs += [stub(), stub()]
        time.sleep(0.3)
        for process in stubs[:2]:
            process.kill()
            process.wait()
        time.sleep(0.6)
        assert reloads == []
        # One of the new ones killed and left a zombie: the model is restarted.
        stubs[2].kill()
        deadline = time.monotonic() + 5
        while not reloads and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reloads == [("emb", restart_marker(1), [1])]
        assert is_restart(reloads[0][1])
        watchdog.stop()
        assert watchdog.stranded_stubs() == {stubs[3].pid}  # its sibling, never ended by Triton
    finally:
        watchdog.stop()
        for process in stubs:
            process.kill()
            process.wait()
