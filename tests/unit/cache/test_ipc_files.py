"""Removal of the /dev/shm files CUDA keeps for the interprocess events of a process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hps_core.cache.ipc_files import cuda_event_files, remove_cuda_event_files
from hps_core.server.process import _group_members, process_group_members


def _touch(directory: Path, uid: int, pid: int) -> Path:
    path = directory / f"cuda.shm.{uid}.{pid:x}.1"
    path.write_bytes(b"\0" * 16)
    return path


def test_only_the_named_processes_of_this_user_lose_their_files(tmp_path: Path) -> None:
    uid = os.getuid()
    mine = _touch(tmp_path, uid, 0x1CB)
    other_pid = _touch(tmp_path, uid, 0x1CC)
    other_user = _touch(tmp_path, uid + 1, 0x1CB)
    unrelated = tmp_path / "hps-triton.x.data"
    unrelated.write_bytes(b"")
    assert cuda_event_files(0x1CB, tmp_path) == [mine]
    assert remove_cuda_event_files([0x1CB, 0x999], tmp_path) == [mine.name]
    assert not mine.exists()
    assert other_pid.exists() and other_user.exists() and unrelated.exists()
    assert remove_cuda_event_files([0x1CB], tmp_path) == []


def test_group_members_lists_a_process_group() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    try:
        assert _group_members(child.pid) == [child.pid]
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie: exited, not reaped
        # Still listed, so that its CUDA event files are removed; no longer a live member.
        assert _group_members(child.pid) == [child.pid]
        assert process_group_members(child.pid) == []
    finally:
        child.kill()
        child.wait()
    assert _group_members(child.pid) == []
