"""FP8 E4M3 ("fn" variant) element conversions in vectorised NumPy.

E4M3fn has 1 sign bit, 4 exponent bits (bias 7) and 3 mantissa bits, no infinities, and one
NaN pattern per sign (``0x7F`` / ``0xFF``). Normal values are ``2**(E-7) * (1 + M/8)`` for
``E`` in 1..15 (``E = 15, M = 7`` is NaN), so the largest finite value is
``2**8 * 1.75 = 448``; subnormals (``E = 0``) are ``M * 2**-9``.

:func:`float_to_e4m3` rounds to nearest, ties to even, and saturates finite values and
infinities to ``+-448``: CUDA's ``__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)``, so a
GPU kernel using that intrinsic writes the same bytes as this module. :func:`e4m3_to_float`
is exact (every E4M3 value is a float32).
"""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0
"""The largest finite E4M3 value (``0x7E``)."""

E4M3_MAX_CODE = 0x7E
"""The magnitude code of :data:`E4M3_MAX`; ``0x7F`` is NaN."""

E4M3_NAN_CODE = 0x7F
"""The magnitude code of NaN (with the sign bit: ``0xFF``)."""

# float32 bit patterns used by the encoder.
_F32_ABS_MASK = np.uint32(0x7FFF_FFFF)
_F32_INF_BITS = np.uint32(0x7F80_0000)
# 2**-6, the smallest normal E4M3 value: below it E4M3 is subnormal (steps of 2**-9).
_E4M3_MIN_NORMAL_BITS = np.uint32((127 - 6) << 23)
# float32's exponent bias is 127, E4M3's is 7: subtracting 120 from the float32 exponent
# field gives the E4M3 one.
_REBIAS = np.uint32((127 - 7) << 23)
# float32 has 23 mantissa bits, E4M3 has 3: 20 bits are rounded away.
_DROPPED_BITS = 20
_HALF_MINUS_ONE = np.uint32((1 << (_DROPPED_BITS - 1)) - 1)


def _decode_table() -> np.ndarray:
    """The float32 value of each of the 256 codes, built from the bit fields."""
    codes = np.arange(256, dtype=np.uint32)
    sign = (codes >> 7) << 31
    exponent = (codes >> 3) & 0xF
    mantissa = codes & 0x7
    # Normal: rebias the exponent to float32's and put the 3 mantissa bits on top of its 23.
    normal = (sign | ((exponent + 120) << 23) | (mantissa << 20)).view(np.float32)
    # Subnormal: M * 2**-9, exact in float32 (M < 8).
    subnormal = np.where(sign != 0, -1.0, 1.0).astype(np.float32) * (
        mantissa.astype(np.float32) * np.float32(2.0**-9)
    )
    table = np.where(exponent == 0, subnormal, normal).astype(np.float32)
    # NaN keeps its sign bit (quiet NaN 0x7FC00000 / 0xFFC00000), as the codes do.
    nan = (exponent == 15) & (mantissa == 7)
    table.view(np.uint32)[nan] = sign[nan] | np.uint32(0x7FC0_0000)
    table.flags.writeable = False
    return table


E4M3_TO_FLOAT32 = _decode_table()
"""float32 value of every E4M3 code (index = code); read-only."""


def e4m3_to_float(codes: np.ndarray) -> np.ndarray:
    """Decode E4M3fn codes to float32 (exactly; NaN codes give NaN).

    Args:
        codes: uint8 array of any shape.

    Returns:
        float32 array of the same shape.

    Raises:
        ValueError: ``codes`` is not uint8.

    Example:
        >>> e4m3_to_float(np.array([0x00, 0x01, 0x38, 0x7E, 0xFE], dtype=np.uint8)).tolist()
        [0.0, 0.001953125, 1.0, 448.0, -448.0]
    """
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise ValueError(f"E4M3 codes must be uint8, got dtype {codes.dtype}")
    return E4M3_TO_FLOAT32[codes]


def float_to_e4m3(values: np.ndarray) -> np.ndarray:
    """Encode float32 values as E4M3fn codes, round to nearest even, saturating.

    Finite values beyond ``+-448`` and infinities become ``+-448`` (``0x7E`` / ``0xFE``) as
    with CUDA's ``__NV_SATFINITE``; NaN becomes ``0x7F`` with the input's sign bit; ``-0.0``
    stays ``0x80``. Magnitudes below ``2**-6`` go to E4M3 subnormals (steps of ``2**-9``),
    half of the smallest one (``2**-10``) and below to zero.

    Args:
        values: float32 array of any shape.

    Returns:
        uint8 array of the same shape.

    Raises:
        ValueError: ``values`` is not float32.

    Example:
        >>> x = np.array([1.0, 1.0625, 1.1875, 500.0, -np.inf, 2.0**-10], dtype=np.float32)
        >>> [hex(c) for c in float_to_e4m3(x)]
        ['0x38', '0x38', '0x3a', '0x7e', '0xfe', '0x0']
    """
    values = np.asarray(values)
    if values.dtype != np.float32:
        raise ValueError(f"values must be float32, got dtype {values.dtype}")
    bits = values.view(np.uint32)
    sign = ((bits >> 24) & 0x80).astype(np.uint8)
    magnitude = bits & _F32_ABS_MASK

    # Normal range: drop 20 mantissa bits with round-half-to-even. Adding 0x7FFFF plus the
    # lowest kept bit and truncating rounds up exactly when the dropped part is above half,
    # or exactly half with an odd kept bit; a carry out of the mantissa bumps the exponent,
    # as it should. Values below 2**-6 would underflow the rebias; they are masked away.
    lowest_kept = (magnitude >> _DROPPED_BITS) & np.uint32(1)
    rebiased = magnitude - np.minimum(magnitude, _REBIAS)
    normal = (rebiased + _HALF_MINUS_ONE + lowest_kept) >> _DROPPED_BITS

    # Subnormal range: the code is the number of 2**-9 steps. |x| * 512 is exact (a power of
    # two) and below 8, and rint rounds half to even; 8 steps is code 0x08 = 2**-6, the
    # smallest normal, so the boundary needs no special case. Larger magnitudes (and NaN)
    # are clamped to 2**-6 first so the multiply and the cast stay in range; they are
    # masked away below.
    absolute = np.minimum(magnitude, _E4M3_MIN_NORMAL_BITS).view(np.float32)
    subnormal = np.rint(absolute * np.float32(512.0)).astype(np.uint32)

    code = np.where(magnitude < _E4M3_MIN_NORMAL_BITS, subnormal, normal)
    # Saturate: anything that rounds past 448 (0x7F would read as NaN), and infinities.
    code = np.minimum(code, np.uint32(E4M3_MAX_CODE))
    code = np.where(magnitude > _F32_INF_BITS, np.uint32(E4M3_NAN_CODE), code)
    return code.astype(np.uint8) | sign
