"""Ranking models on a GPU: CuPy network and GPU caches, in-process and through tritonserver.

The demo DLRM, DCN and W&D run with ``KIND_GPU`` instances; predictions must equal the
references the CPU integration tests use (PyTorch for DLRM, float64 NumPy for DCN and W&D).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "infer"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from ranking_reference import encode_hugectr, encode_samples  # noqa: E402
from test_ranking_models import MODELS, Model, infer_hugectr, infer_samples  # noqa: E402

from hps_core.demo import DEMO_MODELS  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.infer import RankingSession  # noqa: E402
from hps_core.infer.contracts import HugeCTRContract  # noqa: E402
from hps_core.server.process import TritonServer  # noqa: E402
from hps_core.triton_repo import InstanceGroup, ServingOptions  # noqa: E402


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpu_ranking")
    options = ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_GPU"),))
    for name in MODELS:
        DEMO_MODELS[name](root, options)
    return root


@pytest.mark.parametrize("name", MODELS)
def test_gpu_session_equals_the_reference(repo: Path, name: str) -> None:
    model = Model(repo, name)
    rng = np.random.default_rng(3)
    gpu = RankingSession.open(repo / name / "ps.json", name, device_id=0)
    contract = HugeCTRContract(gpu.layout)
    for batch in (1, 64, 256):
        dense, keys = model.samples(rng, batch)
        got = gpu.predict(contract.parse(*encode_hugectr(dense, keys)))
        assert isinstance(got, np.ndarray)  # the pipeline hands scores back on the host
        model.check(got, dense, keys)
    assert gpu.lookup.uses_cache
    HPS.close_all()


def test_served_on_gpu_instances(repo: Path, tmp_path: Path) -> None:
    models = {name: Model(repo, name) for name in MODELS}
    rng = np.random.default_rng(9)
    log = tmp_path / "server.log"
    with TritonServer(repo, log_file=log, startup_timeout_s=300) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url.split("//")[-1])
        for name, model in models.items():
            for batch in (1, 33, 256):
                dense, keys = model.samples(rng, batch)
                got = infer_hugectr(grpcclient, client, name, *encode_hugectr(dense, keys))
                model.check(got, dense, keys)
            dense, keys = model.samples(rng, 16, one_hot=True)
            got = infer_samples(grpcclient, client, name, *encode_samples(dense, keys))
            model.check(got, dense, keys)
        client.close()
    assert "on GPU 0" in log.read_text()
