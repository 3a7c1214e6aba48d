"""Whether a host batch runs as chunks of samples, and how many samples a chunk takes.

A batch with many keys spends as long staging them (a host memory copy) as the GPU spends
scoring it; cut into chunks, the host stages chunk ``i + 1`` while the GPU scores chunk ``i``
(``GpuRankingPipeline._predict_chunks``, on two lanes of buckets). The settings below (``_``
names, which benchmarks and tests set) decide when that pays.
"""

from __future__ import annotations

_CHUNKED_KEY_BYTES = 8 << 20
"""From this many bytes of keys on, a host batch runs as chunks of samples, pipelined: the
host stages the next chunk while the GPU scores the last one)..."""
_CHUNKS_WITH_DYNAMIC_CACHES = False
"""... unless a table has a dynamic cache: each chunk then looks up, reads its misses and
inserts them alone. With each chunk copied on the copy stream and inserted right after its
lookup (e2a9b18, H200, ``gpucacheper`` 0.2, fresh batches, ``ranking_kernel_profile.py``), the
one-hot DLRM's batch of 65,536 (FP16 storage, FP32 dense) took 9.96 ms in chunks of 16,384
against 10.45 whole, but DLRM-v2's of 16,384 (TF32), whose misses fill PCIe, 11.64 in chunks of
4,096 against 9.45 whole."""
_CHUNK_KEY_BYTES = 4 << 20
"""About this many bytes of keys per chunk (a power of two samples)..."""
_MIN_CHUNK_SAMPLES = 4096
"""...and at least this many samples, so that the dense network's products stay efficient."""


def chunk_samples(
    key_bytes: int, samples: int, batch_dependent: bool, dynamic_caches: bool
) -> int | None:
    """Samples per chunk of a host batch, or None to run it whole.

    A batch is cut when it has ``_CHUNKED_KEY_BYTES`` of keys or more and at least two chunks
    of ``_MIN_CHUNK_SAMPLES``, its network's layers see each sample alone (DIN's Dice takes
    statistics over the batch) and no table has a dynamic cache (``_CHUNKS_WITH_DYNAMIC_CACHES``);
    a chunk then takes about ``_CHUNK_KEY_BYTES`` of keys, a power of two samples, at least
    ``_MIN_CHUNK_SAMPLES``.

    Args:
        key_bytes: bytes of the batch's keys, every table.
        samples: its samples.
        batch_dependent: a layer of the network takes statistics over the batch.
        dynamic_caches: a table has a dynamic GPU cache.

    Returns:
        Samples per chunk (the last chunk may hold fewer), or None.

    Example:
        >>> chunk_samples(26 * 8 * 65536, 65536, False, False)  # the one-hot DLRM's 13.6 MB
        16384
        >>> chunk_samples(26 * 8 * 65536, 65536, False, True) is None
        True
    """
    if (
        batch_dependent
        or (dynamic_caches and not _CHUNKS_WITH_DYNAMIC_CACHES)
        or key_bytes < _CHUNKED_KEY_BYTES
        or samples < 2 * _MIN_CHUNK_SAMPLES
    ):
        return None
    per_chunk = max(samples * _CHUNK_KEY_BYTES // key_bytes, 1)
    return max(_MIN_CHUNK_SAMPLES, 1 << (per_chunk.bit_length() - 1))
