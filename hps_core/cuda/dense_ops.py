"""Fused dense-network operations on CuPy, used by the layers when they run on a GPU.

Each replaces several array operations (and passes over memory) of the layer's portable code,
with the same result up to float32 rounding order:

- :func:`bias_activation`: ``y += bias`` then ReLU, in one pass over ``y``;
- :func:`cross_combine`: a DCN cross layer's ``x0 * (y + b) + xl`` after its products, in one
  pass (CuPy's operators took four, each reading and writing the whole ``[B, D]`` tensor:
  2.4 ms of a 7.5 ms DLRM-v2 batch of 16,384 samples on the H200);
- :func:`sigmoid`: the overflow-safe sigmoid in one pass instead of five;
- :func:`layer_norm`, :func:`softmax`: a warp per row, one pass each (BST's LayerNorm, the
  attention's masked softmax, MMoE's and DIN's softmax took five to eight kernels);
- :func:`dice`: DIN's Dice in two reductions over the batch and one pass (from ten kernels);
- :func:`row_dot`: a product with one output per row (a model's last layer) with its bias
  and ReLU, a warp per row, where cuBLAS took a split-K GEMV, a reduction and a bias pass;
- :func:`concatenate`, :func:`split_last_slot`: a Concat of ``n`` inputs, and DIN's
  FusedReshapeConcat, in one kernel (per eight inputs) instead of a copy per input (and two
  more copies for FusedReshapeConcat's strided history and target rows);
- :func:`interaction`: DLRM's dot interaction (stack, Gram matrix, lower triangle, padding) in
  one kernel (``kernels/dense.cu``) instead of a batched GEMM and four copies; each thread sums
  a tile of 4 x 4 entries of the Gram matrix in registers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import cupy
import numpy as np

from hps_core.cuda import kernels
from hps_core.cuda.dense_defines import (
    CONCAT_INPUTS,
    DENSE_TEMPLATES,
    MOMENT_ROWS,
    dense_defines,
)

_MAX_STATIC_SHARED = 48 * 1024
_ELEMENTWISE_THREADS = 256


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
def _cross_kernel(low_rank: bool) -> Any:
    # DCN v2: y = xl U V is [B, D], b [D]; DCN v1: y = xl . w is [B, 1], b [D] after it.
    body = (
        "out = (float)x0 * ((float)y + (float)b) + (float)xl;"
        if low_rank
        else "out = (float)x0 * (float)y + (float)xl + (float)b;"
    )
    name = "hps_cross_v2" if low_rank else "hps_cross_v1"
    return cupy.ElementwiseKernel("X x0, Y y, B b, X xl", "X out", body, name)


def cross_combine(x0: Any, y: Any, bias: Any, xl: Any, low_rank: bool) -> Any:
    """One DCN cross layer after its products, in float32, in one pass.

    Args:
        x0: CuPy float32 ``[B, D]``, the cross network's input.
        y: the layer's product: ``xl @ U @ V`` ``[B, D]`` (``low_rank``, DCN v2) or
            ``xl @ w^T`` ``[B, 1]`` (DCN v1), float32 or float16.
        bias: ``[D]`` or ``[1, D]``, float32 or float16.
        xl: CuPy float32 ``[B, D]``, the layer's input.
        low_rank: DCN v2 (``x0 * (y + b) + xl``) rather than v1 (``x0 * y + xl + b``).

    Returns:
        A new float32 ``[B, D]`` array: the layer's output.
    """
    bias = bias.reshape(-1)
    rows, width = x0.shape
    arrays = (x0, y, bias, xl)
    if (
        low_rank
        and width % 4 == 0
        and all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)
        and all(a.data.ptr % 16 == 0 for a in arrays)
    ):
        out = cupy.empty_like(x0)
        n4 = rows * width // 4
        if n4:
            kernel = dense_function("cross_v2")
            blocks = min(-(-n4 // _ELEMENTWISE_THREADS), _sms() * 16)
            kernel(
                (blocks,), (_ELEMENTWISE_THREADS,),
                (x0, y, bias, xl, out, np.int64(n4), np.int32(width // 4)),
            )  # fmt: skip
        return out
    return _cross_kernel(low_rank)(x0, y, bias, xl)


@functools.cache
def _sigmoid_kernel() -> Any:
    # exp(-|x|) never overflows; the two branches are the same function rearranged.
    body = (
        "float v = (float)x; float e = expf(-fabsf(v));"
        " y = (Y)(v >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e));"
    )
    return cupy.ElementwiseKernel("X x", "Y y", body, "hps_sigmoid")


def sigmoid(x: Any, dtype: Any) -> Any:
    """``1 / (1 + exp(-x))`` in float32 without overflow, in one pass (as
    :class:`~hps_core.nn.layers.Sigmoid` on NumPy).

    Args:
        x: CuPy array, float32 or float16.
        dtype: the result's dtype.

    Returns:
        A new array of ``x``'s shape.
    """
    out = cupy.empty(x.shape, dtype=dtype)
    return _sigmoid_kernel()(x, out)


def _stage_stride(dim: int) -> int:
    """Floats per staged row: whole float4s with an odd count of them when ``dim % 4 == 0``
    (the kernel then loads four d at once), else an odd count; so that the rows one load
    instruction reads across a warp fall in different shared-memory banks."""
    if dim % 4 == 0:
        return dim if (dim // 4) % 2 else dim + 4
    return dim if dim % 2 else dim + 1


def _stage_bytes(n: int, dim: int) -> int:
    """Shared memory of one block: ``n`` vectors padded to a multiple of 4 rows."""
    return -(-n // 4) * 4 * _stage_stride(dim) * 4


def _threads(n: int, dim: int) -> int:
    """Whole warps, at most 4: one thread per 4 x 4 tile of the Gram matrix, or more when the
    vectors are long (staging them from global memory then needs the threads)."""
    row_tiles = -(-n // 4)
    tiles = row_tiles * (row_tiles + 1) // 2
    return min(128, -(-max(tiles, dim) // 32) * 32)


def interaction_fits(n: int, dim: int) -> bool:
    """Whether :func:`interaction` can stage ``n`` vectors of ``dim`` in shared memory."""
    return _stage_bytes(n, dim) <= _MAX_STATIC_SHARED


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
    kernel = dense_function(name)
    item = mlp.itemsize
    kernel(
        (rows,), (_threads(n, dim),),
        (mlp, np.int64(mlp.strides[0] // item), emb, np.int64(emb.strides[0] // item),
         np.int32(n), np.int32(dim), np.int32(_stage_stride(dim)), out, np.int64(width),
         np.bool_(tf32)),
        shared_mem=_stage_bytes(n, dim),
    )  # fmt: skip
    return out


def row_dot(x: Any, weight: Any, bias: Any | None, relu: bool, tf32: bool) -> Any:
    """``relu(x @ weight + bias)`` for a ``weight`` of one column, a warp per row.

    Each row's products are summed in float32 (each lane every 32nd term, then a tree over
    the warp), after rounding both operands to TF32 when ``tf32`` (as
    :func:`hps_core.nn.spec.precision.round_to_tf32`); the bias is added in float32 and the result
    rounded once to the operands' dtype.

    Args:
        x: CuPy ``[R, K]`` float32 or float16, unit column stride (rows may be strided).
        weight: ``[K, 1]`` (or ``[K]``) of the same dtype.
        bias: ``[1]`` (any shape of one value) of the same dtype, or None.
        relu: apply the ReLU.
        tf32: round the operands to TF32 first.

    Returns:
        A new C-contiguous ``[R, 1]`` array of ``x``'s dtype.

    Example:
        >>> y = row_dot(h, w_last, b_last, relu=False, tf32=True)  # doctest: +SKIP
    """
    rows, k = x.shape
    if weight.size != k or weight.dtype != x.dtype:
        raise ValueError(f"row_dot of {x.shape} {x.dtype} and {weight.shape} {weight.dtype}")
    if x.strides[1] != x.itemsize:
        x = cupy.ascontiguousarray(x)
    w = cupy.ascontiguousarray(weight).reshape(-1)
    out = cupy.empty((rows, 1), dtype=x.dtype)
    if rows == 0:
        return out
    item = x.itemsize
    ld = x.strides[0] // item
    quad_bytes = 4 * item
    quads = (
        k % 4 == 0 and ld % 4 == 0 and x.data.ptr % quad_bytes == 0 and w.data.ptr % quad_bytes == 0
    )
    name = "row_dot<float>" if x.dtype == np.float32 else "row_dot<unsigned short>"
    blocks, threads = _rows_grid(rows)
    dense_function(name)(
        (blocks,), (threads,),
        (x, np.int64(ld), np.int64(rows), np.int32(k), w,
         bias if bias is not None else np.uint64(0), out, np.bool_(bias is not None),
         np.bool_(relu), np.bool_(tf32), np.bool_(quads)),
    )  # fmt: skip
    return out


def _rows_grid(rows: int) -> tuple[int, int]:
    """Blocks and threads of a kernel with a warp per row (grid-stride over rows)."""
    sms = _sms()
    warps_per_block = _ELEMENTWISE_THREADS // 32
    return max(1, min(-(-rows // warps_per_block), sms * 32)), _ELEMENTWISE_THREADS


def _sms() -> int:
    return kernels.sm_count(cupy.cuda.Device().id)


def dense_function(name: str) -> Any:
    """The kernel ``name`` of ``kernels/dense.cu`` on the current device."""
    mod = kernels.module("dense", cupy.cuda.Device().id, DENSE_TEMPLATES, dense_defines())
    return mod.get_function(name)


def fits_rows(x: Any) -> bool:
    """Whether a row kernel (:func:`layer_norm`, :func:`softmax`) takes ``x``: float32,
    C-contiguous."""
    return x.dtype == np.float32 and x.flags.c_contiguous


def layer_norm(x: Any, gamma: Any, beta: Any, eps: float) -> Any:
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over the last axis (biased variance), a
    warp per row, as :class:`~hps_core.nn.layers.LayerNorm` computes it on NumPy.

    Args:
        x: CuPy float32 ``[..., N]``, C-contiguous (:func:`fits_rows`).
        gamma, beta: float32 ``[N]`` (any shape of ``N`` values), contiguous.
        eps: added to the variance.

    Returns:
        A new float32 array of ``x``'s shape.
    """
    width = x.shape[-1]
    rows = x.size // max(width, 1)
    out = cupy.empty_like(x)
    if rows:
        blocks, threads = _rows_grid(rows)
        dense_function("layer_norm")(
            (blocks,), (threads,),
            (x, gamma.reshape(-1), beta.reshape(-1), out, np.int64(rows), np.int32(width),
             np.float32(eps)),
        )  # fmt: skip
    return out


