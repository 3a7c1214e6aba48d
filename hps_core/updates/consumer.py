"""Receive embedding updates from Kafka and hand them to the served tiers, as HugeCTR's
``KafkaMessageSource`` does.

:class:`UpdateConsumer` subscribes to the topics of the tables it follows (one topic per
table, named by :func:`~hps_core.tiers.backing.table_tag`), decodes each message
(:mod:`hps_core.updates.messages`) and calls ``apply(table_tag, keys, vectors)`` once per
message: a message is applied whole or not at all. Offsets are committed only for messages
whose ``apply`` returned, so a restarted consumer resumes after the last applied message.

Delivery is **at least once**: a server that stops without committing (a crash, a lost
broker) applies again, after its restart, the messages applied since its last commit (at
most ``max_commit_interval + 1`` per partition, plus those of the idle interval). Applying a
row twice is harmless because an update overwrites; rows of one key travel through one
partition, so they are replayed in their order and the newest vector still wins. No message
is skipped, except malformed ones, which are logged with topic, partition and offset,
counted in :attr:`UpdateStats.malformed` and committed past (they can never be applied).

Commits follow HugeCTR's ``max_commit_interval``: after more than that many messages since
the last commit, and whenever the stream goes idle (a poll of ``poll_timeout_ms`` returns
nothing, or a partition's end is reached), and on :meth:`UpdateConsumer.stop`. The poll loop
commits asynchronously, one commit at a time, its result read by a later poll: a synchronous
commit in flight when the broker dies waits until the broker returns (minutes, measured
against a killed tansu), and with it the loop that serves librdkafka's statistics and errors,
so the outage would never be seen. :meth:`UpdateConsumer.commit` (on a revocation and at the
stop) stays synchronous.

``max_batch_size`` bounds the rows of one ``apply`` only as far as the producer packed its
messages to it (:meth:`~hps_core.updates.producer.UpdateProducer.from_config` does; HugeCTR's
sink packs by ``send_buffer_size`` bytes): a larger message is still applied in one call,
because splitting it would break whole-or-nothing. HugeCTR instead gathers rows of several
messages up to ``max_batch_size`` per callback and may split a message between two.

Consumer group: every server must see every update, so servers must not share a group
unless they share the tier they write into. HugeCTR names the group ``hps.volatile`` (or
``hps.persistent``) when that database is shared by all servers (a Redis cluster, where one
writer per update suffices) and ``hps.volatile.<hostname>`` when each host has its own (its
hash maps, its RocksDB). :func:`default_group_id` follows that naming; two servers on one
host, each with its own tier, must pass distinct ``host`` values (e.g. hostname and port),
or the Kafka group would split the partitions between them.

Replay: a consumer made with ``replay=True`` reads each partition from its beginning the first
time it is assigned, whatever its group committed, then goes on as above. A serving process
needs it when the state its group's committed offsets describe is gone: the update overlay
(:mod:`hps_core.tiers.overlay`) lives in the process's memory and starts empty, and the shared
host tier may have been rebuilt from the model files. Resuming from the committed offsets
would then lose the updates applied before the restart; replaying them is harmless (an
update overwrites) and costs one read of the retained log.

Broker outages: librdkafka's log lines and connection errors go through the process's
:class:`~hps_core.updates.broker_watch.BrokerWatch` of the brokers, which says once that
they are unreachable and once that they are back; the failed commits and the errors of
reaching them in between are counted in :attr:`UpdateStats.errors`, not logged one by one.
Nothing is lost: the consumer resumes from its last commit when the brokers return.

Example:
    >>> consumer = UpdateConsumer(cfg.update_source, [("dlrm", "sparse_embedding0")],
    ...                           apply=host_tier_insert)  # doctest: +SKIP
    >>> consumer.start()  # doctest: +SKIP
    >>> consumer.stop()  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hps_core.config.schema import UpdateSourceConfig
from hps_core.errors import HPSError
from hps_core.log_every import LogEvery
from hps_core.updates.broker_watch import is_connection_error, watch_for
from hps_core.updates.kafka_conf import RECEIVE_MESSAGE_MAX_BYTES, bootstrap_servers, merged
from hps_core.updates.messages import MalformedMessageError, decode_update, topic_for
from hps_core.updates.producer import DEFAULT_TOPIC_PARTITIONS, create_topics

log = logging.getLogger(__name__)

ApplyFn = Callable[[str, np.ndarray, np.ndarray], None]
"""``apply(table_tag, keys int64 [n], vectors float32 [n, dim])``; raises on failure."""

GROUP_PREFIX = "hps."
COMMIT_RESULT_WAIT_S = 60.0
"""How long the poll loop waits for the result of its asynchronous commit before it gives
that commit up and may commit again: librdkafka gives no timeout of its own for one, and a
commit whose result never comes would otherwise hold every later commit of the loop back.
Giving one up loses nothing: its offsets stay pending, and committing them twice is
harmless."""
"""HugeCTR's ``kafka_group_prefix``."""


