"""The zoo models (``hps prepare --zoo``: one per family of HugeCTR's samples) on the GPU
pipeline: scores equal the NumPy path and the float64 reference of the tests, in FP32, and the
NumPy path's TF32 / FP16 emulation within those precisions' rounding.

DIN's Dice takes statistics over the samples of a batch: its dense step replays a CUDA graph
per bucket as the others' do, reading the batch's count of real samples on the device and
leaving the bucket's padding out of the statistics.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "infer"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))
from ranking_reference import encode_hugectr, encode_samples  # noqa: E402
from test_model_zoo import LABELS, ZooModel  # noqa: E402

from hps_core.demo import ZOO_MODELS  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.infer import RankingSession  # noqa: E402
from hps_core.infer.contracts import HugeCTRContract, SamplesContract  # noqa: E402
from hps_core.triton_repo import InstanceGroup, ServingOptions  # noqa: E402


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gpu_zoo")
    options = ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_GPU"),))
    for write in ZOO_MODELS.values():
        write(root, options)
    yield root
    HPS.close_all()


@pytest.mark.parametrize("name", list(ZOO_MODELS))
def test_zoo_model_on_the_gpu_equals_numpy_and_the_reference(repo: Path, name: str) -> None:
    model = ZooModel(repo, name)
    ps = repo / name / "ps.json"
    gpu = RankingSession.open(ps, name, device_id=0)
    cpu = RankingSession.open(ps, name)
    assert gpu.pipeline is not None
    rng = np.random.default_rng(41)
    for batch, contract in ((1, HugeCTRContract), (64, SamplesContract), (200, HugeCTRContract)):
        dense, keys = model.samples(rng, batch)
        encode = encode_hugectr if contract is HugeCTRContract else encode_samples
        parsed = contract(gpu.layout).parse(*encode(dense, keys))
        got = gpu.predict(parsed)
        assert got.shape == (batch, LABELS.get(name, 1))
        np.testing.assert_allclose(got, cpu.predict(parsed), rtol=1e-5, atol=1e-6)
        model.check(got, dense, keys)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_din_scores_each_batch_of_a_bucket_over_its_real_samples(
    repo: Path, precision: str
) -> None:
    """DIN's buckets record the dense step as a graph too; batches of 256, 200 and 129 samples
    one after the other in the bucket of 256 (whose padding then holds the earlier batches'
    rows) score as the NumPy path scores each batch alone: Dice's statistics leave the padding
    out."""
    model = ZooModel(repo, "din")
    ps = repo / "din" / "ps.json"
    gpu = RankingSession.open(ps, "din", device_id=0, precision=precision)
    cpu = RankingSession.open(ps, "din", precision=precision)
    rng = np.random.default_rng(47)
    for batch in (256, 200, 129):
        dense, keys = model.samples(rng, batch)
        parsed = HugeCTRContract(gpu.layout).parse(*encode_hugectr(dense, keys))
        got = gpu.predict(parsed)
        if precision == "fp32":
            np.testing.assert_allclose(got, cpu.predict(parsed), rtol=1e-5, atol=1e-6)
            model.check(got, dense, keys)
        else:  # as test_zoo_model_in_reduced_precision_agrees_with_numpy
            np.testing.assert_allclose(got, cpu.predict(parsed), atol=5e-3)
    bucket = gpu.pipeline._lanes[0][256]
    assert bucket.graphs is not None and bucket.graphs.dense is not None and bucket.batches == 3


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
@pytest.mark.parametrize("name", list(ZOO_MODELS))
def test_zoo_model_in_reduced_precision_agrees_with_numpy(
    repo: Path, name: str, precision: str
) -> None:
    model = ZooModel(repo, name)
    ps = repo / name / "ps.json"
    gpu = RankingSession.open(ps, name, device_id=0, precision=precision)
    cpu = RankingSession.open(ps, name, precision=precision)
    rng = np.random.default_rng(43)
    dense, keys = model.samples(rng, 64)
    parsed = HugeCTRContract(gpu.layout).parse(*encode_hugectr(dense, keys))
    got, emulated = gpu.predict(parsed), cpu.predict(parsed)
    if precision == "tf32":
        # TF32 rounds each operand to 10 mantissa bits: through DLRM-v2's 3,456-wide cross
        # layers both the GPU and the NumPy emulation move 64 samples' probabilities by
        # 1.2-1.5e-3 from FP32 (H200), in different directions (cuBLASLt's kernels may
        # truncate where the emulation rounds to nearest). So each is held to FP32: the GPU's
        # error at most twice the emulation's, plus 1e-4.
        exact = RankingSession.open(ps, name, precision="fp32").predict(parsed)
        emulation_error = np.abs(emulated - exact).max()
        assert np.abs(got - exact).max() <= 2 * emulation_error + 1e-4
    else:
        # On probabilities: each side within ~1e-3 of float64; cuBLAS and the NumPy emulation
        # round in different places (as tests/gpu/pipeline's other models).
        np.testing.assert_allclose(got, emulated, atol=5e-3)
