"""``DenseExecutor.forward_given``: the forward pass from tensors a caller already computed
(what the GPU pipeline feeds), against ``forward`` on the same inputs, on every fixture."""

from __future__ import annotations

import json

import numpy as np
import pytest
from network_files import HUGECTR, OWN, network_id, requires_hugectr
from nn_testdata import FIXTURES, graph_inputs, graph_of

from hps_core.demo.zoo_networks import dlrm_v2_network
from hps_core.errors import RequestError
from hps_core.nn import DenseExecutor, build_graph, load_network_json, random_dense_params
from hps_core.nn.executor import PooledConcat
from hps_core.nn.spec.network_json import parse_network_json


def executor_of(path) -> DenseExecutor:
    graph = build_graph(load_network_json(path))
    return DenseExecutor(graph, random_dense_params(graph.dense_layout(), seed=3))


@pytest.mark.parametrize("path", FIXTURES, ids=network_id)
@pytest.mark.parametrize("batch", [1, 7, 64])
def test_given_embedding_outputs_equal_forward(path, batch) -> None:
    executor = executor_of(path)
    dense, pooled = graph_inputs(executor.graph, batch, np.random.default_rng(batch))
    want = executor.forward(dense, {n: pooled[n] for n in executor.embedding_names})
    tops = dict(zip(executor.embedding_names, executor.embedding_tops(), strict=True))
    given = {tops[n]: pooled[n] for n in executor.embedding_names}
    np.testing.assert_array_equal(executor.forward_given(dense, given), want)


def _embedding(name: str, bottom: str) -> dict:
    hparam = {"embedding_vec_size": 4, "combiner": "sum"}
    return {"name": name, "type": "LocalizedSlotSparseEmbeddingHash", "bottom": bottom,
            "top": name, "sparse_embedding_hparam": hparam}  # fmt: skip


def test_a_concat_of_all_embeddings_is_found_and_skipped() -> None:
    layers = [
        _embedding("emb_a", "keys_a"),
        _embedding("emb_b", "keys_b"),
        {"name": "cat", "type": "Concat", "bottom": ["emb_a", "emb_b"], "top": "cat"},
        {"name": "flat", "type": "Reshape", "bottom": "cat", "top": "flat", "leading_dim": 20},
        {"name": "both", "type": "Concat", "bottom": ["flat", "dense"], "top": "both"},
        {"name": "fc", "type": "InnerProduct", "bottom": "both", "top": "fc",
         "fc_param": {"num_output": 1}},
    ]  # fmt: skip
    graph = graph_of(layers, sparse=(("keys_a", 2, 1), ("keys_b", 3, 2)))
    executor = DenseExecutor(graph, random_dense_params(graph.dense_layout(), seed=3))
    concat = executor.embedding_concat()
    assert concat == "cat"
    dense, pooled = graph_inputs(executor.graph, 5, np.random.default_rng(0))
    want = executor.forward(dense, {n: pooled[n] for n in executor.embedding_names})
    stacked = np.concatenate([pooled[n] for n in executor.embedding_names], axis=1)
    # Only the Concat's output: the embedding steps and the Concat are skipped.
    got = executor.forward_given(dense, {concat: stacked} | _tops_as_garbage(executor))
    np.testing.assert_array_equal(got, want)


def _wide_network(order: tuple[str, ...], extra_reader: bool = False) -> DenseExecutor:
    """Two tables stacked and flattened ([B, 20]), concatenated with the dense input ([B, 4])
    and an MLP of it ([B, 8]) in ``order``; ``extra_reader``: one more layer reads the flat
    embeddings."""
    layers = [
        _embedding("emb_a", "keys_a"),
        _embedding("emb_b", "keys_b"),
        {"name": "cat", "type": "Concat", "bottom": ["emb_a", "emb_b"], "top": "cat"},
        {"name": "flat", "type": "Reshape", "bottom": "cat", "top": "flat", "leading_dim": 20},
        {"name": "mlp", "type": "InnerProduct", "bottom": "dense", "top": "mlp",
         "fc_param": {"num_output": 8}},
        {"name": "wide", "type": "Concat", "bottom": list(order), "top": "wide"},
        {"name": "fc", "type": "InnerProduct", "bottom": "wide", "top": "fc",
         "fc_param": {"num_output": 1}},
    ]  # fmt: skip
    if extra_reader:
        layers[-1]["bottom"] = ["wide", "side"]
        layers[-1]["type"] = "Concat"
        layers[-1].pop("fc_param")
        layers.insert(-1, {"name": "side", "type": "InnerProduct", "bottom": "flat",
                           "top": "side", "fc_param": {"num_output": 4}})  # fmt: skip
    graph = graph_of(layers, sparse=(("keys_a", 2, 1), ("keys_b", 3, 2)))
    return DenseExecutor(graph, random_dense_params(graph.dense_layout(), seed=3))


