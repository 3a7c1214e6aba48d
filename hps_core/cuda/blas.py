"""Matrix products on cuBLAS that can be recorded in a CUDA graph.

CuPy refuses cuBLAS calls while a stream is being captured ("calling cuBLAS API during stream
capture is currently unsupported"), although cuBLAS itself supports capture once it is given
a workspace of its own. So the products of the GPU pipeline call ``cublasGemmEx`` and
``cublasGemmStridedBatchedEx`` directly (ctypes, on the same ``libcublas`` CuPy loaded), on a
handle per thread and device with a fixed workspace, on the caller's current CuPy stream.

The compute type is passed per call, so TF32 needs no process-wide switch:

=========  ==================  ==============================
precision  operands / result   cuBLAS compute type
=========  ==================  ==============================
fp32       float32             ``CUBLAS_COMPUTE_32F``
tf32       float32             ``CUBLAS_COMPUTE_32F_FAST_TF32``
fp16       float16             ``CUBLAS_COMPUTE_32F`` (float32 accumulation, result rounded once)
=========  ==================  ==============================

Row-major ``C = A @ B`` is computed as column-major ``C^T = B^T A^T``; an operand that is a
transposed or sliced view is passed with its own leading dimension instead of being copied.

Fully connected layers with their bias and ReLU use cuBLASLt instead (:mod:`hps_core.cuda.linear`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import cupy
import numpy as np

from hps_core.errors import HPSError, NotAvailableError

_OP_N, _OP_T = 0, 1
_R_32F, _R_16F = 0, 2
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77
_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20
"""cuBLAS workspace per handle (its documented recommendation for Hopper)."""

_COMPUTE = {"fp32": _COMPUTE_32F, "tf32": _COMPUTE_32F_FAST_TF32, "fp16": _COMPUTE_32F}


class BlasError(HPSError):
    """A cuBLAS call failed."""


def _loaded_library(stem: str) -> ctypes.CDLL:
    """The ``stem`` library CuPy uses (libcublas, or the libcublasLt it depends on), found in
    this process's mappings once CuPy has loaded it, so both share one copy and version."""
    cupy.cuda.device.get_cublas_handle()  # makes CuPy load the library
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if f"/{stem}.so" in path:
                return ctypes.CDLL(path)
    try:
        return ctypes.CDLL(f"{stem}.so")
    except OSError as exc:
        raise NotAvailableError(f"{stem} is not loadable: {exc}") from exc


T = TypeVar("T")

_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()
_local = threading.local()


def _cublas() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is None:
            lib = _loaded_library("libcublas")
            vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
            lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
            lib.cublasSetStream_v2.argtypes = [vp, vp]
            lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
            lib.cublasGemmEx.argtypes = [
                vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp, vp, i32, i32,
                i32, i32,
            ]  # fmt: skip
            lib.cublasGemmStridedBatchedEx.argtypes = [
                vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32, i32, i64, vp, vp,
                i32, i32, i64, i32, i32, i32,
            ]  # fmt: skip
            _lib = lib
        return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise BlasError(f"cuBLAS {what} failed with status {status}")


class _Handle:
    """A cuBLAS handle of one thread on one device, with its own workspace."""

    def __init__(self, device_id: int) -> None:
        lib = _cublas()
        self.lib = lib
        self.handle = ctypes.c_void_p()
        with cupy.cuda.Device(device_id):
            _check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
            self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)
        self.stream: int | None = None

    def bind(self, stream_ptr: int) -> None:
        # cublasSetStream resets the workspace to cuBLAS's own pool, which would allocate
        # during a capture: set ours again after every stream change.
        if stream_ptr != self.stream:
            _check(self.lib.cublasSetStream_v2(self.handle, stream_ptr), "cublasSetStream")
            _check(
                self.lib.cublasSetWorkspace_v2(
                    self.handle, self.workspace.data.ptr, WORKSPACE_BYTES
                ),
                "cublasSetWorkspace",
            )
            self.stream = stream_ptr


def per_thread_and_device(local: threading.local, make: Callable[[int], T]) -> T:
    """The object ``make(device_id)`` built once per thread (``local``) and current device:
    library handles are not thread-safe, and each belongs to one device."""
    device_id = cupy.cuda.Device().id
    made = getattr(local, "per_device", None)
    if made is None:
        made = local.per_device = {}
    if device_id not in made:
        made[device_id] = make(device_id)
    return made[device_id]


