"""GPU lookups through the GPU lookup engine (the cache bank's kernels,
hps_core/infer/gpu/bank_lookup.py): HPS.lookup, lookup_fromdlpack and ModelLookup.lookup_many,
unpooled and pooled, against the files' rows (dict reference) and a NumPy float64 pooling, for
dynamic caches smaller than the table, static tables and tables without a GPU cache; keys on
the host and on the GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "lookup"))
from lookup_testdata import write_models  # noqa: E402
from test_lookup_pooled import pooled_reference  # noqa: E402

from hps_core.errors import RequestError  # noqa: E402
from hps_core.hps import HPS  # noqa: E402

CACHES = {
    "dynamic": {"gpucache": True, "gpucacheper": 0.1, "embedding_cache_type": "dynamic"},
    "static": {"gpucache": True, "embedding_cache_type": "static"},
    "none": {"gpucache": False},
}


def models_with(tmp_path: Path, cache: str):
    ps, data = write_models(tmp_path)
    doc = json.loads(ps.read_text())
    for entry in doc["models"]:
        entry.update(CACHES[cache])
    ps.write_text(json.dumps(doc))
    return ps, data


def exact_queries(table, rng: np.random.Generator, n: int) -> np.ndarray:
    return table.queries(rng, n)[:n]


@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("on_device", [False, True])
def test_unpooled_lookups_answer_the_files_rows(tmp_path: Path, cache: str, on_device: bool):
    ps, data = models_with(tmp_path, cache)
    hps = HPS(ps)
    rng = np.random.default_rng(1)
    table = data["wdl"][1]
    known, asked, unknown = set(table.rows), 0, 0
    for n in (1, 5, 33, 1000, 2999, 40_000, 7):  # growing buckets, then a small one again
        keys = exact_queries(table, rng, n)
        asked += n
        unknown += sum(k not in known for k in keys.tolist())  # repeats included
        if on_device:
            out = cupy.full((n, 16), np.nan, dtype=cupy.float32)  # poisoned
            hps.lookup_fromdlpack(cupy.asarray(keys), out, "wdl", 1, 0)
            got = out.get()
        else:
            got = hps.lookup(keys, "wdl", 1, device_id=0)
        np.testing.assert_array_equal(got, table.expected(keys))
    c = hps.model("wdl", 0).counters()[1]
    # The bank counts every key occurrence (without a GPU cache, each one a miss), as the
    # host does (tests/unit/lookup/test_lookup_hps.py).
    assert c.cache_hits + c.cache_misses == c.keys == asked
    assert c.unknown_keys == unknown > 0


@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("hotness", [1, 4, 100])
def test_fixed_hotness_pools_like_numpy(tmp_path: Path, cache: str, combiner: str, hotness: int):
    ps, data = models_with(tmp_path, cache)
    hps = HPS(ps)
    rng = np.random.default_rng(hotness)
    table = data["wdl"][1]
    for bags in (1, 17, 640):
        keys = exact_queries(table, rng, bags * hotness)
        offsets = np.arange(0, bags * hotness + 1, hotness)
        want = pooled_reference(table.expected(keys), offsets, combiner)
        got = hps.lookup(keys, "wdl", 1, 0, hotness=hotness, combiner=combiner)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        out = cupy.full((bags, 16), np.nan, dtype=cupy.float32)
        hps.lookup_fromdlpack(
            cupy.asarray(keys), out, "wdl", 1, 0, hotness=hotness, combiner=combiner
        )
        np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("cache", list(CACHES))
def test_offsets_pool_jagged_bags(tmp_path: Path, cache: str):
    ps, data = models_with(tmp_path, cache)
    hps = HPS(ps)
    rng = np.random.default_rng(9)
    table = data["dcn"][0]
    for bags, longest in ((3, 2), (500, 40), (20, 3000)):
        lengths = rng.integers(0, longest + 1, size=bags)
        lengths[0] = 0
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        keys = exact_queries(table, rng, int(offsets[-1]))
        for combiner in ("sum", "mean"):
            want = pooled_reference(table.expected(keys), offsets, combiner)
            got = hps.lookup(keys, "dcn", 0, 0, offsets=offsets, combiner=combiner)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
            out = cupy.full((bags, 8), np.nan, dtype=cupy.float32)
            hps.lookup_fromdlpack(
                cupy.asarray(keys), out, "dcn", 0, 0,
                offsets=cupy.asarray(offsets), combiner=combiner,
            )  # fmt: skip
            np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=1e-3)
            assert not out[0].get().any()  # an empty bag is zeros


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_several_tables_in_one_call(tmp_path: Path, cache: str):
    """The KEYS/NUMKEYS path: tables of different widths and key counts in one batch."""
    ps, data = models_with(tmp_path, cache)
    lookup = HPS(ps).model("wdl", 0)
    rng = np.random.default_rng(4)
    for counts in ((3, 900), (1000, 2), (0, 5), (64, 64)):
        keys = [exact_queries(t, rng, n) for t, n in zip(data["wdl"], counts, strict=True)]
        got = lookup.lookup_many([0, 1], keys)
        for t, (table, k) in enumerate(zip(data["wdl"], keys, strict=True)):
            np.testing.assert_array_equal(got[t].get(), table.expected(k))
        device = lookup.lookup_many([1, 0], [cupy.asarray(keys[1]), cupy.asarray(keys[0])])
        np.testing.assert_array_equal(device[0].get(), data["wdl"][1].expected(keys[1]))
        np.testing.assert_array_equal(device[1].get(), data["wdl"][0].expected(keys[0]))


def test_a_dynamic_cache_takes_the_misses(tmp_path: Path):
    """The same hot keys asked again hit the cache; counters count every key occurrence."""
    ps, data = models_with(tmp_path, "dynamic")
    hps = HPS(ps)
    table = data["wdl"][1]
    hot = table.keys[:200]  # 10% of 3,000 rows is 300 cache rows
    for _ in range(4):
        np.testing.assert_array_equal(hps.lookup(hot, "wdl", 1, 0), table.expected(hot))
    c = hps.model("wdl", 0).counters()[1]
    assert c.keys == 800 and c.cache_misses == 200 and c.cache_hits == 600, c
    assert c.inserted_keys == 200 and c.unknown_keys == 0
    assert c.hit_rate == 600 / 800  # hits over hits and misses, per key occurrence


def test_bad_outputs_fail_alone(tmp_path: Path):
    ps, data = models_with(tmp_path, "dynamic")
    hps = HPS(ps)
    keys = cupy.asarray(data["dcn"][0].keys[:10])
    with pytest.raises(RequestError, match=r"out must be C-contiguous float32 \[10, 8\]"):
        hps.lookup_fromdlpack(keys, cupy.empty((10, 9), cupy.float32), "dcn", 0, 0)
    with pytest.raises(RequestError, match=r"out must be C-contiguous float32 \[2, 8\]"):
        hps.lookup_fromdlpack(keys, cupy.empty((10, 8), cupy.float32), "dcn", 0, 0, hotness=5)
    out = cupy.empty((10, 8), cupy.float32)
    hps.lookup_fromdlpack(keys, out, "dcn", 0, 0)
    np.testing.assert_array_equal(out.get(), data["dcn"][0].expected(keys.get()))
