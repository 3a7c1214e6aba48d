"""HugeCTR's own DLRM files (its FP16 training form, see
``tests/unit/nn/test_nn_hugectr_dlrm_files.py``) served by the GPU pipeline: the network file
as HugeCTR ships it, random dense parameters and one table of dim 128 behind its 26 slots;
the scores equal the NumPy path's for one-hot and multi-hot requests, static and cached."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from network_files import HUGECTR_DLRM, network_id, requires_hugectr_dlrm  # noqa: E402

from hps_core.export import write_ranking_files  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.infer import RankingSession  # noqa: E402
from hps_core.infer.contracts import HugeCTRContract  # noqa: E402
from hps_core.nn import random_dense_params  # noqa: E402

ROWS, DIM, SLOTS = 3000, 128, 26


@requires_hugectr_dlrm
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("path", HUGECTR_DLRM, ids=network_id)
def test_hugectr_dlrm_file_on_the_gpu_equals_numpy(path: Path, cache: str, tmp_path: Path):
    rng = np.random.default_rng(71)
    table = (0.1 * rng.standard_normal((ROWS, DIM))).astype(np.float32)
    files = write_ranking_files(
        tmp_path, "dlrm", json.loads(path.read_text()),
        lambda layout: random_dense_params(layout, seed=7),
        [lambda start, stop: table[start:stop]], [ROWS],
        max_keys_per_table=2 * SLOTS, max_batch_size=64,
    )  # fmt: skip
    ps = json.loads(files.ps_json.read_text())
    ps["models"][0].update(
        {"embedding_cache_type": "static"} if cache == "static" else {"gpucacheper": 0.1}
    )
    files.ps_json.write_text(json.dumps(ps))
    try:
        gpu = RankingSession.open(files.ps_json, "dlrm", device_id=0)
        cpu = RankingSession.open(files.ps_json, "dlrm")
        contract = HugeCTRContract(gpu.layout)
        for batch, hot in ((1, 1), (64, 1), (37, 2)):
            counts = rng.integers(1 if hot == 1 else 0, hot + 1, (batch, SLOTS))
            keys = rng.integers(0, ROWS + 50, int(counts.sum()))  # some keys unknown
            rows = np.concatenate([[0], np.cumsum(counts.ravel())]).astype(np.int32)
            dense = rng.random((1, batch * 13), dtype=np.float32)
            parsed = contract.parse(dense, keys[None, :], rows[None, :])
            got = gpu.predict(parsed)
            np.testing.assert_allclose(got, cpu.predict(parsed), rtol=1e-5, atol=1e-6)
            assert got.shape == (batch, 1) and np.isfinite(got).all()
    finally:
        HPS.close_all()
