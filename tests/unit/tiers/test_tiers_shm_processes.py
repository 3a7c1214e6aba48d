"""Shared segments across real processes: one build, shared contents, SIGKILL clean-up."""

from __future__ import annotations

import hashlib
import json
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from shm_worker import segment_content
from tiers_testdata import make_keys, mixed_queries, random_vectors

from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.host_table import SharedHostTable
from hps_core.tiers.shm_segment import PREFIX, SharedSegment, remove_stale_segments

WORKER = Path(__file__).with_name("shm_worker.py")
TIMEOUT_S = 30.0


class Children:
    """Worker processes of one test; the ones still running are killed at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: object) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), *map(str, args)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout:
                proc.stdout.close()


@pytest.fixture
def children() -> Iterator[Children]:
    started = Children()
    yield started
    started.kill_all()


def read_line(proc: subprocess.Popen[str]) -> str:
    """The next line the child prints; fails instead of hanging if it prints nothing."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT_S)
    assert ready, f"worker {proc.pid} printed nothing in {TIMEOUT_S} s"
    line = proc.stdout.readline()
    assert line, f"worker {proc.pid} exited with {proc.wait()} before printing"
    return line.strip()


def kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(TIMEOUT_S) == -signal.SIGKILL


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def builds(tmp_path: Path) -> list[str]:
    log = tmp_path / "builds.log"
    return log.read_text().split() if log.exists() else []


def test_concurrent_opens_build_once_and_share_contents(
    tmp_path: Path, shm_path: Path, children: Children
) -> None:
    size, name = 1 << 16, "concurrent"
    go, release = tmp_path / "go", tmp_path / "release"
    procs = [children.start("hold", shm_path, name, size, go, release) for _ in range(4)]
    go.touch()  # all four race to open the segment
    reports = [json.loads(read_line(p)) for p in procs]

    expected = hashlib.sha256(segment_content(name, size)).hexdigest()
    assert [r["digest"] for r in reports] == [expected] * 4
    assert sum(r["built"] for r in reports) == 1
    assert builds(tmp_path) == [str(r["pid"]) for r in reports if r["built"]]
    assert f"{PREFIX}{name}.data" in names(shm_path)

    release.touch()
    assert [p.wait(TIMEOUT_S) for p in procs] == [0] * 4
    assert names(shm_path) == []  # the last process to close removed the files


def test_sigkilled_users_leave_files_until_no_live_user(
    tmp_path: Path, shm_path: Path, children: Children
) -> None:
    size, name = 4096, "killed"
    go = tmp_path / "go"
    go.touch()
    builder = children.start("hold", shm_path, name, size, go)
    assert json.loads(read_line(builder))["built"]
    holder = children.start("hold", shm_path, name, size, go)
    assert not json.loads(read_line(holder))["built"]

    kill9(builder)
    assert remove_stale_segments(shm_path) == []  # the holder still maps it
    assert f"{PREFIX}{name}.data" in names(shm_path)
    # This process can still attach to the contents the dead builder wrote.
    seg = SharedSegment.open(name, size, pytest.fail, shm_path)
    assert not seg.built_here and bytes(seg.buffer) == segment_content(name, size)
    assert seg.close() is False

    kill9(holder)
    assert f"{PREFIX}{name}.data" in names(shm_path)  # nobody detached: files stay
    assert remove_stale_segments(shm_path) == [name]
    assert names(shm_path) == []


def test_builder_killed_mid_build_leaves_nothing_usable(
    tmp_path: Path, shm_path: Path, children: Children
) -> None:
    size, name = 4096, "halfbuilt"
    proc = children.start("hang_in_build", shm_path, name, size)
    assert read_line(proc) == "building"
    kill9(proc)
    assert f"{PREFIX}{name}.data.tmp-{proc.pid}" in names(shm_path)
    assert f"{PREFIX}{name}.data" not in names(shm_path)

    content = segment_content(name, size)

    def build(buffer) -> None:
        buffer[:] = content

    seg = SharedSegment.open(name, size, build, shm_path)
    assert seg.built_here and bytes(seg.buffer) == content
    assert names(shm_path) == sorted(f"{PREFIX}{name}{s}" for s in (".build", ".data", ".users"))
    seg.close()
    assert names(shm_path) == []


def test_host_table_attached_from_another_process(
    tmp_path: Path, shm_path: Path, children: Children, rng: np.random.Generator
) -> None:
    keys = make_keys(rng, 3000, "wide")
    vectors = random_vectors(rng, 3000, 8)
    write_sparse_table(tmp_path / "table", keys, vectors)
    queries = mixed_queries(rng, keys, 2000)
    np.save(tmp_path / "queries.npy", queries)

    table = SharedHostTable(tmp_path / "table", 8)
    assert table.built_here
    values, found = table.lookup(queries)
    proc = children.start("host_table", shm_path, tmp_path / "table", 8, tmp_path / "queries.npy")
    report = json.loads(read_line(proc))
    assert proc.wait(TIMEOUT_S) == 0
    assert report == {
        "built": False,
        "digest": hashlib.sha256(values.tobytes() + found.tobytes()).hexdigest(),
    }
    assert len(list(shm_path.glob("*.data"))) == 1
    table.close()
    assert names(shm_path) == []
