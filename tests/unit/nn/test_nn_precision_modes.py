"""TF32 and FP16 on NumPy: TF32 rounding against a float64 reference, matrix products within
the error bound of each mode, and whole HugeCTR networks whose error shows the mode is real."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
from nn_reference import network_forward
from nn_testdata import FIXTURES, flat, graph_inputs

from hps_core.errors import NotAvailableError
from hps_core.nn import (
    ComputeContext,
    DenseExecutor,
    Precision,
    build_graph,
    load_network_json,
    random_dense_params,
    round_to_tf32,
)

FP32 = ComputeContext(np, Precision.FP32)
TF32 = ComputeContext(np, Precision.TF32)
FP16 = ComputeContext(np, Precision.FP16)
# Unit roundoff of TF32 (10 stored mantissa bits), float16 (10) and float32 (23).
U_TF32 = U_FP16 = 2.0**-11
U_FP32 = 2.0**-24


def tf32_reference(x32: np.ndarray) -> np.ndarray:
    """Round to 11 significant bits in float64 (np.rint: ties to even), on float32's grid."""
    x = x32.astype(np.float64)
    out = x.copy()
    scaled = np.isfinite(x) & (x != 0)
    _, exponent = np.frexp(x[scaled])  # x = m * 2**e with 0.5 <= |m| < 1
    # Subnormals (e < -125) keep float32's fixed grid, whose TF32 step is 2**-136.
    quantum = np.ldexp(1.0, np.maximum(exponent, -125) - 11)
    out[scaled] = np.rint(x[scaled] / quantum) * quantum
    with np.errstate(over="ignore"):
        return out.astype(np.float32)  # a value rounded up to 2**128 overflows to inf


def float32_from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def test_round_to_tf32_matches_the_float64_reference():
    rng = np.random.default_rng(0)
    n = 200_000
    # Random bit patterns cover every exponent, subnormals and the largest finite values.
    random_bits = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    # Exact ties: the 13 dropped bits are 1000000000000b, the kept bits random.
    ties = (random_bits & np.uint32(0xFFFFE000)) | np.uint32(0x1000)
    x = np.concatenate([float32_from_bits(random_bits), float32_from_bits(ties)])
    finite = x[np.isfinite(x)]
    got = round_to_tf32(np, finite)
    assert got.dtype == np.float32 and got.shape == finite.shape
    np.testing.assert_array_equal(got.view(np.uint32), tf32_reference(finite).view(np.uint32))
    assert np.all(got.view(np.uint32) & 0x1FFF == 0)


def test_round_to_tf32_special_values():
    values = np.float32([1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11), 2 - 2**-12, 0.0, -0.0])
    expected = np.float32([1.0, 1 + 2**-9, -1.0, 2.0, 0.0, -0.0])
    got = round_to_tf32(np, values)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    largest = np.float32(np.finfo(np.float32).max)
    nans = float32_from_bits([0x7FC00000, 0x7FFFFFFF, 0xFFFFFFFF])
    special = round_to_tf32(np, np.concatenate([[np.inf, -np.inf, largest, -largest], nans]))
    assert special[:4].tolist() == [np.inf, -np.inf, np.inf, -np.inf]
    assert np.all(np.isnan(special[4:]))


def magnitude(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``|a| @ |b|`` in float64: the scale of each result's rounding error."""
    return np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))


def product_bound(a: np.ndarray, b: np.ndarray, term_error: float) -> np.ndarray:
    """Elementwise bound on |computed - exact|: each term's relative error plus the float32
    accumulation's."""
    return (term_error + a.shape[-1] * U_FP32) * magnitude(a, b)


SHAPES = [
    ((7, 33), (33, 5)),
    ((64, 512), (512, 48)),
    ((3, 4096), (4096, 2)),
    ((16, 27, 128), (16, 128, 27)),  # the Interaction's batched Gram matrices
    ((5, 4, 9), (9, 6)),  # a 3-D input of an InnerProduct
    ((1, 300), (300, 1)),  # a one-element result
]


@pytest.mark.parametrize(("shape_a", "shape_b"), SHAPES)
def test_tf32_products_are_within_the_tf32_bound_and_coarser_than_fp32(shape_a, shape_b):
    rng = np.random.default_rng(len(shape_a) * 1000 + shape_a[-1])
    a = rng.standard_normal(shape_a).astype(np.float32)
    b = rng.standard_normal(shape_b).astype(np.float32)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = TF32.matmul(a, b)
    assert got.dtype == np.float32 and got.shape == exact.shape
    # Each operand is off by at most U_TF32 relative, so each term by 2 U_TF32 (+ U_TF32^2).
    bound = product_bound(a, b, 2 * U_TF32 + U_TF32**2)
    error = np.abs(got - exact)
    assert np.all(error <= bound)
    # Rounding errors mostly cancel: far below 1e-3 of the terms' magnitude in the mean.
    assert np.linalg.norm(error) <= 1e-3 * np.linalg.norm(magnitude(a, b))
    # The mode is real: its error is far above float32's on the same products.
    fp32_error = np.abs(FP32.matmul(a, b) - exact)
    assert error.max() > 10 * fp32_error.max()


