"""The pieces of the export: dlrm's flags, the interaction column map, the network JSON as
``hps_core.nn`` reads it, the dense layout, and the chunked table writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hps_core.errors import ConfigError, ModelFileError
from hps_core.export import (
    DlrmArch,
    dlrm_network_json,
    hugectr_dense_params,
    interaction_source_rows,
    parse_dash_list,
    write_embedding_table,
)
from hps_core.formats.sparse import read_sparse_table
from hps_core.nn import (
    ComputeContext,
    EmbeddingLayer,
    LayerSpec,
    Precision,
    TensorShape,
    build_graph,
    parse_network_json,
)
from hps_core.nn.layers.interaction import Interaction


def test_top_mlp_width_is_computed_as_dlrm_does():
    # MLPerf DLRM: 26 tables of dim 128 -> ln_top 479-1024-1024-512-256-1.
    arch = DlrmArch.from_flags(
        128, "-".join(["1000"] * 26), "13-512-256-128", "1024-1024-512-256-1"
    )
    assert arch.interaction_width == 479
    assert arch.top_layer_sizes == (479, 1024, 1024, 512, 256, 1)
    shapes = arch.expected_shapes()
    assert shapes["top_l.0.weight"] == (1024, 479)
    assert shapes["top_l.8.bias"] == (1,)
    assert shapes["bot_l.4.weight"] == (128, 256)
    assert shapes["emb_l.25.weight"] == (1000, 128)
    assert len(shapes) == 26 + 2 * 3 + 2 * 5


@pytest.mark.parametrize(
    ("text", "flag"), [("13-x-16", "--arch-mlp-bot"), ("", "--arch-mlp-top"), ("4--2", "-e")]
)
def test_bad_dash_list_names_the_flag(text, flag):
    with pytest.raises(ConfigError) as info:
        parse_dash_list(text, flag)
    assert info.value.problems[0].where == flag and repr(text) in str(info.value)


def test_arch_problems_are_all_reported():
    with pytest.raises(ConfigError) as info:
        DlrmArch(16, (), (13,), (0, 1))
    where = {p.where for p in info.value.problems}
    assert where == {"--arch-embedding-size", "--arch-mlp-bot", "--arch-mlp-top"}
    with pytest.raises(ConfigError, match="last width 8 must equal --arch-sparse-feature-size 16"):
        DlrmArch.from_flags(16, "10-10", "13-8", "4-1")


def _dlrm_interaction(vectors: np.ndarray) -> np.ndarray:
    """dlrm's interact_features in NumPy: x, then Z[i, j] for i > j row by row."""
    n = vectors.shape[1]
    z = vectors @ vectors.transpose(0, 2, 1)
    pairs = [z[:, i, j] for i in range(n) for j in range(i)]
    return np.concatenate([vectors[:, 0], np.stack(pairs, axis=1)], axis=1)


