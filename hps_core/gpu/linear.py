"""Fully connected layers, ``act(x @ W + b)``, each in one cuBLASLt call.

In the column-major view :mod:`~hps_core.gpu.blas` uses, the output of ``x [rows, in] @
W [in, out]`` is ``D [out, rows]``, so the bias runs along D's rows: exactly what cuBLASLt's
``BIAS`` and ``RELU_BIAS`` epilogues add, inside the GEMM kernel, where
:func:`hps_core.gpu.dense_ops.bias_activation` did it in a separate pass that read and wrote
every activation once more: 1.2 ms of a 12 ms batch of 65,536 samples of the MLPerf DLRM on
the H200 (CUPTI kernel times, commit 4d347bb). In FP32 and TF32 the bias is added to the
float32 accumulator; FP16 kernels may round the product to half first, as that pass did.
Split-K partial sums stay in float32 (the preference's reduction-scheme mask).

Each distinct call shape gets a plan once per thread and device (descriptors and the algorithm
cuBLASLt's heuristic ranks first for those shapes, alignments and this workspace); a call then
sets the bias pointer and launches on the current CuPy stream, so it can be recorded in a CUDA
graph. Shapes no cuBLASLt algorithm supports fall back to the GEMM plus the separate pass.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

from hps_core.gpu import blas

# cublasLt.h
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER = 3, 4, 7, 8
_EPILOGUE = {(False, False): 1, (True, False): 2, (False, True): 4, (True, True): 6}
"""(relu, bias) -> cublasLtEpilogue_t: DEFAULT, RELU, BIAS, RELU_BIAS."""
_PREF_MAX_WORKSPACE_BYTES = 1
_PREF_REDUCTION_SCHEME_MASK = 3
_REDUCE_IN_FLOAT32 = 1 | 2  # INPLACE | COMPUTE_TYPE: split-K partial sums never in FP16
_PREF_MIN_ALIGNMENT = (5, 6, 7, 8)  # A, B, C, D bytes
_HEURISTIC_RESULT_BYTES = (
    96  # cublasLtMatmulHeuristicResult_t: algo[64], size_t, int, float, int[4]
)
_MAX_ALIGNMENT = 256


class _Lt:
    """The libcublasLt CuPy's libcublas loaded, with the signatures used here."""

    def __init__(self) -> None:
        lib = blas._loaded_library("libcublasLt")
        vp, i32, u64, i64, sz = (
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
        )  # fmt: skip
        lib.cublasLtCreate.argtypes = [ctypes.POINTER(vp)]
        lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), i32, i32]
        lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, i32, vp, sz]
        lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), i32, u64, u64, i64]
        lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(vp)]
        lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, i32, vp, sz]
        lib.cublasLtMatmulPreferenceDestroy.argtypes = [vp]
        lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [
            vp, vp, vp, vp, vp, vp, vp, i32, vp, ctypes.POINTER(i32)
        ]  # fmt: skip
        lib.cublasLtMatmul.argtypes = [
            vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp
        ]  # fmt: skip
        self.lib = lib


_lt: _Lt | None = None
_lt_lock = threading.Lock()
_local = threading.local()


def _library() -> _Lt:
    global _lt
    with _lt_lock:
        if _lt is None:
            _lt = _Lt()
        return _lt


@dataclass
class _Plan:
    desc: ctypes.c_void_p
    layouts: tuple[ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]  # A (W^T), B (x^T), D
    result: Any  # ctypes buffer holding the heuristic result (its algo is the first 64 bytes)

    @property
    def algo(self) -> int:
        return ctypes.addressof(self.result)


