"""The GPU's fused dense kernels against float64 NumPy: ``act(x @ W + b)`` in one cuBLASLt
call (``hps_core.cuda.linear``, each of its candidate algorithms), a product of one output
column a warp per row (``dense_ops.row_dot``) and DLRM's dot interaction in one kernel
(``hps_core.cuda.dense_ops.interaction``); the one-kernel concatenations
(``dense_ops.concatenate``, ``split_last_slot``) against NumPy's, element for element; Dice's
column moments (``dense_ops.column_moments``), of a padded batch too.

Each case runs on random inputs of several sizes (odd widths, one row, strided and
transposed operands) in FP32, TF32 and FP16; the bound is the rounding of each precision
(operands rounded to TF32 or FP16, float32 accumulation over K terms, one rounding of the
result), so a wrong epilogue, a dropped bias or a misplaced triangle entry fails it.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

# tests/gpu/conftest.py marks these tests and skips them without a CUDA device.
cupy = pytest.importorskip("cupy")

from hps_core.cuda import blas, dense_ops, linear  # noqa: E402
from hps_core.nn.spec.precision import round_to_tf32  # noqa: E402

UNIT = {"fp32": 2.0**-24, "tf32": 2.0**-11, "fp16": 2.0**-11}
DTYPE = {"fp32": np.float32, "tf32": np.float32, "fp16": np.float16}


def operand(rng: np.random.Generator, shape: tuple[int, ...], precision: str) -> np.ndarray:
    return rng.standard_normal(shape).astype(DTYPE[precision])


def as_computed(x: np.ndarray, precision: str) -> np.ndarray:
    """The float64 values the interaction kernel multiplies (it rounds to TF32 to nearest)."""
    if precision == "tf32":
        return round_to_tf32(np, x).astype(np.float64)
    return x.astype(np.float64)


def assert_float32_accumulation(got, x, w, b, relu, precision) -> None:
    """``got`` is float64 ``act(x @ w + b)`` of the operands the kernel multiplies (rounded to
    TF32 to nearest in TF32) within float32 accumulation over K terms plus the rounding of the
    result to the storage dtype."""
    xs, ws = as_computed(x, precision), as_computed(w, precision)
    want, scale = xs @ ws, np.abs(xs) @ np.abs(ws)
    if b is not None:
        want, scale = want + b.astype(np.float64), scale + np.abs(b.astype(np.float64))
    if relu:
        want = np.maximum(want, 0)
    result = 2.0**-11 if precision == "fp16" else 2.0**-24
    bound = (x.shape[1] + 2) * 2.0**-24 * scale + result * np.abs(want) + 1e-30
    error = np.abs(cupy.asnumpy(got).astype(np.float64) - want)
    assert (error <= bound).all(), f"largest excess {np.max(error - bound)}"


def reference_linear(x, w, b, relu, precision):
    """float64 ``act(x @ w + b)`` and a bound on the GPU's error: each TF32 operand within
    one TF32 step (cuBLAS may truncate where round_to_tf32 rounds to nearest), float32
    accumulation over k terms, the rounding of the result to the storage dtype (in FP16
    also one of the product before the bias)."""
    xs, ws = x.astype(np.float64), w.astype(np.float64)
    y = xs @ ws
    scale = np.abs(xs) @ np.abs(ws)
    if b is not None:
        y = y + b.astype(np.float64).reshape(-1)
        scale = scale + np.abs(b.astype(np.float64)).reshape(-1)
    if relu:
        y = np.maximum(y, 0)
    k = x.shape[1]
    operands = 2 * 2.0**-10 if precision == "tf32" else 0.0
    result = 2.0**-11 if precision == "fp16" else 2.0**-24
    # FP16 kernels may round the product to half before the epilogue adds the bias.
    product = 2.0**-11 if precision == "fp16" else 0.0
    bound = (operands + product + (k + 2) * 2.0**-24) * scale + result * np.abs(y)
    return y, bound + 1e-30


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "rows,k,n",
    [(1, 13, 512), (3, 479, 1024), (1, 3456, 512), (8, 512, 3456), (64, 7, 5), (1000, 256, 1),
     (2048, 128, 33)],
)  # fmt: skip
def test_linear_equals_float64(rows, k, n, bias, relu, precision):
    rng = np.random.default_rng(rows * 7 + k + n)
    x = operand(rng, (rows, k), precision)
    w = (operand(rng, (k, n), precision) / np.sqrt(k)).astype(DTYPE[precision])
    b = operand(rng, (1, n), precision) if bias else None
    got = linear.linear(
        cupy.asarray(x), cupy.asarray(w), None if b is None else cupy.asarray(b), relu, precision
    )
    assert got.dtype == DTYPE[precision] and got.shape == (rows, n) and got.flags.c_contiguous
    want, bound = reference_linear(x, w, b, relu, precision)
    error = np.abs(cupy.asnumpy(got).astype(np.float64) - want)
    assert (error <= bound).all(), f"largest excess {np.max(error - bound)}"
    if relu:
        assert (cupy.asnumpy(got) >= 0).all()


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize("layout", ["column-slice", "row-stride", "transposed"])
def test_linear_reads_strided_and_transposed_operands(layout, precision):
    rng = np.random.default_rng(3)
    rows, k, n = 96, 40, 24
    wide = cupy.asarray(operand(rng, (rows, k + 9), precision))
    if layout == "column-slice":  # the bottom MLP reading part of a wider buffer
        x = wide[:, 3 : 3 + k]
    elif layout == "row-stride":
        x = cupy.asarray(operand(rng, (2 * rows, k), precision))[::2]
    else:
        x = cupy.asarray(operand(rng, (k, rows), precision)).T
    w = cupy.asarray(operand(rng, (k, n), precision))
    b = cupy.asarray(operand(rng, (n,), precision))
    got = cupy.asnumpy(linear.linear(x, w, b, True, precision))
    want, bound = reference_linear(
        cupy.asnumpy(x), cupy.asnumpy(w), cupy.asnumpy(b), True, precision
    )
    assert (np.abs(got.astype(np.float64) - want) <= bound).all()


def test_linear_fallback_equals_the_epilogue(monkeypatch):
    """When cuBLASLt offers no algorithm, the GEMM plus the separate bias+ReLU pass runs."""
    rng = np.random.default_rng(4)
    x, w, b = (cupy.asarray(operand(rng, s, "fp32")) for s in ((50, 30), (30, 20), (1, 20)))
    fused = linear.linear(x, w, b, True, "fp32")
    monkeypatch.setattr(linear._Handle, "plan", lambda self, key, bias_ptr: None)
    fallback = linear.linear(x, w, b, True, "fp32")
    np.testing.assert_allclose(cupy.asnumpy(fallback), cupy.asnumpy(fused), rtol=1e-5, atol=1e-6)


def test_linear_is_recorded_in_a_cuda_graph():
    """A graph of linear() replays on new input values without host work (no cuBLAS call
    during capture may allocate or synchronise)."""
    rng = np.random.default_rng(5)
    x = cupy.asarray(operand(rng, (256, 64), "tf32"))
    w = cupy.asarray(operand(rng, (64, 48), "tf32"))
    b = cupy.asarray(operand(rng, (48,), "tf32"))
    stream = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.MemoryPool()
    with stream, cupy.cuda.using_allocator(pool.malloc):
        linear.linear(x, w, b, True, "tf32")  # plan outside the capture
        stream.synchronize()
        stream.begin_capture(1)  # cudaStreamCaptureModeThreadLocal, as the pipeline
        out = linear.linear(x, w, b, True, "tf32")
        graph = stream.end_capture()
        for _ in range(2):
            x[...] = cupy.asarray(operand(rng, (256, 64), "tf32"))
            graph.launch(stream)
            stream.synchronize()
            want, bound = reference_linear(
                cupy.asnumpy(x), cupy.asnumpy(w), cupy.asnumpy(b), True, "tf32"
            )
            assert (np.abs(cupy.asnumpy(out).astype(np.float64) - want) <= bound).all()


@pytest.mark.parametrize("rows, k, n", [(1, 1024, 1024), (300, 479, 1024)])
def test_every_candidate_algorithm_equals_float64(rows, k, n):
    """A plan keeps several of cuBLASLt's candidate algorithms, times them on its first call
    and keeps the fastest: whichever is chosen, the product is within the bound."""
    rng = np.random.default_rng(rows + k)
    x = cupy.asarray(operand(rng, (rows, k), "tf32"))
    w = cupy.asarray((operand(rng, (k, n), "tf32") / np.sqrt(k)).astype(np.float32))
    b = cupy.asarray(operand(rng, (1, n), "tf32"))
    linear.linear(x, w, b, True, "tf32")
    plans = [p for key, p in linear._handle().plans.items() if key[2:5] == (n, rows, k)]
    assert plans and all(p is not None and p.tuned for p in plans)
    plan = plans[-1]
    assert 0 <= plan.chosen < len(plan.results) <= linear.CANDIDATES
    want, bound = reference_linear(cupy.asnumpy(x), cupy.asnumpy(w), cupy.asnumpy(b), True, "tf32")
    chosen = plan.chosen
    try:
        for index in range(len(plan.results)):
            plan.chosen = index
            got = cupy.asnumpy(linear.linear(x, w, b, True, "tf32")).astype(np.float64)
            assert (np.abs(got - want) <= bound).all(), f"candidate {index}"
    finally:
        plan.chosen = chosen


def test_each_stream_has_a_workspace_of_its_own_outside_every_pool():
    """A product's workspace belongs to its stream (two streams never share one) and comes from
    no memory pool: the first product of a thread, run while a bucket's pool allocated, took
    its workspace from that pool, and graphs kept writing there after the pool was dropped."""
    results = {}

    def first_products() -> None:  # a new thread: new cuBLAS and cuBLASLt handles
        pool = cupy.cuda.MemoryPool()
        streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
        x = cupy.ones((2, 512), dtype=np.float32)
        w = cupy.ones((512, 3456), dtype=np.float32)
        spaces = []
        with cupy.cuda.using_allocator(pool.malloc):
            for stream in streams + streams[:1]:
                with stream:
                    linear.linear(x, w, None, False, "tf32")
                    blas.matmul(x, w, "fp32")
                    spaces.append(blas.workspace())
                stream.synchronize()
        results["spaces"] = spaces
        results["pool_bytes"] = pool.total_bytes()

    worker = threading.Thread(target=first_products)
    worker.start()
    worker.join()
    first, second, again = results["spaces"]
    assert first != second and first == again
    assert blas.workspace() == blas.workspace()  # the default stream keeps one too
    assert results["pool_bytes"] < blas.WORKSPACE_BYTES


def test_a_first_product_inside_a_capture_says_what_to_do():
    """A stream's workspace cannot be allocated while the stream records a CUDA graph: the
    product says so, and the stream serves once it ran a product eagerly."""
    x = cupy.ones((2, 64), dtype=np.float32)
    w = cupy.ones((64, 32), dtype=np.float32)
    linear.linear(x, w, None, False, "fp32")  # plans (per thread) exist; the new stream has none
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(blas.BlasError, match="eagerly"):
                linear.linear(x, w, None, False, "fp32")
        finally:
            stream.end_capture()
        got = linear.linear(x, w, None, False, "fp32")
    stream.synchronize()
    assert (got == 64.0).all()


def test_products_on_concurrent_streams_equal_serial_ones():
    """Few-row products (cuBLASLt's split-K algorithms, which use the workspace) recorded as
    graphs on two streams and replayed at once from two threads equal the serial results."""
    rng = np.random.default_rng(9)
    w = cupy.asarray((rng.standard_normal((3456, 1024)) / 60).astype(np.float32))
    b = cupy.asarray(rng.standard_normal(1024).astype(np.float32))
    inputs = [cupy.asarray(rng.standard_normal((r, 3456)).astype(np.float32)) for r in (1, 8)]
    want = [linear.linear(x, w, b, True, "tf32") for x in inputs]
    graphs = []
    for x in inputs:
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            linear.linear(x, w, b, True, "tf32")  # plan, tune and workspace outside the capture
            stream.synchronize()
            stream.begin_capture()
            out = linear.linear(x, w, b, True, "tf32")
            graphs.append((stream, stream.end_capture(), out))
    failures = []

    def replay(index: int) -> None:
        stream, graph, out = graphs[index]
        for _ in range(200):
            out.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
            if not (out == want[index]).all():
                failures.append(index)
                return

    threads = [threading.Thread(target=replay, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_linear_rejects_mismatched_operands():
    x = cupy.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match="linear of shapes"):
        linear.linear(x, cupy.zeros((5, 2), np.float32), None, False)
    with pytest.raises(ValueError, match="bias must be"):
        linear.linear(x, cupy.zeros((3, 2), np.float32), cupy.zeros(3, np.float32), False)
    with pytest.raises(ValueError, match="fp16 linear needs"):
        linear.linear(x, cupy.zeros((3, 2), np.float32), None, False, "fp16")


@pytest.fixture
def three_tf32(monkeypatch):
    """Every FP32 linear() of the test runs as 3xTF32, whatever its size."""
    monkeypatch.setattr(linear, "THREE_TF32_MIN_MACS", 0)
    monkeypatch.setattr(linear, "THREE_TF32_MIN_FEATURES", 1)
    monkeypatch.delenv("HPS_FP32_GEMM", raising=False)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize(
    "rows,k,n", [(1, 13, 512), (3, 479, 1024), (64, 7, 5), (1000, 256, 1), (2048, 1024, 33)]
)
def test_three_tf32_is_float32_accurate(three_tf32, rows, k, n, relu):
    """Each term of a 3xTF32 product is off by at most 3 * 2^-22 of itself (the dropped lo*lo
    and the TF32 rounding of each lo), on top of SGEMM's float32 accumulation bound."""
    rng = np.random.default_rng(rows + 3 * k + n)
    x = operand(rng, (rows, k), "fp32")
    w = (operand(rng, (k, n), "fp32") / np.sqrt(k)).astype(np.float32)
    b = operand(rng, (1, n), "fp32")
    got = linear.linear(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), relu, "fp32")
    want, bound = reference_linear(x, w, b, relu, "fp32")
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64))
    bound = bound + 16 * 2.0**-24 * scale
    error = np.abs(cupy.asnumpy(got).astype(np.float64) - want)
    assert (error <= bound).all(), f"largest excess {np.max(error - bound)}"


