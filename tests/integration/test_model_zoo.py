"""One model of each other HugeCTR sample family (``hps prepare --zoo``: DLRM with fused MLP
layers, DIN, BST, MMoE, NCF, shared bottom) served by a real tritonserver through both ranking
contracts, over HTTP and gRPC, against the float64 reference of the tests
(``ranking_reference``: written from HugeCTR's definitions, sharing no code with the engine).

DIN's Dice takes statistics over the samples of a batch, so each request here is its own
batch (requests go one at a time) and the reference sees the same samples.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from hps_core.demo import ZOO_MODELS
from hps_core.triton_repo import InstanceGroup, ServingOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "infer"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranking_reference import encode_hugectr, encode_samples, model_tables, predict_reference
from test_ranking_models import clients, infer_hugectr, infer_samples

pytestmark = pytest.mark.integration

LABELS = {"mmoe": 2, "shared_bottom": 2}  # predictions per sample; 1 for the others


class ZooModel:
    """A served zoo model, its tables and its expected predictions."""

    def __init__(self, repo: Path, name: str) -> None:
        self.name = name
        self.config, self.tables = model_tables(repo / name / "ps.json", name)
        data = json.loads(self.config.network_file.read_text())["layers"][0]
        self.slot_nums = [sparse["slot_num"] for sparse in data["sparse"]]
        # Keys per slot: a fixed-length input's nnz_per_slot (DLRM-v2's multi-hot tables).
        self.hotness = [
            sparse["nnz_per_slot"] if sparse.get("is_fixed_length") else 1
            for sparse in data["sparse"]
        ]

    def samples(self, rng: np.random.Generator, batch: int):
        """Each table's number of keys per slot (a tenth of them unknown to their table,
        repeats likely in multi-hot slots) and dense features; BST's first dense feature is
        the sequence length, 0 to 6."""
        keys = []
        for _ in range(batch):
            sample = []
            for t, (slots, hot) in enumerate(zip(self.slot_nums, self.hotness, strict=True)):
                known = list(self.tables[t])
                sample.append(
                    [
                        [int(rng.choice(known)) if rng.random() > 0.1 else -7 - s
                         for _ in range(hot)]
                        for s in range(slots)
                    ]
                )  # fmt: skip
            keys.append(sample)
        dense = rng.random((batch, 13), dtype=np.float32)
        if self.name == "bst":
            dense[:, 0] = rng.integers(0, 7, batch)
        return dense, keys

    def check(self, got: np.ndarray, dense: np.ndarray, keys) -> None:
        want = predict_reference(
            self.config.network_file, self.config.dense_file, self.tables,
            list(self.config.default_value_for_each_table), dense, keys,
        )  # fmt: skip
        assert want.shape == (len(keys), LABELS.get(self.name, 1))
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def served(module_triton_server, tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("zoo_repo")
    options = ServingOptions(instances=(InstanceGroup(count=1),))
    for write in ZOO_MODELS.values():
        write(repo, options)
    server = module_triton_server(repo, startup_timeout_s=180)
    return server, {name: ZooModel(repo, name) for name in ZOO_MODELS}


@pytest.mark.parametrize("name", list(ZOO_MODELS))
def test_zoo_model_predicts_the_reference(served, name: str) -> None:
    server, models = served
    model = models[name]
    rng = np.random.default_rng(17)
    for module, client in clients(server):
        for batch in (1, 7, 64):
            dense, keys = model.samples(rng, batch)
            got = infer_hugectr(module, client, name, *encode_hugectr(dense, keys))
            assert got.shape == (1, batch * LABELS.get(name, 1))
            model.check(got, dense, keys)
            got = infer_samples(module, client, name, *encode_samples(dense, keys))
            assert got.shape == (batch, LABELS.get(name, 1))
            model.check(got, dense, keys)


def test_zoo_models_are_written_by_hps_prepare(tmp_path: Path) -> None:
    from hps_core.cli.main import main

    assert main(["prepare", str(tmp_path), "--zoo"]) == 0
    for name in ZOO_MODELS:
        assert (tmp_path / name / "config.pbtxt").is_file()
        assert (tmp_path / f"{name}_samples" / "config.pbtxt").is_file()
