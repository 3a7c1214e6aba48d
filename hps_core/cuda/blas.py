"""Matrix products on cuBLAS that can be recorded in a CUDA graph.

CuPy refuses cuBLAS calls while a stream is being captured ("calling cuBLAS API during stream
capture is currently unsupported"), although cuBLAS itself supports capture once it is given
a workspace of its own. So the products of the GPU pipeline call ``cublasGemmEx`` and
``cublasGemmStridedBatchedEx`` through nvmath-python's bindings (``nvmath.bindings.cublas``:
NVIDIA's maintained declarations and enums, on the cuBLAS CuPy loads), on a handle per thread
and device, on the caller's current CuPy stream, with that stream's workspace
(:func:`workspace`).

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

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import cupy
import numpy as np

from hps_core.errors import HPSError, NotAvailableError

try:
    from nvmath import CudaDataType
    from nvmath.bindings import cublas, cublasLt
except ImportError as exc:  # the GPU extra's package, absent from a CPU-only install
    raise NotAvailableError(
        "the GPU path needs nvmath-python for cuBLAS and cuBLASLt: pip install "
        f"'hps-triton[gpu]' (or nvmath-python==1.0.0) into the server's Python ({exc})"
    ) from exc

OP_N, OP_T = int(cublas.Operation.N), int(cublas.Operation.T)
_GEMM_DEFAULT = int(cublas.GemmAlgo.DEFAULT)
WORKSPACE_BYTES = 32 << 20
"""cuBLAS workspace per handle (its documented recommendation for Hopper)."""

COMPUTE = {
    "fp32": int(cublas.ComputeType.COMPUTE_32F),
    "tf32": int(cublas.ComputeType.COMPUTE_32F_FAST_TF32),
    "fp16": int(cublas.ComputeType.COMPUTE_32F),
}
"""cublasComputeType_t of each precision."""


def data_type(dtype: Any) -> int:
    """cudaDataType_t of float32 or float16 storage."""
    return int(CudaDataType.CUDA_R_16F if dtype == np.float16 else CudaDataType.CUDA_R_32F)


SCALARS = np.array([1.0, 0.0], dtype=np.float32)
"""Host alpha and beta values (1, 0) whose addresses the calls pass (read when launched, or
when recorded into a graph)."""
ONE, ZERO = SCALARS.ctypes.data, SCALARS.ctypes.data + SCALARS.itemsize


class BlasError(HPSError):
    """A cuBLAS or cuBLASLt call failed."""


@contextmanager
def checked(what: str) -> Iterator[None]:
    """Raise the bindings' cuBLAS and cuBLASLt errors as :class:`BlasError`, naming ``what``."""
    try:
        yield
    except (cublas.cuBLASError, cublasLt.cuBLASLtError) as exc:
        raise BlasError(f"{what} failed: {exc}") from exc


T = TypeVar("T")

_local = threading.local()


class _Handle:
    """A cuBLAS handle of one thread on one device."""

    def __init__(self, device_id: int) -> None:
        with cupy.cuda.Device(device_id), checked("cublasCreate"):
            self.handle = cublas.create()
        self.bound: tuple[int, int] | None = None  # (stream, workspace) the handle is set to

    def bind(self, stream_ptr: int, workspace_ptr: int) -> None:
        # cublasSetStream resets the workspace to cuBLAS's own pool, which would allocate
        # during a capture: set the stream's own again after every change.
        if (stream_ptr, workspace_ptr) != self.bound:
            with checked("cublasSetStream"):
                cublas.set_stream(self.handle, stream_ptr)
                cublas.set_workspace(self.handle, workspace_ptr, WORKSPACE_BYTES)
            self.bound = (stream_ptr, workspace_ptr)


_workspaces: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()
_workspaces_lock = threading.Lock()