def test_three_tf32_error_is_sgemms(three_tf32, monkeypatch):
    """On a DLRM-sized layer the 3xTF32 result is float32-class against float64 (within 8x of
    SGEMM's relative L2; 4x measured on the H200) and far closer than one TF32 product."""
    rng = np.random.default_rng(8)
    x = np.abs(operand(rng, (4096, 1024), "fp32"))  # a ReLU's output: all terms positive
    w = (operand(rng, (1024, 512), "fp32") / 32).astype(np.float32)
    b = operand(rng, (512,), "fp32")
    want, _ = reference_linear(x, w, b, False, "fp32")

    def rel_l2(precision: str) -> float:
        got = linear.linear(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), False, precision)
        return float(np.linalg.norm(cupy.asnumpy(got) - want) / np.linalg.norm(want))

    split = rel_l2("fp32")
    tf32 = rel_l2("tf32")
    monkeypatch.setenv("HPS_FP32_GEMM", "sgemm")
    assert not linear.three_tf32_pays(4096, 512, 1024)
    sgemm = rel_l2("fp32")
    assert split <= 8 * sgemm + 1e-9, (split, sgemm)
    assert split * 50 < tf32, (split, tf32)


def test_three_tf32_keeps_sgemms_infinities_and_nans(three_tf32, monkeypatch):
    """An infinite or NaN input gives what SGEMM gives (the correction products see zeros),
    and values near the float32 limit do not overflow in the split."""
    x = np.ones((4, 8), np.float32)
    x[0, 0], x[1, 3], x[2, 5] = np.inf, -np.inf, np.nan
    x[3, :] = np.float32(3.4e38)
    w = np.full((8, 6), 0.25, np.float32)
    w[:, 1] = 1.5
    w[0, 4] = 0.0  # inf * 0: NaN in both
    got = cupy.asnumpy(linear.linear(cupy.asarray(x), cupy.asarray(w), None, False, "fp32"))
    monkeypatch.setenv("HPS_FP32_GEMM", "sgemm")
    want = cupy.asnumpy(linear.linear(cupy.asarray(x), cupy.asarray(w), None, False, "fp32"))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isposinf(got), np.isposinf(want))
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)


