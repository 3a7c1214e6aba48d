"""Checks and conversions of the arrays handed to a cache.

Every message names the cache and the argument, e.g. ``cache 'dcn.t0': values must have shape
(3, 16), got (3, 8)``.
"""

from __future__ import annotations

from typing import Any

from hps_core.quant import RowFormat


def as_keys(keys: Any, xp: Any, where: str) -> Any:
    """Return ``keys`` as a C-contiguous 1-D int64 array of ``xp``.

    Unsigned 64-bit keys are reinterpreted bit for bit (HugeCTR stores both as 64-bit
    identifiers); narrower integers are widened.

    Args:
        keys: 1-D integer array or sequence.
        xp: the cache's array module.
        where: the cache's name for error messages.

    Returns:
        int64 array of ``xp`` (``keys`` itself when it already is one).

    Raises:
        TypeError: the keys are not integers.
        ValueError: the keys are not one-dimensional.
    """
    arr = xp.asarray(keys)
    if arr.ndim != 1:
        raise ValueError(f"{where}: keys must be one-dimensional, got shape {tuple(arr.shape)}")
    if arr.size == 0:
        return xp.empty(0, dtype=xp.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{where}: keys must be integers, got dtype {arr.dtype}")
    if arr.dtype == xp.uint64:
        arr = arr.view(xp.int64)
    return xp.ascontiguousarray(arr, dtype=xp.int64)


def as_rows(values: Any, n: int, dim: int, xp: Any, where: str) -> Any:
    """Return ``values`` as a C-contiguous float32 ``[n, dim]`` array of ``xp``.

    Args:
        values: floating-point array, one row per key.
        n: number of keys.
        dim: embedding width of the cache.
        xp: the cache's array module.
        where: the cache's name for error messages.

    Returns:
        float32 array of ``xp``.

    Raises:
        TypeError: the values are not floating point.
        ValueError: the shape is not ``(n, dim)``.
    """
    arr = xp.asarray(values)
    if n == 0 and arr.size == 0:
        return xp.empty((0, dim), dtype=xp.float32)
    if tuple(arr.shape) != (n, dim):
        raise ValueError(f"{where}: values must have shape {(n, dim)}, got {tuple(arr.shape)}")
    if arr.dtype.kind != "f":
        raise TypeError(f"{where}: values must be floating point, got dtype {arr.dtype}")
    return xp.ascontiguousarray(arr, dtype=xp.float32)


def as_stored(values: Any, n: int, row_format: RowFormat, xp: Any, where: str) -> Any:
    """Return ``values`` as C-contiguous stored rows of ``row_format``, an array of ``xp``.

    A cache stores rows as its tiers do (:attr:`RowFormat.stored_dtype` ``[n, row_words]``):
    float32 vectors for fp32 (any floating type is converted, as :func:`as_rows`), else the
    uint32 words of the encoded rows, which only :meth:`RowFormat.encode_stored` or a tier's
    stored rows produce (a float row would be taken as codes).

    Args:
        values: one stored row per key.
        n: number of keys.
        row_format: the cache's row format.
        xp: the cache's array module.
        where: the cache's name for error messages.

    Returns:
        An array of ``xp``.

    Raises:
        TypeError: the dtype is not the stored rows' dtype (or, fp32, not floating point).
        ValueError: the shape is not ``(n, row_words)``.
    """
    if row_format.is_identity:
        return as_rows(values, n, row_format.dim, xp, where)
    arr = xp.asarray(values)
    shape = (n, row_format.row_words)
    if n == 0 and arr.size == 0:
        return xp.empty(shape, dtype=row_format.stored_dtype)
    if tuple(arr.shape) != shape:
        raise ValueError(
            f"{where}: stored {row_format.precision.value} rows must have shape {shape}, got "
            f"{tuple(arr.shape)}"
        )
    if arr.dtype != row_format.stored_dtype:
        raise TypeError(
            f"{where}: stored {row_format.precision.value} rows must be "
            f"{row_format.stored_dtype} words (RowFormat.encode_stored), got dtype {arr.dtype}"
        )
    return xp.ascontiguousarray(arr)


def output_rows(out: Any, n: int, dim: int, xp: Any, where: str) -> Any:
    """Return the buffer a query writes into: ``out`` after checks, or new zeros.

    Args:
        out: caller's buffer or ``None``.
        n: number of keys.
        dim: embedding width of the cache.
        xp: the cache's array module.
        where: the cache's name for error messages.

    Returns:
        ``out`` itself, or a zero-filled float32 ``[n, dim]`` array of ``xp``.

    Raises:
        ValueError: ``out`` is not a C-contiguous float32 ``(n, dim)`` array of ``xp``.
    """
    if out is None:
        return xp.zeros((n, dim), dtype=xp.float32)
    if not isinstance(out, xp.ndarray):
        raise ValueError(f"{where}: out must be a {xp.__name__} array, got {type(out).__name__}")
    if tuple(out.shape) != (n, dim) or out.dtype != xp.float32:
        raise ValueError(
            f"{where}: out must be float32 of shape {(n, dim)}, "
            f"got {out.dtype} of shape {tuple(out.shape)}"
        )
    if not out.flags.c_contiguous:
        raise ValueError(f"{where}: out must be C-contiguous")
    return out
