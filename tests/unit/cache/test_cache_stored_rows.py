"""Caches of compressed rows on NumPy (the twin of the dynamic cache, the static table): they
keep the stored rows they are given and answer them decoded, as the reference quantiser
decodes them; wrong stored rows are refused with the expected dtype and shape named."""

from __future__ import annotations

import numpy as np
import pytest
from cache_twin import NumpyDynamicCache
from quant_reference import reference_decoded, reference_stored

from hps_core.cache import make_cache
from hps_core.quant import RowFormat, StoragePrecision

PRECISIONS = list(StoragePrecision)


def rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    return (rng.standard_normal((n, dim)) * 10.0 ** rng.uniform(-2, 2, (n, 1))).astype(np.float32)


@pytest.mark.parametrize("precision", PRECISIONS, ids=str)
@pytest.mark.parametrize("dim", [4, 13, 128])
def test_dynamic_cache_keeps_stored_rows_and_answers_them_decoded(
    precision: StoragePrecision, dim: int
) -> None:
    rng = np.random.default_rng(dim)
    fmt = RowFormat(precision, dim)
    cache = NumpyDynamicCache(2, dim, precision=precision)
    keys = rng.choice(10_000, 100, replace=False).astype(np.int64)
    vectors = rows(rng, 100, dim)
    cache.replace(keys, reference_stored(fmt, vectors))
    assert cache.export_state().values.dtype == fmt.stored_dtype
    out = np.full((120, dim), np.nan, np.float32)
    queries = np.concatenate([keys, rng.integers(20_000, 30_000, 20)])
    _, hit = cache.query(queries, out=out)
    assert hit[:100].sum() == cache.size and not hit[100:].any()
    np.testing.assert_array_equal(out[:100][hit[:100]], reference_decoded(fmt, vectors)[hit[:100]])
    assert np.isnan(out[100:]).all()  # misses are not written
    update = rows(rng, 100, dim)
    cache.update(keys, reference_stored(fmt, update))
    cache.query(keys, out=out[:100])
    np.testing.assert_array_equal(out[:100][hit[:100]], reference_decoded(fmt, update)[hit[:100]])


@pytest.mark.parametrize("precision", PRECISIONS, ids=str)
def test_static_table_keeps_stored_rows_and_answers_them_decoded(
    precision: StoragePrecision,
) -> None:
    rng = np.random.default_rng(7)
    dim = 24
    fmt = RowFormat(precision, dim)
    keys = rng.choice(1 << 40, 500, replace=False).astype(np.int64)
    vectors = rows(rng, 500, dim)
    table = make_cache(
        "static", 500, dim, np, contents=(keys, reference_stored(fmt, vectors)), precision=precision
    )
    queries = np.concatenate([keys[::-1], [-5, 3]])
    out = np.full((502, dim), np.nan, np.float32)
    _, hit = table.query(queries, out=out)
    assert hit[:500].all() and not hit[500:].any()
    np.testing.assert_array_equal(out[:500], reference_decoded(fmt, vectors[::-1]))
    update = rows(rng, 3, dim)
    table.update(keys[:3], reference_stored(fmt, update))
    np.testing.assert_array_equal(table.query(keys[:3])[0], reference_decoded(fmt, update))


@pytest.mark.parametrize("precision", [StoragePrecision.FP16, StoragePrecision.INT8], ids=str)
def test_float_rows_are_refused_by_a_compressed_cache(precision: StoragePrecision) -> None:
    cache = NumpyDynamicCache(1, 8, name="m.t0", precision=precision)
    fmt = cache.row_format
    with pytest.raises(TypeError, match=r"cache 'm.t0': stored .* rows must be uint32 words"):
        cache.replace(np.array([1]), np.zeros((1, fmt.row_words), np.float32))
    with pytest.raises(ValueError, match=rf"must have shape \(1, {fmt.row_words}\), got \(1, 8\)"):
        cache.update(np.array([1]), np.zeros((1, 8), np.uint32))
