"""Several tables' answers side by side in one array on a GPU (``lookup_side_by_side``): the
cache bank writes each table's bags into their columns itself where the tables are asked in
rising order with widths that are multiples of 4; other calls copy each answer there. Against the
files' rows (dict reference) and a NumPy float64 pooling, into poisoned outputs, for dynamic
caches smaller than the table, static tables and tables without a GPU cache, keys on the
host and on the GPU; then hps_torchrec's EmbeddingBagCollection of one feature per table,
which answers this way, against the host's answer, and without reading anything back from the
GPU where the input says where each feature starts (length_per_key)."""

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
from hps_core.lookup.model_lookup import TableQuery  # noqa: E402
from hps_core.nn import Combiner  # noqa: E402

# Widths 4, 16, 8, 128 (the bank writes them side by side) and 3 (it cannot: rows would lose
# their 16-byte alignment).
MODEL = {"side": ((500, 4, 0.5), (3000, 16, -1.0), (700, 8, 0.0), (2000, 128, 0.25),
                  (600, 3, 1.0))}  # fmt: skip
CACHES = {
    "dynamic": {"gpucache": True, "gpucacheper": 0.1, "embedding_cache_type": "dynamic"},
    "static": {"gpucache": True, "embedding_cache_type": "static"},
    "none": {"gpucache": False},
}


def written(tmp_path: Path, cache: str):
    ps, data = write_models(tmp_path, models=MODEL)
    doc = json.loads(ps.read_text())
    doc["models"][0].update(CACHES[cache])
    ps.write_text(json.dumps(doc))
    return ps, data["side"]


def calls(tables, rng: np.random.Generator, bags: int):
    """Per table, a query of ``bags`` bags (unpooled, by hotness, by offsets, in turn) and
    its expected answer."""
    out = {}
    for t, table in enumerate(tables):
        kind = t % 3
        if kind == 0:
            keys = table.queries(rng, 2 * bags + 4)[:bags]
            out[t] = (TableQuery(t, keys), table.expected(keys))
        elif kind == 1:
            keys = table.queries(rng, 6 * bags + 4)[: 3 * bags]
            query = TableQuery(t, keys, Combiner.SUM, hotness=3)
            want = pooled_reference(table.expected(keys), np.arange(0, 3 * bags + 1, 3), "sum")
            out[t] = (query, want)
        else:
            offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 9, bags))])
            keys = table.queries(rng, 2 * int(offsets[-1]) + 4)[: int(offsets[-1])]
            query = TableQuery(t, keys, Combiner.MEAN, offsets=offsets)
            out[t] = (query, pooled_reference(table.expected(keys), offsets, "mean"))
    return out


def on_gpu(query: TableQuery) -> TableQuery:
    offsets = None if query.offsets is None else cupy.asarray(query.offsets)
    return TableQuery(query.table, cupy.asarray(query.keys), query.combiner, query.hotness,
                      offsets)  # fmt: skip


@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("on_device", [False, True])
def test_answers_side_by_side_as_the_files_say(tmp_path: Path, cache: str, on_device: bool) -> None:
    ps, tables = written(tmp_path, cache)
    lookup = HPS(ps).model("side", 0)
    rng = np.random.default_rng(5)
    orders = {"rising": [0, 1, 2, 3], "some": [1, 3], "not rising": [2, 0, 3],
              "a width of 3": [0, 4, 1]}  # fmt: skip
    for bags in (1, 33, 1000, 5000, 2):  # growing buckets, then a small one again
        asked = calls(tables, rng, bags)
        for order, ids in orders.items():
            queries = [asked[t][0] for t in ids]
            if on_device:
                queries = [on_gpu(q) for q in queries]
            want = np.concatenate([asked[t][1] for t in ids], axis=1)
            width = sum(tables[t].vectors.shape[1] for t in ids)
            out = cupy.full((bags, width), np.nan, dtype=cupy.float32)  # poisoned
            got = lookup.lookup_side_by_side(queries, out)
            assert got is out, order
            np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=1e-4, err_msg=order)
            fresh = lookup.lookup_side_by_side(queries)
            np.testing.assert_allclose(fresh.get(), want, rtol=1e-5, atol=1e-4, err_msg=order)
    engine = lookup._gpu_engine()
    rising = [calls(tables, rng, 4)[t][0] for t in (0, 1, 2, 3)]
    assert engine.side_by_side(rising)  # the bank wrote the rising calls itself
    assert not engine.side_by_side(rising[::-1])


