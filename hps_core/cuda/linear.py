"""Fully connected layers, ``act(x @ W + b)``, each in one cuBLASLt call.

In the column-major view :mod:`~hps_core.cuda.blas` uses, the output of ``x [rows, in] @
W [in, out]`` is ``D [out, rows]``, so the bias runs along D's rows: exactly what cuBLASLt's
``BIAS`` and ``RELU_BIAS`` epilogues add, inside the GEMM kernel, where
:func:`hps_core.cuda.dense_ops.bias_activation` did it in a separate pass that read and wrote
every activation once more: 1.2 ms of a 12 ms batch of 65,536 samples of the MLPerf DLRM on
the H200 (CUPTI kernel times, commit 4d347bb). In FP32 and TF32 the bias is added to the
float32 accumulator; FP16 kernels may round the product to half first, as that pass did.
Split-K partial sums stay in float32 (the preference's reduction-scheme mask).

**FP32 on tensor cores ("3xTF32").** A float32 product on CUDA cores (SGEMM) runs at about 70% of
the H200's 67 TFLOP/s and was over half of a 65,536-sample MLPerf DLRM batch. On GPUs with TF32
tensor cores (compute capability 8.0 and newer) a large FP32 product instead splits both
operands into TF32 parts, ``x = hi + lo`` with ``hi`` TF32-rounded and ``lo`` the TF32-rounded
rest (``kernels/dense.cu``: ``split_tf32``), and sums three TF32 products in float32:
``lo(x) hi(W) + hi(x) lo(W)`` (one call, the two stacked along the inner dimension), then
``hi(x) hi(W)`` with the epilogue. Only ``lo(x) lo(W)`` (about 2^-22 of each term) is dropped,
so each term is within 3 * 2^-22 of itself; against a float64 product the result's relative
L2 error measured 0.8e-6 (K = 479) to 1.7e-6 (K = 1,024) on the H200, where SGEMM's is 0.3e-6 to
0.4e-6 and one TF32 product's 2e-4 (``benchmarks/fp32_gemm_modes.py``): float32-class, not
bit-for-bit SGEMM. An input that is infinite or NaN keeps
SGEMM's outcome: its ``hi`` carries it, and the correction products see a zero. Products
below :data:`THREE_TF32_MIN_MACS` stay SGEMM; ``HPS_FP32_GEMM=sgemm`` in the environment keeps
every FP32 product on SGEMM.

cuBLASLt is reached through nvmath-python's bindings (``nvmath.bindings.cublasLt``: its
enums, attribute types and heuristic-result struct, on the library CuPy loads). Its
higher-level ``Matmul`` is not used: each call would cost it tens of microseconds of Python
where a plan here costs one binding call, and the GPU pipeline replays most products from CUDA
graphs anyway. Each distinct call shape gets a plan once per thread and device (descriptors and
up to :data:`CANDIDATES` algorithms of cuBLASLt's heuristic for those shapes, alignments and
workspace size, the fastest kept after timing them on the first call outside a capture;
``HPS_GEMM_TUNING=off`` in the environment keeps the heuristic's first choice); a call then
sets the bias pointer and launches on the current CuPy stream with that stream's workspace
(:func:`hps_core.cuda.blas.workspace`), so it can be recorded in a CUDA graph. Shapes no
cuBLASLt algorithm supports fall back to the GEMM plus the separate pass.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

# blas first: it raises a clear error when nvmath-python is missing.
from hps_core.cuda import blas, dense_ops, kernels

from nvmath.bindings import cublasLt  # isort: skip

_EPILOGUE = {
    (False, False): int(cublasLt.Epilogue.DEFAULT),
    (True, False): int(cublasLt.Epilogue.RELU),
    (False, True): int(cublasLt.Epilogue.BIAS),
    (True, True): int(cublasLt.Epilogue.RELU_BIAS),
}
"""(relu, bias) -> cublasLtEpilogue_t."""
# Split-K partial sums never in FP16.
_REDUCE_IN_FLOAT32 = int(cublasLt.ReductionScheme.INPLACE | cublasLt.ReductionScheme.COMPUTE_TYPE)
_PREF = cublasLt.MatmulPreferenceAttribute
_DESC = cublasLt.MatmulDescAttribute
_RESULT = cublasLt.matmul_heuristic_result_dtype
_MAX_ALIGNMENT = 256
CANDIDATES = 8
"""Algorithms of a product's plan: the first ones cuBLASLt's heuristic ranks, timed on the
plan's first call outside a graph capture (see :class:`_Plan`)."""
_TUNE_LAUNCHES = (8, 2)
"""Launches per timed candidate: small products, and those of more than 2^30 multiply-adds."""
_local = threading.local()
THREE_TF32_MIN_MACS = 6 << 30
"""FP32 products of at least this many multiply-adds run as 3xTF32 (see the module docstring;
smaller ones lose more to the splitting passes and the three launches than the tensor cores
save: ``benchmarks/fp32_gemm_modes.py`` on the H200 measured 4,096 x 1,024 x 1,024 0.85x of
SGEMM's speed, 16,384 x 479 x 1,024 1.2x, 65,536 x 1,024 x 1,024 1.7x)."""
THREE_TF32_MIN_FEATURES = 384
"""... and only when both feature counts are at least this (65,536 x 512 -> 256 ran at 0.8x of
SGEMM: its TF32 products are too thin to pay for the three of them)."""
_SPLIT_ALIGN = 4  # floats: 16-byte rows for the TF32 kernels
_SPLIT_THREADS = 256


