"""Wiring, ordering and shape inference of the inference graph, and its errors."""

from __future__ import annotations

import itertools
import json

import pytest
from network_files import OWN, hugectr, requires_hugectr
from nn_testdata import graph_of

from hps_core.errors import ConfigError, NotAvailableError
from hps_core.nn import build_graph, load_network_json


def graph_at(path):
    return build_graph(load_network_json(path))


def shapes(graph):
    return {n.spec.name: [str(s) for s in n.output_shapes] for n in graph.nodes}


def test_own_dlrm_interaction_width_and_output():
    graph = graph_at(OWN["dlrm"])
    doc = json.loads(OWN["dlrm"].read_text())
    dim = doc["layers"][1]["sparse_embedding_hparam"]["embedding_vec_size"]
    slots = sum(s["slot_num"] for s in doc["layers"][0]["sparse"])
    width = dim + (slots + 1) * slots // 2 + 1
    assert shapes(graph)["interaction"] == [f"(B, {width})"]
    assert graph.output == "sigmoid" and str(graph.output_shape) == "(B, 1)"
    assert graph.cannot_run == () and all(n.used for n in graph.nodes)


def test_own_deepfm_rows_per_sample_and_branches():
    got = shapes(graph_at(OWN["deepfm"]))
    assert got["reshape1"] == ["(26B, 9)"]
    assert got["slice1"] == ["(26B, 8)", "(26B, 1)"]
    assert got["reshape2"] == ["(B, 208)"] and got["concat1"] == ["(B, 312)"]
    assert got["fm"] == ["(B, 8)"] and got["add"] == ["(B, 1)"]


def test_own_dcn_dense_layout_in_file_order():
    layout = graph_at(OWN["dcn"]).dense_layout()
    assert [layer.layer for layer in layout.layers] == [
        "multicross1", "deep_fc1", "deep_fc2", "fc_out"
    ]  # fmt: skip
    width = 26 * 16 + 13
    cross = 3 * 2 * width  # three cross layers, a weight and a bias vector each
    deep = sum(w_in * w_out + w_out for w_in, w_out in itertools.pairwise([width, 64, 64]))
    assert layout.total_floats == cross + deep + (width + 64) * 1 + 1
    assert [p.shape for p in layout.layers[1].params] == [(width, 64), (1, 64)]


def test_own_wdl_embedding_tables_follow_file_order():
    graph = graph_at(OWN["wdl"])
    tables = [(n.spec.name, n.layer.sparse_input, n.layer.slot_num) for n in graph.embeddings]
    assert tables == [("wide_embedding", "wide_data", 2), ("deep_embedding", "deep_data", 26)]


@requires_hugectr
def test_dlrm_interaction_width_and_output():
    graph = graph_at(hugectr("dlrm_1gpu.json"))
    doc = json.loads(hugectr("dlrm_1gpu.json").read_text())
    dim = doc["layers"][1]["sparse_embedding_hparam"]["embedding_vec_size"]
    slots = doc["layers"][0]["sparse"][0]["slot_num"]
    width = dim + (slots + 1) * slots // 2 + 1
    assert shapes(graph)["interaction1"] == [f"(B, {width})"]
    assert graph.output == "loss" and str(graph.output_shape) == "(B, 1)"
    assert graph.cannot_run == () and all(n.used for n in graph.nodes)


@requires_hugectr
def test_deepfm_rows_per_sample_and_branches():
    got = shapes(graph_at(hugectr("deepfm_1gpu.json")))
    assert got["reshape1"] == ["(26B, 11)"]
    assert got["slice1"] == ["(26B, 10)", "(26B, 1)"]
    assert got["reshape2"] == ["(B, 260)"] and got["concat1"] == ["(B, 390)"]
    assert got["add"] == ["(B, 1)"]


@requires_hugectr
def test_dcn_dense_layout_in_file_order():
    layout = graph_at(hugectr("dcn_inference.json")).dense_layout()
    assert [layer.layer for layer in layout.layers] == ["fc1", "fc2", "fc3", "fc4"]
    widths = [26 * 16 + 13, 200, 200, 200, 1]
    expected = sum(w_in * w_out + w_out for w_in, w_out in itertools.pairwise(widths))
    assert layout.total_floats == expected
    assert [p.shape for p in layout.layers[0].params] == [(429, 200), (1, 200)]


@requires_hugectr
def test_wdl_embedding_tables_follow_file_order():
    graph = graph_at(hugectr("wdl_1gpu.json"))
    tables = [(n.spec.name, n.layer.sparse_input, n.layer.slot_num) for n in graph.embeddings]
    assert tables == [("sparse_embedding2", "wide_data", 2), ("sparse_embedding1", "deep_data", 26)]


def test_layers_out_of_file_order_are_sorted_topologically():
    graph = graph_of(
        [
            {"type": "Sigmoid", "bottom": "fc", "top": "out"},
            {"type": "InnerProduct", "bottom": "dense", "top": "fc", "fc_param": {"num_output": 1}},
        ]
    )
    assert [n.spec.name for n in graph.nodes] == ["fc", "out"]
    assert graph.output == "fc"  # HugeCTR's rule: the last top of the last layer in the file
    assert [n.used for n in graph.nodes] == [True, False]


