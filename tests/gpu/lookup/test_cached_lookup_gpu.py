"""A table's GPU cache in front of the shared host tier (``CachedTableLookup``) with CuPy's
cache kernels: warm-up and refresh against the NumPy twin (the cases CI runs on the twin are
tests/unit/lookup/test_cached_lookup.py), and lookups through such caches via the HPS (the
cache bank's kernels).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "lookup"))
from cached_lookup_cases import (  # noqa: E402
    dynamic_cache,
    expected,
    make_host,
    query_stream,
)

from hps_core.cache import make_cache  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.lookup import CachedTableLookup  # noqa: E402


@pytest.mark.parametrize(("rows", "dim", "chunk"), [(50, 1, 7), (4000, 16, 1 << 20),
                                                    (200_000, 128, 30_000)])  # fmt: skip
def test_warm_and_refresh_on_the_gpu_equal_the_twin(
    tmp_path: Path, rows: int, dim: int, chunk: int
) -> None:
    """Warm-up (in chunks) and refresh leave the CUDA cache as they leave its NumPy twin, and
    every cached row is the host tier's."""
    host, reference = make_host(tmp_path / "t", rows, dim, seed=3)
    capacity = max(rows // 5, 1)
    twin = CachedTableLookup(host, dynamic_cache(capacity, dim, np), np)
    gpu = CachedTableLookup(host, make_cache("dynamic", capacity, dim, cupy), cupy)
    hot = np.fromiter(reference, np.int64, rows)
    unknown = np.array([1, 4, 7], np.int64)  # never multiples of 3
    keys = np.concatenate([hot[: capacity // 2], unknown, hot[capacity // 2 :]])
    assert twin.warm(keys, chunk) == gpu.warm(keys, chunk) > 0
    s_twin, s_gpu = twin.cache.export_state(), gpu.cache.export_state()
    np.testing.assert_array_equal(s_twin.keys, s_gpu.keys)
    np.testing.assert_array_equal(s_twin.stamps, s_gpu.stamps)
    assert twin.cache.stats() == gpu.cache.stats()
    stored = gpu.cache.dump().get()
    np.testing.assert_array_equal(stored, twin.cache.dump())
    rows_gpu, hits = gpu.cache.query(cupy.asarray(stored))
    assert hits.get().all()
    np.testing.assert_array_equal(rows_gpu.get(), expected(reference, stored, dim))
    assert not gpu.cache.query(cupy.asarray(unknown))[1].get().any()
    # Stale rows, then a refresh in two strides reads every one back from the host tier.
    gpu.cache.update(cupy.asarray(stored), cupy.full((len(stored), dim), 99.0, cupy.float32))
    half = gpu.cache.num_sets // 2
    refreshed = gpu.refresh(0, half) + gpu.refresh(half, gpu.cache.num_sets)
    assert refreshed == len(stored)
    np.testing.assert_array_equal(
        gpu.cache.query(cupy.asarray(stored))[0].get(), expected(reference, stored, dim)
    )
    assert gpu.snapshot().evictions == gpu.cache.stats().evictions
    twin.close()
    gpu.close()


def test_a_static_table_on_the_gpu_is_neither_warmed_nor_refreshed(tmp_path: Path) -> None:
    host, reference = make_host(tmp_path / "t", 3000, 8, seed=5)
    keys_all, values_all = host.contents()
    cache = make_cache(
        "static",
        len(keys_all),
        8,
        cupy,
        contents=(cupy.asarray(keys_all), cupy.asarray(values_all)),
    )
    lookup = CachedTableLookup(host, cache, cupy)
    assert lookup.warm(keys_all) == 0 and lookup.refresh(0, 1) == 0
    q = np.concatenate([keys_all[:100], [1, 4]]).astype(np.int64)
    rows, hits = cache.query(cupy.asarray(q))
    assert hits.get().tolist() == [True] * 100 + [False, False]
    np.testing.assert_array_equal(rows.get()[:100], expected(reference, q[:100], 8))
    lookup.close()


def test_hps_lookup_on_gpu_and_from_dlpack(tmp_path: Path) -> None:
    host, reference = make_host(tmp_path / "t", 3000, 8, seed=6)
    host.close()
    ps = {
        "supportlonglong": True,
        "models": [
            {
                "model": "m",
                "sparse_files": ["t"],
                "embedding_vecsize_per_table": [8],
                "default_value_for_each_table": [-0.5],
                "maxnum_catfeature_query_per_table_per_sample": [10],
                "deployed_device_list": [0],
                "gpucacheper": 0.3,
            }
        ],
    }
    (tmp_path / "ps.json").write_text(json.dumps(ps))
    hps = HPS(tmp_path / "ps.json")
    for q in query_stream(reference, 5, 500, seed=8):
        np.testing.assert_array_equal(hps.lookup(q, "m", 0, device_id=0), expected(reference, q, 8))
        keys = cupy.asarray(q)
        out = cupy.full((len(q), 8), np.nan, cupy.float32)
        hps.lookup_fromdlpack(keys, out, "m", 0, 0)
        np.testing.assert_array_equal(out.get(), expected(reference, q, 8))
    assert hps.model("m", 0).uses_cache