@pytest.mark.parametrize(("tables", "dim"), [(1, 4), (2, 3), (7, 8), (26, 16)])
def test_mapped_weight_on_hugectr_interaction_equals_dlrm(tables, dim):
    rng = np.random.default_rng(tables)
    mlp = rng.standard_normal((5, dim)).astype(np.float32)
    emb = rng.standard_normal((5, tables, dim)).astype(np.float32)
    dlrm = _dlrm_interaction(np.concatenate([mlp[:, None], emb], axis=1).astype(np.float64))
    weight = rng.standard_normal((dlrm.shape[1], 3))

    spec = LayerSpec(1, 1, "test.json", "i", "Interaction", ("m", "e"), ("i",), {})
    layer = Interaction.build(spec, [TensorShape(1, (dim,)), TensorShape(1, (tables, dim))])
    (hugectr,) = layer.forward(ComputeContext(np, Precision.FP32), [mlp, emb], ())
    source = interaction_source_rows(tables + 1, dim)
    assert hugectr.shape[1] == source.size == dlrm.shape[1] + 1 and source[-1] == -1
    mapped = np.zeros((source.size, 3))
    mapped[source >= 0] = weight[source[source >= 0]]
    np.testing.assert_allclose(hugectr @ mapped, dlrm @ weight, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(np.sort(source[:-1]), np.arange(dlrm.shape[1]))


@pytest.mark.parametrize("tables", [1, 4])
def test_network_json_as_hps_core_reads_it(tables):
    arch = DlrmArch(8, tuple(range(10, 10 + tables)), (13, 32, 8), (16, 2))
    max_keys = list(range(1, tables + 1))
    graph = build_graph(parse_network_json(json.dumps(dlrm_network_json(arch, max_keys))))
    graph.require_runnable()
    assert graph.spec.data.dense_dim == 13
    assert [s.nnz_per_slot for s in graph.spec.data.sparse] == max_keys
    embeddings = [node.layer for node in graph.embeddings]
    assert [node.spec.name for node in graph.embeddings] == [
        f"sparse_embedding{t}" for t in range(tables)
    ]
    assert all(isinstance(e, EmbeddingLayer) for e in embeddings)
    assert {(e.slot_num, e.vec_size, e.combiner.value) for e in embeddings} == {(1, 8, "sum")}
    assert graph.tensor_shapes["interaction"].dims == (arch.interaction_width + 1,)
    assert graph.output_shape.dims == (2,)
    assert graph.nodes[-1].spec.type == "Sigmoid"
    layout = graph.dense_layout()
    widths = [(13, 32), (32, 8), (arch.interaction_width + 1, 16), (16, 2)]
    assert [layer.params[0].shape for layer in layout.layers] == widths
    assert [layer.params[1].shape for layer in layout.layers] == [(1, w) for _, w in widths]


def test_dense_params_transpose_and_pad():
    arch = DlrmArch(4, (3, 3), (2, 4), (5, 1))
    rng = np.random.default_rng(0)
    dense = {
        k: rng.standard_normal(s).astype(np.float32) for k, s in arch.expected_shapes().items()
    }
    graph = build_graph(parse_network_json(json.dumps(dlrm_network_json(arch, [1, 1]))))
    params = hugectr_dense_params(arch, dense, graph.dense_layout())
    assert list(params) == ["bot_fc0", "top_fc0", "top_fc1"]
    np.testing.assert_array_equal(params["bot_fc0"][0], dense["bot_l.0.weight"].T)
    np.testing.assert_array_equal(params["bot_fc0"][1], dense["bot_l.0.bias"][None])
    top0 = params["top_fc0"][0]
    assert top0.shape == (arch.interaction_width + 1, 5)
    np.testing.assert_array_equal(top0[:-1], dense["top_l.0.weight"].T)  # same order in both
    np.testing.assert_array_equal(top0[-1], 0)  # HugeCTR's padding column reads nothing
    np.testing.assert_array_equal(params["top_fc1"][0], dense["top_l.2.weight"].T)


@pytest.mark.parametrize("chunk_rows", [None, 1, 7, 1000])
def test_table_writer_chunks_give_the_same_folder(tmp_path: Path, chunk_rows):
    table = np.random.default_rng(1).standard_normal((23, 5)).astype(np.float32)
    calls = []

    def rows(start: int, stop: int) -> np.ndarray:
        calls.append((start, stop))
        return table[start:stop]

    keys = np.arange(100, 123, dtype=np.int64)[::-1].copy()
    write_embedding_table(tmp_path / "t", 23, 5, rows, keys, chunk_rows=chunk_rows)
    got_keys, vectors = read_sparse_table(tmp_path / "t", 5)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(vectors, table)
    step = chunk_rows or 23
    assert calls == [(s, min(s + step, 23)) for s in range(0, 23, step)]


def test_table_writer_refuses_a_wrong_chunk(tmp_path: Path):
    with pytest.raises(ModelFileError, match=r"rows 0\.\.4 must come as \[4, 3\], got \(4, 2\)"):
        write_embedding_table(tmp_path / "t", 4, 3, lambda a, b: np.zeros((b - a, 2), np.float32))
    assert not (tmp_path / "t").exists()
