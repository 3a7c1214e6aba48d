"""Pooling of looked-up vectors per (sample, slot) against a loop reference, and the embedding
layer's handling of pooled and unpooled inputs."""

from __future__ import annotations

import numpy as np
import pytest
from nn_reference import pool
from nn_testdata import make_spec, random_csr

from hps_core.errors import ConfigError, RequestError
from hps_core.nn import (
    Combiner,
    ComputeContext,
    EmbeddingLayer,
    SparseInputSpec,
    UnpooledEmbedding,
    pool_embeddings,
    pool_gathered,
)

SPARSE = SparseInputSpec("keys", 5, 3, False)


@pytest.fixture
def rng():
    return np.random.default_rng(99)


@pytest.mark.parametrize("combiner", list(Combiner))
@pytest.mark.parametrize(
    ("batch", "slots", "max_keys", "dim"), [(1, 1, 1, 1), (4, 26, 3, 16), (9, 5, 6, 7)]
)
def test_pooling_matches_loop_reference(rng, combiner, batch, slots, max_keys, dim):
    values, offsets = random_csr(rng, batch * slots, max_keys, dim)
    out = pool_embeddings(np, values, offsets, slots, combiner)
    assert out.shape == (batch, slots, dim) and out.dtype == np.float32
    expected = pool(values, offsets, slots, combiner.value)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combiner", list(Combiner))
@pytest.mark.parametrize("hotness", [1, 2, 5])
def test_fixed_hotness_path_writes_poisoned_out(rng, combiner, hotness):
    batch, slots, dim = 6, 4, 3
    offsets = np.arange(0, batch * slots * hotness + 1, hotness, dtype=np.int32)
    values = rng.standard_normal((batch * slots * hotness, dim)).astype(np.float32)
    out = np.full((batch, slots, dim), np.nan, dtype=np.float32)
    result = pool_embeddings(np, values, offsets, slots, combiner, out=out)
    assert result is out
    np.testing.assert_allclose(out, pool(values, offsets, slots, combiner.value), rtol=1e-5)


def test_variable_hotness_path_writes_poisoned_out(rng):
    values, offsets = random_csr(rng, 3 * 7, 4, 5, empty=0.5)
    out = np.full((3, 7, 5), np.nan, dtype=np.float32)
    pool_embeddings(np, values, offsets, 7, Combiner.MEAN, out=out)
    np.testing.assert_allclose(out, pool(values, offsets, 7, "mean"), rtol=1e-5, atol=1e-6)


def test_empty_slots_pool_to_zero_and_empty_batch_works():
    values = np.ones((2, 3), dtype=np.float32)
    out = pool_embeddings(np, values, np.array([0, 0, 2, 2]), 3, Combiner.MEAN)
    np.testing.assert_array_equal(out[0], [[0, 0, 0], [1, 1, 1], [0, 0, 0]])
    empty = pool_embeddings(np, np.empty((0, 3), np.float32), np.array([0]), 3, Combiner.SUM)
    assert empty.shape == (0, 3, 3)


@pytest.mark.parametrize(
    ("values", "offsets", "message"),
    [
        (np.ones((3, 2)), np.array([0, 1, 3]), "length batch \\* 3 \\+ 1"),
        (np.ones((3, 2)), np.array([0, 2, 1, 3]), "must rise from 0 to the number of values"),
        (np.ones((3, 2)), np.array([1, 2, 3, 3]), "got 1 .. 3"),
        (np.ones((3, 2)), np.array([0, 1, 2, 2]), "number of values \\(3\\)"),
        (np.ones((3, 2)), np.array([0.0, 1, 2, 3]), "must be 1-D integers"),
        (np.ones((0, 2)), np.array([], dtype=np.int64), "must be 1-D integers"),
        (np.ones(3), np.array([0, 1, 2, 3]), "values must be a 2-D float array"),
        (np.ones((3, 2), dtype=np.int32), np.array([0, 1, 2, 3]), "2-D float array"),
    ],
)
def test_invalid_offsets_and_values_are_refused(values, offsets, message):
    with pytest.raises(RequestError, match=f"table7: .*{message}"):
        pool_embeddings(np, values, offsets, 3, Combiner.SUM, where="table7")


