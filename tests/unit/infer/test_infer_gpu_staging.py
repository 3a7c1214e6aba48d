"""The batch layout of the GPU pipeline's staging buffer (NumPy only: runs without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from hps_core.infer.gpu.staging import BatchLayout, bucket_for, split_copies


@pytest.mark.parametrize(
    ("samples", "bucket"), [(0, 1), (1, 1), (2, 2), (3, 4), (1024, 1024), (1025, 2048)]
)
def test_buckets_are_the_next_power_of_two(samples: int, bucket: int) -> None:
    assert bucket_for(samples) == bucket


@pytest.mark.parametrize("size", [1, 3, 64, 1000])
def test_regions_are_aligned_disjoint_and_cover_the_buffer(size: int) -> None:
    lay = BatchLayout(size=size, keys_per_sample=29, slots=27, tables=3, dense_dim=13)
    buffer = np.zeros(lay.nbytes, np.uint8)
    keys, header, offsets, dense = lay.views(buffer)
    assert keys.dtype == np.int64 and keys.shape == (size * 29,)
    assert header.dtype == np.int32 and header.shape == (5,)
    assert offsets.dtype == np.int32 and offsets.shape == (size * 27 + 3,)
    assert dense.dtype == np.float32 and dense.shape == (size, 13)
    for region in (keys, header, offsets, dense):
        assert (region.ctypes.data - buffer.ctypes.data) % 256 == 0
    keys[:] = -1
    header[:] = -4
    offsets[:] = -2
    dense[:] = -3.0
    # Writing one region leaves the others intact: no overlap.
    assert (keys == -1).all() and (header == -4).all()
    assert (offsets == -2).all() and (dense == -3.0).all()
    end = buffer.ctypes.data + lay.nbytes
    assert dense.ctypes.data + dense.nbytes <= end and offsets.ctypes.data + offsets.nbytes <= end


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_a_batch_without_offsets_uses_every_region_but_the_offsets(size: int) -> None:
    lay = BatchLayout(size=size, keys_per_sample=29, slots=27, tables=3, dense_dim=13)
    base = np.zeros(lay.nbytes, np.uint8)
    keys, header, offsets, dense = lay.views(base)
    used = lay.used_bytes(offsets=False)
    for region in (keys, header, dense):
        assert region.ctypes.data + region.nbytes <= base.ctypes.data + used
    assert offsets.ctypes.data - base.ctypes.data >= used
    assert lay.used_bytes(offsets=True) == lay.nbytes


@pytest.mark.parametrize("parts", [1, 3, 4, 7, 100])
@pytest.mark.parametrize("lengths", [[5], [6, 4], [1, 1000, 0, 37], [0], []])
def test_split_copies_cover_every_element_once_in_even_shares(
    lengths: list[int], parts: int
) -> None:
    total = sum(lengths)
    target = np.full(total, -1, np.int64)
    source = np.arange(total, dtype=np.int64) * 3
    copies, at = [], 0
    for n in lengths:
        copies.append((target[at : at + n], source[at : at + n]))
        at += n
    shares = split_copies(copies, parts)
    assert len(shares) <= parts
    for share in shares:
        for t, s in share:
            assert t.shape == s.shape and np.shares_memory(t, target)
            t[...] = s
    np.testing.assert_array_equal(target, source)
    if total:
        sizes = [sum(t.shape[0] for t, _ in share) for share in shares]
        assert max(sizes) <= -(-total // parts) and sum(sizes) == total
