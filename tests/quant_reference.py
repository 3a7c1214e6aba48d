"""Independent references of the row codecs of :mod:`hps_core.quant` (encoded bytes and
decoded rows), shared by the codec tests and by the tests of every tier that stores rows
(host tier, GPU caches and tables, the GPU pipeline).

References: NumPy's float16 cast (fp16); a row-by-row float64 version of FBGEMM's row-wise
8-bit formula written here (int8); ``ml_dtypes.float8_e4m3fn`` for the E4M3 element
conversions (fp8).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from hps_core.quant import RowFormat, StoragePrecision

F32_TINY = float(np.finfo(np.float32).tiny)  # 2**-126, the smallest normal float32


def f32_bytes(value: float) -> bytes:
    return np.array([value], dtype="<f4").tobytes()


def padded(values: bytes, fmt: RowFormat) -> bytes:
    return values + bytes(-len(values) % 4)


def reference_fp16(fmt: RowFormat, rows: np.ndarray) -> tuple[bytes, np.ndarray]:
    with np.errstate(over="ignore"):
        half = rows.astype("<f2")
    encoded = b"".join(padded(row.tobytes(), fmt) for row in half)
    return encoded, half.astype(np.float32)


def reference_int8_row(row: np.ndarray) -> tuple[np.ndarray, np.float32, np.float32]:
    """FBGEMM's row-wise formula in float64 Python scalars, one row at a time."""
    lo, hi = float(row.min()), float(row.max())
    scale = np.float32((hi - lo) / 255.0)
    if scale == 0:
        codes = np.zeros(row.size, dtype=np.uint8)
    else:
        exact = [(float(x) - lo) / float(scale) for x in row]
        codes = np.clip(np.rint(exact), 0, 255).astype(np.uint8)
    return codes, scale, np.float32(lo)


def reference_int8(fmt: RowFormat, rows: np.ndarray) -> tuple[bytes, np.ndarray]:
    encoded, decoded = [], []
    for row in rows:
        codes, scale, bias = reference_int8_row(row)
        encoded.append(padded(codes.tobytes(), fmt) + f32_bytes(scale) + f32_bytes(bias))
        decoded.append(
            np.array([float(q) * float(scale) + float(bias) for q in codes], dtype=np.float32)
        )
    return b"".join(encoded), np.array(decoded, dtype=np.float32).reshape(rows.shape)


def reference_fp8_scale(row: np.ndarray) -> np.float32:
    amax = np.float32(np.abs(row).max())
    if amax == 0:
        return np.float32(1.0)
    return max(amax / np.float32(448.0), np.float32(F32_TINY))


def e4m3_reference(values: np.ndarray) -> np.ndarray:
    """ml_dtypes' cast, made saturating: it turns overflow into NaN (E4M3fn has no inf), so
    clip first (clipping to 448 before rounding gives the same as saturating after)."""
    return np.clip(values, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def reference_fp8(fmt: RowFormat, rows: np.ndarray) -> tuple[bytes, np.ndarray]:
    encoded, decoded = [], []
    for row in rows:
        scale = reference_fp8_scale(row)
        codes = e4m3_reference(row / scale)
        encoded.append(padded(codes.tobytes(), fmt) + f32_bytes(scale))
        decoded.append(codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale)
    return b"".join(encoded), np.array(decoded, dtype=np.float32).reshape(rows.shape)


def reference(fmt: RowFormat, rows: np.ndarray) -> tuple[bytes, np.ndarray]:
    """(encoded bytes of all rows, decoded float32 rows) by the reference of the precision."""
    if fmt.precision is StoragePrecision.FP32:
        return rows.astype("<f4").tobytes(), rows.copy()
    if fmt.precision is StoragePrecision.FP16:
        return reference_fp16(fmt, rows)
    if fmt.precision is StoragePrecision.INT8:
        return reference_int8(fmt, rows)
    return reference_fp8(fmt, rows)


def reference_stored(fmt: RowFormat, rows: np.ndarray) -> np.ndarray:
    """The stored rows (``fmt.stored_dtype`` ``[n, row_words]``) of float32 ``rows``."""
    encoded, _ = reference(fmt, np.asarray(rows, dtype=np.float32).reshape(-1, fmt.dim))
    return np.frombuffer(encoded, np.uint8).view(fmt.stored_dtype).reshape(-1, fmt.row_words)


def reference_decoded(fmt: RowFormat, rows: np.ndarray) -> np.ndarray:
    """What a tier storing ``rows`` in ``fmt`` answers for them: float32 ``[n, dim]``."""
    return reference(fmt, np.asarray(rows, dtype=np.float32).reshape(-1, fmt.dim))[1]