class _Handle:
    """A cuBLASLt handle of one thread on one device: its workspace and its plans."""

    def __init__(self, device_id: int) -> None:
        self.lt = _library()
        self.handle = ctypes.c_void_p()
        with cupy.cuda.Device(device_id):
            blas._check(self.lt.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
            self.workspace = cupy.empty(blas.WORKSPACE_BYTES, dtype=np.uint8)
        self.plans: dict[tuple, _Plan | None] = {}

    def plan(self, key: tuple, bias_ptr: int) -> _Plan | None:
        """The plan for ``key`` (see :func:`linear`), or None when cuBLASLt has no algorithm."""
        if key not in self.plans:
            self.plans[key] = self._new_plan(key, bias_ptr)
        return self.plans[key]

    def _new_plan(self, key: tuple, bias_ptr: int) -> _Plan | None:
        lib = self.lt.lib
        compute, kind, n, m, k, op_w, ld_w, op_x, ld_x, epilogue, aligns = key
        desc = ctypes.c_void_p()
        blas._check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), compute, 0), "DescCreate")
        for attr, value in ((_DESC_TRANSA, op_w), (_DESC_TRANSB, op_x), (_DESC_EPILOGUE, epilogue)):
            v = ctypes.c_int32(value)
            blas._check(
                lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), 4), "DescSet"
            )
        # The heuristic reads the bias pointer's alignment: give it a real one.
        _set_bias(lib, desc, bias_ptr)
        # Stored shapes (before the op): W^T is [n, k] column-major (op N) or [k, n] (op T).
        shapes = (
            ((n, k) if op_w == blas._OP_N else (k, n), ld_w),
            ((k, m) if op_x == blas._OP_N else (m, k), ld_x),
            ((n, m), n),
        )
        layouts = []
        for (rows, cols), ld in shapes:
            layout = ctypes.c_void_p()
            blas._check(
                lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), kind, rows, cols, ld),
                "MatrixLayoutCreate",
            )
            layouts.append(layout)
        pref = ctypes.c_void_p()
        blas._check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        try:
            size = ctypes.c_uint64(blas.WORKSPACE_BYTES)
            blas._check(
                lib.cublasLtMatmulPreferenceSetAttribute(
                    pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size), 8
                ),
                "PreferenceSet",
            )
            mask = ctypes.c_uint32(_REDUCE_IN_FLOAT32)
            blas._check(
                lib.cublasLtMatmulPreferenceSetAttribute(
                    pref, _PREF_REDUCTION_SCHEME_MASK, ctypes.byref(mask), 4
                ),
                "PreferenceSet",
            )
            # A is W, B is x, C and D the output (cuBLASLt assumes 256-byte alignment unless told).
            w_align, x_align, out_align, _ = aligns
            for attr, align in zip(
                _PREF_MIN_ALIGNMENT, (w_align, x_align, out_align, out_align), strict=True
            ):
                value = ctypes.c_uint32(align)
                blas._check(
                    lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(value), 4),
                    "PreferenceSet",
                )
            result = ctypes.create_string_buffer(_HEURISTIC_RESULT_BYTES)
            found = ctypes.c_int(0)
            status = lib.cublasLtMatmulAlgoGetHeuristic(
                self.handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref, 1,
                ctypes.addressof(result), ctypes.byref(found),
            )  # fmt: skip
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        if status != 0 or found.value == 0:
            return None  # e.g. no epilogue kernel for this dtype and shape: the caller falls back
        return _Plan(desc, (layouts[0], layouts[1], layouts[2]), result)


def _set_bias(lib: ctypes.CDLL, desc: ctypes.c_void_p, bias_ptr: int) -> None:
    ptr = ctypes.c_void_p(bias_ptr)
    blas._check(
        lib.cublasLtMatmulDescSetAttribute(
            desc, _DESC_BIAS_POINTER, ctypes.byref(ptr), ctypes.sizeof(ptr)
        ),
        "DescSet bias",
    )


def _handle() -> _Handle:
    return blas.per_thread_and_device(_local, _Handle)


def _alignment(ptr: int) -> int:
    """Largest power of two up to 256 that divides ``ptr``."""
    return min(ptr & -ptr, _MAX_ALIGNMENT) if ptr else _MAX_ALIGNMENT


def linear(x: Any, weight: Any, bias: Any | None, relu: bool, precision: str = "fp32") -> Any:
    """``relu(x @ weight + bias)`` (ReLU and bias each optional) in one cuBLASLt call.

    Every output element is the float32 accumulation plus the bias, then the ReLU, in the
    operands' dtype (see the module docstring for FP16): as :func:`hps_core.gpu.blas.matmul`
    followed by :func:`hps_core.gpu.dense_ops.bias_activation`, which is what runs when
    cuBLASLt has no algorithm for the shapes.

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
    wx, op_w, ld_w = blas._operand(weight)
    xx, op_x, ld_x = blas._operand(x)
    plan = None
    h = _handle()
    if k > 0:
        bias_ptr = bias.data.ptr if bias is not None else 0
        key = (
            blas._COMPUTE[precision], blas._R_16F if dtype == np.float16 else blas._R_32F,
            n, m, k, op_w, ld_w, op_x, ld_x, _EPILOGUE[(relu, bias is not None)],
            (_alignment(wx.data.ptr), _alignment(xx.data.ptr), _alignment(out.data.ptr),
             _alignment(bias_ptr)),
        )  # fmt: skip
        plan = h.plan(key, bias_ptr)
    if plan is None:
        from hps_core.gpu.dense_ops import bias_activation

        y = blas.matmul(x, weight, precision)
        if bias is not None:
            return bias_activation(y, bias, relu)
        return cupy.maximum(y, 0, out=y) if relu else y
    lib = h.lt.lib
    if bias is not None:
        _set_bias(lib, plan.desc, bias_ptr)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    a, b, d = plan.layouts
    status = lib.cublasLtMatmul(
        h.handle, plan.desc, ctypes.byref(one), wx.data.ptr, a, xx.data.ptr, b,
        ctypes.byref(zero), out.data.ptr, d, out.data.ptr, d, plan.algo, h.workspace.data.ptr,
        blas.WORKSPACE_BYTES, cupy.cuda.get_current_stream().ptr,
    )  # fmt: skip
    blas._check(status, f"cublasLtMatmul {x.shape} @ {weight.shape}")
    return out