def test_three_tf32_is_recorded_in_a_cuda_graph(three_tf32):
    rng = np.random.default_rng(9)
    x = cupy.asarray(operand(rng, (300, 479), "fp32"))
    w = cupy.asarray(operand(rng, (479, 64), "fp32"))
    b = cupy.asarray(operand(rng, (64,), "fp32"))
    stream = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.MemoryPool()
    with stream, cupy.cuda.using_allocator(pool.malloc):
        linear.linear(x, w, b, True, "fp32")  # plans and kernels outside the capture
        stream.synchronize()
        stream.begin_capture(1)
        out = linear.linear(x, w, b, True, "fp32")
        graph = stream.end_capture()
        for _ in range(2):
            x[...] = cupy.asarray(operand(rng, (300, 479), "fp32"))
            graph.launch(stream)
            stream.synchronize()
            want, bound = reference_linear(
                cupy.asnumpy(x), cupy.asnumpy(w), cupy.asnumpy(b), True, "fp32"
            )
            scale = np.abs(cupy.asnumpy(x)).astype(np.float64) @ np.abs(cupy.asnumpy(w))
            error = np.abs(cupy.asnumpy(out).astype(np.float64) - want)
            assert (error <= bound + 16 * 2.0**-24 * scale).all()


def test_three_tf32_only_for_large_products(monkeypatch):
    monkeypatch.delenv("HPS_FP32_GEMM", raising=False)
    assert linear.three_tf32_pays(65536, 1024, 1024)
    assert linear.three_tf32_pays(16384, 1024, 479)
    assert not linear.three_tf32_pays(4096, 1024, 1024)
    assert not linear.three_tf32_pays(65536, 1024, 13)  # thin: memory-bound
    assert not linear.three_tf32_pays(65536, 256, 512)
    monkeypatch.setenv("HPS_FP32_GEMM", "SGEMM")
    assert not linear.three_tf32_pays(65536, 1024, 1024)


