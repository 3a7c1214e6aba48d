"""The offline API on a GPU: a Parquet dataset scored through the GPU pipeline equals the CPU
scores, and check_out_tensor answers from the GPU's executor."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "infer"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from ranking_reference import encode_hugectr  # noqa: E402
from test_offline_model import write_dataset  # noqa: E402
from test_ranking_models import Model  # noqa: E402

from hps_core.demo import DEMO_MODELS  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.offline import InferenceModel  # noqa: E402
from hps_core.triton_repo import InstanceGroup, ServingOptions  # noqa: E402


@pytest.mark.parametrize("name", ["dlrm", "wdl"])
def test_gpu_dataset_scores_equal_the_cpus(tmp_path: Path, name: str) -> None:
    options = ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_GPU"),))
    DEMO_MODELS[name](tmp_path, options)
    ps_json = tmp_path / name / "ps.json"
    cpu = InferenceModel.from_ps_json(ps_json, device_id=None)
    gpu = InferenceModel.from_ps_json(ps_json, device_id=0)
    model = Model(tmp_path, name)
    rng = np.random.default_rng(5)
    n = 3 * cpu.layout.max_batch_size + 17
    dense, keys = model.samples(rng, n)
    labels = (rng.random(n) < 0.5).astype(np.float32)
    files = SimpleNamespace(slot_nums=list(cpu.layout.slot_nums))  # what write_dataset reads
    write_dataset(tmp_path / "d.parquet", files, dense, keys, labels)
    want = cpu.predict_dataset(tmp_path / "d.parquet")
    got = gpu.predict_dataset(tmp_path / "d.parquet")
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-6)
    assert got.auc() == pytest.approx(want.auc(), abs=1e-4)
    model.check(got.scores, dense, keys)
    # The same last batch on both: every tensor agrees.
    batch = encode_hugectr(dense[:9], keys[:9])
    cpu.predict(*batch)
    gpu.predict(*batch)
    for tensor in cpu.tensor_names:
        np.testing.assert_allclose(
            gpu.check_out_tensor(tensor), cpu.check_out_tensor(tensor), rtol=1e-4, atol=1e-5,
            err_msg=tensor,
        )  # fmt: skip
    HPS.close_all()
