"""``hps graph``: the report, the dense-file check, and the exit codes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from network_files import OWN, hugectr, network_id, requires_hugectr
from nn_testdata import FIXTURES

from hps_core.cli.main import main
from hps_core.nn import build_graph, load_network_json, random_dense_params, write_dense_blob


def table_rows(stdout: str) -> dict[str, list[str]]:
    """Layer name -> the cells of its row (split on runs of 2+ spaces)."""
    rows = {}
    for line in stdout.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0].isdigit() and len(cells) >= 5:
            rows[cells[1].rstrip(" *")] = cells
    return rows


@pytest.mark.parametrize("path", FIXTURES, ids=network_id)
def test_report_lists_every_layer_with_line_shapes_and_params(capsys, path):
    assert main(["graph", str(path)]) == 0
    out = capsys.readouterr().out
    graph = build_graph(load_network_json(path))
    rows = table_rows(out)
    assert list(rows) == [node.spec.name for node in graph.nodes]
    for node in graph.nodes:
        cells = rows[node.spec.name]
        assert cells[0] == str(node.spec.line)
        assert cells[-2] == ", ".join(map(str, node.output_shapes))
        assert cells[-1] == (f"{node.param_count:,}" if node.param_count else "-")
    total = graph.dense_layout().total_floats
    assert f"dense parameters: {total:,} floats ({4 * total:,} bytes)" in out
    assert f"prediction '{graph.output}' (B, 1)" in out


@pytest.mark.parametrize(
    ("path", "dropout", "table0"),
    [
        (OWN["deepfm"], "dropout1", "'embedding1' <- 'data1', vec_size 9"),
        pytest.param(
            hugectr("wdl_1gpu.json"), "dropout1", "'sparse_embedding2' <- 'wide_data', vec_size 1",
            marks=requires_hugectr, id="hugectr/wdl",
        ),
    ],
    ids=["own/deepfm", "hugectr/wdl"],
)  # fmt: skip
def test_training_form_notes_and_loss_conversion(capsys, path, dropout, table0):
    assert main(["graph", str(path)]) == 0
    out = capsys.readouterr().out
    assert "(training form: solver and optimizer ignored)" in out
    rows = table_rows(out)
    assert rows["loss"][2] == "BinaryCrossEntropyLoss -> Sigmoid"
    assert rows[dropout][2] == "Dropout (identity)"
    assert f"embedding table 0: {table0}, combiner sum" in out


@pytest.mark.parametrize(
    "path",
    [OWN["dlrm"], pytest.param(hugectr("dlrm_1gpu.json"), marks=requires_hugectr)],
    ids=network_id,
)
def test_dense_file_check(capsys, tmp_path, path):
    layout = build_graph(load_network_json(path)).dense_layout()
    blob = tmp_path / "dense.model"
    write_dense_blob(random_dense_params(layout), blob)
    assert main(["graph", str(path), "--dense", str(blob)]) == 0
    assert f"{layout.total_floats:,} floats, matches" in capsys.readouterr().out
    last = layout.layers[-1]
    floats = sum(int(np.prod(t.shape)) for t in (*last.params, *last.state))
    cut = (floats + 1) // 2  # the file ends inside the last layer
    with blob.open("r+b") as f:
        f.truncate(4 * (layout.total_floats - cut))
    assert main(["graph", str(path), "--dense", str(blob)]) == 1
    out = capsys.readouterr().out
    assert "dense file: MISMATCH" in out
    assert f"the file ends inside layer '{last.layer}'" in out
    assert f"expected {floats} floats there, found {floats - cut}" in out


@pytest.mark.parametrize(
    "path",
    [OWN["dcn"], pytest.param(hugectr("dcn_inference.json"), marks=requires_hugectr)],
    ids=network_id,
)
def test_layers_that_cannot_run_make_it_fail_with_their_lines(capsys, tmp_path, path):
    doc = json.loads(path.read_text())
    # A GRU (a HugeCTR layer not served here) before the first fully connected layer.
    at = next(i for i, layer in enumerate(doc["layers"]) if layer["type"] == "InnerProduct")
    fc = doc["layers"][at]
    doc["layers"].insert(at, {"name": "bn", "type": "GRU", "bottom": fc["bottom"], "top": "bn"})
    fc["bottom"] = "bn"
    output = doc["layers"][-1]["top"]
    doc["layers"].append({"name": "side", "type": "Gizmo", "bottom": "dense", "top": "g"})
    # The last layer is the prediction: one on the main path keeps 'side' off it.
    doc["layers"].append({"name": "last", "type": "ReLU", "bottom": output, "top": "out"})
    network = tmp_path / "net.json"
    text = json.dumps(doc, indent=2)
    network.write_text(text)
    assert main(["graph", str(network), "--dense", str(tmp_path / "any.model")]) == 1
    out = capsys.readouterr().out
    lines = text.splitlines()
    bn_line = next(i for i, line in enumerate(lines, 1) if '"name": "bn"' in line) - 1
    assert f"{network}:{bn_line} layers[{at}] 'bn'.type: type 'GRU' is a HugeCTR layer" in out
    assert "'side'.type: unknown layer type 'Gizmo'" in out
    assert "cannot run 2 layer(s):" in out
    rows = table_rows(out)
    assert rows[fc["name"]][-2] == "?" and rows["side"][1] == "side *"
    assert "dense parameters: unknown" in out


def test_invalid_json_exits_2_with_position(capsys, tmp_path):
    network = tmp_path / "broken.json"
    network.write_text('{\n  "layers": [\n    {"type": "Data",}\n  ]\n}\n')
    assert main(["graph", str(network)]) == 2
    err = capsys.readouterr().err
    assert f"error: {network}:3:21: invalid JSON" in err
