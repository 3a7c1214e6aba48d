"""Compressed rows in the CUDA caches: the kernels keep the stored bytes and decode them bit
for bit as the reference quantiser (tests/quant_reference.py) decodes them, on the vectorised
path (rows of whole float4s, aligned output) and the scalar one (other widths, an output off
16-byte alignment); the CUDA dynamic cache equals the NumPy twin call by call."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "cache"))
from cache_twin import NumpyDynamicCache  # noqa: E402
from quant_reference import reference_decoded, reference_stored  # noqa: E402

from hps_core.cache import make_cache  # noqa: E402
from hps_core.cache.cupy_cache import CupyDynamicCache  # noqa: E402
from hps_core.quant import RowFormat, StoragePrecision  # noqa: E402

PRECISIONS = list(StoragePrecision)
DIMS = [1, 3, 4, 13, 128, 129]


def edge_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """Rows of every scale, and each codec's edge rows: zero, constant, a huge range, a tiny
    one, a NaN (a row of NaN once quantised to int8 or fp8)."""
    x = (rng.standard_normal((n, dim)) * 10.0 ** rng.uniform(-4, 4, (n, 1))).astype(np.float32)
    x[0] = 0.0
    x[1] = -2.75
    x[2, 0] = 3e38
    x[3] *= 1e-38
    x[4, dim // 2] = np.nan
    return x


@pytest.mark.parametrize("precision", PRECISIONS, ids=str)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("aligned", [True, False])
def test_static_query_decodes_as_the_reference(
    precision: StoragePrecision, dim: int, aligned: bool
) -> None:
    rng = np.random.default_rng(dim)
    fmt = RowFormat(precision, dim)
    n = 700
    keys = rng.choice(1 << 40, n, replace=False).astype(np.int64)
    vectors = edge_rows(rng, n, dim)
    stored = reference_stored(fmt, vectors)
    table = make_cache(
        "static", n, dim, cupy, contents=(cupy.asarray(keys), cupy.asarray(stored)),
        precision=precision,
    )  # fmt: skip
    queries = np.concatenate([keys[rng.permutation(n)], [-1, 12345]])
    base = cupy.full((len(queries) * dim + 1,), np.nan, dtype=cupy.float32)  # poisoned
    out = base[1:] if not aligned else base[:-1]
    out = out.reshape(len(queries), dim)
    _, hit = table.query(cupy.asarray(queries), out=out)
    want = np.full((len(queries), dim), np.nan, np.float32)  # misses are not written
    rows = {int(k): i for i, k in enumerate(keys)}
    positions = [rows[int(k)] for k in queries[:n]]
    want[:n] = reference_decoded(fmt, vectors[positions])
    np.testing.assert_array_equal(hit.get(), [True] * n + [False, False])
    np.testing.assert_array_equal(out.get(), want)  # bit for bit, NaN where NaN


@pytest.mark.parametrize("precision", PRECISIONS, ids=str)
@pytest.mark.parametrize("dim", [3, 16, 129])
def test_dynamic_cache_of_stored_rows_equals_the_twin(
    precision: StoragePrecision, dim: int
) -> None:
    rng = np.random.default_rng(100 + dim)
    fmt = RowFormat(precision, dim)
    twin = NumpyDynamicCache(4, dim, precision=precision)
    gpu = CupyDynamicCache(4, dim, sync_checks=True, precision=precision)
    for step in range(12):
        keys = rng.integers(0, 600, 300).astype(np.int64)
        op = ("replace", "query", "update", "query")[step % 4]
        if op == "query":
            out_twin = np.full((300, dim), np.nan, np.float32)
            out_gpu = cupy.full((300, dim), np.nan, dtype=cupy.float32)
            _, hit_twin = twin.query(keys, out=out_twin)
            _, hit_gpu = gpu.query(cupy.asarray(keys), out=out_gpu)
            np.testing.assert_array_equal(hit_gpu.get(), hit_twin)
            np.testing.assert_array_equal(out_gpu.get(), out_twin)
        else:
            stored = reference_stored(fmt, edge_rows(rng, 300, dim))
            getattr(twin, op)(keys, stored)
            getattr(gpu, op)(cupy.asarray(keys), cupy.asarray(stored))
        a, b = twin.export_state(), gpu.export_state()
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.values.view(np.uint32), b.values.view(np.uint32))
        assert twin.stats() == gpu.stats()
