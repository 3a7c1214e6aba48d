"""HugeCTR's hps_torch API (hps_core.hps_torch): LookupLayer in a PyTorch model of the shape of
HugeCTR's demo notebook (several layers under torch.jit.fork), on CPU tensors, against the
files' rows."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from lookup_testdata import write_models

torch = pytest.importorskip("torch")

from hps_core import hps_torch  # noqa: E402
from hps_core.errors import RequestError  # noqa: E402
from hps_core.formats.sparse_writer import write_sparse_table  # noqa: E402
from hps_core.hps import HPS  # noqa: E402


class DemoModel(torch.nn.Module):
    """HugeCTR's hps_torch demo model's shape: one LookupLayer per table, run under
    torch.jit.fork, their outputs concatenated and summed by a linear layer."""

    def __init__(self, ps: str, model: str, dims: list[int]) -> None:
        super().__init__()
        self.lookups = torch.nn.ModuleList(
            hps_torch.LookupLayer(ps, model, t, dim) for t, dim in enumerate(dims)
        )
        self.linear = torch.nn.Linear(sum(dims), 1)

    def forward(self, keys: list[torch.Tensor]) -> torch.Tensor:
        futures = [torch.jit.fork(layer, k) for layer, k in zip(self.lookups, keys, strict=True)]
        vectors = [torch.jit.wait(f) for f in futures]
        return self.linear(torch.cat([v.sum(dim=1) for v in vectors], dim=1))


def test_the_demo_model_looks_up_the_files_rows(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path)
    tables = data["wdl"]
    model = DemoModel(str(ps), "wdl", [t.vectors.shape[1] for t in tables]).eval()
    rng = np.random.default_rng(3)
    keys = [t.queries(rng, 64 * 3)[: 64 * 3].reshape(64, 3) for t in tables]
    with torch.no_grad():
        scores = model([torch.from_numpy(k) for k in keys])
        for layer, table, k in zip(model.lookups, tables, keys, strict=True):
            got = layer(torch.from_numpy(k))
            assert got.dtype == torch.float32 and tuple(got.shape) == (64, 3, layer.emb_vec_size)
            want = table.expected(k.reshape(-1)).reshape(64, 3, -1)
            np.testing.assert_array_equal(got.numpy(), want)
    pooled = np.concatenate(
        [t.expected(k.reshape(-1)).reshape(64, 3, -1).astype(np.float64).sum(axis=1)
         for t, k in zip(tables, keys, strict=True)], axis=1,
    )  # fmt: skip
    weight = model.linear.weight.detach().numpy().astype(np.float64)
    want = pooled @ weight.T + model.linear.bias.detach().numpy()
    np.testing.assert_allclose(scores.numpy(), want, rtol=1e-5, atol=1e-5)
    HPS.close_all()


def test_int32_keys_any_shape_and_an_explicit_init(tmp_path: Path) -> None:
    """A model of 32-bit keys (supportlonglong false, as the demo notebook's)."""
    keys = np.arange(0, 2000, 7, dtype=np.int64)
    vectors = np.random.default_rng(2).standard_normal((len(keys), 8), dtype=np.float32)
    write_sparse_table(tmp_path / "t0", keys, vectors)
    ps = tmp_path / "ps.json"
    ps.write_text(json.dumps({"supportlonglong": False, "models": [{
        "model": "small", "sparse_files": ["t0"], "embedding_vecsize_per_table": [8],
        "maxnum_catfeature_query_per_table_per_sample": [6], "max_batch_size": 64,
        "deployed_device_list": [0], "default_value_for_each_table": [0.5],
    }]}))  # fmt: skip
    assert hps_torch.init(ps, 64) == "OK"  # every table open before the first forward
    layer = hps_torch.LookupLayer(ps, "small", 0, 8)
    asked = np.array([0, 7, 1, 1995, 14, 3], dtype=np.int32)  # known and unknown keys
    want = np.where(asked[:, None] % 7 == 0, vectors[np.minimum(asked // 7, len(keys) - 1)], 0.5)
    for shape in ((6,), (2, 3), (1, 2, 3)):
        got = layer(torch.from_numpy(asked.reshape(shape)))
        np.testing.assert_array_equal(got.numpy(), want.reshape(*shape, 8))
    assert layer(torch.empty(0, dtype=torch.int32)).shape == (0, 8)
    HPS.close_all()


def test_bad_keys_and_widths_are_named(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path)
    with pytest.raises(RequestError, match=r"keys must be int32 or int64, got torch\.float32"):
        hps_torch.LookupLayer(ps, "dcn", 0, 8)(torch.zeros(3))
    wrong = hps_torch.LookupLayer(ps, "dcn", 0, 16)
    with pytest.raises(RequestError, match=r"emb_vec_size 16 is not the width of table 0 .* \(8\)"):
        wrong(torch.zeros(3, dtype=torch.int64))
    keys = torch.from_numpy(data["dcn"][0].keys[:4])
    np.testing.assert_array_equal(
        hps_torch.LookupLayer(ps, "dcn", 0, 8)(keys).numpy(), data["dcn"][0].vectors[:4]
    )
    HPS.close_all()


def _torch_bag(table, mode: str) -> tuple[torch.nn.EmbeddingBag, dict[int, int]]:
    """torch.nn.EmbeddingBag over the table's rows plus one row of its default value, and
    each key's row (unknown keys: the last row)."""
    weight = np.concatenate([table.vectors, np.full((1, table.vectors.shape[1]), table.default)])
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(weight.astype(np.float32)),
                                                mode=mode)  # fmt: skip
    return bag, table.rows


def _rows_of(keys: np.ndarray, rows: dict[int, int], unknown: int) -> torch.Tensor:
    return torch.tensor([rows.get(int(k), unknown) for k in keys.reshape(-1)]).reshape(keys.shape)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("bags", [40, 600])  # below and above hps_torch.FUSED_KEYS keys
def test_embedding_bag_pools_as_torch_does(tmp_path: Path, mode: str, bags: int) -> None:
    ps, data = write_models(tmp_path)
    table = data["wdl"][1]
    ours = hps_torch.EmbeddingBag(ps, "wdl", 1, 16, mode=mode)
    reference, rows = _torch_bag(table, mode)
    unknown = len(table.vectors)
    rng = np.random.default_rng(8)
    # Fixed hotness: [B, h].
    keys = table.queries(rng, bags * 5)[: bags * 5].reshape(bags, 5)
    want = reference(_rows_of(keys, rows, unknown))
    torch.testing.assert_close(ours(torch.from_numpy(keys)), want, rtol=1e-5, atol=1e-5)
    # Jagged: 1-D keys with each bag's start (empty bags included).
    lengths = rng.integers(0, 7, size=bags)
    lengths[:2] = 0
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    flat = table.queries(rng, int(lengths.sum()))[: int(lengths.sum())]
    got = ours(torch.from_numpy(flat), torch.from_numpy(starts))
    want = reference(_rows_of(flat, rows, unknown), torch.from_numpy(starts))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if mode == "sum":  # weights scale each row before the sum
        weights = torch.from_numpy(rng.standard_normal(len(flat)).astype(np.float32))
        got = ours(torch.from_numpy(flat), torch.from_numpy(starts), weights)
        want = reference(_rows_of(flat, rows, unknown), torch.from_numpy(starts), weights)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        weights2 = torch.ones(keys.shape)
        got = ours(torch.from_numpy(keys), per_sample_weights=weights2)
        torch.testing.assert_close(got, reference(_rows_of(keys, rows, unknown)))
    HPS.close_all()


@pytest.mark.parametrize("known_only", [True, False])
def test_large_pooled_lookups_read_rows_in_place_as_the_reference(
    tmp_path: Path, known_only: bool
) -> None:
    """A pooled lookup of at least FUSED_KEYS keys is pooled by embedding_bag from the host
    tier's own rows: sums and means equal a float64 NumPy pooling of the files' rows (the
    table's default vector for unknown keys, empty bags zero), and the table's counters count
    its keys and unknown keys, each occurrence, and the host tier's answers, each call's
    distinct keys, as a row lookup would."""
    ps, data = write_models(tmp_path)
    table = data["wdl"][1]
    rng = np.random.default_rng(11)
    n = 3 * hps_torch.FUSED_KEYS
    keys = rng.choice(table.keys, n) if known_only else table.queries(rng, n)[:n]
    rows = table.expected(keys).astype(np.float64)
    lengths = rng.integers(0, 5, size=n // 4)  # at most n keys in all
    lengths[[0, 5, -1]] = 0
    lengths[-2] += n - int(lengths.sum())  # the bags take every key
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    summed = np.stack([rows[a:b].sum(axis=0) for a, b in itertools.pairwise(offsets)])
    for mode in ("sum", "mean"):
        bag = hps_torch.EmbeddingBag(ps, "wdl", 1, 16, mode=mode)
        got = bag(torch.from_numpy(keys), torch.from_numpy(offsets[:-1]))
        want = summed if mode == "sum" else summed / np.maximum(lengths, 1)[:, None]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
        got = bag(torch.from_numpy(keys.reshape(-1, 8)))  # a fixed hotness of 8
        want = rows.reshape(-1, 8, 16).sum(axis=1) / (1 if mode == "sum" else 8)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    [_, counters] = HPS(ps).model("wdl", None).counters()
    distinct, known = set(keys.tolist()), set(table.rows.keys())
    assert counters.keys == 4 * n
    assert counters.unknown_keys == 4 * sum(k not in known for k in keys.tolist())
    assert counters.tier_default_keys == 4 * len(distinct - known)
    assert counters.tier_host_hits == 4 * len(distinct & known)
    HPS.close_all()


def test_large_pooled_lookups_through_lower_tiers(tmp_path: Path) -> None:
    """The in-place pooling of a table whose shared tier holds 30 % of its rows, RocksDB all
    of them: bags mixing both, and unknown keys, equal a float64 pooling of the files' rows."""
    rng = np.random.default_rng(12)
    keys = rng.choice(np.arange(0, 10**8, 7), 5000, replace=False).astype(np.int64)
    vectors = rng.standard_normal((len(keys), 8)).astype(np.float32)
    write_sparse_table(tmp_path / "t0", keys, vectors)
    ps = tmp_path / "ps.json"
    ps.write_text(json.dumps({
        "supportlonglong": True,
        "volatile_db": {"type": "hash_map", "initial_cache_rate": 0.3},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db"), "num_threads": 2},
        "models": [{"model": "m", "sparse_files": ["t0"], "embedding_vecsize_per_table": [8],
                    "maxnum_catfeature_query_per_table_per_sample": [4],
                    "deployed_device_list": [0], "default_value_for_each_table": [-0.5]}],
    }))  # fmt: skip
    rows = dict(zip(keys.tolist(), vectors.astype(np.float64), strict=True))
    asked = rng.choice(np.concatenate([keys, [1, 2, 3]]), 4 * hps_torch.FUSED_KEYS)
    want = np.stack([rows.get(k, np.full(8, -0.5)) for k in asked.tolist()])
    got = hps_torch.EmbeddingBag(ps, "m", 0, 8, mode="mean")(torch.from_numpy(asked.reshape(-1, 4)))
    np.testing.assert_allclose(got.numpy(), want.reshape(-1, 4, 8).mean(axis=1), rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    counters = HPS(ps).model("m", None).counters()[0]
    assert counters.tier_rocks_db_hits > 0 and counters.tier_host_hits > 0
    HPS.close_all()


def test_embedding_bag_refuses_what_torch_would(tmp_path: Path) -> None:
    ps, _ = write_models(tmp_path)
    with pytest.raises(ValueError, match="mode must be 'sum' or 'mean', got 'max'"):
        hps_torch.EmbeddingBag(ps, "dcn", 0, 8, mode="max")
    bag = hps_torch.EmbeddingBag(ps, "dcn", 0, 8, mode="mean")
    keys = torch.arange(6)
    with pytest.raises(RequestError, match="1-D input needs 1-D offsets"):
        bag(keys)
    with pytest.raises(RequestError, match="offsets go with 1-D input"):
        bag(keys.reshape(2, 3), torch.tensor([0]))
    with pytest.raises(RequestError, match="per_sample_weights need mode='sum'"):
        bag(keys.reshape(2, 3), per_sample_weights=torch.ones(2, 3))
    assert bag(torch.empty((4, 0), dtype=torch.int64)).shape == (4, 8)
    HPS.close_all()


def test_compile_and_export_keep_the_lookup_as_one_op(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path)
    tables = data["wdl"]
    model = DemoModel(str(ps), "wdl", [t.vectors.shape[1] for t in tables]).eval()
    rng = np.random.default_rng(6)
    keys = [torch.from_numpy(t.queries(rng, 24)[:24].reshape(8, 3)) for t in tables]

    def forward(keys: list[torch.Tensor]) -> torch.Tensor:  # the demo's, without jit.fork
        vectors = [layer(k).sum(dim=1) for layer, k in zip(model.lookups, keys, strict=True)]
        return model.linear(torch.cat(vectors, dim=1))

    with torch.no_grad():
        eager = model(keys)
        compiled = torch.compile(forward, backend="aot_eager", fullgraph=True)(keys)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    layer = hps_torch.LookupLayer(ps, "wdl", 1, 16)
    exported = torch.export.export(layer, (keys[1],))
    ops = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert ops == [torch.ops.hps.lookup.default], ops
    torch.testing.assert_close(exported.module()(keys[1]), layer(keys[1]), rtol=0, atol=0)
    # An EmbeddingBag is one operator too, bags of a fixed hotness or CSR bags.
    bag = hps_torch.EmbeddingBag(ps, "wdl", 1, 16, mode="mean")
    flat, starts = keys[1].reshape(-1), torch.tensor([0, 5, 5, 17])
    for args in ((keys[1],), (flat, starts)):
        exported = torch.export.export(bag, args)
        ops = [n.target for n in exported.graph.nodes if n.op == "call_function"]
        assert torch.ops.hps.lookup_bags.default in ops and torch.ops.hps.lookup.default not in ops
        torch.testing.assert_close(exported.module()(*args), bag(*args), rtol=0, atol=0)
        compiled = torch.compile(bag, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(*args), bag(*args), rtol=0, atol=0)
    HPS.close_all()
