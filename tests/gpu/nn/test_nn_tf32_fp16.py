"""TF32 and FP16 on CuPy: the products really run in the mode (TF32-rounded operands in 2-D
and batched GEMMs, float16 operands with float32 accumulation), match the NumPy emulation
within the mode's error, leave full float32 behind them, and whole networks agree with NumPy.
Also per-layer profiling with CUDA events. Skipped without CuPy and a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
from network_files import NETWORKS, OWN, network_id

from hps_core.nn import (
    ComputeContext,
    DenseExecutor,
    Precision,
    build_graph,
    load_network_json,
    random_dense_params,
)

cupy = pytest.importorskip("cupy")
try:
    HAVE_DEVICE = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # no driver or no device: the CUDA runtime raises its own error types
    HAVE_DEVICE = False
if not HAVE_DEVICE:
    pytest.skip("no CUDA device", allow_module_level=True)

from cupy._core import _routines_linalg as linalg  # noqa: E402  (needs CuPy)

pytestmark = pytest.mark.gpu
HAVE_TF32 = int(cupy.cuda.Device().compute_capability) >= 80
needs_tf32 = pytest.mark.skipif(not HAVE_TF32, reason="TF32 needs compute capability 8.0+")

FIXTURES = NETWORKS  # the project's networks, and HugeCTR's where they are here
U_TF32 = U_FP16 = 2.0**-11
U_FP32 = 2.0**-24


def skip_without(precision):
    if precision is Precision.TF32 and not HAVE_TF32:
        pytest.skip("TF32 needs compute capability 8.0+")


def contexts(precision):
    return ComputeContext(np, precision), ComputeContext(cupy, precision)


def cublas_state():
    handle = cupy.cuda.device.get_cublas_handle()
    return cupy.cuda.cublas.getMathMode(handle), linalg.get_compute_type(np.float32)


def probe_operands(kind):
    """Operands whose products are 256-term sums of 1 + 2**-12 (times 1).

    1 + 2**-12 is not a TF32 number: rounded (or truncated) to TF32 it is 1, so each sum is
    exactly 256 in TF32 and 256.0625 in float32.
    """
    odd, full, ones = 1 + 2.0**-12, cupy.full, cupy.ones
    if kind == "gemm":
        return full((64, 256), odd, cupy.float32), ones((256, 64), cupy.float32)
    if kind == "strided-batched":
        return full((8, 27, 256), odd, cupy.float32), ones((8, 256, 27), cupy.float32)
    if kind == "transposed-view":  # as the Interaction's stacked @ stacked^T
        b = full((8, 27, 256), odd, cupy.float32).transpose(0, 2, 1)
        return ones((8, 27, 256), cupy.float32), b
    if kind == "3d-by-2d":  # an InnerProduct on a 3-D input
        return full((5, 4, 256), odd, cupy.float32), ones((256, 3), cupy.float32)
    assert kind == "one-element"  # CuPy's reduction path, rounded by round_to_tf32
    return full((1, 256), odd, cupy.float32), ones((256, 1), cupy.float32)


@needs_tf32
@pytest.mark.parametrize(
    "kind", ["gemm", "strided-batched", "transposed-view", "3d-by-2d", "one-element"]
)
def test_tf32_rounds_the_operands_of_every_kind_of_product(kind):
    a, b = probe_operands(kind)
    before = cublas_state()
    tf32 = ComputeContext(cupy, Precision.TF32).matmul(a, b)
    assert cublas_state() == before
    full = ComputeContext(cupy, Precision.FP32).matmul(a, b)
    assert tf32.dtype == cupy.float32 and tf32.shape == full.shape
    assert bool(cupy.all(tf32 == 256.0)), f"{kind}: TF32 not applied, got {cupy.unique(tf32)}"
    assert bool(cupy.all(full == 256.0625)), f"{kind}: float32 not restored"


@needs_tf32
def test_tf32_switches_are_restored_after_an_error():
    before = cublas_state()
    ctx = ComputeContext(cupy, Precision.TF32)
    with pytest.raises(ValueError):
        ctx.matmul(cupy.ones((4, 5), cupy.float32), cupy.ones((6, 7), cupy.float32))
    assert cublas_state() == before


def magnitude(a, b):
    return np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))


SHAPES = [
    ((7, 33), (33, 5)),
    ((256, 512), (512, 1024)),
    ((4096, 480), (480, 1024)),
    ((64, 27, 128), (64, 128, 27)),
    ((5, 4, 9), (9, 6)),
    ((1, 300), (300, 1)),
]


@needs_tf32
@pytest.mark.parametrize(("shape_a", "shape_b"), SHAPES)
def test_tf32_agrees_with_the_numpy_emulation(shape_a, shape_b):
    rng = np.random.default_rng(shape_a[-1])
    a = rng.standard_normal(shape_a).astype(np.float32)
    b = rng.standard_normal(shape_b).astype(np.float32)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    cpu_ctx, gpu_ctx = contexts(Precision.TF32)
    gpu = cupy.asnumpy(gpu_ctx.matmul(cupy.asarray(a), cupy.asarray(b)))
    cpu = cpu_ctx.matmul(a, b)
    k = shape_a[-1]
    # Hardware may truncate to TF32 instead of rounding: allow twice the rounding error.
    gpu_bound = (4 * U_TF32 + k * U_FP32) * magnitude(a, b)
    cpu_bound = (2 * U_TF32 + k * U_FP32) * magnitude(a, b)
    assert np.all(np.abs(gpu - exact) <= gpu_bound)
    assert np.all(np.abs(gpu - cpu) <= gpu_bound + cpu_bound)
    if shape_a[-2] * shape_b[-1] > 1:  # a one-element result is a float32 dot product
        fp32 = cupy.asnumpy(ComputeContext(cupy).matmul(cupy.asarray(a), cupy.asarray(b)))
        assert np.abs(gpu - exact).max() > 10 * np.abs(fp32 - exact).max()


@pytest.mark.parametrize("shape", [(2, 4096), (1, 4096), (3, 30000)])
def test_fp16_products_accumulate_in_float32(shape):
    # A float16 accumulator stops at 2048 when adding ones.
    ones = cupy.ones(shape, dtype=cupy.float16)
    product = ComputeContext(cupy, Precision.FP16).matmul(ones, ones.T)
    assert product.dtype == cupy.float16
    assert bool(cupy.all(product == np.float16(shape[1])))


@pytest.mark.parametrize(("shape_a", "shape_b"), SHAPES)
def test_fp16_agrees_with_the_numpy_emulation(shape_a, shape_b):
    rng = np.random.default_rng(shape_a[0])
    a = rng.standard_normal(shape_a).astype(np.float16)
    b = rng.standard_normal(shape_b).astype(np.float16)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    cpu_ctx, gpu_ctx = contexts(Precision.FP16)
    gpu = gpu_ctx.matmul(cupy.asarray(a), cupy.asarray(b))
    assert gpu.dtype == cupy.float16
    gpu = cupy.asnumpy(gpu).astype(np.float64)
    cpu = cpu_ctx.matmul(a, b).astype(np.float64)
    k = shape_a[-1]
    bound = k * U_FP32 * magnitude(a, b) * (1 + U_FP16) + U_FP16 * np.abs(exact) + 2.0**-25
    assert np.all(np.abs(gpu - exact) <= bound)
    assert np.all(np.abs(gpu - cpu) <= 2 * bound)


# Max abs difference of predicted probabilities, GPU against NumPy, per mode: about 3x the
# error each has against float64 on the CPU (hps_core.nn.spec.precision), doubled.
NETWORK_TOLERANCE = {Precision.TF32: 5e-4, Precision.FP16: 8e-3}


@pytest.mark.parametrize("precision", [Precision.TF32, Precision.FP16])
@pytest.mark.parametrize("path", FIXTURES, ids=network_id)
def test_networks_agree_with_numpy(path, precision):
    skip_without(precision)
    graph = build_graph(load_network_json(path))
    params = random_dense_params(graph.dense_layout(), seed=11)
    rng = np.random.default_rng(5)
    batch = 512
    dense = (0.3 * rng.standard_normal((batch, graph.spec.data.dense_dim))).astype(np.float32)
    pooled = {
        node.spec.name: (
            0.3 * rng.standard_normal((batch, node.layer.slot_num, node.layer.vec_size))
        ).astype(np.float32)
        for node in graph.embeddings
    }
    on_gpu = {name: cupy.asarray(v) for name, v in pooled.items()}
    cpu = DenseExecutor(graph, params, np, precision).forward(dense, pooled)
    gpu = DenseExecutor(graph, params, cupy, precision).forward(cupy.asarray(dense), on_gpu)
    gpu_fp32 = DenseExecutor(graph, params, cupy).forward(cupy.asarray(dense), on_gpu)
    assert gpu.dtype == cupy.float32 and gpu.shape == cpu.shape
    difference = np.abs(cupy.asnumpy(gpu) - cpu).max()
    assert difference < NETWORK_TOLERANCE[precision]
    # The GPU mode is real: it differs from the GPU's float32 result.
    assert float(cupy.abs(gpu - gpu_fp32).max()) > 1e-6


@pytest.mark.parametrize("precision", list(Precision))
def test_profile_with_cuda_events(precision):
    skip_without(precision)
    graph = build_graph(load_network_json(OWN["dlrm"]))
    executor = DenseExecutor(graph, random_dense_params(graph.dense_layout()), cupy, precision)
    rng = np.random.default_rng(0)
    batch = 8192
    dense = cupy.asarray(rng.standard_normal((batch, graph.spec.data.dense_dim)), cupy.float32)
    pooled = {
        node.spec.name: cupy.asarray(
            0.3 * rng.standard_normal((batch, node.layer.slot_num, node.layer.vec_size)),
            cupy.float32,
        )
        for node in graph.embeddings
    }
    executor.forward(dense, pooled)  # warm-up: kernels compiled, memory pooled
    profile = executor.profile(dense, pooled)
    assert [entry.step for entry in profile.layers] == [s for s, _ in executor.step_flops(batch)]
    assert all(entry.seconds >= 0 for entry in profile.layers)
    assert 0.8 * profile.total_seconds <= profile.layer_seconds <= profile.total_seconds
    assert bool(cupy.all(profile.predictions == executor.forward(dense, pooled)))