def test_bad_calls_fail_alone(tmp_path: Path) -> None:
    ps, tables = written(tmp_path, "dynamic")
    lookup = HPS(ps).model("side", 0)
    keys = cupy.asarray(tables[0].keys[:6])
    with pytest.raises(RequestError, match=r"the same bags, got \[3, 6\]"):
        lookup.lookup_side_by_side([TableQuery(0, keys), TableQuery(1, keys, Combiner.SUM, 2)])
    with pytest.raises(RequestError, match=r"\[6, 20\]"):
        lookup.lookup_side_by_side(
            [TableQuery(0, keys), TableQuery(1, keys)], cupy.empty((6, 21), cupy.float32)
        )
    got = lookup.lookup_side_by_side([TableQuery(0, keys), TableQuery(1, keys)])
    np.testing.assert_array_equal(got[:, :4].get(), tables[0].expected(keys.get()))
    np.testing.assert_array_equal(got[:, 4:].get(), tables[1].expected(keys.get()))


def test_outputs_off_16_byte_alignment_are_answered_too(tmp_path: Path) -> None:
    """bank_pool stores 16 bytes at a time: a C-contiguous view 4 bytes into its buffer (side
    by side, and one table's answer) is written through an aligned copy, not stored into
    misaligned (which would fault the GPU)."""
    ps, tables = written(tmp_path, "dynamic")
    hps = HPS(ps)
    lookup = hps.model("side", 0)
    keys = tables[1].queries(np.random.default_rng(2), 64)[:40]
    want = np.concatenate([tables[0].expected(keys), tables[1].expected(keys)], axis=1)
    queries = [TableQuery(0, cupy.asarray(keys)), TableQuery(1, cupy.asarray(keys))]
    assert lookup._gpu_engine().side_by_side(queries)
    buffer = cupy.full(40 * 20 + 1, np.nan, dtype=cupy.float32)
    out = buffer[1:].reshape(40, 20)
    assert out.flags.c_contiguous and out.data.ptr % 16
    assert lookup.lookup_side_by_side(queries, out) is out
    np.testing.assert_array_equal(out.get(), want)
    single = cupy.full(40 * 16 + 1, np.nan, dtype=cupy.float32)[1:].reshape(40, 16)
    hps.lookup_fromdlpack(cupy.asarray(keys), single, "side", 1, 0)
    np.testing.assert_array_equal(single.get(), tables[1].expected(keys))


def test_an_embedding_bag_collection_answers_side_by_side(tmp_path: Path) -> None:
    """One feature per table, unweighted: the KeyedTensor's values come from one side by side
    lookup; they equal the host's (the host tier) and TorchRec's layout."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    from hps_core import hps_torchrec
    from hps_core.jagged import _KeyedJaggedTensor

    ps, tables = written(tmp_path, "dynamic")
    names = HPS(ps).config.model("side").embedding_table_names
    spec = hps_torchrec.TableSpec
    order = (0, 1, 3)
    ebc = hps_torchrec.EmbeddingBagCollection(
        ps, "side",
        [spec(names[t], tables[t].vectors.shape[1], (f"f{t}",), "sum" if t else "mean")
         for t in order],
    )  # fmt: skip
    rng = np.random.default_rng(8)
    cuda = torch.device("cuda", 0)
    for samples in (1, 64, 4096):
        for hot in (None, 2):  # ragged bags, then bags of one length (pooled by hotness)
            lengths = rng.integers(0, 5, 3 * samples) if hot is None else np.full(3 * samples, hot)
            values = np.concatenate([
                tables[order[i // samples]].queries(rng, int(n) + 4)[: int(n)]
                for i, n in enumerate(lengths)
            ]).astype(np.int64)  # fmt: skip
            keys = [f"f{t}" for t in order]
            host = _KeyedJaggedTensor(keys, torch.from_numpy(values),
                                      lengths=torch.from_numpy(lengths))  # fmt: skip
            gpu = _KeyedJaggedTensor(keys, host.values().to(cuda), lengths=host.lengths().to(cuda))
            got, want = ebc(gpu), ebc(host)
            # Where each feature starts known on the host (TorchRec's length_per_key): the
            # forward reads nothing back from the GPU (PyTorch raises on a synchronising call).
            per_key = lengths.reshape(3, samples).sum(axis=1).tolist()
            known = _KeyedJaggedTensor(
                keys, gpu.values(), lengths=gpu.lengths(), length_per_key=per_key
            )
            torch.cuda.set_sync_debug_mode("error")
            try:
                unsynced = ebc(known)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.testing.assert_close(unsynced.values().cpu(), want.values(), rtol=1e-5, atol=1e-5)
            assert got.values().device == cuda and got.keys() == keys
            assert got.values().shape == (samples, 4 + 16 + 128)
            torch.testing.assert_close(got.values().cpu(), want.values(), rtol=1e-5, atol=1e-5)
            mean = pooled_reference(
                tables[0].expected(values[: int(lengths[:samples].sum())]),
                np.concatenate([[0], np.cumsum(lengths[:samples])]), "mean",
            )  # fmt: skip
            np.testing.assert_allclose(got.values()[:, :4].cpu().numpy(), mean, rtol=1e-5,
                                       atol=1e-5)  # fmt: skip
