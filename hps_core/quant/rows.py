"""Row codecs: one embedding row of ``dim`` float32 values as a fixed number of bytes.

Each :class:`StoragePrecision` has one row layout, described by :class:`RowFormat`. Every
encoded row is a multiple of 4 bytes long, so that in a table of encoded rows each row, and
the float32 scale and bias that follow its values, start 4-byte aligned: GPU kernels read
them as float32 (and the values as 32-bit words) without unaligned accesses, and the host
reads them as float32 views. The layouts, for ``d = dim`` and ``pad(n)`` = ``n`` rounded up
to a multiple of 4:

========= ===================================================== ======================
precision bytes of one row                                      row_bytes
========= ===================================================== ======================
fp32      ``d`` little-endian float32                           ``4 d``
fp16      ``d`` little-endian IEEE half, zero padding           ``pad(2 d)``
int8      ``d`` uint8 codes, zero padding, float32 scale, bias  ``pad(d) + 8``
fp8       ``d`` E4M3fn codes, zero padding, float32 scale       ``pad(d) + 4``
========= ===================================================== ======================

Quantisation, per row ``x``:

* **fp16**: ``x.astype(float16)``, round to nearest even. Magnitudes from 65520 up become
  ``+-inf`` (the cast's overflow, not a saturation); NaN stays NaN, ``+-inf`` stays ``+-inf``.
* **int8** (FBGEMM's row-wise ``Fused8BitRowwiseQuantizedSBFloat`` scheme): ``bias =
  min(x)``, ``scale = (max(x) - min(x)) / 255`` rounded to float32, ``q = rint((x - bias) /
  scale)`` (ties to even) clipped to ``[0, 255]``. A constant row has ``scale = 0`` and
  ``q = 0``. Decoding gives ``q * scale + bias`` rounded once to float32 (``bias`` exactly
  for a constant row). Differences from FBGEMM: FBGEMM multiplies by ``255 / (range +
  1e-8)`` rather than dividing by ``scale`` (its epsilon shifts codes of rows whose range is
  near 1e-8 and below), and it packs scale and bias right after the ``d`` codes, without
  padding.
* **fp8** (E4M3fn with a per-row scale): ``scale = max|x| / 448`` (float32 division), ``q =
  e4m3(x / scale)`` with round-to-nearest-even and saturation to ``+-448``
  (:func:`~hps_core.quant.e4m3.float_to_e4m3`). An all-zero row has ``scale = 1``; a row
  whose ``max|x| / 448`` is below float32's smallest normal (``2**-126``, i.e. ``max|x| <
  5.3e-36``) uses ``2**-126`` so that the division never meets a zero or subnormal scale
  (its values up to ``2**-136``, about 1.1e-41, then round to zero). Decoding gives
  ``e4m3_to_float(q) * scale`` in float32; it stays finite up to float32's largest value.

Arithmetic: int8 computes the range, the codes and the decoded values in float64, because in
float32 ``max - min`` and ``q * scale + bias`` overflow for rows spanning more than float32's
largest value (e.g. ``[-3e38, 3e38]``); every other step, and all of fp8, is float32.

Non-finite inputs (HugeCTR's float32 tables never hold them, but an update might):

* fp32 and fp16 store them as they are (fp16: NaN stays NaN, possibly with another payload).
* int8 and fp8 cannot represent them with a finite scale, and one of them would wreck the
  scale of the whole row anyway. A row holding any NaN or ``+-inf`` is stored with zero
  codes and a NaN scale (and NaN bias for int8), so it decodes to a row of NaN: the damage
  stays visible and confined to that row instead of being silently replaced by finite
  numbers.

Every step works row by row, so encoding a table chunk by chunk (:meth:`RowFormat.encode_into`
on slices of a preallocated buffer) gives exactly the bytes of encoding it whole, and the
padding bytes are always written as zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from hps_core.quant.e4m3 import E4M3_MAX, e4m3_to_float, float_to_e4m3


class StoragePrecision(str, Enum):
    """How the values of an embedding row are stored."""

    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"
    FP8 = "fp8"

    @classmethod
    def parse(cls, value: object) -> StoragePrecision:
        """The precision a configuration value names (exact, lower-case spelling).

        Args:
            value: a :class:`StoragePrecision`, or one of the strings ``"fp32"``, ``"fp16"``,
                ``"int8"``, ``"fp8"``.

        Returns:
            The member.

        Raises:
            ValueError: ``value`` names no precision; the message lists the allowed values.

        Example:
            >>> StoragePrecision.parse("int8")
            <StoragePrecision.INT8: 'int8'>
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for member in cls:
                if member.value == value:
                    return member
        allowed = ", ".join(f'"{m.value}"' for m in cls)
        raise ValueError(f"unknown storage precision {value!r}; expected one of {allowed}")


