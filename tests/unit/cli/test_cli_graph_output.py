"""``hps graph``: a narrow table for wide layers, and a ps.json given by mistake named."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_testdata import ps_document, write_ps

from hps_core.cli.graph import TABLE_WIDTH, _fit_list
from hps_core.cli.main import main

TABLES = 26


def criteo_like_network(tables: int = TABLES) -> str:
    """A Data layer with ``tables`` sparse inputs, one embedding each and a Concat of them."""
    data = {
        "name": "data",
        "type": "Data",
        "label": {"top": "label", "label_dim": 1},
        "dense": {"top": "dense", "dense_dim": 13},
        "sparse": [
            {"top": f"data{t}", "slot_num": 1, "nnz_per_slot": 1} for t in range(1, tables + 1)
        ],
    }
    embeddings = [
        {
            "name": f"sparse_embedding{t}",
            "type": "DistributedSlotSparseEmbeddingHash",
            "bottom": f"data{t}",
            "top": f"sparse_embedding{t}",
            "sparse_embedding_hparam": {"embedding_vec_size": 16, "combiner": "sum"},
        }
        for t in range(1, tables + 1)
    ]
    tops = [layer["top"] for layer in embeddings]
    head = [
        {"name": "concat1", "type": "Concat", "bottom": tops, "top": "concat1"},
        {"name": "reshape1", "type": "Reshape", "bottom": "concat1", "top": "reshape1",
         "leading_dim": 16 * tables},
        {"name": "fc1", "type": "InnerProduct", "bottom": "reshape1", "top": "fc1",
         "fc_param": {"num_output": 1}},
        {"name": "sigmoid", "type": "Sigmoid", "bottom": "fc1", "top": "sigmoid"},
    ]  # fmt: skip
    doc = {"solver": {"batchsize": 16}, "layers": [data, *embeddings, *head]}
    return json.dumps(doc, indent=2)


def run_graph(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["graph", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_concat_of_26_embeddings_fits_in_the_table_width(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "net.json").write_text(criteo_like_network())
    # A relative path: the first line names the file, and pytest's tmp_path can be long.
    monkeypatch.chdir(tmp_path)
    code, out, err = run_graph(capsys, "net.json")
    assert code == 0, err
    lines = out.splitlines()
    assert TABLE_WIDTH <= 120
    too_wide = [line for line in lines if len(line) > TABLE_WIDTH]
    assert not too_wide, too_wide
    concat = next(line for line in lines if re.match(r"\s*\d+\s+concat1\s", line))
    cells = re.split(r"\s{2,}", concat.strip())
    assert cells[:3] == [cells[0], "concat1", "Concat"]
    assert re.fullmatch(
        r"sparse_embedding1(, sparse_embedding\d+)*, \.\.\. \(26 inputs\)", cells[3]
    )
    assert cells[4:] == ["(B, 26, 16)", "-"]
    # Rows that fit are printed whole.
    reshape = next(line for line in lines if re.match(r"\s*\d+\s+reshape1\s", line))
    assert re.split(r"\s{2,}", reshape.strip())[3:] == ["concat1 (B, 26, 16)", "(B, 416)", "-"]
    assert "dense parameters: 417 floats (1,668 bytes)" in lines


def test_lists_wrap_then_drop_shapes_then_abbreviate() -> None:
    items = ("relu3 (B, 128)", "sparse_embedding1 (B, 26, 128)")
    names = ("relu3", "sparse_embedding1")
    assert _fit_list(items, names, "inputs", 60) == [
        "relu3 (B, 128), sparse_embedding1 (B, 26, 128)"
    ]
    # Broken after a comma onto a second line: still every name and shape.
    assert _fit_list(items, names, "inputs", 32) == [
        "relu3 (B, 128),",
        "sparse_embedding1 (B, 26, 128)",
    ]
    three = ("fc4 (B, 1)", "reducesum1 (B, 1)", "reducesum2 (B, 1)")
    assert _fit_list(three, ("fc4", "reducesum1", "reducesum2"), "inputs", 28) == [
        "fc4, reducesum1, reducesum2"
    ]
    many = tuple(f"data{i} (sparse)" for i in range(1, 27))
    short = tuple(f"data{i}" for i in range(1, 27))
    assert _fit_list(many, short, "inputs", 30) == ["data1, data2, ... (26 inputs)"]
    assert _fit_list(many, short, "inputs", 36) == ["data1, data2, data3, ... (26 inputs)"]
    # One name longer than the column is shortened in the middle.
    long_name = ("a_very_long_layer_name (B, 1)",)
    assert _fit_list(long_name, ("a_very_long_layer_name",), "inputs", 16) == ["a_very_...(B, 1)"]


def test_a_ps_json_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ps = write_ps(
        tmp_path / "ps.json", ps_document(["wdl/0_sparse"], [16], network_file="wdl.json")
    )
    code, out, err = run_graph(capsys, str(ps))
    assert code == 2 and out == ""
    assert err == (
        f"error: {ps}: expected a HugeCTR network JSON (a 'layers' array), but this looks like "
        "a ps.json (top-level 'models', no 'layers'); it names its network files, relative to "
        "its folder: models[0].network_file = 'wdl.json'\n"
    )
    bare = write_ps(tmp_path / "bare.json", ps_document(["wdl/0_sparse"], [16]))
    code, _, err = run_graph(capsys, str(bare))
    assert code == 2
    assert err.startswith(f"error: {bare}: expected a HugeCTR network JSON")
    assert "looks like a ps.json" in err and "network_file" not in err


def test_a_network_without_layers_keeps_its_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"solver": {}, "layers": []}')
    code, _, err = run_graph(capsys, str(other))
    assert code == 2
    assert err == f"error: {other} layers: 'layers' must be a non-empty array\n"


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """``hps graph ... | head``: the pipe closes before the output is written; the command
    stops as a shell tool killed by SIGPIPE would (status 141), without a traceback."""
    network = Path(__file__).resolve().parents[2] / "data" / "networks" / "dlrm.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hps_core.cli.main", "graph", str(network)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the child has started writing
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err