def _set(setter: Any, dtype_of: Any, target: int, attribute: Any, value: int) -> None:
    """Set a cuBLASLt descriptor or preference attribute, in the type the library declares."""
    buffer = np.array(value, dtype=dtype_of(attribute))
    setter(target, attribute, buffer.ctypes.data, buffer.itemsize)


def _set_desc(desc: int, attribute: Any, value: int) -> None:
    _set(
        cublasLt.matmul_desc_set_attribute, cublasLt.get_matmul_desc_attribute_dtype, desc,
        attribute, value,
    )  # fmt: skip


def _set_pref(pref: int, attribute: Any, value: int) -> None:
    _set(
        cublasLt.matmul_preference_set_attribute, cublasLt.get_matmul_preference_attribute_dtype,
        pref, attribute, value,
    )  # fmt: skip


@dataclass
class _Plan:
    """A product's descriptors and its candidate algorithms (cuBLASLt heuristic results,
    best ranked first). The heuristic ranks by a model of the GPU, which misjudges some
    shapes: at one row, TF32 1,024 -> 1,024 took 12.3 us on its first choice where PyTorch's
    layout ran 3.6 us on the H200. So the first call outside a capture times every candidate
    on the call's own operands (a CUDA graph of a few launches each, so launch costs do not
    hide the kernels) and keeps the fastest."""

    desc: int
    layouts: tuple[int, int, int]  # A (W^T), B (x^T), D
    results: Any  # numpy array of matmul_heuristic_result_dtype, the candidates
    chosen: int = 0
    tuned: bool = False

    @property
    def algo(self) -> int:
        """Address of the chosen cublasLtMatmulAlgo_t (each result's first field)."""
        return self.results.ctypes.data + self.chosen * _RESULT.itemsize