def workspace() -> int:
    """Address of the current stream's workspace for cuBLAS and cuBLASLt: :data:`WORKSPACE_BYTES`
    of device memory for that stream alone (per thread for the per-thread default stream).

    Two streams running products at once on one workspace would overwrite each other's split-K
    partial sums, and a CUDA graph keeps the address it was recorded with: so each stream has
    its own, allocated outside every CuPy memory pool (whose blocks go to other arrays once
    their pool is dropped, while graphs recorded on them still write there) and freed with the
    stream object. A workspace that came from a bucket's pool, as the first product of a thread
    allocated it, gave wrong scores and then illegal addresses once that pool was dropped.

    Returns:
        The device pointer.

    Raises:
        BlasError: the stream's first product is being recorded in a CUDA graph (a workspace
            cannot be allocated during a capture: run a product on the stream before).

    Example:
        >>> ptr = workspace()  # doctest: +SKIP
    """
    stream = cupy.cuda.get_current_stream()
    device_id = cupy.cuda.Device().id
    if stream.ptr == cupy.cuda.Stream.ptds.ptr:  # one object, a stream per thread
        owned = _local.__dict__.setdefault("ptds_workspaces", {})
    else:
        with _workspaces_lock:
            owned = _workspaces.setdefault(stream, {})
    memory = owned.get(device_id)
    if memory is None:
        if stream.is_capturing():
            raise BlasError(
                "the first cuBLAS product on this stream is being recorded in a CUDA graph, "
                "and its workspace cannot be allocated during a capture: run one eagerly first"
            )
        memory = owned[device_id] = cupy.cuda.Memory(WORKSPACE_BYTES)
    return memory.ptr


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
    handle.bind(cupy.cuda.get_current_stream().ptr, workspace())
    return handle


def operand(x: Any) -> tuple[Any, int, int]:
    """``(array, op, ld)`` for a row-major ``[r, c]`` matrix (last two axes of ``x``) read as
    column-major ``x^T``: op N with ld = row stride when rows are contiguous, op T with ld =
    column stride when columns are; anything else is copied first."""
    r, c = x.shape[-2], x.shape[-1]
    item = x.itemsize
    sr, sc = x.strides[-2] // item, x.strides[-1] // item
    if x.strides[-1] % item == 0 and x.strides[-2] % item == 0:
        if sc == 1 and sr >= max(c, 1):
            return x, OP_N, sr
        if sr == 1 and sc >= max(r, 1) and r > 1:
            return x, OP_T, sc
    x = cupy.ascontiguousarray(x)
    return x, OP_N, max(c, 1)


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
    bx, op_b, ld_b = operand(b)
    ax, op_a, ld_a = operand(a)
    kind = data_type(dtype)
    compute = COMPUTE[precision]
    h = _handle()
    if a.ndim == 2:
        with checked(f"cublasGemmEx {a.shape} @ {b.shape}"):
            cublas.gemm_ex(
                h.handle, op_b, op_a, n, m, k, ONE, bx.data.ptr, kind, ld_b, ax.data.ptr, kind,
                ld_a, ZERO, out.data.ptr, kind, n, compute, _GEMM_DEFAULT,
            )  # fmt: skip
        return out
    stride_b, stride_a = _batch_stride(bx, batch), _batch_stride(ax, batch)
    if stride_a is None or stride_b is None:
        bx, op_b, ld_b = operand(cupy.ascontiguousarray(b))
        ax, op_a, ld_a = operand(cupy.ascontiguousarray(a))
        stride_b, stride_a = k * n, m * k
    with checked(f"cublasGemmStridedBatchedEx {a.shape} @ {b.shape}"):
        cublas.gemm_strided_batched_ex(
            h.handle, op_b, op_a, n, m, k, ONE, bx.data.ptr, kind, ld_b, stride_b, ax.data.ptr,
            kind, ld_a, stride_a, ZERO, out.data.ptr, kind, n, m * n, batch, compute,
            _GEMM_DEFAULT,
        )  # fmt: skip
    return out
