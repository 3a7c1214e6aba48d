"""``hps graph --tensor``: the values of named tensors for given or random inputs, against
the float64 interpreter of the network file."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from network_files import OWN

from hps_core.cli.main import main
from hps_core.nn import build_graph, load_network_json, random_dense_params, write_dense_blob

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))
from nn_reference import network_forward


def printed(out: str, name: str) -> np.ndarray:
    """The values printed under ``tensor 'name' ...:`` (until the next tensor or the end)."""
    block = out.split(f"tensor '{name}'", 1)[1].split("\ntensor '", 1)[0]
    shape = tuple(int(d) for d in re.search(r"\(([\d, ]+)\)", block).group(1).split(",") if d)
    body = block.split(":", 1)[1]
    values = [float(v) for v in re.findall(r"-?\d+\.\d*(?:e[-+]?\d+)?", body)]
    return np.array(values).reshape(shape)


@pytest.fixture
def dlrm(tmp_path: Path):
    path = OWN["dlrm"]
    graph = build_graph(load_network_json(path))
    params = random_dense_params(graph.dense_layout(), seed=4)
    dense_file = tmp_path / "dense.model"
    write_dense_blob(params, dense_file)
    return path, graph, dense_file


def test_tensors_of_given_inputs_equal_the_reference(dlrm, tmp_path, capsys) -> None:
    path, graph, dense_file = dlrm
    rng = np.random.default_rng(5)
    dense = rng.standard_normal((3, 13)).astype(np.float32)
    pooled = {
        node.spec.name: (0.5 * rng.standard_normal((3, 1, node.layer.vec_size))).astype(np.float32)
        for node in graph.embeddings
    }
    np.savez(tmp_path / "in.npz", dense=dense, **pooled)
    names = ["bot_fc1", "bot_relu1", "interaction", "sigmoid"]
    argv = ["graph", str(path), "--dense", str(dense_file), "--inputs", str(tmp_path / "in.npz"),
            "--full", *(a for n in names for a in ("--tensor", n))]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    want = network_forward(path, np.fromfile(dense_file, "<f4"), dense, pooled, keep=True)
    for name in names:
        got = printed(out, name)
        np.testing.assert_allclose(got, want[name].reshape(got.shape), atol=2e-6, err_msg=name)
    # Unfused: the InnerProduct's own output, negative values included.
    assert np.any(printed(out, "bot_fc1") < 0)


def test_random_inputs_list_and_errors(dlrm, tmp_path, capsys) -> None:
    path, _, dense_file = dlrm
    assert main(["graph", str(path), "--tensor", "list"]) == 0
    assert "tensors: dense, sparse_embedding0, " in capsys.readouterr().out
    argv = ["graph", str(path), "--dense", str(dense_file), "--tensor", "interaction",
            "--random-inputs", "2", "--seed", "3"]  # fmt: skip
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "tensor 'interaction' float32 (2, " in first
    assert main(argv) == 0 and capsys.readouterr().out == first  # the seed fixes the inputs
    assert main(["graph", str(path), "--tensor", "nope", "--dense", str(dense_file),
                 "--random-inputs", "1"]) == 2  # fmt: skip
    assert "no tensor 'nope'; tensors: dense" in capsys.readouterr().err
    assert main(["graph", str(path), "--tensor", "sigmoid", "--random-inputs", "1"]) == 2
    assert "--tensor needs the dense model file" in capsys.readouterr().err
    np.savez(tmp_path / "partial.npz", dense=np.zeros((1, 13), np.float32))
    assert main(["graph", str(path), "--tensor", "sigmoid", "--dense", str(dense_file),
                 "--inputs", str(tmp_path / "partial.npz")]) == 2  # fmt: skip
    assert "missing arrays 'sparse_embedding0'" in capsys.readouterr().err