@pytest.mark.parametrize(("shape_a", "shape_b"), SHAPES)
def test_tf32_equals_fp32_when_the_operands_are_tf32_numbers(shape_a, shape_b):
    rng = np.random.default_rng(shape_a[-1])
    a = tf32_reference(rng.standard_normal(shape_a).astype(np.float32))
    b = tf32_reference(rng.standard_normal(shape_b).astype(np.float32))
    np.testing.assert_array_equal(TF32.matmul(a, b), FP32.matmul(a, b))


@pytest.mark.parametrize(("shape_a", "shape_b"), SHAPES)
def test_fp16_products_round_a_float32_accumulation_once(shape_a, shape_b):
    rng = np.random.default_rng(shape_a[0])
    a = rng.standard_normal(shape_a).astype(np.float16)
    b = rng.standard_normal(shape_b).astype(np.float16)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = FP16.matmul(a, b)
    assert got.dtype == np.float16 and got.shape == exact.shape
    # float16 operands are exact; the error is the float32 sum plus one rounding to float16
    # (relative, or half the smallest subnormal step for tiny results).
    bound = product_bound(a, b, 0.0) * (1 + U_FP16) + U_FP16 * np.abs(exact) + 2.0**-25
    assert np.all(np.abs(got.astype(np.float64) - exact) <= bound)


def test_fp16_one_element_products_accumulate_in_float32():
    ones = np.ones((1, 4096), dtype=np.float16)
    product = FP16.matmul(ones, ones.T)
    assert product.dtype == np.float16 and product[0, 0] == 4096


def test_fp32_and_tf32_cast_operands_to_float32():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    for ctx in (FP32, TF32):
        assert ctx.matmul(a, a.T).dtype == np.float32


def test_tf32_is_refused_on_a_gpu_without_tf32_tensor_cores():
    old_gpu = ModuleType("cupy")  # stands in for CuPy on a compute capability 7.5 device
    old_gpu.cuda = SimpleNamespace(Device=lambda: SimpleNamespace(id=0, compute_capability="75"))
    with pytest.raises(NotAvailableError, match=r"8\.0 or newer\); GPU 0 has 7\.5"):
        ComputeContext(old_gpu, Precision.TF32)
    assert ComputeContext(old_gpu, Precision.FP16).dtype == np.float16


@pytest.fixture(scope="module")
def network_errors():
    """Max abs and relative L2 error against float64 per (network, precision), batch 64."""
    errors = {}
    for path in FIXTURES:
        graph = build_graph(load_network_json(path))
        params = random_dense_params(graph.dense_layout(), seed=11)
        dense, pooled = graph_inputs(graph, 64, np.random.default_rng(8))
        expected = network_forward(path, flat(params), dense, pooled)
        for precision in Precision:
            out = DenseExecutor(graph, params, np, precision).forward(dense, pooled)
            assert out.dtype == np.float32 and out.shape == expected.shape
            diff = out - expected
            errors[path.stem, precision] = (
                float(np.abs(diff).max()),
                float(np.linalg.norm(diff) / np.linalg.norm(expected)),
            )
    return errors


# Bounds about 3x above the largest error measured (precision.py's table): max abs, rel L2.
BOUNDS = {Precision.TF32: (2e-4, 1.5e-4), Precision.FP16: (3e-3, 1.2e-3)}


@pytest.mark.parametrize("precision", [Precision.TF32, Precision.FP16])
@pytest.mark.parametrize("name", [p.stem for p in FIXTURES])
def test_reduced_precision_networks_are_bounded_and_really_reduced(
    network_errors, name, precision, record_property
):
    max_abs, rel_l2 = network_errors[name, precision]
    fp32_max_abs, fp32_rel_l2 = network_errors[name, Precision.FP32]
    record_property(f"max_abs_error_{precision.value}", max_abs)
    record_property(f"rel_l2_error_{precision.value}", rel_l2)
    bound_abs, bound_rel = BOUNDS[precision]
    assert max_abs < bound_abs and rel_l2 < bound_rel
    assert fp32_max_abs < 2e-6 and fp32_rel_l2 < 1e-6
    assert max_abs > 10 * fp32_max_abs and rel_l2 > 10 * fp32_rel_l2


@pytest.mark.parametrize("name", [p.stem for p in FIXTURES])
def test_tf32_networks_are_closer_than_fp16(network_errors, name):
    # Same mantissa width, but FP16 also stores every activation in float16.
    assert network_errors[name, Precision.TF32][1] < network_errors[name, Precision.FP16][1]