def test_unused_branch_is_marked():
    graph = graph_of(
        [
            {"type": "ReLU", "bottom": "dense", "top": "side"},
            {"type": "Sigmoid", "bottom": "dense", "top": "out"},
        ]
    )
    assert {n.spec.name: n.used for n in graph.nodes} == {"side": False, "out": True}


@pytest.mark.parametrize(
    ("layers", "messages"),
    [
        (
            [
                {"type": "ReLU", "bottom": "dense", "top": "a"},
                {"type": "ReLU", "bottom": "dense", "top": "a"},
            ],
            ["'a' is already produced by layer 'a'"],
        ),
        ([{"type": "ReLU", "bottom": "dense", "top": "dense"}], ["'dense' is also one of its"]),
        (
            [
                {"name": "n", "type": "ReLU", "bottom": "dense", "top": "a"},
                {"name": "n", "type": "ReLU", "bottom": "a", "top": "b"},
            ],
            ["'n'.name: layer name 'n' is also used at line 25"],
        ),
        (
            [{"type": "ReLU", "bottom": "nothing", "top": "a"}],
            ["no layer or input produces 'nothing'; sparse input 'keys' feeds no embedding"],
        ),
        ([{"type": "ReLU", "bottom": "label", "top": "a"}], ["reads the label 'label'"]),
        ([{"type": "ReLU", "bottom": "keys", "top": "a"}], ["can only feed an embedding layer"]),
        (
            [
                {
                    "type": "DistributedSlotSparseEmbeddingHash",
                    "bottom": "dense",
                    "top": "e",
                    "sparse_embedding_hparam": {"embedding_vec_size": 4, "combiner": "sum"},
                }
            ],
            ["'dense' is not a sparse input of Data"],
        ),
        (
            [
                {"type": "ReLU", "bottom": "dense", "top": "x"},
                {"type": "Add", "bottom": ["x", "nope"], "top": "y"},
                {"type": "Concat", "bottom": ["x", "dense"], "top": "x"},
            ],
            ["no layer or input produces 'nope'", "'x' is also one of its bottoms"],
        ),
    ],
)
def test_wiring_errors_are_collected(layers, messages):
    with pytest.raises(ConfigError) as info:
        graph_of(layers)
    text = str(info.value)
    for message in messages:
        assert message in text
    assert "net.json:" in text


def test_cycle_is_reported():
    with pytest.raises(ConfigError, match=r"cycle among: 'a' \(line \d+\), 'b' \(line \d+\)"):
        graph_of(
            [
                {"type": "Add", "bottom": ["dense", "b"], "top": "a"},
                {"type": "ReLU", "bottom": "a", "top": "b"},
            ]
        )


def test_shape_errors_of_several_layers_come_together():
    with pytest.raises(ConfigError) as info:
        graph_of(
            [
                {"type": "Add", "bottom": ["dense", "s"], "top": "a"},
                {"type": "Slice", "bottom": "dense", "top": ["s"], "ranges": [[0, 3]]},
                {"type": "FmOrder2", "bottom": "dense", "top": "f", "out_dim": 3},
            ],
            dense_dim=4,
        )
    assert len(info.value.problems) == 2
    assert "same shape" in str(info.value) and "not a multiple of 3" in str(info.value)


def test_layers_that_cannot_run_are_listed_with_lines_and_block_downstream():
    graph = graph_of(
        [
            {"type": "GRU", "bottom": "dense", "top": "bn", "gru_param": {"num_output": 3}},
            {"type": "FancyNorm", "bottom": "bn", "top": "fancy"},
            {"type": "InnerProduct", "bottom": "fancy", "top": "fc", "fc_param": {"num_output": 2}},
        ]
    )
    problems = [str(p) for p in graph.cannot_run]
    assert problems[0].startswith("net.json:25 layers[1] 'bn'.type: type 'GRU' is a HugeCTR")
    assert "layers[2] 'fancy'.type: unknown layer type 'FancyNorm'" in problems[1]
    assert graph.output_shape is None
    with pytest.raises(NotAvailableError, match=r"cannot run:\n.*GRU.*\n.*FancyNorm"):
        graph.require_runnable()
    with pytest.raises(NotAvailableError, match=r"layout is unknown because of: .*GRU"):
        graph.dense_layout()


def test_layout_stays_known_when_only_parameter_free_layers_cannot_run():
    graph = graph_of(
        [
            {"type": "Gather", "bottom": "dense", "top": "side", "indices": [0, 2]},
            {"type": "InnerProduct", "bottom": "dense", "top": "fc", "fc_param": {"num_output": 3}},
        ],
        dense_dim=5,
    )
    assert len(graph.cannot_run) == 1
    assert graph.dense_layout().total_floats == 5 * 3 + 3
