"""hps convert torchrec: a TorchRec-shaped model's tables (state dict or
torch.distributed.checkpoint folder) -> sparse folders + ps.json that HPS.lookup answers from,
row for row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hps_core import HPS  # noqa: E402
from hps_core.cli.main import main  # noqa: E402


class SparseArch(torch.nn.Module):
    """TorchRec's naming without TorchRec: DLRM's sparse_arch.embedding_bag_collection
    .embedding_bags.<table> and an EmbeddingCollection's embeddings.<table>."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        bags = torch.nn.Module()
        bags.embedding_bags = torch.nn.ModuleDict(
            {"t_cat_0": torch.nn.EmbeddingBag(50, 8), "t_cat_1": torch.nn.EmbeddingBag(7, 8)}
        )
        self.sparse_arch = torch.nn.Module()
        self.sparse_arch.embedding_bag_collection = bags
        items = torch.nn.Module()
        items.embeddings = torch.nn.ModuleDict({"item": torch.nn.Embedding(30, 16)})
        self.item_collection = items
        self.dense = torch.nn.Linear(4, 2)  # not a table


def _weights(model: SparseArch) -> dict[str, np.ndarray]:
    bags = model.sparse_arch.embedding_bag_collection.embedding_bags
    return {
        "t_cat_0": bags["t_cat_0"].weight.detach().numpy(),
        "t_cat_1": bags["t_cat_1"].weight.detach().numpy(),
        "item": model.item_collection.embeddings["item"].weight.detach().numpy(),
    }


@pytest.mark.parametrize("source", ["torch.save", "dcp"])
def test_every_table_is_served_row_for_row(tmp_path: Path, source: str, capsys) -> None:
    model = SparseArch()
    if source == "dcp":
        import torch.distributed.checkpoint as dcp

        given = tmp_path / "ckpt"
        dcp.save(model.state_dict(), checkpoint_id=given)
    else:
        given = tmp_path / "model.pt"
        torch.save(model.state_dict(), given)
    out = tmp_path / "out"
    args = ["convert", "torchrec", "--state-dict", str(given), "--model-name", "rec",
            "--out", str(out), "--max-keys-per-table", "3-1-20"]  # fmt: skip
    assert main(args) == 0
    assert "serve it with: hps repo" in capsys.readouterr().out
    doc = json.loads((out / "ps.json").read_text())["models"][0]
    assert doc["embedding_table_names"] == ["t_cat_0", "t_cat_1", "item"]
    assert doc["embedding_vecsize_per_table"] == [8, 8, 16]
    assert doc["maxnum_catfeature_query_per_table_per_sample"] == [3, 1, 20]
    hps = HPS(out / "ps.json")
    for t, weight in enumerate(_weights(model).values()):
        rows = np.arange(len(weight) + 2, dtype=np.int64)  # every row, then two unknown ids
        got = hps.lookup(rows, "rec", t)
        np.testing.assert_array_equal(got[: len(weight)], weight)
        assert not got[len(weight) :].any()  # default 0.0
    hps.close()


def test_what_cannot_be_converted_is_named(tmp_path: Path, capsys) -> None:
    plain = tmp_path / "plain.pt"
    torch.save({"dense.weight": torch.zeros(2, 4)}, plain)
    out = str(tmp_path / "out")
    assert main(["convert", "torchrec", "--state-dict", str(plain), "--model-name", "m",
                 "--out", out]) != 0  # fmt: skip
    assert "holds no TorchRec table" in capsys.readouterr().err
    good = tmp_path / "good.pt"
    torch.save(SparseArch().state_dict(), good)
    assert main(["convert", "torchrec", "--state-dict", str(good), "--model-name", "m",
                 "--out", out, "--max-keys-per-table", "1-2"]) != 0  # fmt: skip
    assert "one value or one per table (3), got 2" in capsys.readouterr().err
    assert not (tmp_path / "out" / "ps.json").exists()