_ALIGN = 4
_SCALE_BYTES = 4
# Encoded scale/bias and fp16/fp32 values are little-endian whatever the host, so a host
# tier's files and shared memory mean the same on every machine.
_F32 = np.dtype("<f4")
_F16 = np.dtype("<f2")
_F32_MIN_NORMAL = np.float32(np.finfo(np.float32).tiny)
_INT8_LEVELS = 255.0
_BLOCK_VALUES = 1 << 16


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class RowFormat:
    """Layout and codec of one encoded embedding row (see the module docstring).

    Args:
        precision: a :class:`StoragePrecision` or its string value.
        dim: values per row (``embedding_vecsize``), at least 1.

    Example:
        >>> fmt = RowFormat(StoragePrecision.INT8, 3)
        >>> fmt.values_bytes, fmt.scale_offset, fmt.row_bytes
        (3, 4, 12)
        >>> rows = np.array([[0.0, 0.5, 2.55]], dtype=np.float32)
        >>> fmt.encode(rows)[0, :3].tolist()
        [0, 50, 255]
        >>> fmt.decode(fmt.encode(rows)).tolist()
        [[0.0, 0.5, 2.549999952316284]]
    """

    precision: StoragePrecision
    dim: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", StoragePrecision.parse(self.precision))
        if isinstance(self.dim, bool) or not isinstance(self.dim, int | np.integer):
            raise ValueError(f"dim must be an integer, got {self.dim!r}")
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        object.__setattr__(self, "dim", int(self.dim))

    @property
    def values_bytes(self) -> int:
        """Bytes of the ``dim`` encoded values, before any padding."""
        per_value = {
            StoragePrecision.FP32: 4,
            StoragePrecision.FP16: 2,
            StoragePrecision.INT8: 1,
            StoragePrecision.FP8: 1,
        }[self.precision]
        return per_value * self.dim

    @property
    def scale_offset(self) -> int | None:
        """Byte offset of the float32 scale in a row (4-byte aligned); ``None`` without one.

        int8 stores its float32 bias right after the scale (``scale_offset + 4``).
        """
        if self.precision in (StoragePrecision.INT8, StoragePrecision.FP8):
            return _round_up(self.values_bytes, _ALIGN)
        return None

    @property
    def row_bytes(self) -> int:
        """Bytes of one encoded row, a multiple of 4 (values, padding, scale[, bias])."""
        scalars = {StoragePrecision.INT8: 2, StoragePrecision.FP8: 1}.get(self.precision, 0)
        return _round_up(self.values_bytes, _ALIGN) + scalars * _SCALE_BYTES

    @property
    def row_words(self) -> int:
        """32-bit words of one encoded row (``row_bytes / 4``; ``dim`` for fp32)."""
        return self.row_bytes // _ALIGN

    @property
    def stored_dtype(self) -> np.dtype:
        """Element type of a table of stored rows: float32 for fp32 (the rows themselves),
        else uint32 words of the encoded bytes. GPU caches and tables hold ``[n, row_words]``
        arrays of it, so that FP32 tables keep their float32 arrays unchanged."""
        return np.dtype(np.float32 if self.precision is StoragePrecision.FP32 else np.uint32)

    @property
    def is_identity(self) -> bool:
        """Whether stored rows are the float32 rows themselves (fp32)."""
        return self.precision is StoragePrecision.FP32

    def __str__(self) -> str:
        return f"RowFormat({self.precision.value}, dim={self.dim})"

    # ------------------------------------------------------------------ checks

    def _check_rows(self, rows: object, name: str = "rows") -> np.ndarray:
        if not isinstance(rows, np.ndarray):
            raise ValueError(f"{name} must be a NumPy array, got {type(rows).__name__}")
        if rows.dtype != np.float32:
            raise ValueError(f"{name} must be float32, got dtype {rows.dtype}")
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise ValueError(f"{name} must have shape (n, {self.dim}) for {self}, got {rows.shape}")
        return rows

    def _check_encoded(self, encoded: object, name: str = "encoded") -> np.ndarray:
        if not isinstance(encoded, np.ndarray):
            raise ValueError(f"{name} must be a NumPy array, got {type(encoded).__name__}")
        if encoded.dtype != np.uint8:
            raise ValueError(f"{name} must be uint8, got dtype {encoded.dtype}")
        if encoded.ndim != 2:
            raise ValueError(
                f"{name} must have shape (n, {self.row_bytes}) for {self}, got {encoded.shape}"
            )
        if encoded.shape[1] != self.row_bytes:
            raise ValueError(
                f"{name} has rows of {encoded.shape[1]} bytes but {self} rows have "
                f"{self.row_bytes} bytes"
            )
        return encoded

    @staticmethod
    def _check_writeable(out: np.ndarray, name: str) -> None:
        if not out.flags.writeable:
            raise ValueError(f"{name} is read-only")

    # ------------------------------------------------------------------ codec

    def encode(self, rows: np.ndarray) -> np.ndarray:
        """Encode float32 rows into a new buffer.

        Args:
            rows: float32 ``[n, dim]`` (any strides).

        Returns:
            uint8 ``[n, row_bytes]``.

        Raises:
            ValueError: ``rows`` is not a float32 array of shape ``(n, dim)``.

        Example:
            >>> RowFormat("fp16", 3).encode(np.ones((2, 3), dtype=np.float32)).shape
            (2, 8)
        """
        rows = self._check_rows(rows)
        out = np.empty((rows.shape[0], self.row_bytes), dtype=np.uint8)
        self._blocks(self._encode, rows, out)
        return out

    def encode_into(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Encode float32 rows into a preallocated buffer (e.g. a slice of shared memory).

        Writes every byte of ``out``, padding included (as zeros). Encoding a table in
        chunks gives the same bytes as encoding it at once, so a caller can stream a sparse
        file into its encoded table without holding the float32 table in memory.

        Args:
            rows: float32 ``[n, dim]`` (any strides).
            out: writeable uint8 ``[n, row_bytes]`` (any strides).

        Raises:
            ValueError: ``rows`` or ``out`` has the wrong dtype or shape, or ``out`` is
                read-only.

        Example:
            >>> fmt = RowFormat("fp8", 2)
            >>> table = np.zeros((4, fmt.row_bytes), dtype=np.uint8)
            >>> fmt.encode_into(np.full((2, 2), 3.0, dtype=np.float32), table[2:])
            >>> fmt.decode(table)[2:].tolist()
            [[3.0, 3.0], [3.0, 3.0]]
        """
        rows = self._check_rows(rows)
        out = self._check_encoded(out, "out")
        if out.shape[0] != rows.shape[0]:
            raise ValueError(
                f"out has {out.shape[0]} rows but rows has {rows.shape[0]}; they must match"
            )
        self._check_writeable(out, "out")
        self._blocks(self._encode, rows, out)

    def decode(self, encoded: np.ndarray) -> np.ndarray:
        """Decode rows to float32.

        Args:
            encoded: uint8 ``[n, row_bytes]`` (any strides).

        Returns:
            float32 ``[n, dim]``, C-contiguous.

        Raises:
            ValueError: ``encoded`` is not uint8 of shape ``(n, row_bytes)``.

        Example:
            >>> fmt = RowFormat("fp8", 2)
            >>> fmt.decode(fmt.encode(np.array([[1.0, -448.0]], dtype=np.float32))).tolist()
            [[1.0, -448.0]]
        """
        encoded = self._check_encoded(encoded)
        out = np.empty((encoded.shape[0], self.dim), dtype=np.float32)
        self._blocks(self._decode, encoded, out)
        return out

    def decode_into(self, encoded: np.ndarray, out: np.ndarray) -> None:
        """Decode rows into a preallocated float32 buffer (e.g. a lookup's output).

        Args:
            encoded: uint8 ``[n, row_bytes]`` (any strides).
            out: writeable float32 ``[n, dim]`` (any strides).

        Raises:
            ValueError: wrong dtype or shape of either array, or ``out`` is read-only.

        Example:
            >>> fmt = RowFormat("fp32", 2)
            >>> out = np.empty((1, 2), dtype=np.float32)
            >>> fmt.decode_into(fmt.encode(np.array([[1.5, 2.0]], dtype=np.float32)), out)
            >>> out.tolist()
            [[1.5, 2.0]]
        """
        encoded = self._check_encoded(encoded)
        out = self._check_rows(out, "out")
        if out.shape[0] != encoded.shape[0]:
            raise ValueError(
                f"out has {out.shape[0]} rows but encoded has {encoded.shape[0]}; they must match"
            )
        self._check_writeable(out, "out")
        self._blocks(self._decode, encoded, out)

    # ------------------------------------------------------------------ stored rows

    def encode_stored(self, rows: np.ndarray) -> np.ndarray:
        """Encode float32 rows as stored rows (:attr:`stored_dtype` ``[n, row_words]``).

        Args:
            rows: float32 ``[n, dim]``.

        Returns:
            A new C-contiguous array; for fp32 a copy of ``rows``.

        Example:
            >>> RowFormat("int8", 3).encode_stored(np.ones((2, 3), np.float32)).shape
            (2, 3)
        """
        return self.encode(rows).view(self.stored_dtype)

    def decode_stored(self, stored: np.ndarray) -> np.ndarray:
        """Decode stored rows (:attr:`stored_dtype` ``[n, row_words]``) to float32 ``[n, dim]``.

        Example:
            >>> fmt = RowFormat("fp16", 2)
            >>> fmt.decode_stored(fmt.encode_stored(np.array([[0.5, 2.0]], np.float32)))
            array([[0.5, 2. ]], dtype=float32)
        """
        stored = np.ascontiguousarray(stored)
        shape_ok = stored.ndim == 2 and stored.shape[1] == self.row_words
        if stored.dtype != self.stored_dtype or not shape_ok:
            raise ValueError(
                f"stored rows of {self} must be {self.stored_dtype} [n, {self.row_words}], got "
                f"{stored.dtype} {stored.shape}"
            )
        return self.decode(stored.view(np.uint8))

    # ------------------------------------------------------------------ per precision

    def _blocks(
        self, step: Callable[[np.ndarray, np.ndarray], None], src: np.ndarray, dst: np.ndarray
    ) -> None:
        """``step`` on blocks of about 64K values: the codecs make a dozen passes over their
        temporaries, which then stay in the CPU's cache (fp8 encodes 8x faster than in one
        pass over a large table; rows are independent, so the bytes are the same). fp32 and
        fp16 are one cast: whole."""
        if self.precision in (StoragePrecision.FP32, StoragePrecision.FP16):
            step(src, dst)
            return
        block = max(1, _BLOCK_VALUES // self.dim)
        for start in range(0, src.shape[0], block):
            step(src[start : start + block], dst[start : start + block])

    def _encode(self, rows: np.ndarray, out: np.ndarray) -> None:
        n = rows.shape[0]
        if n == 0:
            return
        values_end = self.values_bytes
        pad_end = _round_up(values_end, _ALIGN)
        precision = self.precision
        if precision is StoragePrecision.FP32:
            out[:] = _as_bytes(rows, _F32)
            return
        if precision is StoragePrecision.FP16:
            # Overflow to inf is the documented behaviour; silence NumPy's warning about it.
            with np.errstate(over="ignore"):
                out[:, :values_end] = _as_bytes(rows, _F16)
        elif precision is StoragePrecision.INT8:
            codes, scale, bias = _int8_encode(rows)
            out[:, :values_end] = codes
            out[:, pad_end : pad_end + 4] = _as_bytes(scale[:, None], _F32)
            out[:, pad_end + 4 : pad_end + 8] = _as_bytes(bias[:, None], _F32)
        else:
            codes, scale = _fp8_encode(rows)
            out[:, :values_end] = codes
            out[:, pad_end : pad_end + 4] = _as_bytes(scale[:, None], _F32)
        # Padding is zero, not whatever the buffer held: equal rows give equal bytes.
        out[:, values_end:pad_end] = 0

    def _decode(self, encoded: np.ndarray, out: np.ndarray) -> None:
        if encoded.shape[0] == 0:
            return
        values_end = self.values_bytes
        precision = self.precision
        if precision is StoragePrecision.FP32:
            out[:] = _from_bytes(encoded[:, :values_end], _F32)
            return
        if precision is StoragePrecision.FP16:
            out[:] = _from_bytes(encoded[:, :values_end], _F16)
            return
        offset = self.scale_offset
        assert offset is not None
        scale = _from_bytes(encoded[:, offset : offset + 4], _F32)
        codes = encoded[:, :values_end]
        if precision is StoragePrecision.INT8:
            bias = _from_bytes(encoded[:, offset + 4 : offset + 8], _F32)
            # q * scale is exact in float64 (8 by 24 significant bits) and cannot overflow;
            # the sum is rounded to float64 then to float32.
            decoded = codes.astype(np.float64)
            decoded *= scale.astype(np.float64)
            decoded += bias.astype(np.float64)
            out[:] = decoded
        else:
            np.multiply(e4m3_to_float(codes), scale, out=out)


def _as_bytes(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` cast to ``dtype``, as uint8 ``[n, k * itemsize]``."""
    cast = np.ascontiguousarray(values, dtype=dtype)
    return cast.view(np.uint8).reshape(cast.shape[0], -1)


def _from_bytes(raw: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """uint8 ``[n, k * itemsize]`` read as native ``[n, k]`` values of ``dtype``."""
    values = np.ascontiguousarray(raw).view(dtype)
    return values.astype(dtype.newbyteorder("="), copy=False)


def _int8_encode(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, scale and bias of FBGEMM's row-wise 8-bit scheme (module docstring)."""
    lo = rows.min(axis=1)
    hi = rows.max(axis=1)
    # min and max propagate NaN, and an inf shows in one of them: one test per row.
    finite = np.isfinite(lo) & np.isfinite(hi)
    lo64 = lo.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        # In float64 the range of any finite float32 row is finite, and /255 brings it back
        # into float32's range.
        scale = ((hi.astype(np.float64) - lo64) / _INT8_LEVELS).astype(np.float32)
    # Codes use the stored float32 scale, so decoding reproduces what was quantised. A
    # constant row (scale 0) and a non-finite one divide by 1 instead: their codes are 0.
    divisor = np.where(finite & (scale > 0), scale.astype(np.float64), 1.0)
    shifted = rows.astype(np.float64)
    shifted -= np.where(finite, lo64, 0.0)[:, None]
    shifted /= divisor[:, None]
    np.rint(shifted, out=shifted)
    np.clip(shifted, 0.0, _INT8_LEVELS, out=shifted)
    shifted[~finite] = 0.0
    codes = shifted.astype(np.uint8)
    bias = lo.copy()
    scale[~finite] = np.nan
    bias[~finite] = np.nan
    return codes, scale, bias


def _fp8_encode(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """E4M3 codes and float32 scale of each row (module docstring)."""
    amax = np.abs(rows).max(axis=1)
    finite = np.isfinite(amax)
    scale = amax / np.float32(E4M3_MAX)
    # An all-zero row keeps scale 1; a tiny row takes the smallest normal float32 so that
    # x / scale neither divides by zero nor by a subnormal that lost its precision.
    scale = np.where(amax == 0, np.float32(1.0), np.maximum(scale, _F32_MIN_NORMAL))
    scale = np.where(finite, scale, np.float32(np.nan)).astype(np.float32)
    divisor = np.where(finite, scale, np.float32(1.0))
    scaled = rows / divisor[:, None]
    scaled[~finite] = 0.0
    return float_to_e4m3(scaled), scale
