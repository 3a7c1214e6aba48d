"""64-bit key mixing shared by the host tier and the GPU cache, and HugeCTR's partition hash.

``mix64`` is the SplitMix64 finaliser: a bijection on 64-bit integers that spreads any key
set (dense ids 0..N-1, Criteo-style hashes, negative keys) evenly over the 64-bit range. Because
it is a bijection, two keys collide after mixing only if they are equal, so structures that
store mixed keys never need to store the original key as well.

``partition_of`` is HugeCTR's key-to-partition hash of its volatile databases
(``HCTR_HPS_KEY_TO_PART_INDEX_``): the Redis tier lays tables out by it, the update overlay
bounds its partitions by it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
# Inverses of the multipliers modulo 2**64, for ``unmix64``.
_M1_INV = np.uint64(0x96DE1B173F119089)
_M2_INV = np.uint64(0x319642B2D24D8EC3)


def mix64(keys: Any, xp: Any = np) -> Any:
    """Mix int64 keys into well-spread uint64 hashes (bijective).

    Args:
        keys: integer array (any shape) of NumPy or CuPy, int64 or uint64.
        xp: the array module of ``keys`` (``numpy`` or ``cupy``).

    Returns:
        A new uint64 array of the same shape.

    Example:
        >>> mix64(np.array([0, 1, -1], dtype=np.int64)).dtype
        dtype('uint64')
    """
    z = xp.asarray(keys).view(xp.uint64) if keys.dtype == xp.int64 else xp.asarray(keys, xp.uint64)
    z = z ^ (z >> np.uint64(30))
    z = z * _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def _unshift_xor(z: Any, shift: int) -> Any:
    # Invert z ^= z >> shift by re-applying it until all 64 bits are recovered.
    s = np.uint64(shift)
    out = z.copy()
    for _ in range(64 // shift):
        out = z ^ (out >> s)
    return out


def unmix64(hashes: Any, xp: Any = np) -> Any:
    """Invert :func:`mix64`: recover the int64 keys from their hashes.

    Args:
        hashes: uint64 array produced by ``mix64``.
        xp: the array module of ``hashes``.

    Returns:
        An int64 array of the original keys.
    """
    z = _unshift_xor(xp.asarray(hashes, xp.uint64), 31)
    z = z * _M2_INV
    z = _unshift_xor(z, 27)
    z *= _M1_INV
    z = _unshift_xor(z, 30)
    return z.view(xp.int64)


def partition_of(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """HugeCTR's partition of each key: ``rrxmrrxmsx_0(uint64(key)) % num_partitions``.

    Args:
        keys: int64 ``[n]``.
        num_partitions: partitions of the table (at least 1).

    Returns:
        int64 ``[n]`` partition indices.

    Example:
        >>> partition_of(np.array([0, 1, -1], np.int64), 16).tolist()  # doctest: +SKIP
    """
    x = np.ascontiguousarray(keys, dtype="<i8").view(np.uint64).copy()

    def rotr(v: np.ndarray, n: int) -> np.ndarray:
        return (v >> np.uint64(n)) | (v << np.uint64(64 - n))

    # NumPy's uint64 array arithmetic wraps modulo 2**64, as the C++ does.
    x ^= rotr(x, 25) ^ rotr(x, 50)
    x *= np.uint64(0xA24BAED4963EE407)
    x ^= rotr(x, 24) ^ rotr(x, 49)
    x *= np.uint64(0x9FB21C651E98DF25)
    x ^= x >> np.uint64(28)
    return (x % np.uint64(num_partitions)).astype(np.int64)