class UpdateSourceError(HPSError):
    """The update consumer cannot be set up (bad settings, unreachable brokers at start)."""


@dataclass(frozen=True)
class UpdateStats:
    """Counters of an :class:`UpdateConsumer` since it was created.

    Args:
        messages_applied: messages whose ``apply`` returned.
        keys_applied: rows in those messages.
        malformed: messages skipped as not decodable (see :class:`MalformedMessageError`).
        beacons: empty messages (HugeCTR's connection beacons) passed over.
        errors: broker errors, failed commits and failed ``apply`` calls (each retried).
        commits: offset commits that succeeded.
        last_error: the text of the last error or malformed message, if any.
        outages: times every broker became unreachable from this process
            (:class:`~hps_core.updates.broker_watch.BrokerWatch`).
        reachable: whether the brokers are reachable now (False during an outage).
        lag: messages published to the consumer's partitions that it has not read yet, at
            librdkafka's last statistics report (-1 before the first that knows it).
    """

    messages_applied: int = 0
    keys_applied: int = 0
    malformed: int = 0
    beacons: int = 0
    errors: int = 0
    commits: int = 0
    last_error: str | None = None
    outages: int = 0
    reachable: bool = True
    lag: int = -1


def consumer_lag(stats: str) -> int | None:
    """A consumer's lag from librdkafka's statistics: messages published to its partitions
    that it has not read, summed (each partition's ``consumer_lag``; partitions that do not
    know theirs yet, -1, are left out).

    Args:
        stats: librdkafka's statistics report (JSON).

    Returns:
        The lag; None when the report holds no partition that knows it (none assigned yet).

    Example:
        >>> consumer_lag('{"topics": {"t": {"partitions": {"0": {"consumer_lag": 3}, '
        ...              '"-1": {"consumer_lag": -1}}}}}')
        3
    """
    try:
        topics = json.loads(stats).get("topics", {})
    except ValueError:
        return None
    lags = [
        int(part.get("consumer_lag", -1))
        for topic in topics.values()
        for number, part in topic.get("partitions", {}).items()
        if number != "-1"  # librdkafka's placeholder for messages not yet partitioned
    ]
    known = [lag for lag in lags if lag >= 0]
    return sum(known) if known else None


def default_group_id(level: str = "volatile", shared: bool = False, host: str | None = None) -> str:
    """HugeCTR's consumer group name for the updates of one database level.

    Args:
        level: ``volatile`` or ``persistent`` (HugeCTR's two subscribers), or another name
            for another tier that applies updates on its own.
        shared: the tier is shared by every server (one group for all: each update is
            applied once); otherwise one group per host.
        host: the host part; ``None`` is this machine's hostname, as HugeCTR. Two servers
            on one host that each keep their own copy need distinct values.

    Example:
        >>> default_group_id("volatile", shared=True)
        'hps.volatile'
        >>> default_group_id("volatile", host="node7")
        'hps.volatile.node7'
    """
    if shared:
        return f"{GROUP_PREFIX}{level}"
    return f"{GROUP_PREFIX}{level}.{host or socket.gethostname()}"


