"""A shared-memory folder too small for a segment: a clear error before any page is touched.

Writing to a tmpfs past its size kills the writing process with SIGBUS (issue 47: every stub
died, "Stub process ... is not healthy"). Each test mounts a tmpfs of a few MiB, as Docker's
``--shm-size`` makes ``/dev/shm``; a build that did not reserve its pages first would take
pytest down here instead of failing the test.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from private_shm import mounted_tmpfs

from hps_core.errors import SharedMemoryFullError
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.host_table import SharedHostTable, host_layout
from hps_core.tiers.shm_segment import (
    DEV_SHM,
    SharedSegment,
    folder_space,
    shortage_message,
)

MiB = 2**20


@pytest.fixture
def small_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 4 MiB tmpfs, the segment folder of this test (``HPS_SHM_DIR``)."""
    with mounted_tmpfs(tmp_path / "small_shm", "4m") as folder:
        monkeypatch.setenv("HPS_SHM_DIR", str(folder))
        yield folder


def _fill(buffer: mmap.mmap) -> None:
    buffer[:] = b"\x07" * len(buffer)


def test_a_segment_larger_than_the_free_space_is_refused_naming_the_numbers(
    small_shm: Path,
) -> None:
    free, total = folder_space(small_shm)
    assert total == 4 * MiB and free == total
    with pytest.raises(SharedMemoryFullError) as err:
        SharedSegment.open("big", 5 * MiB, _fill, what="the host tier of /m/t0")
    assert str(err.value) == (
        f"{small_shm} is too small for the host tier of /m/t0: 5,242,880 bytes (5.0 MiB) "
        f"needed, 4,194,304 bytes (4.0 MiB) free of 4.0 MiB; free space in {small_shm} (a "
        f"tmpfs grows with mount -o remount,size=1G {small_shm}), or set HPS_SHM_DIR to a "
        f"larger one"
    )
    # Nothing is left behind, and the space is free again.
    assert list(small_shm.iterdir()) == []
    assert folder_space(small_shm)[0] == free


def test_free_space_taken_by_other_segments_counts(small_shm: Path) -> None:
    with SharedSegment.open("first", 3 * MiB, _fill) as first:
        assert first.buffer is not None and first.buffer[-1] == 7
        with pytest.raises(SharedMemoryFullError, match=r"1,048,576 bytes \(1.0 MiB\) free"):
            SharedSegment.open("second", 2 * MiB, _fill)
        # A segment that fits what is left builds, and an existing one costs nothing more.
        with SharedSegment.open("third", MiB // 2, _fill) as third:
            assert third.built_here
        with SharedSegment.open("first", 3 * MiB, _fill) as again:
            assert not again.built_here


def test_the_host_tier_names_its_table(small_shm: Path, tmp_path: Path) -> None:
    rows, dim = 40_000, 32  # 5.1 MB of vectors, above the 4 MiB
    keys = np.arange(rows, dtype=np.int64)
    vectors = np.random.default_rng(0).standard_normal((rows, dim), dtype=np.float32)
    write_sparse_table(tmp_path / "t0", keys, vectors)
    needed = host_layout(rows, dim).nbytes
    with pytest.raises(SharedMemoryFullError) as err:
        SharedHostTable(tmp_path / "t0", dim)
    assert str(err.value).startswith(
        f"{small_shm} is too small for the host tier of {tmp_path / 't0'} (40,000 rows of dim "
        f"32): {needed:,} bytes"
    )
    assert list(small_shm.iterdir()) == []
    # A table that fits serves its rows from the same folder.
    write_sparse_table(tmp_path / "t1", keys[:1000], vectors[:1000])
    table = SharedHostTable(tmp_path / "t1", dim)
    try:
        found, ok = table.lookup(np.array([3, 999], np.int64))
        assert ok.all()
        np.testing.assert_array_equal(found, vectors[[3, 999]])
    finally:
        table.close()


def test_dev_shm_gets_dockers_fix_sized_to_hold_everything() -> None:
    message = shortage_message(DEV_SHM, "2 tables", 3 * 2**30, 2**29, 64 * MiB)
    # 64 MiB there, 2.5 GiB more needed: 2.56 GiB, rounded up to whole GiB.
    assert message.endswith(
        "free of 64.0 MiB; give the server more shared memory: docker run --shm-size=3g ..., "
        "or mount -o remount,size=3G /dev/shm"
    )
    assert re.match(
        r"/dev/shm is too small for 2 tables: 3,221,225,472 bytes \(3072.0 MiB\)", message
    )
