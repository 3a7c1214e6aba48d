"""Pairing ps.json tables with embedding layers: the rule, and every mismatch reported with the
ps.json field it is about."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from network_files import OWN
from nn_testdata import network_text
from ranking_testdata import write_ranking_files

from hps_core.config import load_ps_config
from hps_core.errors import ConfigError, NotAvailableError
from hps_core.infer import is_ranking_model, load_ranking_graph
from hps_core.nn import Combiner


def edit_model(ps_json: Path, **fields) -> Path:
    doc = json.loads(ps_json.read_text())
    doc["models"][0].update(fields)
    for key, value in fields.items():
        if value is None:
            del doc["models"][0][key]
    ps_json.write_text(json.dumps(doc))
    return ps_json


def layout_of(ps_json: Path):
    return load_ranking_graph(load_ps_config(ps_json).models[0], "models[0]")[1]


def problems_of(ps_json: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        layout_of(ps_json)
    return [str(p) for p in info.value.problems]


@pytest.fixture
def wdl(tmp_path: Path):
    return write_ranking_files(tmp_path / "wdl", OWN["wdl"], seed=1)


def test_layout_of_wide_and_deep(wdl) -> None:
    layout = layout_of(wdl.ps_json)
    assert (layout.model, layout.dense_dim, layout.label_dim) == ("rank", 13, 1)
    assert layout.max_batch_size == 64
    assert [(t.table, t.layer, t.slot_num, t.vec_size, t.combiner) for t in layout.tables] == [
        (0, "wide_embedding", 2, 1, Combiner.SUM),
        (1, "deep_embedding", 26, 16, Combiner.SUM),
    ]
    assert layout.slot_nums == (2, 26) and layout.total_slots == 28
    assert [t.max_keys_per_sample for t in layout.tables] == [6, 78]
    assert [layout.max_keys(t) for t in range(2)] == [64 * 6, 64 * 78]


def test_table_count_must_match_the_embedding_layers(wdl) -> None:
    doc = json.loads(wdl.ps_json.read_text())
    model = doc["models"][0]
    for key in (
        "sparse_files",
        "embedding_vecsize_per_table",
        "maxnum_catfeature_query_per_table_per_sample",
        "default_value_for_each_table",
    ):
        model[key] = model[key][1:]
    wdl.ps_json.write_text(json.dumps(doc))
    [problem] = problems_of(wdl.ps_json)
    assert problem.startswith("models[0].sparse_files: lists 1 table but the network")
    assert "2 embedding layers ('wide_embedding', 'deep_embedding')" in problem


def test_dims_and_slot_limits_are_checked_together(wdl) -> None:
    edit_model(
        wdl.ps_json,
        embedding_vecsize_per_table=[16, 1],
        maxnum_catfeature_query_per_table_per_sample=[1, 26],
    )
    problems = problems_of(wdl.ps_json)
    assert len(problems) == 3
    assert problems[0].startswith("models[0].embedding_vecsize_per_table[0]: is 16 but table 0")
    assert "'wide_embedding'" in problems[0] and "embedding_vec_size is 1" in problems[0]
    assert problems[1].startswith(
        "models[0].maxnum_catfeature_query_per_table_per_sample[0]: is 1 but table 0"
    )
    assert "with 2 slots" in problems[1]
    assert problems[2].startswith("models[0].embedding_vecsize_per_table[1]: is 1")


@pytest.mark.parametrize("missing", ["network_file", "dense_file"])
def test_missing_network_or_dense_file_is_named(wdl, missing: str) -> None:
    edit_model(wdl.ps_json, **{missing: None})
    model = load_ps_config(wdl.ps_json).models[0]
    assert not is_ranking_model(model)
    assert problems_of(wdl.ps_json) == [
        f"models[0].{missing}: is not set; a ranking model needs network_file and dense_file"
    ]


def test_ranking_model_needs_both_files(wdl) -> None:
    assert is_ranking_model(load_ps_config(wdl.ps_json).models[0])
    edit_model(wdl.ps_json, network_file=None, dense_file=None)
    assert not is_ranking_model(load_ps_config(wdl.ps_json).models[0])


def test_dense_file_of_the_wrong_size_is_named(wdl) -> None:
    floats = np.fromfile(wdl.dense_file, dtype="<f4")
    floats[:-3].tofile(wdl.dense_file)
    [problem] = problems_of(wdl.ps_json)
    assert problem.startswith(f"models[0].dense_file: {wdl.dense_file}: dense model file has")
    assert "the file ends inside layer" in problem


def test_label_dim_is_the_width_of_the_output(tmp_path: Path) -> None:
    layers = [
        {"name": "e", "type": "DistributedSlotSparseEmbeddingHash", "bottom": "keys",
         "top": "e", "sparse_embedding_hparam": {"embedding_vec_size": 4, "combiner": "mean"}},
        {"type": "Reshape", "bottom": "e", "top": "flat", "leading_dim": 12},
        {"type": "Concat", "bottom": ["flat", "dense"], "top": "cat"},
        {"type": "InnerProduct", "bottom": "cat", "top": "out", "fc_param": {"num_output": 3}},
    ]  # fmt: skip
    network = tmp_path / "net.json"
    network.write_text(network_text(layers, dense_dim=4, sparse=(("keys", 3, 2),)))
    files = write_ranking_files(tmp_path / "m", network, seed=2)
    layout = layout_of(files.ps_json)
    assert (layout.dense_dim, layout.label_dim, layout.slot_nums) == (4, 3, (3,))
    assert layout.tables[0].combiner is Combiner.MEAN


def test_layer_the_engine_cannot_run_is_reported(tmp_path: Path) -> None:
    layers = [
        {"name": "e", "type": "DistributedSlotSparseEmbeddingHash", "bottom": "keys",
         "top": "e", "sparse_embedding_hparam": {"embedding_vec_size": 4, "combiner": "sum"}},
        {"type": "Reshape", "bottom": "e", "top": "flat", "leading_dim": 12},
        {"type": "Gather", "bottom": "flat", "top": "out", "indices": [0]},
    ]  # fmt: skip
    network = tmp_path / "net.json"
    network.write_text(network_text(layers, dense_dim=4, sparse=(("keys", 3, 1),)))
    ps = tmp_path / "ps.json"
    ps.write_text(
        json.dumps(
            {
                "supportlonglong": True,
                "models": [
                    {
                        "model": "m",
                        "network_file": "net.json",
                        "dense_file": "dense.model",
                        "sparse_files": ["t0"],
                        "embedding_vecsize_per_table": [4],
                        "maxnum_catfeature_query_per_table_per_sample": [3],
                        "default_value_for_each_table": [0.0],
                        "deployed_device_list": [0],
                    }
                ],
            }
        )
    )
    with pytest.raises(NotAvailableError, match="Gather"):
        layout_of(ps)