def _as_tag(table: str | tuple[str, str]) -> str:
    if isinstance(table, tuple):
        return topic_for(*table)
    return table


class UpdateConsumer:
    """Applies the updates of some tables from Kafka through a callback.

    Args:
        config: the ps.json ``update_source`` (brokers, poll and commit settings).
        tables: the tables to follow: ``(model, table)`` pairs or table tags.
        apply: called as ``apply(table_tag, keys, vectors)`` once per message, from the
            consumer's thread (or the caller of :meth:`poll_once`); it must raise if it
            could not apply the rows: the message is then retried after
            ``failure_backoff_ms``, and nothing after it in its partition is applied first.
        group_id: the Kafka consumer group; ``None`` is :func:`default_group_id` (one
            group per host).
        dims: floats per vector of each table tag, when known: a message of another width
            is malformed instead of reaching ``apply``.
        key_bytes: 8 (``supportlonglong: true``) or 4.
        topic_partitions: partitions of a followed topic that does not exist yet; it is
            created at start (``None``: do not create; the consumer waits for it).
        kafka_options: further librdkafka settings, overriding HugeCTR's.
        replay: read each partition from its beginning when it is first assigned to this
            consumer, instead of from the group's committed offset (see the module notes).

    Raises:
        UpdateSourceError: the settings are refused by librdkafka or ``tables`` is empty.

    Example:
        >>> received = {}
        >>> def apply(tag, keys, vectors):  # doctest: +SKIP
        ...     received.update(zip(keys.tolist(), vectors))
        >>> with UpdateConsumer(config, [("dlrm", "t0")], apply) as consumer:  # doctest: +SKIP
        ...     consumer.poll_once()
    """

    def __init__(
        self,
        config: UpdateSourceConfig,
        tables: Iterable[str | tuple[str, str]],
        apply: ApplyFn,
        *,
        group_id: str | None = None,
        dims: Mapping[str, int] | None = None,
        key_bytes: int = 8,
        topic_partitions: int | None = DEFAULT_TOPIC_PARTITIONS,
        kafka_options: Mapping[str, Any] | None = None,
        replay: bool = False,
    ) -> None:
        from confluent_kafka import Consumer, KafkaException

        self.config = config
        self.topics = sorted({_as_tag(t) for t in tables})
        if not self.topics:
            raise UpdateSourceError("update consumer: no table to follow")
        self.group_id = group_id or default_group_id()
        self._apply = apply
        self._dims = dict(dims or {})
        self._key_bytes = key_bytes
        self._stats = UpdateStats()
        self._stats_lock = threading.Lock()
        self._every = LogEvery()
        # Offsets to commit: (topic, partition) -> next offset, set after apply returned.
        self._pending: dict[tuple[str, int], int] = {}
        self._uncommitted = 0
        # The poll loop's commit awaiting its result (on_commit): its offsets and how many
        # applied messages it covers.
        self._in_flight: dict[tuple[str, int], int] | None = None
        self._in_flight_messages = 0
        self._in_flight_since = 0.0
        self._broker_trouble = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._replay = replay
        # Partitions assigned at least once: a replay starts each from its beginning only once.
        self._seen: set[tuple[str, int]] = set()
        try:
            brokers = bootstrap_servers(config.brokers)
        except ValueError as exc:
            raise UpdateSourceError(f"update_source.brokers: {exc}") from exc
        self._link = watch_for(brokers).link(f"update consumer {self.group_id}", steady=True)
        if topic_partitions is not None:
            try:
                create_topics(brokers, self.topics, topic_partitions)
            except HPSError as exc:
                # Not fatal: the broker may create topics itself, or they appear later.
                self._count_error(f"creating topics: {exc}")
        # HugeCTR's consumer settings (kafka_message.cpp).
        conf = {
            "bootstrap.servers": brokers,
            "group.id": self.group_id,
            "message.max.bytes": config.receive_buffer_size + 1024,
            "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES,
            "topic.metadata.refresh.interval.ms": config.metadata_refresh_interval_ms,
            "session.timeout.ms": 30_000,
            "heartbeat.interval.ms": 3_000,
            # Offsets are committed here, only after apply; never by librdkafka on its own.
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "queued.min.messages": 64 * 1024,
            "queued.max.messages.kbytes": 1024 * 1024,
            "enable.partition.eof": True,
            "check.crcs": False,
            "allow.auto.create.topics": True,
            # A new group starts from the oldest update still kept (HugeCTR: smallest).
            "auto.offset.reset": "smallest",
            "error_cb": self._on_error,
            "on_commit": self._on_commit,
            # librdkafka's lines and statistics go to the broker watch, never to stderr.
            **self._link.settings(),
            "stats_cb": self._on_stats,
        }
        try:
            self._consumer = Consumer(merged(conf, kafka_options))
            self._consumer.subscribe(
                self.topics,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
        except (KafkaException, ValueError, TypeError) as exc:
            self._link.close()
            raise UpdateSourceError(f"cannot create the Kafka update consumer: {exc}") from exc

    # -- counters -------------------------------------------------------------------------

    @property
    def stats(self) -> UpdateStats:
        """A snapshot of the counters."""
        watch = self._link.watch
        with self._stats_lock:
            return dataclasses.replace(
                self._stats, outages=watch.outages, reachable=watch.reachable
            )

    def _add(self, **deltas: Any) -> None:
        with self._stats_lock:
            values = {
                k: (v if k == "last_error" else getattr(self._stats, k) + v)
                for k, v in deltas.items()
            }
            self._stats = dataclasses.replace(self._stats, **values)

    def _on_stats(self, stats: str) -> None:
        """librdkafka's statistics: the broker watch's, and the consumer's lag."""
        self._link.on_stats(stats)
        lag = consumer_lag(stats)
        if lag is not None:
            with self._stats_lock:
                self._stats = dataclasses.replace(self._stats, lag=lag)

    def _count_error(self, text: str, error: Any = None) -> None:
        """Count an error; log it unless it is about reaching the brokers (the broker watch
        says those once per outage) or its kind was said within 10 s."""
        # A broker error during an outage is part of it, whatever its kind.
        quiet = error is not None and (is_connection_error(error) or not self._link.watch.reachable)
        if not quiet:
            kind = text.split(":", 1)[0]
            self._every.log(log, logging.WARNING, kind, "kafka updates (group %s): %s",
                            self.group_id, text)  # fmt: skip
        self._add(errors=1, last_error=text)

    def _on_error(self, err: Any) -> None:
        # Broker-level trouble (connection refused, all brokers down): librdkafka reconnects
        # by itself; the poll loop backs off.
        self._broker_trouble = True
        self._link.on_error(err)
        self._count_error(f"broker error {err.name()}: {err.str()}", err)

    # -- rebalancing ----------------------------------------------------------------------

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        from confluent_kafka import OFFSET_BEGINNING

        fresh = [p for p in partitions if (p.topic, p.partition) not in self._seen]
        self._seen.update((p.topic, p.partition) for p in partitions)
        if not (self._replay and fresh):
            return  # librdkafka assigns them at their committed offsets
        for p in fresh:
            p.offset = OFFSET_BEGINNING
        log.info(
            "kafka updates (group %s): replaying %d partition(s) from their beginning",
            self.group_id,
            len(fresh),
        )
        consumer.assign(partitions)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        # Partitions move to another member: commit what was applied from them first, or it
        # would be applied again there.
        revoked = {(p.topic, p.partition) for p in partitions}
        self.commit(only=revoked)
        for key in revoked:
            self._pending.pop(key, None)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        # The group went on without us: committing now would fail; the new owner resumes
        # from the last commit (at-least-once).
        for p in partitions:
            self._pending.pop((p.topic, p.partition), None)

    # -- the loop -------------------------------------------------------------------------

    def _handle(self, msg: Any) -> bool | None:
        """Process one polled message; True at a partition's end, None if apply failed."""
        from confluent_kafka import KafkaError, TopicPartition

        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return True
            self._broker_trouble = True
            self._count_error(f"{error.name()}: {error.str()}", error)
            return False
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        try:
            if msg.key():
                # HugeCTR's sink never sets a message key; HugeCTR discards such messages.
                raise MalformedMessageError("has a message key; HugeCTR updates have none")
            update = decode_update(msg.value(), self._key_bytes, self._dims.get(topic))
        except MalformedMessageError as exc:
            located = exc.at(topic, partition, offset)
            log.warning("kafka updates: %s", located)
            self._add(malformed=1, last_error=str(located))
            self._done(topic, partition, offset)
            return False
        if update.is_beacon:
            self._add(beacons=1)
            self._done(topic, partition, offset)
            return False
        try:
            self._apply(topic, update.keys, update.vectors)
        except Exception as exc:
            self._count_error(
                f"apply failed for topic {topic!r} partition {partition} offset {offset} "
                f"({len(update.keys)} keys): {type(exc).__name__}: {exc}; retrying"
            )
            # Fetch this message again; seeking also drops what was prefetched after it, so
            # nothing later in the partition overtakes it.
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except Exception as seek_exc:  # KafkaException: partition no longer assigned
                self._count_error(f"cannot rewind {topic!r} partition {partition}: {seek_exc}")
            return None
        self._add(messages_applied=1, keys_applied=len(update.keys))
        self._link.watch.count_applied()
        self._done(topic, partition, offset)
        return False

    def _done(self, topic: str, partition: int, offset: int) -> None:
        self._pending[(topic, partition)] = offset + 1
        self._uncommitted += 1

    def poll_once(self, timeout_ms: int | None = None) -> int:
        """Wait for messages up to ``timeout_ms``, apply those available (at most
        ``max_commit_interval + 1``), and commit as HugeCTR would.

        Not to be called while :meth:`start`'s thread runs.

        Args:
            timeout_ms: the longest wait for the first message; ``None`` is
                ``poll_timeout_ms``.

        Returns:
            The number of messages processed (applied, malformed or beacons).

        Raises:
            UpdateSourceError: the consumer is closed.
        """
        if self._closed:
            raise UpdateSourceError("the update consumer is closed")
        timeout = self.config.poll_timeout_ms if timeout_ms is None else timeout_ms
        limit = self.config.max_commit_interval + 1
        processed = 0
        failed = False
        msg = self._consumer.poll(timeout / 1000)
        idle = msg is None
        while msg is not None:
            outcome = self._handle(msg)
            if outcome is None:
                failed = True
                break
            idle = idle or outcome
            if msg.error() is None:
                processed += 1
            if processed >= limit or self._stop.is_set():
                break
            # Drain what is already fetched without waiting; an empty queue here is not
            # idleness (the next fetch may be on its way).
            msg = self._consumer.poll(0)
        due = self._uncommitted > self.config.max_commit_interval or (idle and self._pending)
        # Not during an outage (a commit then waits for a coordinator and fails; the offsets
        # are kept for the first commit after the return), nor while one is under way.
        if self._in_flight is not None:
            waited = time.monotonic() - self._in_flight_since
            if waited > COMMIT_RESULT_WAIT_S:
                self._in_flight = None
                self._count_error(
                    f"no result of a commit after {waited:.0f} s; its offsets are kept for "
                    "the next commit"
                )
        if due and self._link.watch.reachable and self._in_flight is None:
            self._commit_async()
        if failed or self._broker_trouble:
            self._broker_trouble = False
            self._stop.wait(self.config.failure_backoff_ms / 1000)
        return processed

    def _commit_async(self) -> None:
        """Commit the offsets applied so far without waiting; :meth:`_on_commit` takes the
        result in a later poll (the offsets stay pending until it says they are committed)."""
        from confluent_kafka import TopicPartition

        items = dict(self._pending)
        offsets = [TopicPartition(t, p, o) for (t, p), o in items.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except Exception as exc:  # KafkaException: not in a group (yet), closed
            self._count_error(f"commit of {len(offsets)} partition offset(s) failed: {exc}", exc)
            return
        self._in_flight, self._in_flight_messages = items, self._uncommitted
        self._in_flight_since = time.monotonic()

    def _on_commit(self, err: Any, partitions: list[Any]) -> None:
        """librdkafka's result of a commit (``on_commit``, served by a poll; also called for
        the synchronous commits, which :meth:`commit` accounts for itself)."""
        items = self._in_flight
        if items is None:
            return
        answered = {(tp.topic, tp.partition): tp.offset for tp in partitions or []}
        # A failed request may come back without its partitions: it is taken as this one's
        # failure (at worst a synchronous commit's, and the offsets are committed again).
        if answered != items and not (err is not None and not answered):
            return
        self._in_flight = None
        failed = [tp for tp in partitions or [] if tp.error is not None]
        if err is not None or failed:
            error = err if err is not None else failed[0].error
            self._count_error(f"commit of {len(items)} partition offset(s) failed: {error}", error)
            return
        self._committed(items)
        self._uncommitted = max(0, self._uncommitted - self._in_flight_messages)

    def commit(self, only: set[tuple[str, int]] | None = None) -> bool:
        """Commit the offsets of the messages applied so far (synchronously).

        Args:
            only: restrict to these ``(topic, partition)``.

        Returns:
            Whether the commit succeeded (or there was nothing to commit); a failure is
            counted and the offsets are kept for the next attempt.
        """
        from confluent_kafka import TopicPartition

        items = {k: v for k, v in self._pending.items() if only is None or k in only}
        if not items:
            return True
        offsets = [TopicPartition(t, p, o) for (t, p), o in items.items()]
        try:
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # KafkaException: coordinator unavailable, rebalance
            self._count_error(f"commit of {len(offsets)} partition offset(s) failed: {exc}", exc)
            return False
        failed = [tp for tp in result or [] if tp.error is not None]
        if failed:
            self._count_error(
                f"commit failed for {', '.join(f'{tp.topic}[{tp.partition}]' for tp in failed)}"
                f": {failed[0].error}",
                failed[0].error,
            )
            return False
        self._committed(items)
        if only is None or not self._pending:
            self._uncommitted = 0
        return True

    def _committed(self, items: dict[tuple[str, int], int]) -> None:
        """Count a confirmed commit of ``items`` and drop them from the pending offsets,
        unless a later message of their partition has been applied since (then that
        message's offset stays pending)."""
        for key, offset in items.items():
            if self._pending.get(key) == offset:
                del self._pending[key]
        self._add(commits=1)

    # -- background thread ----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # a bug or librdkafka failure: keep serving updates
                log.exception("kafka updates: poll failed")
                self._count_error(f"poll failed: {type(exc).__name__}: {exc}")
                self._stop.wait(self.config.failure_backoff_ms / 1000)

    def start(self) -> None:
        """Apply updates in a background thread until :meth:`stop`.

        Raises:
            UpdateSourceError: the consumer is closed or already started.
        """
        if self._closed:
            raise UpdateSourceError("the update consumer is closed")
        if self._thread is not None:
            raise UpdateSourceError("the update consumer is already started")
        self._thread = threading.Thread(
            target=self._run, name=f"kafka-updates-{self.group_id}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the thread, commit what was applied, leave the group (idempotent).

        Args:
            timeout_s: longest wait for the thread (an ``apply`` under way finishes first).
        """
        if self._closed:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("kafka updates: the consumer thread did not stop in %s s", timeout_s)
                return
        self._closed = True
        try:
            self.commit()
        finally:
            self._consumer.close()
            self._link.close()

    close = stop

    def __enter__(self) -> UpdateConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