def softmax(x: Any, mask: Any | None = None, factor: float = 1.0, eps: float = 0.0) -> Any:
    """Softmax over the last axis, a warp per row; with ``mask``, HugeCTR's masked softmax
    (:func:`hps_core.nn.layers.attention.masked_softmax`).

    Args:
        x: CuPy float32, C-contiguous (:func:`fits_rows`): any shape, or the scores
            ``[B, H, Sf, St]`` when masked.
        mask: float32 ``[B, 1, Sf, St]`` of 1 and 0, C-contiguous, or None.
        factor: scale of the scores (masked only).
        eps: added to the denominator.

    Returns:
        A new float32 array of ``x``'s shape.
    """
    width = x.shape[-1]
    rows = x.size // max(width, 1)
    heads, steps = (x.shape[1], x.shape[2]) if mask is not None else (1, 1)
    out = cupy.empty_like(x)
    if rows:
        blocks, threads = _rows_grid(rows)
        dense_function("softmax_rows")(
            (blocks,), (threads,),
            (x, mask if mask is not None else np.uint64(0), out, np.int64(rows),
             np.int32(width), np.int32(heads), np.int32(steps), np.float32(factor),
             np.float32(eps)),
        )  # fmt: skip
    return out


_MOMENT_ROWS_PER_RANGE = 256
"""Rows one block of ``column_moments`` sums (about; at most ``_MOMENT_RANGES`` ranges)."""
_MOMENT_RANGES = 1024
_NULL = np.uint64(0)  # a kernel's null pointer argument