@pytest.mark.parametrize(
    "order", [("flat", "dense", "mlp"), ("mlp", "flat", "dense"), ("dense", "mlp", "flat")]
)
@pytest.mark.parametrize("batch", [1, 5])
def test_embeddings_pooled_into_a_later_concat_equal_forward(order, batch) -> None:
    """The Concat of the flattened embeddings with 2-D tensors: a caller that writes the
    embeddings into their columns of its output (the rest poisoned) gets forward's answer;
    the executor copies the other inputs into their columns and reads nothing else given."""
    executor = _wide_network(order)
    widths = {"flat": 20, "dense": 4, "mlp": 8}
    at = sum(widths[n] for n in order[: order.index("flat")])
    copied = tuple(
        (n, sum(widths[m] for m in order[: order.index(n)]),
         sum(widths[m] for m in order[: order.index(n) + 1]))
        for n in order if n != "flat"
    )  # fmt: skip
    assert executor.pooled_concat == PooledConcat("wide", 32, at, "flat", copied)
    dense, pooled = graph_inputs(executor.graph, batch, np.random.default_rng(batch))
    want = executor.forward(dense, {n: pooled[n] for n in executor.embedding_names})
    wide = np.full((batch, 32), np.nan, np.float32)
    stacked = np.concatenate([pooled[n] for n in executor.embedding_names], axis=1)
    wide[:, at : at + 20] = stacked.reshape(batch, 20)
    flat = wide[:, at : at + 20]
    given = {"wide": wide, "flat": flat, "cat": flat.reshape(batch, -1, 4)}
    given |= _tops_as_garbage(executor)
    assert executor.reads_of_given(given) == {"wide"}
    np.testing.assert_array_equal(executor.forward_given(dense, given), want)
    # With the dense-only steps run first (the MLP), as the GPU pipeline does.
    prefix = executor.forward_dense_prefix(dense)
    wide[:, [c for c in range(32) if not at <= c < at + 20]] = np.nan
    np.testing.assert_array_equal(
        executor.forward_given(dense, given | prefix, prefix_done=True), want
    )


def test_no_pooled_concat_when_another_layer_reads_the_embeddings() -> None:
    assert _wide_network(("flat", "dense"), extra_reader=True).pooled_concat is None
    assert _wide_network(("flat", "dense")).pooled_concat is not None


def test_the_zoo_dlrm_v2_pools_into_its_concat() -> None:
    network = dlrm_v2_network(dim=8, hotness=(3, 1, 2), bottom=(16, 8))
    graph = build_graph(parse_network_json(json.dumps(network)))
    executor = DenseExecutor(graph, random_dense_params(graph.dense_layout(), seed=3))
    assert executor.pooled_concat == PooledConcat("concat1", 32, 0, "embeddings_flat",
                                                  (("mlp1", 24, 32),))  # fmt: skip


def _tops_as_garbage(executor: DenseExecutor) -> dict[str, np.ndarray]:
    # The embedding outputs are given too (as the pipeline does) but must not be read.
    return {top: np.full((5, 1, 1), np.nan, np.float32) for top in executor.embedding_tops()}


@requires_hugectr
@pytest.mark.parametrize("path", HUGECTR, ids=network_id)
def test_fixtures_have_no_such_concat(path) -> None:
    # HugeCTR's own files use one embedding layer per input, read without a Concat.
    assert executor_of(path).embedding_concat() is None


def test_the_exported_dlrm_has_such_a_concat() -> None:
    # The exporter stacks the tables' [B, 1, D] outputs into the interaction's [B, 26, D].
    assert executor_of(OWN["dlrm"]).embedding_concat() is not None


def test_a_missing_tensor_is_named() -> None:
    executor = executor_of(FIXTURES[0])
    dense, _ = graph_inputs(executor.graph, 2, np.random.default_rng(0))
    with pytest.raises(RequestError, match="needs tensors not given"):
        executor.forward_given(dense, {})


@pytest.mark.parametrize("path", FIXTURES, ids=network_id)
@pytest.mark.parametrize("batch", [1, 9])
def test_dense_prefix_then_the_rest_equals_forward(path, batch) -> None:
    """The steps fed by the dense input alone run first (the pipeline overlaps them with the
    lookup); the rest, given their outputs, skips them and gives forward's answer."""
    executor = executor_of(path)
    dense, pooled = graph_inputs(executor.graph, batch, np.random.default_rng(batch + 1))
    want = executor.forward(dense, {n: pooled[n] for n in executor.embedding_names})
    tops = dict(zip(executor.embedding_names, executor.embedding_tops(), strict=True))
    given = {tops[n]: pooled[n] for n in executor.embedding_names}
    prefix = executor.forward_dense_prefix(dense)
    if "dlrm" in path.stem:  # the bottom MLP: its output is what the interaction reads
        assert len(prefix) == 1 and next(iter(prefix.values())).shape[0] == batch
    np.testing.assert_array_equal(
        executor.forward_given(dense, given | prefix, prefix_done=True), want
    )
    # Without its outputs the rest cannot run: the skipped steps are not recomputed.
    if prefix:
        with pytest.raises(RequestError, match="needs tensors not given"):
            executor.forward_given(dense, given, prefix_done=True)


def test_no_prefix_in_a_network_without_dense_only_steps() -> None:
    layers = [
        _embedding("emb_a", "keys_a"),
        {"name": "flat", "type": "Reshape", "bottom": "emb_a", "top": "flat", "leading_dim": 8},
        {"name": "both", "type": "Concat", "bottom": ["flat", "dense"], "top": "both"},
        {"name": "fc", "type": "InnerProduct", "bottom": "both", "top": "fc",
         "fc_param": {"num_output": 1}},
    ]  # fmt: skip
    graph = graph_of(layers, sparse=(("keys_a", 2, 1),))
    executor = DenseExecutor(graph, random_dense_params(graph.dense_layout(), seed=3))
    dense, _ = graph_inputs(executor.graph, 3, np.random.default_rng(0))
    assert executor.forward_dense_prefix(dense) == {}