def reference_interaction(mlp, emb, precision):
    """HugeCTR's layout: the MLP vector, the strictly lower triangle of the Gram matrix of
    [mlp, emb...] row by row, one zero (float64, from the values the GPU multiplies)."""
    vectors = np.concatenate([mlp[:, None, :], emb], axis=1)
    v = as_computed(vectors, precision)
    gram = np.einsum("rid,rjd->rij", v, v)
    scale = np.einsum("rid,rjd->rij", np.abs(v), np.abs(v))
    i, j = np.tril_indices(vectors.shape[1], k=-1)
    zeros = np.zeros((mlp.shape[0], 1))
    want = np.concatenate([mlp.astype(np.float64), gram[:, i, j], zeros], axis=1)
    dim = mlp.shape[1]
    bound = np.concatenate(
        [np.zeros_like(mlp, dtype=np.float64),
         (dim + 2) * 2.0**-24 * scale[:, i, j]
         + (2.0**-11 if precision == "fp16" else 0.0) * np.abs(gram[:, i, j]),
         zeros],
        axis=1,
    )  # fmt: skip
    return want, bound + 1e-30


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize(
    "rows,n,dim,emb_offset",
    [
        (1, 2, 1, 0), (5, 4, 7, 0), (64, 27, 16, 0), (300, 27, 128, 0), (33, 9, 64, 0),
        (7, 14, 3, 0),
        (40, 45, 32, 0),  # 78 tiles: 96 threads
        (9, 70, 8, 0),  # 171 tiles: threads take several
        (50, 27, 128, 1),  # rows not 16-byte aligned: element loads
        (20, 5, 12, 2),
    ],
)  # fmt: skip
def test_interaction_equals_float64(rows, n, dim, emb_offset, precision):
    rng = np.random.default_rng(rows + n + dim)
    dtype = DTYPE[precision]
    # The MLP output as the top MLP's input buffer holds it: rows strided, then contiguous.
    wide = operand(rng, (rows, dim + 5), precision)
    mlp = cupy.asarray(wide)[:, 2 : 2 + dim]
    values = rows * (n - 1) * dim
    flat = cupy.asarray(operand(rng, (values + emb_offset,), precision))
    emb = flat[emb_offset:].reshape(rows, n - 1, dim)
    got = dense_ops.interaction(mlp, emb, tf32=precision == "tf32")
    assert got.dtype == dtype and got.shape == (rows, dim + n * (n - 1) // 2 + 1)
    want, bound = reference_interaction(cupy.asnumpy(mlp), cupy.asnumpy(emb), precision)
    out = cupy.asnumpy(got).astype(np.float64)
    np.testing.assert_array_equal(out[:, :dim], cupy.asnumpy(mlp).astype(np.float64))
    assert (np.abs(out - want) <= bound).all(), (
        f"largest excess {np.max(np.abs(out - want) - bound)}"
    )


def test_interaction_sizes_that_do_not_fit_are_reported():
    assert dense_ops.interaction_fits(27, 128)
    assert dense_ops.interaction_fits(92, 128)  # 92 rows of 132 floats
    assert not dense_ops.interaction_fits(93, 128)  # padded to 96 rows: over 48 KiB


@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 37), (255, 80), (257, 200), (70001, 33)])
def test_column_moments_equal_float64(rows, cols):
    """Dice's column means and mean squares (two kernels) against float64 NumPy: one row,
    widths that are not multiples of 32, more rows than one range, more ranges than the
    cap; the sums are float32 over the rows, so the bound grows with the row count."""
    rng = np.random.default_rng(rows + cols)
    x = (3.0 + rng.standard_normal((rows, cols))).astype(np.float32)
    mean, square = dense_ops.column_moments(cupy.asarray(x))
    want = x.astype(np.float64)
    bound = 4 * 2.0**-24 * np.sqrt(rows) * 32
    np.testing.assert_allclose(mean.get(), want.mean(axis=0), rtol=bound, atol=0)
    np.testing.assert_allclose(square.get(), (want * want).mean(axis=0), rtol=bound, atol=0)
    again = dense_ops.column_moments(cupy.asarray(x))
    assert (again[0] == mean).all() and (again[1] == square).all()  # same order every time


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("per_sample, cols", [(1, 37), (9, 80), (300, 33)])
def test_column_moments_of_a_padded_batch_replay_for_any_count(dtype, per_sample, cols):
    """A batch padded to 16 samples (``per_sample`` rows each; 300 x 16 rows span several
    ranges): the launches recorded once in a CUDA graph and replayed with 16, 5, 1 and 0 real
    samples in the device count give each count's moments of its real rows (float64 NumPy),
    whatever the padding holds (NaN, huge values); 0 real samples give zeros."""
    rng = np.random.default_rng(per_sample + cols)
    x = (2.0 + rng.standard_normal((16 * per_sample, cols))).astype(dtype)
    x_d = cupy.asarray(x)
    count = cupy.zeros(1, dtype=cupy.int32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        dense_ops.column_moments(x_d, count, per_sample)  # compiles, outside the capture
        stream.begin_capture()
        mean, square = dense_ops.column_moments(x_d, count, per_sample)
        graph = stream.end_capture()
    for real in (16, 5, 1, 0):
        rows = real * per_sample
        poisoned = x.copy()
        poisoned[rows::2] = np.nan
        poisoned[rows + 1 :: 2] = 6e4
        x_d.set(poisoned)
        count.fill(real)
        mean.fill(np.nan)
        graph.launch(stream)
        stream.synchronize()
        if rows == 0:
            assert (mean.get() == 0).all() and (square.get() == 0).all()
            continue
        want = x[:rows].astype(np.float64)
        bound = 4 * 2.0**-24 * np.sqrt(rows) * 32
        np.testing.assert_allclose(mean.get(), want.mean(axis=0), rtol=bound, atol=0)
        np.testing.assert_allclose(square.get(), (want * want).mean(axis=0), rtol=bound, atol=0)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "rows, k, stride",
    [(1, 256, 256), (1, 7, 7), (3, 479, 480), (1000, 3456, 3456), (70001, 33, 40)],
)
def test_row_dot_equals_float64(rows, k, stride, bias, relu, precision):
    """A product with one output per row (a warp per row) against float64 NumPy of the
    operands it multiplies (rounded to TF32 to nearest in TF32): one row, widths that are
    not multiples of 4 (the scalar loop), aligned widths (four at a time), strided rows,
    more rows than the grid; the bound is float32 accumulation over K terms plus the
    rounding of the result."""
    rng = np.random.default_rng(rows + k + stride)
    storage = operand(rng, (rows, stride), precision)
    x = storage[:, :k]
    w = (operand(rng, (k, 1), precision) / np.sqrt(k)).astype(DTYPE[precision])
    b = operand(rng, (1, 1), precision) if bias else None
    x_d = cupy.asarray(storage)[:, :k]
    got = dense_ops.row_dot(
        x_d, cupy.asarray(w), None if b is None else cupy.asarray(b), relu, precision == "tf32"
    )
    assert got.dtype == DTYPE[precision] and got.shape == (rows, 1) and got.flags.c_contiguous
    assert_float32_accumulation(got, x, w, None if b is None else b.reshape(-1), relu, precision)


