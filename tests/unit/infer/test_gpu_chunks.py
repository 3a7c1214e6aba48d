"""When the GPU pipeline cuts a host batch into chunks, and how large they are (no GPU needed)."""

from __future__ import annotations

import pytest

from hps_core.infer.gpu import chunks
from hps_core.infer.gpu.chunks import chunk_samples

MB = 1 << 20


@pytest.mark.parametrize(
    ("key_bytes", "samples", "expected"),
    [
        (26 * 8 * 65536, 65536, 16384),  # the one-hot MLPerf DLRM: 13.6 MB, 4 MB a chunk
        (8 * MB, 65536, 32768),  # just large enough: two chunks
        (8 * MB - 1, 65536, None),  # too few keys to gain from chunks
        (64 * MB, 16384, 4096),  # many keys a sample: the smallest chunk
        (64 * MB, 8191, None),  # not two of the smallest chunks
        (28 * MB, 16384, 4096),  # DLRM-v2's 16,384 samples
    ],
)
def test_chunks_take_about_a_set_size_of_keys_in_a_power_of_two_samples(
    key_bytes: int, samples: int, expected: int | None
) -> None:
    got = chunk_samples(key_bytes, samples, batch_dependent=False, dynamic_caches=False)
    assert got == expected
    if got is not None:
        assert got & (got - 1) == 0 and got >= chunks._MIN_CHUNK_SAMPLES and got < samples
        # About the set size, never more than twice it (a power of two rounds down), unless
        # the smallest chunk holds more.
        per_chunk = got * key_bytes // samples
        assert per_chunk <= 2 * chunks._CHUNK_KEY_BYTES or got == chunks._MIN_CHUNK_SAMPLES


def test_batch_statistics_and_dynamic_caches_keep_a_batch_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    large = (64 * MB, 65536)
    assert chunk_samples(*large, batch_dependent=True, dynamic_caches=False) is None
    assert chunk_samples(*large, batch_dependent=False, dynamic_caches=True) is None
    monkeypatch.setattr(chunks, "_CHUNKS_WITH_DYNAMIC_CACHES", True)
    assert chunk_samples(*large, batch_dependent=False, dynamic_caches=True) == 4096
