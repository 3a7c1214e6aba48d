"""SharedSegment lifecycle and remove_stale_segments inside one process."""

from __future__ import annotations

import fcntl
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hps_core.tiers.shm_segment import PREFIX, SharedSegment, remove_stale_segments, shm_dir


def filler(content: bytes, calls: list[int]):
    """A build callback writing ``content`` and counting its calls."""

    def build(buffer: mmap.mmap) -> None:
        calls.append(len(buffer))
        buffer[:] = content

    return build


def never_called(buffer: mmap.mmap) -> None:
    raise AssertionError("build called for a segment that already exists")


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def segment_files(name: str) -> list[str]:
    return sorted(f"{PREFIX}{name}{suffix}" for suffix in (".build", ".data", ".users"))


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_shm_dir_follows_environment(shm_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert shm_dir() == shm_path
    nested = shm_path / "a" / "b"
    monkeypatch.setenv("HPS_SHM_DIR", str(nested))
    assert shm_dir() == nested and nested.is_dir()
    monkeypatch.delenv("HPS_SHM_DIR")
    assert shm_dir() == Path("/dev/shm")


def test_first_open_builds_second_attaches_last_close_removes(shm_path: Path) -> None:
    content = np.random.default_rng(1).integers(0, 256, 4096, np.uint8).tobytes()
    calls: list[int] = []
    first = SharedSegment.open("seg", 4096, filler(content, calls))
    assert first.built_here and calls == [4096]
    assert listing(shm_path) == segment_files("seg")
    second = SharedSegment.open("seg", 4096, never_called)
    assert not second.built_here
    assert bytes(first.buffer) == bytes(second.buffer) == content
    assert first.data_path == second.data_path

    assert first.close() is False  # the second still uses it
    assert listing(shm_path) == segment_files("seg")
    assert bytes(second.buffer) == content
    assert second.close() is True
    assert listing(shm_path) == []
    assert not first.attached and not second.attached
    assert second.close() is False  # closing twice is harmless


def test_read_only_by_default_writable_on_request(shm_path: Path) -> None:
    reader = SharedSegment.open("rw", 64, filler(bytes(64), []))
    with pytest.raises(TypeError):
        reader.buffer[0] = 1
    writer = SharedSegment.open("rw", 64, never_called, writable=True)
    writer.buffer[:4] = b"\x01\x02\x03\x04"
    assert bytes(reader.buffer[:4]) == b"\x01\x02\x03\x04"  # the same shared pages
    writer.close()
    reader.close()
    assert listing(shm_path) == []


def test_context_manager_and_explicit_directory(tmp_path: Path, shm_path: Path) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    with SharedSegment.open("ctx", 128, filler(b"\x07" * 128, []), directory=other) as seg:
        assert seg.data_path.parent == other and seg.attached
        assert listing(shm_path) == []
    assert listing(other) == []


def test_close_with_live_views_still_removes_files(shm_path: Path) -> None:
    seg = SharedSegment.open("views", 64, filler(bytes(range(64)), []))
    view = np.frombuffer(seg.buffer, np.uint8)
    assert seg.close() is True
    assert listing(shm_path) == []
    assert view.tolist() == list(range(64))  # the mapping lives as long as the view


def test_zero_size_segment(shm_path: Path) -> None:
    calls: list[int] = []
    seg = SharedSegment.open("empty", 0, filler(b"", calls))
    assert seg.buffer is None and seg.built_here and calls == []
    again = SharedSegment.open("empty", 0, never_called)
    assert not again.built_here
    seg.close()
    again.close()
    assert listing(shm_path) == []


def test_other_size_under_the_same_name_is_rebuilt(shm_path: Path) -> None:
    small = SharedSegment.open("resized", 64, filler(b"\x01" * 64, []))
    big = SharedSegment.open("resized", 128, filler(b"\x02" * 128, []))
    assert big.built_here and len(big.buffer) == 128 and bytes(big.buffer) == b"\x02" * 128
    assert bytes(small.buffer) == b"\x01" * 64  # the old mapping is untouched
    small.close()
    big.close()
    assert listing(shm_path) == []


@pytest.mark.parametrize("error", [ValueError("broken table"), KeyboardInterrupt()])
def test_failed_build_propagates_and_next_open_builds(shm_path: Path, error: BaseException) -> None:
    def failing(buffer: mmap.mmap) -> None:
        buffer[:4] = b"half"
        raise error

    with pytest.raises(type(error)):
        SharedSegment.open("fails", 64, failing)
    assert not any(p.name.endswith(".data") or ".tmp-" in p.name for p in shm_path.iterdir())
    calls: list[int] = []
    seg = SharedSegment.open("fails", 64, filler(b"\x05" * 64, calls))
    assert seg.built_here and calls == [64] and bytes(seg.buffer) == b"\x05" * 64
    seg.close()
    assert listing(shm_path) == []


def test_failed_build_leaves_no_files(shm_path: Path) -> None:
    def failing(buffer: mmap.mmap) -> None:
        raise ValueError("broken table")

    with pytest.raises(ValueError):
        SharedSegment.open("fails", 64, failing)
    assert listing(shm_path) == []


def test_failed_build_holding_views_raises_the_callback_error(shm_path: Path) -> None:
    def failing(buffer: mmap.mmap) -> None:
        view = np.frombuffer(buffer, np.uint8)
        view[:] = 1
        raise ValueError("broken table")

    with pytest.raises(ValueError, match="broken table"):
        SharedSegment.open("views-fail", 64, failing)


def test_remove_stale_removes_unused_segment_and_keeps_used_one(shm_path: Path) -> None:
    alive = SharedSegment.open("alive", 64, filler(bytes(64), []))
    # Files of a segment whose every user died: nobody holds a lock on them.
    for suffix in (".build", ".users", ".data"):
        (shm_path / f"{PREFIX}dead{suffix}").write_bytes(b"x")
    (shm_path / "unrelated.file").write_bytes(b"keep")
    assert remove_stale_segments(shm_path) == ["dead"]
    assert listing(shm_path) == sorted([*segment_files("alive"), "unrelated.file"])
    assert remove_stale_segments() == []  # the default directory is HPS_SHM_DIR
    alive.close()
    assert listing(shm_path) == ["unrelated.file"]


def test_remove_stale_skips_a_segment_being_built(shm_path: Path) -> None:
    for suffix in (".build", ".users"):
        (shm_path / f"{PREFIX}busy{suffix}").write_bytes(b"")
    fd = os.open(shm_path / f"{PREFIX}busy.build", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a builder in another process would
        assert remove_stale_segments(shm_path) == []
        assert len(listing(shm_path)) == 2
    finally:
        os.close(fd)
    assert remove_stale_segments(shm_path) == ["busy"]
    assert listing(shm_path) == []


def test_remove_stale_temporary_files_only_of_dead_builders(shm_path: Path) -> None:
    dead = shm_path / f"{PREFIX}t.data.tmp-{dead_pid()}"
    live = shm_path / f"{PREFIX}t.data.tmp-{os.getpid()}"
    dead.write_bytes(b"half")
    live.write_bytes(b"half")
    assert remove_stale_segments(shm_path) == [dead.name]
    assert listing(shm_path) == [live.name]


def test_remove_stale_data_file_without_lock_files(shm_path: Path) -> None:
    orphan = shm_path / f"{PREFIX}orphan.data"
    orphan.write_bytes(b"x" * 10)
    assert remove_stale_segments(shm_path) == [orphan.name]
    assert listing(shm_path) == []


def test_open_cleans_stale_segments_first(shm_path: Path) -> None:
    for suffix in (".build", ".users", ".data"):
        (shm_path / f"{PREFIX}old{suffix}").write_bytes(b"x")
    (shm_path / f"{PREFIX}old.data.tmp-{dead_pid()}").write_bytes(b"x")
    seg = SharedSegment.open("new", 8, filler(bytes(8), []))
    assert listing(shm_path) == segment_files("new")
    seg.close()
    assert listing(shm_path) == []
