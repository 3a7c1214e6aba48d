"""``hps graph``: the report, the dense-file check, and the exit codes."""

from __future__ import annotations

import json
import re

import pytest
from nn_testdata import FIXTURE_DIR, FIXTURES

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


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
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


def test_training_form_notes_and_loss_conversion(capsys):
    assert main(["graph", str(FIXTURE_DIR / "wdl_1gpu.json")]) == 0
    out = capsys.readouterr().out
    assert "(training form: solver and optimizer ignored)" in out
    rows = table_rows(out)
    assert rows["loss"][2] == "BinaryCrossEntropyLoss -> Sigmoid"
    assert rows["dropout1"][2] == "Dropout (identity)"
    assert "embedding table 0: 'sparse_embedding2' <- 'wide_data', vec_size 1, combiner sum" in out


def test_dense_file_check(capsys, tmp_path):
    path = FIXTURE_DIR / "dlrm_1gpu.json"
    layout = build_graph(load_network_json(path)).dense_layout()
    blob = tmp_path / "dense.model"
    write_dense_blob(random_dense_params(layout), blob)
    assert main(["graph", str(path), "--dense", str(blob)]) == 0
    assert f"{layout.total_floats:,} floats, matches" in capsys.readouterr().out
    with blob.open("r+b") as f:
        f.truncate(4 * (layout.total_floats - 100))
    assert main(["graph", str(path), "--dense", str(blob)]) == 1
    out = capsys.readouterr().out
    assert "dense file: MISMATCH" in out
    assert (
        "the file ends inside layer 'fc8'" in out and "expected 257 floats there, found 157" in out
    )


def test_layers_that_cannot_run_make_it_fail_with_their_lines(capsys, tmp_path):
    doc = json.loads((FIXTURE_DIR / "dcn_inference.json").read_text())
    doc["layers"].insert(5, {"name": "bn", "type": "GRU", "bottom": "fc1", "top": "bn"})
    doc["layers"][6]["bottom"] = "bn"
    doc["layers"].append({"name": "side", "type": "Gizmo", "bottom": "dense", "top": "g"})
    doc["layers"].append({"name": "last", "type": "ReLU", "bottom": "sigmoid", "top": "out"})
    network = tmp_path / "net.json"
    text = json.dumps(doc, indent=2)
    network.write_text(text)
    assert main(["graph", str(network), "--dense", str(tmp_path / "any.model")]) == 1
    out = capsys.readouterr().out
    lines = text.splitlines()
    bn_line = next(i for i, line in enumerate(lines, 1) if '"name": "bn"' in line) - 1
    assert f"{network}:{bn_line} layers[5] 'bn'.type: type 'GRU' is a HugeCTR layer" in out
    assert "'side'.type: unknown layer type 'Gizmo'" in out
    assert "cannot run 2 layer(s):" in out
    rows = table_rows(out)
    assert rows["relu1"][-2] == "?" and rows["side"][1] == "side *"
    assert "dense parameters: unknown" in out


def test_invalid_json_exits_2_with_position(capsys, tmp_path):
    network = tmp_path / "broken.json"
    network.write_text('{\n  "layers": [\n    {"type": "Data",}\n  ]\n}\n')
    assert main(["graph", str(network)]) == 2
    err = capsys.readouterr().err
    assert f"error: {network}:3:21: invalid JSON" in err
