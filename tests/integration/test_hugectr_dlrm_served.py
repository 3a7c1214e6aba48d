"""HugeCTR's own DLRM network files (v24.06's five files in the FP16 training form, see
``tests/unit/nn/test_nn_hugectr_dlrm_files.py``) served as a user serves them: each file as
HugeCTR ships it, with random dense parameters and one table of dim 128 behind its 26 slots,
in a repository ``hps repo`` writes, all five in one tritonserver (CPU instances, and GPU
instances where CUDA is usable); over HTTP and gRPC, one-hot
and multi-hot requests with unknown keys score as the float64 reference does (its own reading
of the files, sharing no code with the engine). Skipped where the files are not (see
``tests/network_files.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from hps_core.export import write_ranking_files
from hps_core.nn import random_dense_params
from hps_core.triton_repo import InstanceGroup, ServingOptions, write_repository

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "infer"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from instance_kinds import INSTANCE_KINDS
from network_files import HUGECTR_DLRM, network_id, requires_hugectr_dlrm
from ranking_reference import (
    encode_hugectr,
    model_tables,
    predict_reference,
    random_keys,
)
from test_ranking_models import clients, infer_hugectr

pytestmark = [pytest.mark.integration, requires_hugectr_dlrm]

ROWS, DIM, SLOTS, MAX_HOT = 3000, 128, 26, 2


@pytest.fixture(scope="module", params=INSTANCE_KINDS)
def served(module_triton_server, tmp_path_factory: pytest.TempPathFactory, request):
    root = tmp_path_factory.mktemp("hugectr_dlrm")
    table = (0.1 * np.random.default_rng(3).standard_normal((ROWS, DIM))).astype(np.float32)
    options = ServingOptions(instances=(InstanceGroup(count=1, kind=request.param),))
    models = {}
    for seed, path in enumerate(HUGECTR_DLRM):
        name = path.stem
        files = write_ranking_files(
            root / name, name, json.loads(path.read_text()),
            lambda layout, seed=seed: random_dense_params(layout, seed=seed),
            [lambda start, stop: table[start:stop]], [ROWS],
            max_keys_per_table=MAX_HOT * SLOTS, max_batch_size=64,
        )  # fmt: skip
        write_repository(files.ps_json, root / "repo", options)
        models[name] = files.ps_json
    return module_triton_server(root / "repo", startup_timeout_s=180), models


@pytest.mark.parametrize("path", HUGECTR_DLRM, ids=network_id)
def test_hugectr_dlrm_file_served_predicts_the_reference(served, path: Path) -> None:
    server, models = served
    name = path.stem
    config, tables = model_tables(models[name], name)
    known = [np.array(sorted(t), dtype=np.int64) for t in tables]
    defaults = list(config.default_value_for_each_table)
    rng = np.random.default_rng(11)
    for module, client in clients(server):
        for batch, hot in ((1, 1), (7, MAX_HOT), (64, 1)):
            dense = rng.random((batch, 13), dtype=np.float32)
            keys = random_keys(rng, batch, [SLOTS], known, hot, unknown=0.1)
            got = infer_hugectr(module, client, name, *encode_hugectr(dense, keys))
            want = predict_reference(
                config.network_file, config.dense_file, tables, defaults, dense, keys
            )
            assert got.shape == (1, batch) and got.dtype == np.float32
            np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)
