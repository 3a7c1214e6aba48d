"""Serving a user's PyTorch module (hps_core.torch_serving, hps repo-torch) without a server:
the folder hps repo-torch writes, the module built from it answering as the module itself,
requests batched and split, and every bad input, file or module named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lookup_testdata import write_models  # noqa: E402

from hps_core.cli.main import main  # noqa: E402
from hps_core.errors import ConfigError, ModelFileError, RequestError  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.torch_repo import is_table_weight  # noqa: E402
from hps_core.torch_serving import TorchBatcher, load_module, torch_io  # noqa: E402
from hps_core.triton_repo import read_config  # noqa: E402

MODULE = '''
import torch
from hps_core import hps_torch


class Scorer(torch.nn.Module):
    """Pooled rows of table 0 and 1 of model wdl, a linear layer, and the rows themselves."""

    def __init__(self, ps, model):
        super().__init__()
        self.rows = torch.nn.ModuleList(
            [hps_torch.LookupLayer(ps, model, 0, DIM0), hps_torch.LookupLayer(ps, model, 1, DIM1)])
        self.linear = torch.nn.Linear(DIM0 + DIM1 + 2, 1)
        self.sparse_arch = torch.nn.Module()  # where a TorchRec model keeps its tables

    def forward(self, dense, ids):
        pooled = [layer(ids[:, t]).sum(dim=1) for t, layer in enumerate(self.rows)]
        return {"score": self.linear(torch.cat([dense, *pooled], dim=1)), "first": pooled[0]}


def build(ps_config_file, model_name):
    return Scorer(ps_config_file, model_name)
'''


@pytest.fixture
def made(tmp_path: Path):
    """A ps.json of two tables, the module file and its weights (with a TorchRec table
    weight that hps repo-torch leaves out), and the folder it writes."""
    ps, data = write_models(tmp_path)
    dims = [t.vectors.shape[1] for t in data["wdl"]]
    source = tmp_path / "scorer.py"
    source.write_text(MODULE.replace("DIM0", str(dims[0])).replace("DIM1", str(dims[1])))
    torch.manual_seed(0)
    linear = torch.nn.Linear(dims[0] + dims[1] + 2, 1)
    state = {f"linear.{k}": v for k, v in linear.state_dict().items()}
    state["sparse_arch.embedding_bag_collection.embedding_bags.t0.weight"] = torch.ones(3, 2)
    torch.save(state, tmp_path / "model.pt")
    assert main(["repo-torch", str(ps), str(tmp_path / "repo"), "--model", "wdl",
                 "--module", f"{source}:build", "--state-dict", str(tmp_path / "model.pt"),
                 "--input", "dense:fp32:2", "--input", "ids:int64:2x3",
                 "--output", "score:fp32:1", "--output", f"first:fp32:{dims[0]}",
                 "--max-batch-size", "8"]) == 0  # fmt: skip
    yield tmp_path / "repo" / "wdl", data["wdl"], linear
    HPS.close_all()


def _config(folder: Path) -> dict:
    """config.pbtxt as Triton hands it to initialize (JSON)."""
    from google.protobuf import json_format

    text = json_format.MessageToJson(
        read_config(folder / "config.pbtxt"), preserving_proto_field_name=True
    )
    config = json.loads(text)
    for section in ("input", "output"):
        for item in config.get(section, []):
            item["dims"] = [int(d) for d in item["dims"]]
    return config | {"max_batch_size": int(config["max_batch_size"])}


def test_the_folder_serves_the_module_with_the_files_rows(made) -> None:
    folder, tables, linear = made
    assert (folder / "1" / "model.py").read_text().count("TorchModel as TritonPythonModel") == 1
    dense = torch.load(folder / "1" / "dense.pt", weights_only=True)
    assert sorted(dense) == ["linear.bias", "linear.weight"]  # the table's weight left out
    assert (folder / "warmup" / "ids").stat().st_size == 6 * 8
    config = _config(folder)
    io = torch_io(config)
    assert [(s.name, s.dims) for s in io.inputs] == [("dense", (2,)), ("ids", (2, 3))]
    params = {k: v["string_value"] for k, v in config["parameters"].items()}
    module = load_module(folder / "1", params["torch_module"], folder / "ps.json", "wdl",
                         params["torch_state_dict"], torch.device("cpu"))  # fmt: skip
    batcher = TorchBatcher(module, io, torch.device("cpu"), 8)
    rng = np.random.default_rng(1)
    requests = []
    for n in (3, 1, 4):
        ids = np.stack([t.queries(rng, n * 3)[: n * 3].reshape(n, 3) for t in tables], axis=1)
        requests.append({"dense": rng.standard_normal((n, 2), dtype=np.float32), "ids": ids})
    answers = batcher([batcher.checked(r) for r in requests])
    weight = linear.weight.detach().numpy().astype(np.float64)
    bias = linear.bias.detach().numpy().astype(np.float64)
    for request, (score, first) in zip(requests, answers, strict=True):
        pooled = [t.expected(request["ids"][:, i].reshape(-1)).reshape(len(score), 3, -1)
                  .astype(np.float64).sum(axis=1) for i, t in enumerate(tables)]  # fmt: skip
        want = np.concatenate([request["dense"], *pooled], axis=1) @ weight.T + bias
        np.testing.assert_allclose(score, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(first, pooled[0], rtol=1e-5, atol=1e-5)
        assert score.flags.owndata  # the stub owns what it is handed


def test_bad_requests_and_modules_are_named(made, tmp_path: Path) -> None:
    folder, _, _ = made
    config = _config(folder)
    io = torch_io(config)
    module = load_module(folder / "1", "scorer.py:build", folder / "ps.json", "wdl", "dense.pt",
                         torch.device("cpu"))  # fmt: skip
    batcher = TorchBatcher(module, io, torch.device("cpu"), 8)
    ids = np.zeros((2, 2, 3), np.int64)
    dense = np.zeros((2, 2), np.float32)
    for bad, message in [
        ({"dense": dense}, "input 'ids' is missing"),
        ({"dense": dense, "ids": ids.astype(np.int32)}, "input 'ids' must be int64, got int32"),
        ({"dense": dense, "ids": ids[:, :, :2]}, r"input 'ids' must be \[batch, 2, 3\]"),
        ({"dense": dense[:1], "ids": ids}, "input 'ids' has 2 samples, the others 1"),
        ({"dense": np.zeros((9, 2), np.float32), "ids": np.zeros((9, 2, 3), np.int64)},
         "9 samples exceed max_batch_size 8"),
    ]:  # fmt: skip
        with pytest.raises(RequestError, match=message):
            batcher.checked(bad)
    # Outputs that do not match config.pbtxt, and one that overflows.
    narrow = TorchBatcher(lambda **kw: torch.zeros(2, 3), io, torch.device("cpu"), 8)
    with pytest.raises(RequestError, match=r"answered Tensor; config\.pbtxt declares 2 output"):
        narrow([{"dense": dense, "ids": ids}])
    width = io.outputs[1].dims[0]
    both = {"score": torch.tensor([[1.0], [np.inf]]), "first": torch.zeros(2, width)}
    overflow = TorchBatcher(lambda **kw: both, io, torch.device("cpu"), 8)
    one = {"dense": dense[:1], "ids": ids[:1]}
    fine, refused = overflow([one, one])
    assert isinstance(refused, RequestError) and not isinstance(fine, RequestError)
    assert "output 'score' of sample 0 is not finite" in str(refused)
    # Files and factories.
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match=r"must be FILE\.py:FACTORY"):
        load_module(folder / "1", "scorer:build", folder / "ps.json", "wdl", None, cpu)
    with pytest.raises(ConfigError, match="has no function 'make'"):
        load_module(folder / "1", "scorer.py:make", folder / "ps.json", "wdl", None, cpu)
    (tmp_path / "bad.pt").write_bytes(b"not a state dict")
    with pytest.raises(ModelFileError, match="cannot read as a PyTorch state dict"):
        load_module(folder / "1", "scorer.py:build", folder / "ps.json", "wdl",
                    str(tmp_path / "bad.pt"), torch.device("cpu"))  # fmt: skip
    width = module.linear.weight.shape[1]
    torch.save({"linear.weight": torch.zeros(1, width), "other": torch.zeros(1)}, tmp_path / "w.pt")
    with pytest.raises(ConfigError, match=r"1 weights of the module are not in it \(linear\.bias\)"
                       r"; 1 of its weights are not the module's \(other\)"):  # fmt: skip
        load_module(folder / "1", "scorer.py:build", folder / "ps.json", "wdl",
                    str(tmp_path / "w.pt"), torch.device("cpu"))  # fmt: skip
    narrow_weights = {"linear.weight": torch.zeros(1, 3), "linear.bias": torch.zeros(1)}
    torch.save(narrow_weights, tmp_path / "w.pt")
    with pytest.raises(ConfigError, match=r"size mismatch for linear\.weight"):
        load_module(folder / "1", "scorer.py:build", folder / "ps.json", "wdl",
                    str(tmp_path / "w.pt"), torch.device("cpu"))  # fmt: skip


def test_config_and_command_line_refusals(made, tmp_path: Path, capsys) -> None:
    folder, _, _ = made
    config = _config(folder)
    bad = config | {"max_batch_size": 0}
    bad["input"] = [dict(config["input"][0], dims=[-1])]
    with pytest.raises(ConfigError) as caught:
        torch_io(bad)
    text = str(caught.value)
    assert "max_batch_size" in text and "dims must be fixed, got [-1]" in text
    with pytest.raises(SystemExit):
        main(["repo-torch", str(folder / "ps.json"), str(tmp_path / "r2"), "--model", "wdl",
              "--module", f"{tmp_path}/missing.py:build", "--input", "x:fp32:0"])  # fmt: skip
    assert "DIMS are positive integers" in capsys.readouterr().err
    missing = f"{tmp_path}/missing.py:build"
    assert main(["repo-torch", str(folder / "ps.json"), str(tmp_path / "r2"), "--model", "wdl",
                 "--module", missing, "--input", "x:fp32:4"]) == 1  # fmt: skip
    assert "missing.py is not there" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()


def test_table_weights_are_told_from_dense_ones() -> None:
    assert is_table_weight("sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0.weight")
    assert is_table_weight("embeddings.item.weight")
    assert not is_table_weight("dense_arch.model._mlp.0._linear.weight")
    assert not is_table_weight("embedding_bags.t0.bias")
