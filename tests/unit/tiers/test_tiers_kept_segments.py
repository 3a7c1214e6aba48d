"""Host tiers kept across a server's restart (``hps_core.tiers.shm_segment``, KEEP_ENV): kept
only while the stopping launcher's marker exists and only for segments built from files;
re-attached while the files keep their identity; removed once they change, or when the
restart asks to rebuild, or when the repository no longer opens them."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.host_table import SharedHostTable, segment_name
from hps_core.tiers.shm_segment import KEEP_ENV, PREFIX, SharedSegment, remove_stale_segments


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The launcher's marker, named in the environment (absent until a test creates it)."""
    path = tmp_path / "keep-marker"
    monkeypatch.setenv(KEEP_ENV, str(path))
    return path


def fill(content: bytes):
    def build(buffer: mmap.mmap) -> None:
        buffer[:] = content

    return build


def source(tmp_path: Path) -> Path:
    path = tmp_path / "rows.bin"
    path.write_bytes(b"rows")
    return path


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_segment_is_kept_only_while_the_marker_exists(
    tmp_path: Path, shm_path: Path, marker: Path
) -> None:
    rows = source(tmp_path)
    SharedSegment.open("a", 4, fill(b"abcd"), sources=[rows]).close()
    assert names(shm_path) == []  # no marker: the last user removes it, as always
    marker.touch()
    SharedSegment.open("a", 4, fill(b"abcd"), sources=[rows]).close()
    assert names(shm_path) == [f"{PREFIX}a{s}" for s in (".build", ".data", ".source", ".users")]
    SharedSegment.open("b", 4, fill(b"wxyz")).close()  # not built from files: not kept
    assert not any(n.startswith(f"{PREFIX}b.") for n in names(shm_path))
    marker.unlink()
    # A restart: stale segments are removed first, the kept one is attached, not built.
    again = SharedSegment.open("a", 4, fill(b"XXXX"), sources=[rows])
    assert not again.built_here and bytes(again.buffer) == b"abcd"
    again.close()  # no marker any more: now it goes
    assert names(shm_path) == []


def test_a_kept_segment_goes_once_its_files_change_or_when_not_wanted(
    tmp_path: Path, shm_path: Path, marker: Path
) -> None:
    rows = source(tmp_path)
    marker.touch()
    for name in ("a", "b"):
        SharedSegment.open(name, 4, fill(b"abcd"), sources=[rows]).close()
    assert remove_stale_segments() == []  # unchanged files: both kept
    assert remove_stale_segments(keep={"a"}) == ["b"]  # a repository that opens only "a"
    assert remove_stale_segments(keep={"a"}) == []
    st = rows.stat()
    os.utime(rows, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten: a new identity
    assert remove_stale_segments() == ["a"]
    SharedSegment.open("c", 4, fill(b"abcd"), sources=[rows]).close()
    assert remove_stale_segments(keep=()) == ["c"]  # hps serve --rebuild-host-tiers
    assert names(shm_path) == []


def test_a_host_tier_kept_at_a_stop_is_re_attached_with_its_rows(
    tmp_path: Path, shm_path: Path, marker: Path
) -> None:
    rng = np.random.default_rng(3)
    keys = rng.choice(10**9, 500, replace=False).astype(np.int64)
    vectors = rng.standard_normal((500, 8)).astype(np.float32)
    write_sparse_table(tmp_path / "t", keys, vectors)
    marker.touch()
    SharedHostTable(tmp_path / "t", 8).close()  # the server stops
    marker.unlink()
    table = SharedHostTable(tmp_path / "t", 8)  # and starts again
    assert not table.built_here
    values, found = table.lookup(keys[::-1].copy())
    assert found.all()
    np.testing.assert_array_equal(values, vectors[::-1])
    table.close()
    # Files rewritten while no server ran: a new segment is built, the old one removed.
    marker.touch()
    SharedHostTable(tmp_path / "t", 8).close()
    marker.unlink()
    old = segment_name(tmp_path / "t", 8)
    write_sparse_table(tmp_path / "t", keys, vectors + 1, overwrite=True)
    table = SharedHostTable(tmp_path / "t", 8)
    assert table.built_here and segment_name(tmp_path / "t", 8) != old
    assert not any(old in n for n in names(shm_path))
    np.testing.assert_array_equal(table.lookup(keys)[0], vectors + 1)
    table.close()
    assert names(shm_path) == []
