"""Parsing of HugeCTR network files: both forms, the Data layer, line numbers, and errors that
name the file, line and field."""

from __future__ import annotations

import json

import pytest
from network_files import OWN, hugectr, network_id, requires_hugectr
from nn_testdata import FIXTURES, network_text

from hps_core.errors import ConfigError
from hps_core.nn import NetworkForm, load_network_json, parse_network_json


@pytest.mark.parametrize("path", FIXTURES, ids=network_id)
def test_fixture_line_numbers_point_at_each_layer(path):
    spec = load_network_json(path)
    lines = path.read_text().splitlines()
    for layer in spec.layers:
        # The layer object opens on its line, and its own "type" follows within the object.
        assert lines[layer.line - 1].strip().startswith("{")
        following = "\n".join(lines[layer.line - 1 : layer.line + 12])
        assert f'"type": "{layer.type}"' in following
    assert lines[spec.data.line - 1].strip() == "{"


def test_forms_and_data_layers_of_the_own_files():
    dcn = load_network_json(OWN["dcn"])
    assert dcn.form is NetworkForm.INFERENCE
    assert dcn.inference["max_batchsize"] == 1024
    assert (dcn.data.dense_name, dcn.data.dense_dim, dcn.data.label_names) == (
        "dense",
        13,
        ("label",),
    )
    wdl = load_network_json(OWN["wdl"])
    assert wdl.form is NetworkForm.TRAINING and wdl.inference == {}
    assert [(s.name, s.slot_num, s.nnz_per_slot, s.is_fixed_length) for s in wdl.data.sparse] == [
        ("deep_data", 26, 2, False),
        ("wide_data", 2, 1, True),
    ]
    assert [layer.name for layer in wdl.layers[:3]] == [
        "wide_embedding",
        "deep_embedding",
        "reshape1",
    ]
    slice2 = load_network_json(OWN["deepfm"]).layers[5]
    assert slice2.tops == ("slice21", "slice22") and slice2.bottoms == ("dense",)


@requires_hugectr
def test_forms_and_data_layers_of_the_fixtures():
    dcn = load_network_json(hugectr("dcn_inference.json"))
    assert dcn.form is NetworkForm.INFERENCE
    assert dcn.inference["max_batchsize"] == 4096
    assert (dcn.data.dense_name, dcn.data.dense_dim, dcn.data.label_names) == (
        "dense",
        13,
        ("label",),
    )
    wdl = load_network_json(hugectr("wdl_1gpu.json"))
    assert wdl.form is NetworkForm.TRAINING and wdl.inference == {}
    assert [(s.name, s.slot_num, s.nnz_per_slot, s.is_fixed_length) for s in wdl.data.sparse] == [
        ("deep_data", 26, 2, False),
        ("wide_data", 2, 1, True),
    ]
    assert [layer.name for layer in wdl.layers[:3]] == [
        "sparse_embedding2",
        "sparse_embedding1",
        "reshape1",
    ]
    slice2 = load_network_json(hugectr("deepfm_1gpu.json")).layers[5]
    assert slice2.tops == ("slice21", "slice22") and slice2.bottoms == ("dense",)


def test_compact_and_tricky_json_keeps_line_numbers():
    doc = {
        "note": 'brackets ] } [ { and "quotes" in strings',
        "layers": [
            {"type": "Data", "dense": {"top": "dense", "dense_dim": 2}},
            {"type": "ReLU", "bottom": "dense", "top": "r", "extra": [[1], {"a": "]"}]},
        ],
        "solver": {"layers": "not these"},
    }
    text = json.dumps(doc, indent=1)
    spec = parse_network_json(text)
    assert text.splitlines()[spec.layers[0].line - 1].strip() == "{"
    one_line = parse_network_json(json.dumps(doc))
    assert one_line.layers[0].line == 1 and one_line.form is NetworkForm.TRAINING


def test_unnamed_layers_take_their_first_top():
    text = network_text([{"type": "ReLU", "bottom": "dense", "top": ["r1"]}])
    assert parse_network_json(text).layers[0].name == "r1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"layers": [', r"net.json:1:13: invalid JSON"),
        # HugeCTR's own dcn_ebc.json (v24.06) has a trailing comma after a list.
        ('{"layers": [{"top": [1,],}]}', r"net.json:1:24: invalid JSON: .* \(trailing comma"),
        ('{"layers": [// the MLP\n]}', r"invalid JSON: .* \(JSON has no comments; remove them\)"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"layers": []}', "'layers' must be a non-empty array"),
        ('{"layers": [{"type": "ReLU", "bottom": "a", "top": "b"}]}', "layers\\[0\\] must be"),
        ('{"layers": [3]}', r"net.json:1 layers\[0\]: each layer must be a JSON object"),
        (
            '{"layers": [{"type": "Data", "dense": {"top": "d", "dense_dim": 1}}, '
            '{"type": "Data"}]}',
            r"layers\[1\].type: only layers\[0\] may be the Data layer",
        ),
        (
            '{"inference": 1, "layers": [{"type": "Data", "dense": {"top": "d", "dense_dim": 1}}]}',
            "'inference' must be an object",
        ),
        ('{"layers": [{"bottom": "a"}]}', r"layers\[0\].type: 'type' must be a non-empty string"),
        ('{"layers": [{"type": "Data", "dense": {"dense_dim": 3}}]}', "'data'.dense: must be"),
        (
            '{"layers": [{"type": "Data", "dense": {"top": "d", "dense_dim": -1}}]}',
            r"'data'.dense.dense_dim: must be an integer >= 0, got -1",
        ),
    ],
)
def test_malformed_files_are_refused_with_location(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_network_json(text, source="net.json")


def test_bad_bottoms_tops_and_sparse_fields_name_the_field():
    bad_layers = [
        {"type": "ReLU", "top": "r"},
        {"type": "ReLU", "bottom": ["dense", 3], "top": "r2"},
    ]
    with pytest.raises(ConfigError) as info:
        parse_network_json(network_text(bad_layers), source="net.json")
    where = [p.where for p in info.value.problems]
    assert where == ["net.json:25 layers[1].bottom", "net.json:29 layers[2].bottom"]
    bad_sparse = network_text([], sparse=(("keys", 0, 2),))
    with pytest.raises(ConfigError, match=r"sparse\[0\].slot_num: must be an integer >= 1, got 0"):
        parse_network_json(bad_sparse)
    bad_nnz = network_text([], sparse=(("keys", 3, [1, 0, 2]),))
    with pytest.raises(ConfigError, match=r"sparse\[0\].nnz_per_slot: must be a non-empty list"):
        parse_network_json(bad_nnz)


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read network file"):
        load_network_json(tmp_path / "missing.json")
