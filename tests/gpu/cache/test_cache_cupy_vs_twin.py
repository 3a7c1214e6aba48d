"""The CUDA cache against the NumPy twin: same calls, bit-for-bit the same answers and state.

Outputs are poisoned with NaN before every query, so a row the kernel should not write (a
miss) or failed to write (a hit) shows up. State (keys, stamps, values, clock), dumps and
counters are compared after every call.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "cache"))
from cache_twin import NumpyDynamicCache  # noqa: E402

from hps_core.cache import EMPTY_KEY, StaticTable  # noqa: E402
from hps_core.cache.cupy_cache import (  # noqa: E402
    CacheKernelError,
    CupyDynamicCache,
    load_kernels,
)
from hps_core.cache.kernel_consts import KERNEL_NAMES, THREADS  # noqa: E402

INT64_MIN = int(np.iinfo(np.int64).min)


def make_pair(num_sets: int, dim: int) -> tuple[NumpyDynamicCache, CupyDynamicCache]:
    return NumpyDynamicCache(num_sets, dim), CupyDynamicCache(num_sets, dim, sync_checks=True)


def assert_same_state(twin: NumpyDynamicCache, gpu: CupyDynamicCache, rng) -> None:
    a, b = twin.export_state(), gpu.export_state()
    assert a.clock == b.clock
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.stamps, b.stamps)
    np.testing.assert_array_equal(a.values, b.values)
    assert twin.stats() == gpu.stats()
    assert twin.size == gpu.size
    np.testing.assert_array_equal(twin.dump(), gpu.dump().get())
    for _ in range(3):
        start, end = sorted(rng.integers(0, twin.num_sets + 1, 2).tolist())
        np.testing.assert_array_equal(twin.dump(start, end), gpu.dump(start, end).get())


def run_step(twin, gpu, op: str, keys: np.ndarray, rng) -> None:
    n, dim = keys.shape[0], twin.dim
    if op == "query":
        out_twin = np.full((n, dim), np.nan, np.float32)
        out_gpu = cupy.full((n, dim), np.nan, dtype=cupy.float32)
        _, hit_twin = twin.query(keys, out=out_twin)
        result, hit_gpu = gpu.query(cupy.asarray(keys), out=out_gpu)
        assert result is out_gpu
        np.testing.assert_array_equal(hit_gpu.get(), hit_twin)
        np.testing.assert_array_equal(out_gpu.get(), out_twin)  # NaN rows must match too
    elif op == "query_fresh":
        values_twin, hit_twin = twin.query(keys)
        values_gpu, hit_gpu = gpu.query(cupy.asarray(keys))
        np.testing.assert_array_equal(hit_gpu.get(), hit_twin)
        np.testing.assert_array_equal(values_gpu.get(), values_twin)
    elif op == "clear":
        twin.clear()
        gpu.clear()
    else:
        values = rng.standard_normal((n, dim)).astype(np.float32)
        getattr(twin, op)(keys, values)
        getattr(gpu, op)(cupy.asarray(keys), cupy.asarray(values))


def test_query_into_a_misaligned_out_uses_the_scalar_copy() -> None:
    rng = np.random.default_rng(1)
    twin, gpu = make_pair(4, 8)
    keys = rng.integers(0, 300, 200).astype(np.int64)
    values = rng.standard_normal((200, 8)).astype(np.float32)
    twin.replace(keys, values)
    gpu.replace(cupy.asarray(keys), cupy.asarray(values))
    flat = cupy.full(200 * 8 + 1, np.nan, dtype=cupy.float32)
    out = flat[1:].reshape(200, 8)  # 4 bytes past a 16-byte boundary
    assert out.data.ptr % 16 != 0
    gpu.query(cupy.asarray(keys), out=out)
    want, _ = twin.query(keys, out=np.full((200, 8), np.nan, np.float32))
    np.testing.assert_array_equal(out.get(), want)


def skewed_keys(key_space: np.ndarray, batch: int, rng) -> np.ndarray:
    """Hot keys first; duplicates, negative keys and the reserved key all occur."""
    ranks = (rng.random(batch) ** 3 * key_space.shape[0]).astype(np.int64)
    return key_space[ranks]


def key_space_of(universe: int, rng) -> np.ndarray:
    space = rng.integers(INT64_MIN, EMPTY_KEY, size=universe, dtype=np.int64)
    special = [EMPTY_KEY, -1, INT64_MIN][:universe]
    space[rng.choice(universe, len(special), replace=False)] = special
    return space


OPS = ("replace", "query", "update", "query_fresh", "replace", "query", "clear", "replace", "query")


@pytest.mark.parametrize(
    ("num_sets", "dim", "universe", "batch", "steps"),
    [
        (1, 1, 6, 1, 60),
        (1, 3, 300, 150, 18),
        (5, 33, 2_000, 700, 18),
        (64, 16, 40_000, 10_000, 9),
        (4, 8, 500, 100_000, 9),
        (8, 128, 3_000, 2_000, 9),
        (16_384, 8, 4_000_000, 2_000_000, 5),
    ],
)
def test_gpu_cache_equals_twin_on_streams(num_sets, dim, universe, batch, steps) -> None:
    rng = np.random.default_rng(universe + batch)
    key_space = key_space_of(universe, rng)
    twin, gpu = make_pair(num_sets, dim)
    for step in range(steps):
        op = OPS[step % len(OPS)]
        run_step(twin, gpu, op, skewed_keys(key_space, batch, rng), rng)
        assert_same_state(twin, gpu, rng)
    stats = twin.stats()
    assert stats.inserts > 0 and stats.hits > 0


def test_gpu_cache_equals_twin_when_sets_overflow_within_one_batch() -> None:
    rng = np.random.default_rng(7)
    twin, gpu = make_pair(2, 4)
    for _ in range(4):
        keys = rng.integers(-(10**9), 10**9, 1000, dtype=np.int64)
        run_step(twin, gpu, "replace", keys, rng)
        assert_same_state(twin, gpu, rng)
        run_step(twin, gpu, "query", np.concatenate([keys, keys[::-1]]), rng)
        assert_same_state(twin, gpu, rng)
    assert twin.stats().evictions > 0


def test_empty_batches_and_reserved_key_on_gpu() -> None:
    rng = np.random.default_rng(3)
    twin, gpu = make_pair(3, 2)
    for op in ("query", "replace", "update"):
        run_step(twin, gpu, op, np.zeros(0, np.int64), rng)
    reserved = np.array([EMPTY_KEY, 5, EMPTY_KEY, -5], dtype=np.int64)
    for op in ("replace", "query", "update", "query"):
        run_step(twin, gpu, op, reserved, rng)
        assert_same_state(twin, gpu, rng)
    assert gpu.stats().reserved_key_misses == 4
    assert gpu.size == 2


def test_kernels_build_for_the_current_device() -> None:
    kernels = load_kernels(cupy.cuda.Device().id)
    assert set(kernels) == set(KERNEL_NAMES)


def test_a_failed_launch_is_reported_with_the_kernel_name() -> None:
    _, gpu = make_pair(1, 1)
    warps_per_block = THREADS // 32
    too_many_items = (2**31) * warps_per_block  # one block more than the grid limit
    keys = cupy.zeros(1, dtype=cupy.int64)
    args = (
        keys,
        np.int64(1),
        np.uint64(gpu.num_sets),
        gpu._keys,
        gpu._stamps,
        gpu._values,
        np.int32(1),
        np.uint64(0),
        cupy.zeros((1, 1), cupy.float32),
        cupy.zeros(1, dtype=bool),
        gpu._counters,
        False,
    )
    with pytest.raises(CacheKernelError, match="cache_query"):
        gpu._launch("cache_query", too_many_items, args)


@pytest.mark.parametrize(
    ("rows", "queries"), [(0, 10), (1, 1), (1000, 5000), (2_000_000, 1_000_000)]
)
def test_static_table_on_gpu_equals_numpy(rows: int, queries: int) -> None:
    rng = np.random.default_rng(rows)
    keys = np.unique(rng.integers(INT64_MIN, EMPTY_KEY, rows * 2, dtype=np.int64))[:rows]
    rng.shuffle(keys)
    if rows:
        keys[0] = EMPTY_KEY
    values = rng.standard_normal((keys.shape[0], 8)).astype(np.float32)
    host = StaticTable(keys, values)
    device = StaticTable(cupy.asarray(keys), cupy.asarray(values), xp=cupy)
    asked = rng.integers(INT64_MIN, EMPTY_KEY, queries, dtype=np.int64)
    if rows:
        asked[::2] = rng.choice(keys, asked[::2].shape[0])
    out_host = np.full((queries, 8), np.nan, np.float32)
    out_device = cupy.full((queries, 8), np.nan, dtype=cupy.float32)
    _, hit_host = host.query(asked, out=out_host)
    _, hit_device = device.query(cupy.asarray(asked), out=out_device)
    np.testing.assert_array_equal(hit_device.get(), hit_host)
    np.testing.assert_array_equal(out_device.get(), out_host)
    updates = rng.standard_normal((queries, 8)).astype(np.float32)
    host.update(asked, updates)
    device.update(cupy.asarray(asked), cupy.asarray(updates))
    np.testing.assert_array_equal(device.query(cupy.asarray(asked))[0].get(), host.query(asked)[0])
    assert device.stats() == host.stats()
