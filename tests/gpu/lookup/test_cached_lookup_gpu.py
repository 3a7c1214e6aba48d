"""The cached lookup pipeline on a GPU: CuPy cache kernels behind the shared host tier.

The cases are those CI runs on the NumPy twin (tests/unit/lookup/cached_lookup_cases.py);
here they run with CuPy, and the GPU pipeline is also compared with the twin step by step.
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
    run_stream,
)

from hps_core.cache import make_cache  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.lookup import CachedTableLookup  # noqa: E402


@pytest.fixture(autouse=True)
def _private_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HPS_SHM_DIR", str(tmp_path / "shm"))
    yield
    HPS.close_all()


@pytest.mark.parametrize("keys_on_device", [True, False])
@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.1])
def test_every_answer_is_the_true_vector(
    tmp_path: Path, threshold: float, keys_on_device: bool
) -> None:
    lookup = run_stream(cupy, tmp_path / "t", threshold=threshold, keys_on_device=keys_on_device)
    c = lookup.counters
    assert c.cache_hits + c.cache_misses == c.unique_keys and c.unknown_keys > 0
    lookup.close()


def test_default_policy_and_static_cache(tmp_path: Path) -> None:
    lookup = run_stream(cupy, tmp_path / "a", threshold=0.0, policy="default")
    assert lookup.counters.default_answers > 0
    lookup.close()
    lookup = run_stream(cupy, tmp_path / "b", kind="static")
    assert lookup.counters.cache_misses == lookup.counters.unknown_keys
    lookup.close()


@pytest.mark.parametrize(("rows", "dim", "batch"), [(50, 1, 1), (200_000, 128, 100_000)])
def test_sizes(tmp_path: Path, rows: int, dim: int, batch: int) -> None:
    run_stream(cupy, tmp_path / "t", rows=rows, dim=dim, batch=batch, batches=4).close()


def test_gpu_pipeline_equals_twin_pipeline(tmp_path: Path) -> None:
    host, reference = make_host(tmp_path / "t", 4000, 16, seed=3)
    twin = CachedTableLookup(host, dynamic_cache(700, 16, np), np, 0.8)
    gpu = CachedTableLookup(host, make_cache("dynamic", 700, 16, cupy), cupy, 0.8)
    for q in query_stream(reference, 25, 900, seed=4):
        a = twin.lookup(q)
        twin.flush()
        b = gpu.lookup(cupy.asarray(q) if len(q) % 2 else q).get()  # device and host keys
        gpu.flush()
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(b, expected(reference, q, 16))
    s_twin, s_gpu = twin.cache.export_state(), gpu.cache.export_state()
    np.testing.assert_array_equal(s_twin.keys, s_gpu.keys)
    np.testing.assert_array_equal(s_twin.stamps, s_gpu.stamps)
    assert twin.cache.stats() == gpu.cache.stats()
    twin.close()
    gpu.close()


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
