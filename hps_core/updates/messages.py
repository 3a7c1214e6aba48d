"""HugeCTR's Kafka message format for online embedding updates, and its topic names.

HugeCTR's ``KafkaMessageSink`` (training side) and ``KafkaMessageSource`` (HPS side) agree on
this layout, which is all a message carries: there is no Kafka message key, no Kafka header
and no schema.

=========  =====  ==========================================================================
offset     size   content
=========  =====  ==========================================================================
0          4      the prefix ``b"HCTR"`` (``uint32`` 0x52544348 little-endian)
4          4      ``value_size``: bytes per value, ``uint32`` little-endian (``4 * dim``)
8          n*r    ``n`` records of ``key`` (8 bytes ``<i8``, or 4 bytes ``<u4`` for a model
                  with ``supportlonglong: false``) followed by ``value_size`` bytes of
                  little-endian float32 vector
=========  =====  ==========================================================================

HugeCTR writes the header and keys with native x86/ARM byte order, i.e. little-endian; the
key width is not in the message, both ends must agree on it (``supportlonglong``). A body
that is a whole number of records at one width only tells a mismatch by its length; one that
is whole at both is refused when a third of its rows or more read as subnormal floats (key
bytes below 2**23) at the table's width and none at the other. A message with no record is a
*beacon* (HugeCTR's sink sends one to ``__hps_beacon`` to await a connection); it updates
nothing. One message is at most the sink's ``send_buffer_size`` (256 KiB by default), which
the consumer's ``receive_buffer_size`` should equal.

Topics are the tables' tags, :func:`hps_core.tiers.backing.table_tag`:
``hps_et.<model>.<table>``, so one topic carries one table.

Example:
    >>> import numpy as np
    >>> payload = encode_message(np.array([7], np.int64), np.ones((1, 2), np.float32))
    >>> payload[:8], payload[8:16].hex(), payload[16:].hex()
    (b'HCTR\\x08\\x00\\x00\\x00', '0700000000000000', '0000803f0000803f')
    >>> keys, vectors = decode_message(payload)
    >>> keys.tolist(), vectors.tolist()
    ([7], [[1.0, 1.0]])
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from hps_core.errors import HPSError
from hps_core.tiers.backing import table_tag

MESSAGE_PREFIX = b"HCTR"
"""First 4 bytes of every message (HugeCTR's ``HCTR_KAFKA_VALUE_PREFIX`` in memory order)."""

HEADER_BYTES = 8
"""Prefix plus ``value_size``."""

DEFAULT_SEND_BUFFER_SIZE = 256 * 1024
"""HugeCTR's ``KafkaMessageSink`` default ``send_buffer_size``: the largest message."""

BEACON_TOPIC = "__hps_beacon"
"""Where HugeCTR's sink sends its connection beacon (an empty message)."""

TAG_PREFIX = "hps_et"
"""HugeCTR's ``PS_EMBEDDING_TABLE_TAG_PREFIX``: first part of every table tag."""

KEY_DTYPES: dict[int, np.dtype] = {8: np.dtype("<i8"), 4: np.dtype("<u4")}
"""Key encodings by width: HugeCTR's ``long long`` and ``unsigned int`` key types."""

VALUE_DTYPE = np.dtype("<f4")

_TAG = re.compile(r"^hps_et\.([^.]+)\.(.+)$")


class MalformedMessageError(HPSError):
    """A Kafka message is not a HugeCTR update: wrong prefix, truncated record, wrong width.

    Args:
        reason: what is wrong with the payload.
        topic, partition, offset: where the message lies (``None`` when decoding bytes
            that came from no broker).
    """

    def __init__(
        self,
        reason: str,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.topic = topic
        self.partition = partition
        self.offset = offset
        where = "message"
        if topic is not None:
            where = f"topic {topic!r} partition {partition} offset {offset}"
        super().__init__(f"{where}: {reason}; the message is skipped")

    def at(self, topic: str, partition: int, offset: int) -> MalformedMessageError:
        """The same error, located in the log of a broker."""
        return MalformedMessageError(self.reason, topic, partition, offset)


@dataclass(frozen=True)
class UpdateMessage:
    """One decoded message: the rows one HugeCTR ``post`` put in one Kafka message.

    Args:
        keys: int64 ``[n]``.
        vectors: float32 ``[n, dim]``, C-contiguous, owning its memory.
        value_size: bytes per value as the header says (``4 * dim``).
    """

    keys: np.ndarray
    vectors: np.ndarray
    value_size: int

    @property
    def is_beacon(self) -> bool:
        """No rows: a connection beacon (or an empty post) that updates nothing."""
        return len(self.keys) == 0


def parse_tag(tag: str) -> tuple[str, str]:
    """Split a topic named by :func:`table_tag` into ``(model, table)``.

    Args:
        tag: ``hps_et.<model>.<table>``.

    Returns:
        The model and table names.

    Raises:
        ValueError: ``tag`` is not of that form.

    Example:
        >>> parse_tag("hps_et.dlrm.sparse_embedding0")
        ('dlrm', 'sparse_embedding0')
    """
    match = _TAG.match(tag)
    if match is None:
        raise ValueError(f"{tag!r} is not a table tag (hps_et.<model>.<table>)")
    return match.group(1), match.group(2)


def topic_for(model: str, table: str) -> str:
    """The Kafka topic that carries the updates of one table: its tag.

    Example:
        >>> topic_for("dlrm", "sparse_embedding0")
        'hps_et.dlrm.sparse_embedding0'
    """
    if not model or "." in model:
        # HugeCTR splits tags at dots to find the model; a dotted model name would be read
        # back as another model.
        raise ValueError(f"model name {model!r} must be non-empty and contain no '.'")
    if not table:
        raise ValueError("table name must be non-empty")
    return table_tag(model, table)


def _record_dtype(key_bytes: int, value_size: int) -> np.dtype:
    if key_bytes not in KEY_DTYPES:
        raise ValueError(f"key_bytes must be 8 or 4, got {key_bytes!r}")
    # A packed record: no padding between key and value, as the sink memcpy's them.
    return np.dtype([("key", KEY_DTYPES[key_bytes]), ("value", np.uint8, (value_size,))])


def record_bytes(dim: int, key_bytes: int = 8) -> int:
    """Bytes one row takes in a message: key plus ``dim`` float32."""
    return key_bytes + dim * VALUE_DTYPE.itemsize


def rows_per_message(dim: int, send_buffer_size: int, key_bytes: int = 8) -> int:
    """How many rows HugeCTR's sink packs into one message of at most ``send_buffer_size``.

    Raises:
        ValueError: not even one row fits.
    """
    per_row = record_bytes(dim, key_bytes)
    rows = (send_buffer_size - HEADER_BYTES) // per_row
    if rows < 1:
        raise ValueError(
            f"send_buffer_size {send_buffer_size} holds no row of dim {dim} "
            f"({HEADER_BYTES} header + {per_row} bytes per row)"
        )
    return rows


def _check_rows(keys: np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keys = np.asarray(keys)
    vectors = np.asarray(vectors)
    if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer):
        raise ValueError(f"keys must be a 1-D integer array, got {keys.dtype} {keys.shape}")
    if vectors.ndim != 2 or vectors.shape[0] != keys.shape[0] or vectors.shape[1] < 1:
        raise ValueError(
            f"vectors must be [n, dim] with n = {keys.shape[0]} keys and dim >= 1, "
            f"got {vectors.shape}"
        )
    if vectors.dtype != VALUE_DTYPE:
        if not np.issubdtype(vectors.dtype, np.floating):
            raise ValueError(f"vectors must be float32, got {vectors.dtype}")
        vectors = vectors.astype(VALUE_DTYPE)
    return keys, vectors


def encode_message(keys: np.ndarray, vectors: np.ndarray, key_bytes: int = 8) -> bytes:
    """One message holding every row given, in HugeCTR's layout.

    Args:
        keys: integer ``[n]`` (int64 keys; with ``key_bytes=4``, values in ``[0, 2**32)``).
        vectors: float ``[n, dim]`` (converted to float32).
        key_bytes: 8 (``supportlonglong: true``) or 4.

    Returns:
        The payload, ``8 + n * (key_bytes + 4 * dim)`` bytes.

    Raises:
        ValueError: the shapes disagree, or a key does not fit ``key_bytes``.
    """
    keys, vectors = _check_rows(keys, vectors)
    value_size = vectors.shape[1] * VALUE_DTYPE.itemsize
    records = np.empty(len(keys), _record_dtype(key_bytes, value_size))
    if key_bytes == 4 and len(keys) and (keys.min() < 0 or keys.max() > 0xFFFFFFFF):
        raise ValueError("keys must lie in [0, 2**32) for 4-byte keys")
    records["key"] = keys
    records["value"] = np.ascontiguousarray(vectors).view(np.uint8).reshape(len(keys), -1)
    header = MESSAGE_PREFIX + np.uint32(value_size).astype("<u4").tobytes()
    return header + records.tobytes()


def encode_beacon(value_size: int = 8) -> bytes:
    """An empty message, as HugeCTR's sink sends to :data:`BEACON_TOPIC` (value size 8)."""
    return MESSAGE_PREFIX + np.uint32(value_size).astype("<u4").tobytes()


def iter_messages(
    keys: np.ndarray,
    vectors: np.ndarray,
    send_buffer_size: int = DEFAULT_SEND_BUFFER_SIZE,
    max_rows: int | None = None,
    key_bytes: int = 8,
) -> Iterator[tuple[slice, bytes]]:
    """Split rows into messages of at most ``send_buffer_size`` bytes, as HugeCTR's sink.

    Args:
        keys: integer ``[n]``.
        vectors: float ``[n, dim]``.
        send_buffer_size: largest message in bytes (HugeCTR's sink parameter).
        max_rows: also at most this many rows per message (``None``: no limit).
        key_bytes: 8 or 4.

    Returns:
        An iterator of ``(rows, payload)``: the slice of the input a message holds, and it.
    """
    keys, vectors = _check_rows(keys, vectors)
    per_message = rows_per_message(vectors.shape[1], send_buffer_size, key_bytes)
    if max_rows is not None:
        per_message = min(per_message, max_rows)
    for start in range(0, len(keys), per_message):
        rows = slice(start, min(start + per_message, len(keys)))
        yield rows, encode_message(keys[rows], vectors[rows], key_bytes)


def _records(data: memoryview, key_bytes: int, value_size: int) -> tuple[np.ndarray, np.ndarray]:
    n = (len(data) - HEADER_BYTES) // (key_bytes + value_size)
    records = np.frombuffer(data, _record_dtype(key_bytes, value_size), count=n, offset=8)
    keys = records["key"].astype(np.int64)
    # A copy: the result must not pin (or alias) the consumer's message buffer.
    vectors = np.array(records["value"], copy=True, order="C").view(VALUE_DTYPE)
    return keys, vectors.reshape(n, value_size // VALUE_DTYPE.itemsize)


def _has_subnormals(vectors: np.ndarray) -> bool:
    """Whether the rows hold key bytes read as values: subnormal floats in at least a third of
    the rows (a misread width puts one in most rows; a trained table rarely holds any, and
    one genuine tiny value does not make a message misread)."""
    magnitude = np.abs(vectors)
    tiny = ((magnitude < np.finfo(VALUE_DTYPE).tiny) & (magnitude > 0)).any(axis=1)
    return bool(tiny.sum() * 3 >= max(len(vectors), 1))


def decode_message(
    payload: bytes | memoryview | None,
    key_bytes: int = 8,
    expected_dim: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Keys and vectors of one message.

    Args:
        payload: the message value.
        key_bytes: 8 or 4, as the sink wrote them.
        expected_dim: the table's dim when known; another value width is malformed.

    Returns:
        ``(keys, vectors)``: int64 ``[n]`` and float32 ``[n, dim]``, fresh arrays (the
        payload may be released). A beacon gives ``n = 0`` and ``dim = value_size / 4``.

    Raises:
        MalformedMessageError: no payload, a wrong prefix, a value size that is not a
            whole number of float32 (or not ``expected_dim``), or a body that is not a whole
            number of records (truncated). Nothing of such a message is returned.
    """
    message = decode_update(payload, key_bytes, expected_dim)
    return message.keys, message.vectors


def decode_update(
    payload: bytes | memoryview | None,
    key_bytes: int = 8,
    expected_dim: int | None = None,
) -> UpdateMessage:
    """:func:`decode_message` returning an :class:`UpdateMessage` (with ``value_size``)."""
    if payload is None:
        raise MalformedMessageError("no payload (a tombstone)")
    data = memoryview(payload).cast("B")
    if len(data) < HEADER_BYTES:
        raise MalformedMessageError(
            f"{len(data)} bytes, shorter than the {HEADER_BYTES}-byte header"
        )
    if bytes(data[:4]) != MESSAGE_PREFIX:
        raise MalformedMessageError(
            f"prefix {bytes(data[:4])!r}, expected {MESSAGE_PREFIX!r} (not a HugeCTR update)"
        )
    value_size = int(np.frombuffer(data, "<u4", count=1, offset=4)[0])
    if value_size == 0 or value_size % VALUE_DTYPE.itemsize:
        raise MalformedMessageError(
            f"value size {value_size} bytes is not a positive multiple of 4 (float32)"
        )
    dim = value_size // VALUE_DTYPE.itemsize
    body = len(data) - HEADER_BYTES
    if body and expected_dim is not None and dim != expected_dim:
        raise MalformedMessageError(
            f"value size {value_size} bytes is dim {dim}; the table has dim {expected_dim}"
        )
    per_row = key_bytes + value_size
    if body % per_row:
        raise MalformedMessageError(
            f"body of {body} bytes is not a whole number of {per_row}-byte records "
            f"({key_bytes}-byte key + {value_size}-byte value): truncated, or another "
            f"key width or dim"
        )
    keys, vectors = _records(data, key_bytes, value_size)
    other = 4 if key_bytes == 8 else 8
    # The key width is not in the message, and a body may be a whole number of records at
    # both widths. Key bytes read as values are tiny (subnormal) floats, which trained
    # embeddings do not hold: refuse rather than apply garbage rows.
    if (
        body % (other + value_size) == 0
        and _has_subnormals(vectors)
        and not _has_subnormals(_records(data, other, value_size)[1])
    ):
        raise MalformedMessageError(
            f"its {body}-byte body reads as records of {key_bytes}-byte keys only with "
            f"subnormal values, and cleanly as {other}-byte keys: the publisher's key "
            f"width differs from this table's ({key_bytes} bytes; HugeCTR's "
            "supportlonglong, hps publish --int32-keys)"
        )
    finite = np.isfinite(vectors)
    if not finite.all():  # a row that would score NaN (an int8 row turns inf into NaN too)
        row, j = (int(i[0]) for i in np.nonzero(~finite))
        raise MalformedMessageError(
            f"row {row} (key {int(keys[row])}) holds {vectors[row, j]} at {j}; embedding "
            "values must be finite numbers"
        )
    return UpdateMessage(keys, vectors, value_size)