def _handle() -> _Handle:
    handle = per_thread_and_device(_local, _Handle)
    handle.bind(cupy.cuda.get_current_stream().ptr)
    return handle


def _operand(x: Any) -> tuple[Any, int, int]:
    """``(array, op, ld)`` for a row-major ``[r, c]`` matrix (last two axes of ``x``) read as
    column-major ``x^T``: op N with ld = row stride when rows are contiguous, op T with ld =
    column stride when columns are; anything else is copied first."""
    r, c = x.shape[-2], x.shape[-1]
    item = x.itemsize
    sr, sc = x.strides[-2] // item, x.strides[-1] // item
    if x.strides[-1] % item == 0 and x.strides[-2] % item == 0:
        if sc == 1 and sr >= max(c, 1):
            return x, _OP_N, sr
        if sr == 1 and sc >= max(r, 1) and r > 1:
            return x, _OP_T, sc
    x = cupy.ascontiguousarray(x)
    return x, _OP_N, max(c, 1)


def _batch_stride(x: Any, batch: int) -> int | None:
    """Element stride between the matrices of ``x`` (3-D), or None if not uniform."""
    if batch == 1:
        return 0
    return x.strides[0] // x.itemsize if x.strides[0] % x.itemsize == 0 else None


def matmul(a: Any, b: Any, precision: str = "fp32") -> Any:
    """``a @ b`` on cuBLAS, 2-D or batched 3-D, in ``precision`` (see the module docstring).

    Args:
        a: CuPy ``[M, K]`` or ``[batch, M, K]``, float32 (fp32, tf32) or float16 (fp16).
        b: CuPy ``[K, N]`` or ``[batch, K, N]``, the same dtype.
        precision: ``"fp32"``, ``"tf32"`` or ``"fp16"``.

    Returns:
        A new C-contiguous ``[M, N]`` (or ``[batch, M, N]``) array of the operands' dtype.

    Raises:
        ValueError: shapes or dtypes do not fit.
        BlasError: cuBLAS failed.
    """
    dtype = np.dtype(np.float16 if precision == "fp16" else np.float32)
    if a.dtype != dtype or b.dtype != dtype:
        raise ValueError(f"{precision} matmul needs {dtype} operands, got {a.dtype} and {b.dtype}")
    if a.ndim != b.ndim or a.ndim not in (2, 3) or a.shape[:-2] != b.shape[:-2]:
        raise ValueError(f"matmul of shapes {a.shape} and {b.shape} is not supported")
    m, k = a.shape[-2:]
    if b.shape[-2] != k:
        raise ValueError(f"matmul: inner dimensions differ, {a.shape} @ {b.shape}")
    n = b.shape[-1]
    batch = a.shape[0] if a.ndim == 3 else 1
    out = cupy.empty((*a.shape[:-2], m, n), dtype=dtype)
    if out.size == 0:
        return out
    if k == 0:
        out.fill(0)
        return out
    bx, op_b, ld_b = _operand(b)
    ax, op_a, ld_a = _operand(a)
    kind = _R_16F if dtype == np.float16 else _R_32F
    compute = _COMPUTE[precision]
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    h = _handle()
    if a.ndim == 2:
        status = h.lib.cublasGemmEx(
            h.handle, op_b, op_a, n, m, k, ctypes.byref(one), bx.data.ptr, kind, ld_b,
            ax.data.ptr, kind, ld_a, ctypes.byref(zero), out.data.ptr, kind, n, compute,
            _GEMM_DEFAULT,
        )  # fmt: skip
        _check(status, f"GemmEx {a.shape} @ {b.shape}")
        return out
    stride_b, stride_a = _batch_stride(bx, batch), _batch_stride(ax, batch)
    if stride_a is None or stride_b is None:
        bx, op_b, ld_b = _operand(cupy.ascontiguousarray(b))
        ax, op_a, ld_a = _operand(cupy.ascontiguousarray(a))
        stride_b, stride_a = k * n, m * k
    status = h.lib.cublasGemmStridedBatchedEx(
        h.handle, op_b, op_a, n, m, k, ctypes.byref(one), bx.data.ptr, kind, ld_b, stride_b,
        ax.data.ptr, kind, ld_a, stride_a, ctypes.byref(zero), out.data.ptr, kind, n, m * n,
        batch, compute, _GEMM_DEFAULT,
    )  # fmt: skip
    _check(status, f"GemmStridedBatchedEx {a.shape} @ {b.shape}")
    return out