def test_out_must_fit():
    with pytest.raises(RequestError, match=r"out must be C-contiguous float32 \(1, 3, 2\)"):
        pool_embeddings(
            np,
            np.ones((3, 2)),
            np.array([0, 1, 2, 3]),
            3,
            Combiner.SUM,
            out=np.empty((1, 3, 2), dtype=np.float64),
        )


def embedding(combiner="sum", vec=4):
    spec = make_spec(
        "LocalizedSlotSparseEmbeddingHash",
        "keys",
        "emb",
        sparse_embedding_hparam={"embedding_vec_size": vec, "combiner": combiner},
    )
    return EmbeddingLayer.from_sparse(spec, SPARSE)


def test_embedding_layer_pools_unpooled_and_accepts_pooled(rng):
    layer = embedding("mean")
    assert str(layer.output_shapes[0]) == "(B, 5, 4)" and layer.combiner is Combiner.MEAN
    values, offsets = random_csr(rng, 2 * 5, 3, 4)
    ctx = ComputeContext(np)
    (pooled,) = layer.forward(ctx, [UnpooledEmbedding(values, offsets)], ())
    np.testing.assert_allclose(pooled, pool(values, offsets, 5, "mean"), rtol=1e-5, atol=1e-6)
    flat = pooled.reshape(2, 20).astype(np.float64)
    np.testing.assert_array_equal(layer.forward(ctx, [flat], ())[0], pooled)


def test_embedding_layer_old_integer_combiner_and_errors():
    assert embedding(1).combiner is Combiner.MEAN and embedding(0).combiner is Combiner.SUM
    with pytest.raises(ConfigError, match=r"'emb'.sparse_embedding_hparam.combiner: must be"):
        embedding("max")
    with pytest.raises(ConfigError, match="embedding_vec_size: must be an integer >= 1"):
        embedding(vec=0)
    with pytest.raises(
        RequestError, match=r"must be float \[batch, 5, 4\], got float32 \(2, 5, 3\)"
    ):
        embedding().forward(ComputeContext(np), [np.ones((2, 5, 3), np.float32)], ())


@pytest.mark.parametrize("gather_bytes", [1, 300, 64 << 20])
@pytest.mark.parametrize("combiner", list(Combiner))
def test_bags_of_many_counts_pool_alike_in_any_gather_size(
    rng, monkeypatch, combiner, gather_bytes
):
    """Variable hotness on NumPy: the bags of each key count are summed together, in pieces
    of at most gather_bytes of rows (1: one bag at a time)."""
    from hps_core.nn.layers import embedding

    monkeypatch.setattr(embedding, "_POOL_GATHER_BYTES", gather_bytes)
    values, offsets = random_csr(rng, 40 * 6, 30, 9, empty=0.2)
    out = np.full((40, 6, 9), np.nan, dtype=np.float32)
    pool_embeddings(np, values, offsets, 6, combiner, out=out)
    np.testing.assert_allclose(out, pool(values, offsets, 6, combiner.value), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hotness", [1, 2, 3, 100])
@pytest.mark.parametrize("bags", [1, 511, 512, 513, 1500])
def test_pool_gathered_sums_each_keys_row_in_key_order(rng, hotness, bags):
    """Bags summed from the distinct rows (a block of 512 bags at a time from 512 on) equal,
    bit for bit, the float32 sum of a row per key in key order; an index of None reads a row
    per key."""
    rows = rng.standard_normal((int(rng.integers(1, 3000)), 24)).astype(np.float32)
    index = rng.integers(0, len(rows), bags * hotness)
    per_key = rows[index]
    want = np.zeros((bags, 24), np.float32)
    for j in range(hotness):  # key order, float32 accumulation
        want += per_key.reshape(bags, hotness, 24)[:, j]
    got = pool_gathered(rows, index, hotness)
    assert got.dtype == np.float32 and got.shape == (bags, 24)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(pool_gathered(per_key, None, hotness), want)
