"""Fused dense-network operations on CuPy, used by the layers when they run on a GPU.

Each replaces several array operations (and passes over memory) of the layer's portable code,
with the same result up to float32 rounding order:

- :func:`bias_activation`: ``y += bias`` then ReLU, in one pass over ``y``;
- :func:`interaction`: DLRM's dot interaction (stack, Gram matrix, lower triangle, padding) in
  one kernel (``kernels/dense.cu``) instead of a batched GEMM and four copies.
"""

from __future__ import annotations

import functools
from typing import Any

import cupy
import numpy as np

from hps_core.gpu import kernels

DENSE_TEMPLATES = ("interaction<float>", "interaction<unsigned short>")
"""The template instantiations ``kernels/dense.cu`` is compiled with (one module for all)."""
_INTERACTION_THREADS = 128
_MAX_STATIC_SHARED = 48 * 1024


@functools.cache
def _bias_act_kernel(relu: bool) -> Any:
    body = "float v = (float)y + (float)b;"
    body += " y = (T)(v > 0.0f ? v : 0.0f);" if relu else " y = (T)v;"
    return cupy.ElementwiseKernel("T b", "T y", body, f"hps_bias_{'relu' if relu else 'add'}")


def bias_activation(y: Any, bias: Any, relu: bool) -> Any:
    """``y = relu(y + bias)`` (or ``y + bias``) in place, each element in float32 and rounded
    once to ``y``'s dtype.

    Args:
        y: CuPy ``[..., N]`` float32 or float16, written in place.
        bias: CuPy ``[1, N]`` or ``[N]`` of the same dtype.
        relu: apply the ReLU.

    Returns:
        ``y``.
    """
    _bias_act_kernel(relu)(bias.reshape(-1), y)
    return y


@functools.cache
def _pairs(n: int, device_id: int) -> Any:
    i, j = np.tril_indices(n, k=-1)
    with cupy.cuda.Device(device_id):
        return cupy.asarray(np.stack([i, j], axis=1).astype(np.int32).ravel())


def interaction_fits(n: int, dim: int) -> bool:
    """Whether :func:`interaction` can stage ``n`` vectors of ``dim`` in shared memory."""
    return n * (dim + 1) * 4 <= _MAX_STATIC_SHARED


def interaction(mlp: Any, emb: Any, tf32: bool) -> Any:
    """DLRM dot interaction in HugeCTR's layout (see :class:`~hps_core.nn.layers.Interaction`).

    Args:
        mlp: CuPy ``[R, D]`` (float32 or float16), rows may be strided.
        emb: CuPy ``[R, N, D]`` of the same dtype, each row's ``N * D`` values contiguous.
        tf32: round the operands of the dot products to TF32 first.

    Returns:
        New C-contiguous ``[R, D + N(N+1)/2 + 1]`` array of the inputs' dtype.
    """
    rows, dim = mlp.shape
    n = emb.shape[1] + 1
    if mlp.strides[1] != mlp.itemsize:
        mlp = cupy.ascontiguousarray(mlp)
    if emb.strides[2] != emb.itemsize or emb.strides[1] != dim * emb.itemsize:
        emb = cupy.ascontiguousarray(emb)
    width = dim + n * (n - 1) // 2 + 1
    out = cupy.empty((rows, width), dtype=mlp.dtype)
    if rows == 0:
        return out
    name = "interaction<float>" if mlp.dtype == np.float32 else "interaction<unsigned short>"
    device_id = cupy.cuda.Device().id
    mod = kernels.module("dense", device_id, DENSE_TEMPLATES)
    kernel = mod.get_function(name)
    item = mlp.itemsize
    kernel(
        (rows,), (_INTERACTION_THREADS,),
        (mlp, np.int64(mlp.strides[0] // item), emb, np.int64(emb.strides[0] // item),
         _pairs(n, device_id), np.int32(n), np.int32(dim), out, np.int64(width), np.bool_(tf32)),
        shared_mem=n * (dim + 1) * 4,
    )  # fmt: skip
    return out