def column_moments(x: Any, count: Any = None, per_sample: int = 1) -> tuple[Any, Any]:
    """The mean and the mean square of each column of ``x`` over its real rows, in float32
    (two kernels, where CuPy's reductions over axis 0 took 30-35% of a DIN batch each).

    Args:
        x: CuPy float32 or float16 ``[rows, C]``, C-contiguous.
        count: for a padded batch (:class:`~hps_core.nn.spec.precision.PaddedBatch`), a CuPy
            int32 array whose first element is its number of real samples, read on the
            device (so the launches can be recorded in a CUDA graph and replayed for any
            number): only the first ``count[0] * per_sample`` rows count, and with none the
            means are 0. None: every row.
        per_sample: rows of ``x`` per sample.

    Returns:
        float32 ``[C]`` means and ``[C]`` means of squares.
    """
    rows, cols = x.shape
    count = _NULL if count is None else count
    ranges = max(1, min(_MOMENT_RANGES, -(-rows // _MOMENT_ROWS_PER_RANGE)))
    part = cupy.empty((2, ranges, cols), dtype=cupy.float32)
    mean = cupy.empty(cols, dtype=cupy.float32)
    square = cupy.empty(cols, dtype=cupy.float32)
    name = "float" if x.dtype == np.float32 else "unsigned short"
    dense_function(f"column_moments<{name}>")(
        (-(-cols // 32), ranges), (32, MOMENT_ROWS),
        (x, np.int64(rows), np.int32(cols), count, np.int64(per_sample), part),
    )  # fmt: skip
    dense_function("column_moments_finish")(
        (-(-cols // 128),), (128,),
        (part, np.int32(ranges), np.int32(cols), np.int64(rows), count, np.int64(per_sample),
         mean, square),
    )  # fmt: skip
    return mean, square


@functools.cache
def _dice_kernel() -> Any:
    body = (
        "float v = (float)x; float var = fmaxf(q - m * m, 0.0f);"  # rounding may make it < 0
        " float p = 1.0f / (1.0f + expf((m - v) / sqrtf(var + eps)));"
        " y = (Y)(p * v + (1.0f - p) * alpha * v);"
    )
    return cupy.ElementwiseKernel(
        "X x, float32 m, float32 q, float32 alpha, float32 eps", "Y y", body, "hps_dice"
    )


def dice(
    x: Any, alpha: float, eps: float, dtype: Any, count: Any = None, per_sample: int = 1
) -> Any:
    """DIN's Dice over the rows of ``x`` (:class:`~hps_core.nn.layers.PReLUDice`): the column
    means of ``x`` and of ``x * x`` over its real rows (:func:`column_moments`), then one pass
    over every row.

    Args:
        x: CuPy ``[rows, C]``, float32 or float16.
        alpha, eps: the layer's parameters.
        dtype: the result's dtype.
        count, per_sample: a padded batch's count of real samples (on the device) and the
            rows of ``x`` per sample: the means skip the padding (see :func:`column_moments`).

    Returns:
        A new ``[rows, C]`` array.
    """
    x = cupy.ascontiguousarray(x)
    out = cupy.empty(x.shape, dtype=dtype)
    if x.size == 0:
        return out
    mean, square = column_moments(x, count, per_sample)
    return _dice_kernel()(x, mean, square, np.float32(alpha), np.float32(eps), out)


def _rows(a: Any, lead: int) -> tuple[int, int] | None:
    """``a`` seen as rows: its first ``lead`` axes flattened into rows of the other axes.

    Returns:
        (row stride, row width) in elements, or None where a row is not contiguous or the
        rows are not evenly spaced.
    """
    expect = a.itemsize
    for axis in reversed(range(lead, a.ndim)):  # a row's own axes: C-contiguous
        if a.shape[axis] > 1 and a.strides[axis] != expect:
            return None
        expect *= a.shape[axis]
    width = expect // a.itemsize
    stride = span = None
    for axis in reversed(range(lead)):  # the leading axes: one even spacing
        if a.shape[axis] == 1:
            continue
        if span is not None and a.strides[axis] != span:
            return None
        stride = a.strides[axis] if stride is None else stride
        span = a.strides[axis] * a.shape[axis]
    stride = width * a.itemsize if stride is None else stride
    if stride < 0 or stride % a.itemsize:
        return None
    return stride // a.itemsize, width


def _concat_rows(
    arrays: Sequence[Any], lead: int, out: Any, per: int, group: int, first_row: int
) -> bool:
    """Launches of ``concat_rows`` (one per ``CONCAT_INPUTS`` inputs) filling the rows of
    ``out`` (C-contiguous, ``[rows, ...]``) from the rows of ``arrays`` (their first ``lead``
    axes flattened; row ``(o // per) * group + first_row + o % per`` for output row ``o``).

    Returns:
        False, having launched nothing, where an input's layout, dtype or alignment does not
        allow it (the caller then copies with CuPy).
    """
    item = out.itemsize
    spans: list[tuple[int, int, int]] = []  # bytes: the first row's address, stride, width
    for a in arrays:
        view = _rows(a, lead) if a.dtype == out.dtype else None
        if view is None:
            return False
        spans.append((a.data.ptr if view[1] else 0, view[0] * item, view[1] * item))
    # Whole 4-byte units where every address, stride and width allows them, else 2-byte ones.
    units = [
        u for u in (4, 2) if all(p % u == 0 and s % u == 0 and w % u == 0 for p, s, w in spans)
    ]
    if not units:
        return False
    unit = units[0]
    dtype, name = (np.uint32, "unsigned") if unit == 4 else (np.uint16, "unsigned short")
    rows = out.shape[0]
    total = sum(w for _, _, w in spans) // unit
    kernel = dense_function(f"concat_rows<{name}>")
    first = 0
    for start in range(0, len(spans), CONCAT_INPUTS):
        chunk = spans[start : start + CONCAT_INPUTS]
        pad = CONCAT_INPUTS - len(chunk)
        # Each input as a one-element array at its first row: the kernel's pointer argument
        # (an input of no width is never read: ``out`` stands in).
        sources = [
            cupy.ndarray((1,), dtype, memptr=a.data) if width else out
            for a, (_, _, width) in zip(arrays[start:], chunk, strict=False)
        ]
        sources += [out] * pad
        widths = [np.int32(w // unit) for _, _, w in chunk] + [np.int32(0)] * pad
        strides = [np.int64(s // unit) for _, s, _ in chunk] + [np.int64(0)] * pad
        units = rows * int(sum(widths))  # a thread per output unit (grid-stride)
        blocks = max(1, min(-(-units // _ELEMENTWISE_THREADS), _sms() * 32))
        kernel(
            (blocks,), (_ELEMENTWISE_THREADS,),
            (out, np.int64(rows), np.int64(total), np.int32(first), np.int64(per),
             np.int64(group), np.int64(first_row), np.int32(len(chunk)), *sources, *widths,
             *strides),
        )  # fmt: skip
        first += sum(w for _, _, w in chunk) // unit
    return True


def concatenate(arrays: Sequence[Any], axis: int) -> Any | None:
    """``cupy.concatenate(arrays, axis)`` in one kernel per eight inputs.

    Args:
        arrays: CuPy arrays of one dtype whose shapes differ only along ``axis`` (as the
            Concat layer checked).
        axis: the axis to concatenate along (``>= 1``).

    Returns:
        A new C-contiguous array, or None where an input's layout does not allow the kernel
        (each input's axes from ``axis`` on contiguous, its rows evenly spaced).

    Example:
        >>> concatenate([cupy.ones((4, 3)), cupy.zeros((4, 2))], axis=1).shape  # doctest: +SKIP
        (4, 5)
    """
    first = arrays[0]
    shape = list(first.shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    out = cupy.empty(shape, dtype=first.dtype)
    rows = int(np.prod(shape[:axis], dtype=np.int64))
    if out.size and not _concat_rows(arrays, axis, out.reshape(rows, -1), rows, 0, 0):
        return None
    return out


def split_last_slot(arrays: Sequence[Any]) -> tuple[Any, Any] | None:
    """DIN's FusedReshapeConcat (:class:`~hps_core.nn.layers.FusedReshapeConcat`): the
    ``[B, S, w_k]`` inputs concatenated along the width, slots ``0 .. S-2`` as rows
    ``[B * (S - 1), W]`` and slot ``S - 1`` as ``[B, W]``, in two kernels.

    Returns:
        (history, target), new C-contiguous arrays; or None as for :func:`concatenate`.
    """
    batch, slots = arrays[0].shape[:2]
    width = sum(a.shape[2] for a in arrays)
    dtype = arrays[0].dtype
    history = cupy.empty((batch * (slots - 1), width), dtype=dtype)
    target = cupy.empty((batch, width), dtype=dtype)
    if history.size == 0 and target.size == 0:
        return history, target
    if not _concat_rows(arrays, 2, history, slots - 1, slots, 0):
        return None
    _concat_rows(arrays, 2, target, 1, slots, slots - 1)
    return history, target
