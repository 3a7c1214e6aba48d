"""Publish embedding rows to Kafka as HugeCTR's training-side ``KafkaMessageSink`` does.

Rows go to the topic of their table (:func:`~hps_core.updates.messages.topic_for`), packed
into messages of at most ``send_buffer_size`` bytes (:mod:`hps_core.updates.messages`), so a
HugeCTR HPS applies what this publishes and :class:`~hps_core.updates.consumer.UpdateConsumer`
applies what HugeCTR's sink publishes.

Partitions: as in HugeCTR, a key belongs to one of ``num_key_groups`` key groups and a key
group to partition ``group % partitions``; every update of one key therefore travels through
one partition, and Kafka keeps them in order (the last published vector wins at every
server). HugeCTR hashes keys with XXH3; the group here comes from a splitmix64 hash, which is
cheap in NumPy. Either way the consumer does not care which partition a row came through.

Brokers that cannot be reached: librdkafka's lines go through the process's
:class:`~hps_core.updates.broker_watch.BrokerWatch` (one line when the brokers go, one when
they are back, never a line per attempt). Asking the brokers for a topic's metadata fails
after :data:`METADATA_TIMEOUT_S` (:class:`PublishError`); a message already queued is kept
and sent when the brokers return, for up to librdkafka's ``message.timeout.ms`` (5 minutes
by default), after which :meth:`UpdateProducer.flush` raises naming how many were delivered.

Example:
    >>> with UpdateProducer("127.0.0.1:9092") as producer:  # doctest: +SKIP
    ...     producer.publish("dlrm", "sparse_embedding0", keys, vectors)
    ...     producer.flush()
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hps_core.config.schema import UpdateSourceConfig
from hps_core.errors import HPSError
from hps_core.updates.broker_watch import error_name, watch_for
from hps_core.updates.kafka_conf import RECEIVE_MESSAGE_MAX_BYTES, bootstrap_servers, merged
from hps_core.updates.messages import (
    BEACON_TOPIC,
    DEFAULT_SEND_BUFFER_SIZE,
    encode_beacon,
    iter_messages,
    topic_for,
)

log = logging.getLogger(__name__)

DEFAULT_NUM_KEY_GROUPS = 8
"""HugeCTR's ``KafkaMessageSink`` default ``num_key_groups``."""

DEFAULT_TOPIC_PARTITIONS = 8
"""Partitions of a topic this package creates: one per default key group."""

# HugeCTR backs off this long when librdkafka's queue is full.
_QUEUE_FULL_BACKOFF_S = 0.05

METADATA_TIMEOUT_S = 10.0
"""Longest wait for the brokers' answer about topics before :class:`PublishError`."""


class PublishError(HPSError):
    """Rows could not be handed to Kafka, or Kafka did not acknowledge them."""


@dataclass(frozen=True)
class ChangeReport:
    """What :meth:`UpdateProducer.publish_changed` found between two sparse folders.

    Args:
        rows: rows of the new folder.
        added: keys in the new folder only (published).
        changed: keys in both whose vector bytes differ (published).
        unchanged: keys in both with identical vectors (not published).
        removed: keys in the old folder only (not published: HugeCTR's message format has
            no delete; servers keep serving the old vector).
    """

    rows: int
    added: int
    changed: int
    unchanged: int
    removed: int

    @property
    def sent(self) -> int:
        """Keys published."""
        return self.added + self.changed


def key_groups(keys: np.ndarray, num_key_groups: int) -> np.ndarray:
    """The key group of each key: a splitmix64 hash modulo ``num_key_groups``.

    Example:
        >>> key_groups(np.array([1, 2, 3]), 8).tolist()
        [1, 6, 5]
    """
    x = keys.astype(np.int64).view(np.uint64)
    # splitmix64's finaliser: every key bit reaches the low bits used by the modulo.
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(num_key_groups)).astype(np.int64)