def test_row_dot_rejects_a_weight_of_another_width():
    x = cupy.ones((4, 8), dtype=cupy.float32)
    with pytest.raises(ValueError, match="row_dot"):
        dense_ops.row_dot(x, cupy.ones((7, 1), dtype=cupy.float32), None, False, False)


def _shapes(case: str, rows: int) -> tuple[list[tuple[int, ...]], int]:
    return {
        "2d": ([(rows, 3), (rows, 1), (rows, 16), (rows, 5)], 1),
        "3d axis 1": ([(rows, 1, 4), (rows, 2, 4), (rows, 3, 4)], 1),
        "3d axis 2": ([(rows, 3, 2), (rows, 3, 7), (rows, 3, 1)], 2),
        "19 inputs": ([(rows, 2)] * 19, 1),  # three launches of at most eight inputs
        "an empty input": ([(rows, 4), (rows, 0), (rows, 3)], 1),
    }[case]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("rows", [1, 37, 1000])
@pytest.mark.parametrize("case", ["2d", "3d axis 1", "3d axis 2", "19 inputs", "an empty input"])
def test_concatenate_equals_numpy(case, rows, dtype):
    rng = np.random.default_rng(rows)
    shapes, axis = _shapes(case, rows)
    host = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
    got = dense_ops.concatenate([cupy.asarray(h) for h in host], axis)
    assert got is not None and got.flags.c_contiguous
    np.testing.assert_array_equal(cupy.asnumpy(got), np.concatenate(host, axis=axis))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_concatenate_reads_evenly_spaced_rows_and_declines_other_layouts(dtype):
    rng = np.random.default_rng(5)
    wide = cupy.asarray(rng.standard_normal((50, 11)).astype(dtype))
    other = cupy.asarray(rng.standard_normal((50, 3)).astype(dtype))
    columns = wide[:, 2:7]  # rows 11 elements apart
    got = dense_ops.concatenate([columns, other], 1)
    want = np.concatenate([cupy.asnumpy(columns), cupy.asnumpy(other)], axis=1)
    np.testing.assert_array_equal(cupy.asnumpy(got), want)
    assert dense_ops.concatenate([wide[:, ::2], other], 1) is None  # a row not contiguous
    assert dense_ops.concatenate([wide[:, :3], other.astype(np.float64)], 1) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(
    ("rows", "slots", "widths"), [(1, 2, (8, 8)), (37, 5, (3, 5)), (300, 4, (16,))]
)
def test_split_last_slot_equals_numpy(rows, slots, widths, dtype):
    rng = np.random.default_rng(rows + slots)
    host = [rng.standard_normal((rows, slots, w)).astype(dtype) for w in widths]
    history, target = dense_ops.split_last_slot([cupy.asarray(h) for h in host])
    stacked = np.concatenate(host, axis=2)
    np.testing.assert_array_equal(cupy.asnumpy(history), stacked[:, :-1].reshape(-1, sum(widths)))
    np.testing.assert_array_equal(cupy.asnumpy(target), stacked[:, -1])


def test_concatenate_is_recorded_in_a_cuda_graph():
    """A graph of concatenate() replays on new input values (nothing during the capture
    allocates beyond the pool's cached block or copies from the host)."""
    a = cupy.arange(12, dtype=cupy.float32).reshape(4, 3)
    b = cupy.arange(8, dtype=cupy.float32).reshape(4, 2)
    stream = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.MemoryPool()
    with stream, cupy.cuda.using_allocator(pool.malloc):
        dense_ops.concatenate([a, b], 1)  # compiles the kernel outside the capture
        stream.synchronize()
        stream.begin_capture(1)  # cudaStreamCaptureModeThreadLocal, as the pipeline
        out = dense_ops.concatenate([a, b], 1)
        graph = stream.end_capture()
        a += 100
        graph.launch(stream)
        stream.synchronize()
    want = np.concatenate([cupy.asnumpy(a), cupy.asnumpy(b)], axis=1)
    np.testing.assert_array_equal(cupy.asnumpy(out), want)