class _Handle:
    """A cuBLASLt handle of one thread on one device, and its plans."""

    def __init__(self, device_id: int) -> None:
        with cupy.cuda.Device(device_id), blas.checked("cublasLtCreate"):
            self.handle = cublasLt.create()
        self.plans: dict[tuple, _Plan | None] = {}

    def plan(self, key: tuple, bias_ptr: int) -> _Plan | None:
        """The plan for ``key`` (see :func:`linear`), or None when cuBLASLt has no algorithm."""
        if key not in self.plans:
            with blas.checked(f"cuBLASLt plan of {key}"):
                self.plans[key] = self._new_plan(key, bias_ptr)
        return self.plans[key]

    def _new_plan(self, key: tuple, bias_ptr: int) -> _Plan | None:
        compute, kind, n, m, k, op_w, ld_w, op_x, ld_x, epilogue, aligns = key
        desc = cublasLt.matmul_desc_create(compute, blas.data_type(np.float32))
        _set_desc(desc, _DESC.TRANSA, op_w)
        _set_desc(desc, _DESC.TRANSB, op_x)
        _set_desc(desc, _DESC.EPILOGUE, epilogue)
        # The heuristic reads the bias pointer's alignment: give it a real one.
        _set_desc(desc, _DESC.BIAS_POINTER, bias_ptr)
        # Stored shapes (before the op): W^T is [n, k] column-major (op N) or [k, n] (op T).
        shapes = (
            ((n, k) if op_w == blas.OP_N else (k, n), ld_w),
            ((k, m) if op_x == blas.OP_N else (m, k), ld_x),
            ((n, m), n),
        )
        layouts = tuple(
            cublasLt.matrix_layout_create(kind, rows, cols, ld) for (rows, cols), ld in shapes
        )
        pref = cublasLt.matmul_preference_create()
        try:
            _set_pref(pref, _PREF.MAX_WORKSPACE_BYTES, blas.WORKSPACE_BYTES)
            _set_pref(pref, _PREF.REDUCTION_SCHEME_MASK, _REDUCE_IN_FLOAT32)
            # A is W, B is x, C and D the output (cuBLASLt assumes 256-byte alignment unless told).
            w_align, x_align, out_align, _ = aligns
            for attribute, align in (
                (_PREF.MIN_ALIGNMENT_A_BYTES, w_align),
                (_PREF.MIN_ALIGNMENT_B_BYTES, x_align),
                (_PREF.MIN_ALIGNMENT_C_BYTES, out_align),
                (_PREF.MIN_ALIGNMENT_D_BYTES, out_align),
            ):
                _set_pref(pref, attribute, align)
            results = np.zeros(CANDIDATES, dtype=_RESULT)
            found = np.zeros(1, dtype=np.int32)
            try:
                cublasLt.matmul_algo_get_heuristic(
                    self.handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref,
                    CANDIDATES, results.ctypes.data, found.ctypes.data,
                )  # fmt: skip
            except cublasLt.cuBLASLtError:
                found[0] = 0  # NOT_SUPPORTED: no algorithm for these shapes and epilogue
        finally:
            cublasLt.matmul_preference_destroy(pref)
        results = results[: int(found[0])]
        results = results[results["state"] == 0]
        if len(results) == 0:
            return None  # e.g. no epilogue kernel for this dtype and shape: the caller falls back
        return _Plan(desc, layouts, results.copy())


def _handle() -> _Handle:
    return blas.per_thread_and_device(_local, _Handle)


def _alignment(ptr: int) -> int:
    """Largest power of two up to 256 that divides ``ptr``."""
    return min(ptr & -ptr, _MAX_ALIGNMENT) if ptr else _MAX_ALIGNMENT


def linear(x: Any, weight: Any, bias: Any | None, relu: bool, precision: str = "fp32") -> Any:
    """``relu(x @ weight + bias)`` (ReLU and bias each optional) in one cuBLASLt call.

    Every output element is the float32 accumulation plus the bias, then the ReLU, in the
    operands' dtype (see the module docstring for FP16): as :func:`hps_core.cuda.blas.matmul`
    followed by :func:`hps_core.cuda.dense_ops.bias_activation`, which is what runs when
    cuBLASLt has no algorithm for the shapes. Large FP32 products run as 3xTF32 (see the
    module docstring).

    Args:
        x: CuPy ``[rows, in]`` (rows may be strided), float32 (fp32, tf32) or float16 (fp16).
        weight: CuPy ``[in, out]`` of the same dtype.
        bias: CuPy ``[out]`` or ``[1, out]`` of the same dtype, contiguous, or None.
        relu: apply the ReLU.
        precision: ``"fp32"``, ``"tf32"`` or ``"fp16"``.

    Returns:
        A new C-contiguous ``[rows, out]`` array.

    Raises:
        ValueError: shapes or dtypes do not fit.
        BlasError: cuBLASLt failed.

    Example:
        >>> y = linear(x, w, b, relu=True, precision="tf32")  # doctest: +SKIP
    """
    dtype = np.dtype(np.float16 if precision == "fp16" else np.float32)
    if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[0]:
        raise ValueError(f"linear of shapes {x.shape} and {weight.shape} is not supported")
    if bias is not None:
        bias = bias.reshape(-1)
        if bias.shape[0] != weight.shape[1] or not bias.flags.c_contiguous:
            raise ValueError(f"bias must be [{weight.shape[1]}] contiguous, got {bias.shape}")
    if any(a is not None and a.dtype != dtype for a in (x, weight, bias)):
        raise ValueError(f"{precision} linear needs {dtype} operands")
    m, k = x.shape
    n = weight.shape[1]
    out = cupy.empty((m, n), dtype=dtype)
    if m == 0 or n == 0:
        return out
    if (
        k > 0
        and precision == "fp32"
        and three_tf32_pays(m, n, k)
        and _three_tf32(x, weight, bias, relu, out)
    ):
        return out
    product = _product(x, weight, out, bias, relu, precision) if k > 0 else None
    if product is not None:
        product.launch(accumulate=False)
        return out
    y = blas.matmul(x, weight, precision)
    if bias is not None:
        return dense_ops.bias_activation(y, bias, relu)
    return cupy.maximum(y, 0, out=y) if relu else y