class UpdateProducer:
    """A Kafka producer of embedding updates in HugeCTR's format.

    Args:
        brokers: ``host[:port]`` entries separated by ``;`` or ``,``.
        send_buffer_size: largest message in bytes (HugeCTR's sink parameter; the servers'
            ``receive_buffer_size`` should be the same).
        max_batch_size: at most this many rows per message, so that a server applies at
            most that many in one call (``None``: only ``send_buffer_size`` limits).
        num_key_groups: key groups (HugeCTR's sink parameter).
        topic_partitions: partitions of a topic that does not exist yet; it is created
            before the first message (``None``: leave creation to the broker's
            ``auto.create.topics.enable`` as HugeCTR does).
        key_bytes: 8 (``supportlonglong: true``) or 4.
        linger_ms: how long librdkafka gathers messages into one request (HugeCTR: 100).
        kafka_options: further librdkafka settings, overriding this class's.

    Raises:
        ValueError: ``brokers`` is malformed or a size is out of range.

    Example:
        >>> producer = UpdateProducer("127.0.0.1:9092")  # doctest: +SKIP
        >>> producer.publish("dlrm", "sparse_embedding0", keys, vectors)  # doctest: +SKIP
        >>> producer.flush()  # doctest: +SKIP
    """

    def __init__(
        self,
        brokers: str,
        *,
        send_buffer_size: int = DEFAULT_SEND_BUFFER_SIZE,
        max_batch_size: int | None = None,
        num_key_groups: int = DEFAULT_NUM_KEY_GROUPS,
        topic_partitions: int | None = DEFAULT_TOPIC_PARTITIONS,
        key_bytes: int = 8,
        linger_ms: int = 100,
        kafka_options: Mapping[str, Any] | None = None,
    ) -> None:
        from confluent_kafka import Producer

        if send_buffer_size < 1024:
            raise ValueError(f"send_buffer_size must be at least 1024, got {send_buffer_size}")
        if num_key_groups < 1:
            raise ValueError(f"num_key_groups must be at least 1, got {num_key_groups}")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.brokers = bootstrap_servers(brokers)
        self.send_buffer_size = send_buffer_size
        self.max_batch_size = max_batch_size
        self.num_key_groups = num_key_groups
        self.topic_partitions = topic_partitions
        self.key_bytes = key_bytes
        self.keys_sent = 0
        """Rows handed to librdkafka so far."""
        self.messages_sent = 0
        """Messages handed to librdkafka so far."""
        self.messages_delivered = 0
        """Messages the broker acknowledged."""
        self._failures: list[str] = []
        self._failed = 0
        self._reports = 0  # delivery reports received: messages no longer in librdkafka's hands
        self._lock = threading.Lock()
        self._partitions: dict[str, int] = {}
        self._link = watch_for(self.brokers).link("update producer")
        # HugeCTR's sink settings; idempotence keeps retried batches from being written twice
        # or out of order, which per-key ordering relies on.
        conf = {
            "bootstrap.servers": self.brokers,
            "message.max.bytes": send_buffer_size + 1024,
            "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES,
            "topic.metadata.refresh.interval.ms": 60_000,
            "enable.idempotence": True,
            "queue.buffering.max.messages": 64 * 1024,
            "queue.buffering.max.kbytes": 1024 * 1024,
            "queue.buffering.max.ms": linger_ms,
            "compression.codec": "none",
            "batch.num.messages": 8 * 1024,
            "error_cb": self._on_error,
            # librdkafka's lines and statistics go to the broker watch, never to stderr.
            **self._link.settings(),
        }
        try:
            self._producer = Producer(merged(conf, kafka_options))
        except BaseException:
            self._link.close()
            raise
        self._closed = False

    @classmethod
    def from_config(cls, config: UpdateSourceConfig, **kwargs: Any) -> UpdateProducer:
        """A producer for the servers of a ps.json: its brokers, its ``receive_buffer_size``
        as the message size and its ``max_batch_size`` as the rows per message.

        Args:
            config: the ps.json ``update_source``.
            kwargs: further :class:`UpdateProducer` arguments.
        """
        kwargs.setdefault("send_buffer_size", config.receive_buffer_size)
        kwargs.setdefault("max_batch_size", config.max_batch_size)
        return cls(config.brokers, **kwargs)

    # -- delivery bookkeeping -------------------------------------------------------------

    def _on_error(self, err: Any) -> None:
        # Connection trouble: librdkafka retries by itself and the broker watch says it once;
        # fatal errors also fail deliveries.
        if not self._link.on_error(err):
            log.warning("kafka producer: %s", err)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        with self._lock:
            self._reports += 1
            if err is None:
                self.messages_delivered += 1
                self._link.reached()
                return
            self._failed += 1
            if len(self._failures) < 5:
                self._failures.append(
                    f"topic {msg.topic()!r} partition {msg.partition()}: {err.str()}"
                )

    def _raise_failures(self) -> None:
        with self._lock:
            failed, failures = self._failed, list(self._failures)
            self._failed, self._failures = 0, []
        if failed:
            raise PublishError(
                f"{failed} update message(s) to {self.brokers} were not delivered ("
                + "; ".join(failures)
                + ")"
            )

    # -- topics ---------------------------------------------------------------------------

    def partitions(self, topic: str) -> int:
        """Partitions of ``topic``, creating it first if it does not exist.

        Raises:
            PublishError: the brokers do not answer, or the topic cannot be created.
        """
        if topic in self._partitions:
            return self._partitions[topic]
        count = _topic_partitions(self._producer, self.brokers, topic)
        if count is None and self.topic_partitions is not None:
            create_topics(self.brokers, [topic], self.topic_partitions)
            count = _topic_partitions(self._producer, self.brokers, topic)
        if count is None:
            # No creation asked for: the first message makes the broker create it.
            return 0
        self._partitions[topic] = count
        return count

    def existing_topics(self, timeout_s: float = METADATA_TIMEOUT_S) -> set[str]:
        """The names of the topics the brokers hold now.

        Args:
            timeout_s: longest wait for the brokers' answer.

        Returns:
            The topic names.

        Raises:
            PublishError: the brokers do not answer.
        """
        try:
            metadata = self._producer.list_topics(timeout=timeout_s)
        except Exception as exc:  # KafkaException: brokers unreachable
            raise _no_answer(self.brokers, timeout_s, exc) from exc
        return {name for name, info in metadata.topics.items() if info.error is None}

    # -- publishing -----------------------------------------------------------------------

    def _produce(self, topic: str, payload: bytes, partition: int | None) -> None:
        kwargs: dict[str, Any] = {"on_delivery": self._on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._producer.produce(topic, payload, **kwargs)
                break
            except BufferError:
                # librdkafka's queue is full: serve deliveries, then try again (as HugeCTR).
                self._producer.poll(_QUEUE_FULL_BACKOFF_S)
            except Exception as exc:  # KafkaException: unknown topic, message too large
                raise PublishError(f"cannot publish to topic {topic!r}: {exc}") from exc
        self.messages_sent += 1
        self._producer.poll(0)

    def publish_tag(self, tag: str, keys: np.ndarray, vectors: np.ndarray) -> int:
        """Publish rows to the topic ``tag`` (see :meth:`publish`)."""
        self._check_open()
        keys = np.asarray(keys)
        if len(keys) == 0:
            return 0
        vectors = np.asarray(vectors)
        partitions = self.partitions(tag)
        if partitions:
            part = key_groups(keys, self.num_key_groups) % partitions
            # Stable: two updates of one key within a call keep their order.
            order = np.argsort(part, kind="stable")
            keys, vectors, part = keys[order], vectors[order], part[order]
            starts = np.concatenate(([0], np.flatnonzero(np.diff(part)) + 1))
            runs = [
                (int(part[s]), s, e) for s, e in zip(starts, [*starts[1:], len(keys)], strict=True)
            ]
        else:
            runs = [(None, 0, len(keys))]
        for partition, start, stop in runs:
            for _, payload in iter_messages(
                keys[start:stop],
                vectors[start:stop],
                self.send_buffer_size,
                self.max_batch_size,
                self.key_bytes,
            ):
                self._produce(tag, payload, partition)
        self.keys_sent += len(keys)
        return len(keys)

    def publish(self, model: str, table: str, keys: np.ndarray, vectors: np.ndarray) -> int:
        """Queue rows of one table for sending; :meth:`flush` waits for them.

        Args:
            model: the model name (ps.json ``model``).
            table: the table name (``embedding_table_names`` entry).
            keys: integer ``[n]``.
            vectors: float ``[n, dim]`` (sent as float32).

        Returns:
            The number of rows queued.

        Raises:
            ValueError: the shapes disagree or a name is not usable in a tag.
            PublishError: a message could not be queued (e.g. the topic cannot be created).
        """
        return self.publish_tag(topic_for(model, table), keys, vectors)

    def publish_chunks(
        self, model: str, table: str, chunks: Iterable[tuple[np.ndarray, np.ndarray]]
    ) -> int:
        """Publish ``(keys, vectors)`` chunks one after another; returns the rows queued."""
        tag = topic_for(model, table)
        return sum(self.publish_tag(tag, keys, vectors) for keys, vectors in chunks)

    def publish_sparse(
        self, model: str, table: str, folder: str | os.PathLike[str], dim: int | None = None
    ) -> int:
        """Publish every row of a HugeCTR sparse model folder (``key`` + ``emb_vector``).

        Args:
            model: the model name.
            table: the table name.
            folder: the sparse model folder (a path or a URI, see :mod:`hps_core.formats`).
            dim: floats per vector; ``None`` infers it from the file sizes.

        Returns:
            The number of rows queued.

        Raises:
            ModelFileError: the folder is invalid.
            PublishError: as :meth:`publish`.
        """
        from hps_core.formats.sparse import iter_sparse_table

        return self.publish_chunks(
            model, table, ((c.keys, c.vectors) for c in iter_sparse_table(folder, dim))
        )

    def publish_parquet(
        self,
        model: str,
        table: str,
        path: str | os.PathLike[str],
        key_column: str = "key",
        vector_column: str = "vector",
        dim: int | None = None,
    ) -> int:
        """Publish every row of a Parquet table, the shape ``hps convert parquet-to-hugectr``
        reads (an integer key column, a list-of-floats vector column; a file or a folder of
        part files).

        Returns:
            The number of rows queued.

        Raises:
            ModelFileError: a file is unreadable or a column is missing or of the wrong type.
            PublishError: as :meth:`publish`.
        """
        # Here, not at the top: serving processes import this package for the consumer and
        # need not load pyarrow (about 40 MiB of resident memory per Triton stub).
        from hps_core.formats.parquet import iter_parquet_rows

        return self.publish_chunks(
            model, table, iter_parquet_rows(path, key_column, vector_column, dim)
        )

    def publish_changed(
        self,
        model: str,
        table: str,
        old_folder: str | os.PathLike[str],
        new_folder: str | os.PathLike[str],
        dim: int | None = None,
    ) -> ChangeReport:
        """Publish the rows of ``new_folder`` that are not in ``old_folder`` or whose vector
        differs there (bit for bit: ``-0.0`` vs ``0.0`` and NaN payloads count as changes).

        The old table is read into memory (12 + 4 * dim bytes per row); the new one is
        streamed in chunks.

        Returns:
            A :class:`ChangeReport`.

        Raises:
            ModelFileError: a folder is invalid, or the two have different dims.
            PublishError: as :meth:`publish`.
        """
        from hps_core.errors import ModelFileError
        from hps_core.formats.sparse import inspect_sparse_table, read_sparse_table

        new_info = inspect_sparse_table(new_folder, dim)
        old_keys, old_vectors = read_sparse_table(old_folder)
        if old_keys.size and old_vectors.shape[1] != new_info.dim:
            raise ModelFileError(
                f"{old_folder} has dim {old_vectors.shape[1]}, {new_folder} has dim "
                f"{new_info.dim}; publish the new table whole instead"
            )
        order = np.argsort(old_keys, kind="stable")
        sorted_keys = old_keys[order]
        old_bits = old_vectors.view(np.uint32)
        seen = np.zeros(len(old_keys), bool)
        added = changed = 0
        for chunk_keys, chunk_vectors in _sparse_chunks(new_folder, new_info.dim):
            if len(sorted_keys):
                pos = np.minimum(np.searchsorted(sorted_keys, chunk_keys), len(sorted_keys) - 1)
                found = sorted_keys[pos] == chunk_keys
            else:
                pos, found = np.zeros(len(chunk_keys), np.intp), np.zeros(len(chunk_keys), bool)
            differs = ~found
            if found.any():
                rows = order[pos[found]]
                seen[rows] = True
                same = (old_bits[rows] == chunk_vectors[found].view(np.uint32)).all(axis=1)
                differs[np.flatnonzero(found)[~same]] = True
                changed += int((~same).sum())
            added += int((~found).sum())
            if differs.any():
                self.publish(model, table, chunk_keys[differs], chunk_vectors[differs])
        removed = int((~seen).sum())
        return ChangeReport(
            rows=new_info.rows,
            added=added,
            changed=changed,
            unchanged=new_info.rows - added - changed,
            removed=removed,
        )

    def beacon(self) -> None:
        """Send HugeCTR's connection beacon (an empty message to ``__hps_beacon``) and wait
        for it: proves the brokers accept messages.

        Raises:
            PublishError: it was not delivered within 30 s.
        """
        self._check_open()
        self._produce(BEACON_TOPIC, encode_beacon(), None)
        self.flush(30.0)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued message is acknowledged by the brokers.

        Args:
            timeout_s: give up after this long (``None``: wait as long as it takes, as
                HugeCTR's sink does).

        Raises:
            PublishError: a message failed (the error names topic, partition and reason),
                or messages were still pending at the timeout.
        """
        self._check_open()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            step = 5.0 if deadline is None else max(0.0, min(5.0, deadline - time.monotonic()))
            pending = self._producer.flush(step)
            if pending == 0 or (deadline is not None and time.monotonic() >= deadline):
                break
        self._raise_failures()
        if pending:
            raise PublishError(
                f"{pending} update message(s) still unacknowledged by {self.brokers} after "
                f"{timeout_s} s"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise PublishError("the update producer is closed")

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Flush what is queued and release the producer (idempotent).

        Raises:
            PublishError: as :meth:`flush`; the producer is closed anyway.
        """
        if self._closed:
            return
        try:
            # Nothing queued, nothing to wait for: a publish that failed before its first
            # message (brokers that never answered) ends with its error alone.
            if self.messages_sent > self._reports or self._failed:
                self.flush(timeout_s)
        finally:
            self._closed = True
            self._producer = None
            self._link.close()

    def __enter__(self) -> UpdateProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            # Already failing: do not hide the error behind a flush error.
            try:
                self.close(timeout_s=5.0)
            except PublishError as flush_error:
                log.warning("while closing the update producer: %s", flush_error)


def _sparse_chunks(folder: str | os.PathLike[str], dim: int) -> Iterator[tuple[np.ndarray, ...]]:
    from hps_core.formats.sparse import iter_sparse_table

    for chunk in iter_sparse_table(folder, dim):
        yield chunk.keys, chunk.vectors


def _no_answer(brokers: str, timeout_s: float, exc: BaseException) -> PublishError:
    """The error of a metadata request the brokers did not answer (one line)."""
    error = exc.args[0] if exc.args else exc
    reason = error.str() if error_name(error) else str(exc)
    return PublishError(
        f"the Kafka brokers {brokers} did not answer within {timeout_s:g} s ({reason})"
    )


def _topic_partitions(
    client: Any, brokers: str, topic: str, timeout_s: float = METADATA_TIMEOUT_S
) -> int | None:
    """Partitions of ``topic`` by the brokers' metadata; ``None`` if it does not exist."""
    try:
        metadata = client.list_topics(topic, timeout=timeout_s)
    except Exception as exc:  # KafkaException: brokers unreachable
        raise _no_answer(brokers, timeout_s, exc) from exc
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        return None
    return len(info.partitions)


def create_topics(brokers: str, topics: Iterable[str], partitions: int) -> list[str]:
    """Create the topics that do not exist yet, with ``partitions`` partitions each.

    Args:
        brokers: librdkafka's ``bootstrap.servers`` (comma-separated ``host:port``).
        topics: topic names.
        partitions: partitions of each new topic.

    Returns:
        The topics created (those that already existed are left as they are).

    Raises:
        PublishError: the brokers refused a creation for another reason than existence.
    """
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    # Never polled: its librdkafka lines are held by the logger, never written to stderr.
    link = watch_for(brokers).link("topic creation")
    admin = AdminClient({"bootstrap.servers": brokers, "logger": link})
    wanted = sorted(set(topics))
    created = []
    try:
        futures = admin.create_topics(
            [NewTopic(t, num_partitions=partitions, replication_factor=-1) for t in wanted],
            operation_timeout=10,
            request_timeout=15,
        )
        for topic, future in futures.items():
            try:
                future.result()
                created.append(topic)
            except Exception as exc:
                error = exc.args[0] if exc.args else None
                if getattr(error, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                raise PublishError(f"cannot create Kafka topic {topic!r}: {exc}") from exc
    finally:
        link.close()
    return created
