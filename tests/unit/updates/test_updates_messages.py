"""HugeCTR's Kafka update format: encode/decode against a layout built by hand with
``struct``, and every kind of malformed message refused whole."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from hps_core.updates.messages import (
    BEACON_TOPIC,
    MalformedMessageError,
    decode_message,
    decode_update,
    encode_beacon,
    encode_message,
    iter_messages,
    parse_tag,
    rows_per_message,
    topic_for,
)
from hps_core.updates.producer import key_groups


def hugectr_payload(keys: list[int], vectors: list[list[float]], key_fmt: str = "<q") -> bytes:
    """What HugeCTR's KafkaMessageSink writes on x86: 'HCTR', value size, then key+value
    records, all little-endian, built independently of the code under test."""
    value_size = 4 * len(vectors[0]) if vectors else 8
    out = b"HCTR" + struct.pack("<I", value_size)
    for key, vector in zip(keys, vectors, strict=True):
        out += struct.pack(key_fmt, key) + struct.pack(f"<{len(vector)}f", *vector)
    return out


def test_prefix_is_hugectr_value_prefix():
    # HCTR_KAFKA_VALUE_PREFIX = 'H' | 'C' << 8 | 'T' << 16 | 'R' << 24, stored little-endian.
    prefix = ord("H") | ord("C") << 8 | ord("T") << 16 | ord("R") << 24
    assert encode_beacon()[:4] == struct.pack("<I", prefix) == b"HCTR"


@pytest.mark.parametrize("dim", [1, 3, 16])
def test_encode_matches_hand_built_layout(dim):
    rng = np.random.default_rng(dim)
    keys = np.array([0, -1, 2**62 + 5, 17], np.int64)
    vectors = rng.standard_normal((4, dim), dtype=np.float32)

    payload = encode_message(keys, vectors)

    assert payload == hugectr_payload(keys.tolist(), vectors.tolist())
    assert len(payload) == 8 + 4 * (8 + 4 * dim)


def test_decode_of_hand_built_layout_returns_exact_rows():
    vectors = [[1.5, -2.0], [0.0, 3.25], [-0.0, 1e-30]]
    payload = hugectr_payload([5, -9, 2**63 - 1], vectors)

    keys, decoded = decode_message(payload)

    assert keys.dtype == np.int64 and keys.tolist() == [5, -9, 2**63 - 1]
    assert decoded.dtype == np.float32 and decoded.shape == (3, 2)
    assert (
        decoded.view(np.uint32).tolist() == np.array(vectors, np.float32).view(np.uint32).tolist()
    )


def test_decoded_arrays_own_their_memory():
    payload = bytearray(hugectr_payload([1], [[2.0, 3.0]]))
    keys, vectors = decode_message(payload)
    payload[8:] = b"\xff" * (len(payload) - 8)  # the consumer reuses its buffer
    assert keys.tolist() == [1] and vectors.tolist() == [[2.0, 3.0]]
    vectors[0, 0] = 9.0  # writable, as tiers may normalise in place


def test_four_byte_keys_round_trip():
    payload = hugectr_payload([7, 2**32 - 1], [[1.0], [2.0]], key_fmt="<I")
    keys, vectors = decode_message(payload, key_bytes=4)
    assert keys.tolist() == [7, 2**32 - 1] and keys.dtype == np.int64
    assert encode_message(keys, vectors, key_bytes=4) == payload
    with pytest.raises(ValueError, match="2\\*\\*32"):
        encode_message(np.array([-1]), vectors[:1], key_bytes=4)


@pytest.mark.parametrize(("written", "read"), [("<I", 8), ("<q", 4)])
def test_a_body_whole_at_both_key_widths_is_read_as_the_width_it_was_written_in(written, read):
    # dim 2: records of 12 bytes (4-byte keys) and 16 (8-byte keys); 4 x 12 = 3 x 16, so
    # the length alone cannot tell the widths apart. Keys below 2**23 read as values are
    # subnormal floats, which is how the misreading shows (larger keys read as ordinary
    # floats: such a message is applied as it reads, as HugeCTR does).
    rng = np.random.default_rng(5)
    rows = 4 if written == "<I" else 3
    keys = rng.integers(1, 2**23, rows).tolist()
    vectors = rng.standard_normal((rows, 2)).astype(np.float32).tolist()
    payload = hugectr_payload(keys, vectors, key_fmt=written)
    assert (len(payload) - 8) % 12 == 0 and (len(payload) - 8) % 16 == 0
    with pytest.raises(
        MalformedMessageError,
        match=f"publisher's key width differs from this table's \\({read} bytes",
    ):
        decode_message(payload, key_bytes=read, expected_dim=2)
    got_keys, got_vectors = decode_message(payload, key_bytes=12 - read, expected_dim=2)
    assert got_keys.tolist() == keys
    np.testing.assert_array_equal(got_vectors, np.float32(vectors))


def test_a_row_of_tiny_values_in_a_body_whole_at_both_widths_is_kept_when_neither_reads_clean():
    # A genuine subnormal value cannot be told from key bytes; with subnormals in both
    # readings the configured width stands.
    tiny = float(np.finfo(np.float32).smallest_subnormal) * 3
    payload = hugectr_payload([1, 2, 3], [[tiny, 1.0], [0.5, tiny], [tiny, tiny]])
    keys, vectors = decode_message(payload, key_bytes=8, expected_dim=2)
    assert keys.tolist() == [1, 2, 3] and vectors[0, 0] == np.float32(tiny)


def test_one_genuine_tiny_value_does_not_make_a_message_misread():
    # 6 rows of 8-byte keys (96 bytes, also 8 records of 4-byte keys); one row holds a
    # subnormal value, as a trained table may: not the key bytes of a misread width.
    tiny = float(np.finfo(np.float32).smallest_subnormal) * 5
    vectors = [[0.25 * (i + 1), -0.5] for i in range(6)]
    vectors[3][1] = tiny
    payload = hugectr_payload(list(range(101, 107)), vectors)
    keys, got = decode_message(payload, key_bytes=8, expected_dim=2)
    assert keys.tolist() == list(range(101, 107)) and got[3, 1] == np.float32(tiny)


def test_beacon_decodes_to_no_rows():
    message = decode_update(encode_beacon())
    assert message.is_beacon and message.keys.shape == (0,) and message.vectors.shape == (0, 2)
    assert BEACON_TOPIC == "__hps_beacon"


MALFORMED = [
    (None, "tombstone"),
    (b"HCT", "shorter than the 8-byte header"),
    (b"XCTR" + struct.pack("<I", 8), "prefix"),
    (b"HCTR" + struct.pack("<I", 6) + b"\0" * 14, "not a positive multiple of 4"),
    (b"HCTR" + struct.pack("<I", 0), "not a positive multiple of 4"),
    # Truncated: the last record lost 3 bytes of its vector.
    (hugectr_payload([1, 2], [[1.0, 2.0], [3.0, 4.0]])[:-3], "not a whole number of 16-byte"),
    # Written with dim 3, read as a table of dim 2.
    (hugectr_payload([1], [[1.0, 2.0, 3.0]]), "the table has dim 2"),
    # Values that would score NaN: the message is refused, not applied.
    (hugectr_payload([1, 7], [[1.0, 2.0], [3.0, float("nan")]]), r"row 1 \(key 7\) holds nan"),
    (hugectr_payload([5], [[float("inf"), 2.0]]), r"holds inf at 0; embedding values must"),
]


@pytest.mark.parametrize(("payload", "fragment"), MALFORMED)
def test_malformed_messages_are_refused_whole(payload, fragment):
    with pytest.raises(MalformedMessageError, match=fragment) as info:
        decode_message(payload, expected_dim=2)
    located = info.value.at("hps_et.m.t", 3, 41)
    assert "topic 'hps_et.m.t' partition 3 offset 41" in str(located)
    assert "skipped" in str(located)


def test_iter_messages_respects_send_buffer_and_max_rows():
    keys = np.arange(1000, dtype=np.int64)
    vectors = np.ones((1000, 16), np.float32)
    per = rows_per_message(16, 4096)
    assert per == (4096 - 8) // 72

    parts = list(iter_messages(keys, vectors, send_buffer_size=4096))
    assert all(len(p) <= 4096 for _, p in parts)
    assert [s.stop - s.start for s, _ in parts[:-1]] == [per] * (len(parts) - 1)
    joined = np.concatenate([decode_message(p)[0] for _, p in parts])
    assert joined.tolist() == keys.tolist()

    capped = list(iter_messages(keys, vectors, send_buffer_size=4096, max_rows=10))
    assert len(capped) == 100 and all(s.stop - s.start == 10 for s, _ in capped)
    with pytest.raises(ValueError, match="holds no row"):
        rows_per_message(1024, 1024)


def test_topics_are_table_tags():
    assert topic_for("dlrm", "sparse_embedding0") == "hps_et.dlrm.sparse_embedding0"
    assert parse_tag("hps_et.dlrm.emb.v2") == ("dlrm", "emb.v2")
    with pytest.raises(ValueError):
        topic_for("a.b", "t")
    with pytest.raises(ValueError):
        parse_tag("other.dlrm.t")


def test_key_groups_are_stable_and_spread():
    keys = np.arange(80_000, dtype=np.int64)
    groups = key_groups(keys, 8)
    assert np.array_equal(groups, key_groups(keys.copy(), 8))
    counts = np.bincount(groups, minlength=8)
    assert counts.min() > 9_000  # ~10,000 each: sequential keys do not pile up