def three_tf32_pays(rows: int, out: int, inner: int) -> bool:
    """Whether an FP32 product of these dimensions runs as 3xTF32 on this GPU (see the module
    docstring): large enough, on TF32 tensor cores, and not switched off by ``HPS_FP32_GEMM``.

    Args:
        rows: rows of ``x``.
        out: output features.
        inner: input features.

    Returns:
        True where :func:`linear` in ``"fp32"`` uses three TF32 products.
    """
    if os.environ.get("HPS_FP32_GEMM", "3xtf32").lower() == "sgemm":
        return False
    if min(out, inner) < THREE_TF32_MIN_FEATURES or rows * out * inner < THREE_TF32_MIN_MACS:
        return False
    return _has_tf32_tensor_cores(cupy.cuda.Device().id)


@functools.cache
def _has_tf32_tensor_cores(device_id: int) -> bool:
    return int(cupy.cuda.Device(device_id).compute_capability) >= 80


def _three_tf32(x: Any, weight: Any, bias: Any | None, relu: bool, out: Any) -> bool:
    """``out = relu(x @ weight + bias)`` in float32 accuracy from three TF32 products: lo(x) @
    hi(W) + hi(x) @ lo(W), then hi(x) @ hi(W) with the bias and ReLU epilogue; False (nothing
    launched) when cuBLASLt has no algorithm for one of the two calls."""
    m, k = x.shape
    n = weight.shape[1]
    kp = -(-k // _SPLIT_ALIGN) * _SPLIT_ALIGN  # 16-byte rows for the tensor-core kernels
    # x's planes side by side: [lo | hi_finite | hi], each kp wide, zero padded.
    if x.strides[1] != x.itemsize:
        x = cupy.ascontiguousarray(x)
    planes = cupy.empty((m, 3 * kp), dtype=np.float32)
    _split(x, x.strides[0] // x.itemsize, kp, planes, 3 * kp, (0, 2 * kp, kp))
    # W's planes stacked: [hi; lo], each kp rows, zero padded.
    weight = cupy.ascontiguousarray(weight)
    stacked = cupy.zeros((2 * kp, n), dtype=np.float32)
    _split(weight, n, n, stacked, n, (kp * n, 0, -1))
    correction = _product(planes[:, : 2 * kp], stacked, out, None, False, "tf32")
    main = _product(planes[:, 2 * kp :], stacked[:kp], out, bias, relu, "tf32")
    if correction is None or main is None:
        return False
    correction.launch(accumulate=False)
    main.launch(accumulate=True)
    return True


def _split(x: Any, ld: int, out_cols: int, out: Any, out_ld: int, at: tuple[int, int, int]) -> None:
    """``kernels/dense.cu``'s ``split_tf32`` of float32 ``x [rows, cols]`` (row stride ``ld``,
    unit column stride) into ``out``: planes of ``out_cols`` columns at element offsets
    ``at`` = (lo, hi, hi_finite) from each row's start, -1 for a plane not written."""
    rows, cols = x.shape
    n = rows * out_cols
    if n == 0:
        return
    kernel = dense_ops.dense_function("split_tf32")
    blocks = min(-(-n // _SPLIT_THREADS), kernels.sm_count(cupy.cuda.Device().id) * 16)
    kernel(
        (blocks,), (_SPLIT_THREADS,),
        (x, np.int64(ld), np.int64(rows), np.int64(cols), np.int64(out_cols), out,
         np.int64(out_ld), *(np.int64(a) for a in at)),
    )  # fmt: skip


@dataclass
class _Product:
    """One planned cuBLASLt call ``out (+)= x @ weight`` with its epilogue."""

    handle: _Handle
    plan: _Plan
    key: tuple  # the plan's (see _product)
    operands: tuple[int, int, int]  # W, x, out device pointers
    bias_ptr: int | None

    def launch(
        self,
        accumulate: bool,
        algo: int | None = None,
        out: int | None = None,
        workspace: int | None = None,
    ) -> None:
        """Queue the call on the current stream, with that stream's workspace (when tuning:
        another candidate ``algo``, into another ``out``, with the caller's ``workspace``)."""
        if self.bias_ptr is not None:
            _set_desc(self.plan.desc, _DESC.BIAS_POINTER, self.bias_ptr)
        a, b, d = self.plan.layouts
        w, x, target = self.operands
        target = target if out is None else out
        with blas.checked("cublasLtMatmul"):
            cublasLt.matmul(
                self.handle.handle, self.plan.desc, blas.ONE, w, a, x, b,
                blas.ONE if accumulate else blas.ZERO, target, d, target, d,
                self.plan.algo if algo is None else algo,
                blas.workspace() if workspace is None else workspace, blas.WORKSPACE_BYTES,
                cupy.cuda.get_current_stream().ptr,
            )  # fmt: skip

    def tune(self, out_bytes: int) -> None:
        """Time each candidate of the plan (see :class:`_Plan`) into a scratch output and keep
        the fastest; skipped while the current stream is being captured."""
        plan = self.plan
        plan.tuned = True
        if len(plan.results) < 2:
            return
        caller = cupy.cuda.get_current_stream()
        # The timing stream runs between two events of the caller's: it borrows its workspace.
        borrowed = blas.workspace()
        scratch = cupy.empty(out_bytes, dtype=np.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)
        stream.wait_event(caller.record())  # the operands are written on the caller's stream
        _, _, n, m, k, *_ = self.key
        launches = _TUNE_LAUNCHES[int(n * m * k > 1 << 30)]
        times = []
        for index in range(len(plan.results)):
            algo = plan.results.ctypes.data + index * _RESULT.itemsize
            try:
                with stream:
                    stream.begin_capture()
                    try:
                        for _ in range(launches):
                            self.launch(False, algo, scratch.data.ptr, borrowed)
                    finally:
                        graph = stream.end_capture()
            except (blas.BlasError, cupy.cuda.runtime.CUDARuntimeError):
                times.append(np.inf)  # a candidate that does not launch is never chosen
                continue
            graph.launch(stream)  # warm-up
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop))
        plan.chosen = int(np.argmin(times))
        caller.wait_event(stream.record())


def _product(
    x: Any, weight: Any, out: Any, bias: Any | None, relu: bool, precision: str
) -> _Product | None:
    """The planned call for these operands (tuned on first use outside a capture), or None
    when cuBLASLt has no algorithm."""
    m, k = x.shape
    n = weight.shape[1]
    wx, op_w, ld_w = blas.operand(weight)
    xx, op_x, ld_x = blas.operand(x)
    bias_ptr = bias.data.ptr if bias is not None else 0
    key = (
        blas.COMPUTE[precision], blas.data_type(out.dtype), n, m, k, op_w, ld_w, op_x, ld_x,
        _EPILOGUE[(relu, bias is not None)],
        (_alignment(wx.data.ptr), _alignment(xx.data.ptr), _alignment(out.data.ptr),
         _alignment(bias_ptr)),
    )  # fmt: skip
    h = _handle()
    plan = h.plan(key, bias_ptr)
    if plan is None:
        return None
    product = _Product(
        h, plan, key, (wx.data.ptr, xx.data.ptr, out.data.ptr), None if bias is None else bias_ptr
    )
    if not plan.tuned and not cupy.cuda.get_current_stream().is_capturing():
        if os.environ.get("HPS_GEMM_TUNING", "on").lower() == "off":
            plan.tuned = True  # the heuristic's first choice, as cuBLASLt ranks it
        else:
            product.tune(out.nbytes)
    return product
