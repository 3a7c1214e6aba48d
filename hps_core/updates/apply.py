"""Apply online updates to the tiers a serving process reads, and to its GPU caches.

HugeCTR's update consumers write the volatile and persistent databases only; rows a GPU cache
holds stay stale until refreshed or evicted. Here one message is applied everywhere the
process could answer it from:

1. **keys the shared host tier holds**: their rows are overwritten in place in the
   shared-memory segment (:meth:`~hps_core.tiers.host_table.SharedHostTable.write_rows`). The
   segment is one copy per machine, so every instance writes the same values: harmless; GPUs
   read the same pages through their zero-copy mapping (:mod:`hps_core.infer.gpu.host_mapping`).
2. **other keys**: into this process's update overlay
   (:class:`~hps_core.tiers.overlay.OverlayStore`), the first tier below the shared one, which
   the host path and the GPU pipeline (``lookup_lower``) consult; and into the Redis cluster
   when the model has one (HugeCTR's volatile database). RocksDB is opened read-only by
   serving processes and is not written: the overlay answers before it.
3. **GPU caches**: rows of the message's keys that a cache holds (dynamic, private or shared
   between instances, or static) are overwritten, inside the caches' ordering section
   (:meth:`~hps_core.lookup.model_lookup.ModelLookup.update_cached_rows`).

Whole or nothing: a message is applied under one lock; steps 1 and 2 keep what they overwrite
and put it back if a later step fails (a Redis node that does not take its rows, a cache that
raises), then the error goes to the consumer, which retries the message. Rows a Redis cluster
took before the failure stay (they hold the message's values; the retry writes them again).
Lookups of other processes or threads may see a message half way through being written (rows
are written while they read); the lock is the applier's, not the readers'.

Settling: a batch that read a key's old row before step 1 may insert it into a GPU cache after
step 3 (the cache bank inserts a batch's misses after its answer, for the ranking pipeline
and the GPU lookups alike; the refresher reads the host first and writes the cache later).
So the cached rows of every applied message are written once more, from the tiers' current
values, ``settle_s`` after the apply (longer than a batch), which no batch that started
before the apply can follow.

Which tables take updates: those whose topic (``hps_et.<model>.<table>``) matches one of the
``update_filters`` of the ps.json's databases (regular expressions searched in the topic, as
HugeCTR subscribes each database's update source to the topics its filters match; the default
``^hps_.+$`` matches every table). The filters of ``volatile_db`` count unless it is disabled
in favour of RocksDB (then the shared host tier holds no rows, as HugeCTR has no volatile
database), those of ``persistent_db`` when it is RocksDB: rows reach the tiers that stand for
both here. A model none of whose tables take updates starts no Kafka consumer at all
(:meth:`ModelUpdates.start` returns ``None`` and says so once).

Example:
    >>> updater = ModelUpdater(HPS(ps_json).model("dlrm", device_id=0))  # doctest: +SKIP
    >>> updater.apply("hps_et.dlrm.t0", keys, vectors)  # doctest: +SKIP
    >>> updates = ModelUpdates.start(lookup, group_id="hps.volatile.host.repo.dlrm_0")
    ... # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import logging
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hps_core.config.enums import DatabaseType
from hps_core.config.schema import PSConfig
from hps_core.errors import HPSError
from hps_core.lookup.model_lookup import ModelLookup
from hps_core.lookup.table_lookup import CachedTableLookup
from hps_core.tiers.backing import table_tag
from hps_core.tiers.cascade import LowerTier, TieredTable
from hps_core.tiers.factory import receives_updates
from hps_core.updates.consumer import UpdateConsumer, UpdateStats, default_group_id

logger = logging.getLogger("hps_core")

SETTLE_S = 0.5
"""Delay of the second write of cached rows: longer than a batch takes (see the notes)."""


class UpdateApplyError(HPSError):
    """A message could not be applied; nothing of it was kept (the consumer retries it)."""


@dataclass(frozen=True)
class ApplyStats:
    """What an updater applied since it was made.

    Args:
        messages: messages applied whole.
        keys: rows in those messages (repeated keys counted once per message).
        host_rows: rows overwritten in the shared host tier.
        overlay_rows: rows written to the update overlay (keys the shared tier lacks).
        redis_rows: rows written to the Redis cluster.
        cache_tables: cache updates run (one per message and table with a cache, settling
            included).
        failed: messages that failed and were undone.
        last_error: the text of the last failure.
    """

    messages: int = 0
    keys: int = 0
    host_rows: int = 0
    overlay_rows: int = 0
    redis_rows: int = 0
    cache_tables: int = 0
    failed: int = 0
    last_error: str | None = None


@dataclass
class _Target:
    table_id: int
    host: TieredTable
    overlay: LowerTier
    redis: LowerTier | None


def update_filters(config: PSConfig) -> tuple[str, ...]:
    """The ``update_filters`` in effect: ``volatile_db``'s unless it is disabled in favour of
    RocksDB, and ``persistent_db``'s when it is RocksDB (see the module notes).

    Args:
        config: the ps.json.

    Returns:
        The patterns, volatile ones first.
    """
    volatile, persistent = config.volatile_db, config.persistent_db
    rocks = persistent.type == DatabaseType.ROCKS_DB
    filters: list[str] = []
    if not (volatile.type == DatabaseType.DISABLED and rocks):
        filters += volatile.update_filters
    if rocks:
        filters += [f for f in persistent.update_filters if f not in filters]
    return tuple(filters)


def updated_tables(config: PSConfig, model: str) -> list[str]:
    """The topics of ``model``'s tables that take online updates (none without a Kafka
    update source).

    Args:
        config: the ps.json.
        model: the name of one of its models.

    Returns:
        The topics (``hps_et.<model>.<table>``), in table order.

    Example:
        >>> updated_tables(config, "dlrm")  # doctest: +SKIP
        ['hps_et.dlrm.sparse_embedding0', 'hps_et.dlrm.sparse_embedding1']
    """
    if not receives_updates(config):
        return []
    return _filtered_tables(config, model)


def _filtered_tables(config: PSConfig, model: str) -> list[str]:
    """The topics of ``model``'s tables that its ps.json's ``update_filters`` match."""
    patterns = [re.compile(f) for f in update_filters(config)]
    topics = [table_tag(model, t.name) for t in config.model(model).tables]
    return [t for t in topics if any(p.search(t) for p in patterns)]


def instance_group_id(instance: str, scope: str = "", host: str | None = None) -> str:
    """The Kafka consumer group of one serving instance: stable across its restarts.

    Each instance keeps its own overlay (and GPU caches), so each must receive every update:
    instances may not share a group (Kafka would split the partitions between them). The
    group is :func:`~hps_core.updates.consumer.default_group_id` (one per host, HugeCTR's
    naming) narrowed by ``scope`` (what tells two servers of one host apart, e.g. a digest of
    the model repository path) and the Triton instance name. A restarted instance joins its
    own group again, so its committed offsets say how far it got.

    Args:
        instance: Triton's ``model_instance_name`` (e.g. ``dlrm_0_1``).
        scope: distinguishes servers on one host; hashed, so a path may be passed.
        host: the host part; ``None`` is this machine's hostname.

    Returns:
        The group id.

    Example:
        >>> instance_group_id("dlrm_0_1", "/models/repo", host="node7")
        'hps.volatile.node7.b6092542a7.dlrm_0_1'
    """
    digest = hashlib.sha256(scope.encode()).hexdigest()[:10]
    return default_group_id("volatile", host=f"{host or socket.gethostname()}.{digest}.{instance}")


class ModelUpdater:
    """The ``apply`` callback of an :class:`UpdateConsumer` for one model's lookup.

    Args:
        lookup: the model's lookup (host or GPU); every table is opened. Its tables
            must have been opened with an update source (each is a cascade with an overlay).
        settle_s: delay of the second write of cached rows; 0 disables it.
        topics: the topics of the tables to apply; ``None`` is those the ps.json's
            ``update_filters`` match.

    Raises:
        UpdateApplyError: a table was not opened for updates.

    Example:
        >>> updater = ModelUpdater(lookup)  # doctest: +SKIP
        >>> updater("hps_et.dlrm.t0", np.array([7]), np.ones((1, 16), np.float32))
        ... # doctest: +SKIP
    """

    def __init__(
        self, lookup: ModelLookup, settle_s: float = SETTLE_S, topics: list[str] | None = None
    ) -> None:
        lookup.open_all()
        self.lookup = lookup
        self.settle_s = settle_s
        self._targets: dict[str, _Target] = {}
        if topics is None:
            topics = _filtered_tables(lookup.config, lookup.model.name)
        for table_id, table in enumerate(lookup.model.tables):
            tag = table_tag(lookup.model.name, table.name)
            if tag not in topics:
                continue
            host = lookup.table(table_id).host
            overlay = host.lower_store("overlay") if isinstance(host, TieredTable) else None
            if overlay is None:
                raise UpdateApplyError(
                    f"model '{lookup.model.name}' table '{table.name}' was opened without an "
                    "update source (ps.json update_source.type must be 'kafka_message_queue')"
                )
            self._targets[tag] = _Target(table_id, host, overlay, host.lower_store("redis_cluster"))
        self._lock = threading.Lock()
        self._stats = ApplyStats()
        # Settling: (due time, sequence, table id, keys), a heap served by one thread.
        self._due: list[tuple[float, int, int, np.ndarray]] = []
        self._due_cv = threading.Condition()
        self._sequence = 0
        self._settler: threading.Thread | None = None
        self._closed = False

    @property
    def tags(self) -> list[str]:
        """The table tags (Kafka topics) this updater applies."""
        return sorted(self._targets)

    @property
    def dims(self) -> dict[str, int]:
        """Floats per vector of each tag (for :class:`UpdateConsumer`'s ``dims``)."""
        return {tag: t.host.dim for tag, t in self._targets.items()}

    @property
    def stats(self) -> ApplyStats:
        """A snapshot of the counters."""
        return self._stats

    def _add(self, **deltas: Any) -> None:
        values = {
            k: (v if k == "last_error" else getattr(self._stats, k) + v) for k, v in deltas.items()
        }
        self._stats = dataclasses.replace(self._stats, **values)

    def __call__(self, tag: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """:meth:`apply` (the form :class:`UpdateConsumer` calls)."""
        self.apply(tag, keys, vectors)

    def apply(self, tag: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Apply one message whole, or nothing of it.

        Args:
            tag: the table's tag (``hps_et.<model>.<table>``, the message's topic).
            keys: int64 ``[n]``; repeated keys: the last row wins.
            vectors: float32 ``[n, dim]``.

        Raises:
            UpdateApplyError: unknown table, wrong shapes, or a tier failed (undone).
        """
        target = self._targets.get(tag)
        if target is None:
            raise UpdateApplyError(f"no table {tag!r} in model '{self.lookup.model.name}'")
        keys = np.ascontiguousarray(keys, dtype=np.int64).ravel()
        vectors = np.asarray(vectors, dtype=np.float32)
        dim = target.host.dim
        if vectors.shape != (len(keys), dim):
            raise UpdateApplyError(
                f"{tag}: {len(keys)} keys need vectors of shape {(len(keys), dim)}, got "
                f"{vectors.shape}"
            )
        if not len(keys):
            return
        # One row per key, the last one of the message (a later row of a key is newer).
        reversed_unique, last = np.unique(keys[::-1], return_index=True)
        keys, vectors = reversed_unique, np.ascontiguousarray(vectors[len(vectors) - 1 - last])
        with self._lock:
            try:
                written = self._write(target, keys, vectors)
            except Exception as exc:
                text = f"{tag}: update of {len(keys)} keys failed and was undone: {exc}"
                self._add(failed=1, last_error=text)
                raise UpdateApplyError(text) from exc
            self._add(messages=1, keys=len(keys), **written)
        if self.settle_s > 0 and self._has_cache(target):
            self._schedule(target.table_id, keys)

    def _has_cache(self, target: _Target) -> bool:
        return isinstance(self.lookup.table(target.table_id), CachedTableLookup)

    def _write(self, target: _Target, keys: np.ndarray, vectors: np.ndarray) -> dict[str, int]:
        """Steps 1-3 of the module notes, undone if any raises."""
        shared, overlay, redis = target.host.shared, target.overlay, target.redis
        dim = target.host.dim
        rows = shared.find(keys) if shared.rows else np.full(len(keys), -1, np.int64)
        held = rows >= 0
        held_rows, new = rows[held], ~held
        new_keys, new_vectors = keys[new], vectors[new]
        # What the writes replace, for the undo.
        old_shared = shared.read_stored(held_rows)  # restored byte for byte
        old_overlay, in_overlay = overlay.store.lookup_stored(
            overlay.table, new_keys, dim, count=False
        )
        # A step is marked before it runs: one that fails may have written part of its rows,
        # and undoing a step that wrote nothing is harmless.
        done: list[str] = []
        try:
            if len(held_rows):
                done.append("shared")
                shared.write_rows(held_rows, vectors[held])
            if len(new_keys):
                done.append("overlay")
                overlay.store.insert(overlay.table, new_keys, new_vectors)
                if redis is not None:
                    before = redis.store.errors
                    redis.store.insert(redis.table, new_keys, new_vectors)
                    if redis.store.errors != before:
                        raise UpdateApplyError("the Redis cluster did not take every row")
            cache = self._has_cache(target)
            if cache:
                done.append("cache")
                self.lookup.update_cached_rows(target.table_id, keys, vectors)
        except BaseException:
            if "shared" in done:
                shared.write_stored(held_rows, old_shared)
            if "overlay" in done:
                overlay.store.remove(overlay.table, new_keys[~in_overlay])
                overlay.store.insert_stored(
                    overlay.table, new_keys[in_overlay], old_overlay[in_overlay], dim
                )
            if "cache" in done:
                self._restore_cache(target, keys)
            raise
        return {
            "host_rows": len(held_rows),
            "overlay_rows": len(new_keys),
            "redis_rows": len(new_keys) if redis is not None else 0,
            "cache_tables": int(cache),
        }

    def _restore_cache(self, target: _Target, keys: np.ndarray) -> None:
        # The cache update may have run before the failure: put the tiers' (restored) rows back.
        try:
            stored, found = target.host.lookup_stored(keys)
            self.lookup.update_cached_rows(target.table_id, keys[found], stored[found], stored=True)
        except Exception as exc:  # the cache is broken; the settling pass tries again
            logger.error("%s: cached rows not restored after a failed update: %s", target, exc)

    def _current(self, target: _Target, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The keys' rows as the shared tier and the overlay hold them now (no counters),
        stored in the table's precision (both tiers' own bytes)."""
        shared, overlay = target.host.shared, target.overlay
        rows = shared.find(keys) if shared.rows else np.full(len(keys), -1, np.int64)
        held = rows >= 0
        dim = target.host.dim
        values, found = overlay.store.lookup_stored(overlay.table, keys, dim, count=False)
        values[held] = shared.read_stored(rows[held])
        return values, found | held

    # --- settling --------------------------------------------------------------------------

    def _schedule(self, table_id: int, keys: np.ndarray) -> None:
        with self._due_cv:
            if self._closed:
                return
            self._sequence += 1
            heapq.heappush(
                self._due, (time.monotonic() + self.settle_s, self._sequence, table_id, keys)
            )
            if self._settler is None:
                self._settler = threading.Thread(
                    target=self._settle_loop,
                    name=f"hps-update-settle-{self.lookup.model.name}",
                    daemon=True,
                )
                self._settler.start()
            self._due_cv.notify()

    def _settle_loop(self) -> None:
        targets = {t.table_id: t for t in self._targets.values()}
        while True:
            with self._due_cv:
                while not self._closed and (not self._due or self._due[0][0] > time.monotonic()):
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    self._due_cv.wait(wait)
                if self._closed:
                    return
                _, _, table_id, keys = heapq.heappop(self._due)
            try:
                self.settle(targets[table_id], keys)
            except Exception as exc:  # a cache failure must not stop later settling
                logger.error("update settling of %s failed: %s", targets[table_id], exc)

    def settle(self, target: _Target, keys: np.ndarray) -> None:
        """Write the cached rows of ``keys`` again from the tiers' current values."""
        with self._lock:
            stored, found = self._current(target, keys)
            if found.any():
                self.lookup.update_cached_rows(
                    target.table_id, keys[found], stored[found], stored=True
                )
                self._add(cache_tables=1)

    def flush(self) -> None:
        """Run the settling writes still due now (tests; :meth:`close` drops them)."""
        targets = {t.table_id: t for t in self._targets.values()}
        with self._due_cv:
            due, self._due = self._due, []
        for _, _, table_id, keys in sorted(due):
            self.settle(targets[table_id], keys)

    def close(self) -> None:
        """Stop the settling thread (idempotent); writes still due are dropped."""
        with self._due_cv:
            self._closed = True
            self._due = []
            self._due_cv.notify_all()
        if self._settler is not None:
            self._settler.join(5.0)
            self._settler = None


class ModelUpdates:
    """A model's update consumer and updater, started and stopped together.

    Args:
        updater: applies the messages.
        consumer: receives them (its thread is started by :meth:`start`).
    """

    def __init__(self, updater: ModelUpdater, consumer: UpdateConsumer) -> None:
        self.updater = updater
        self.consumer = consumer

    @classmethod
    def start(
        cls,
        lookup: ModelLookup,
        group_id: str,
        *,
        replay: bool = True,
        kafka_options: Mapping[str, Any] | None = None,
        settle_s: float = SETTLE_S,
    ) -> ModelUpdates | None:
        """Start applying the updates of ``lookup``'s tables, if its ps.json has a source
        and its ``update_filters`` match at least one of them (see the module notes).

        Args:
            lookup: the model's lookup.
            group_id: the consumer group (:func:`instance_group_id`).
            replay: read the retained updates from their beginning at start (see
                :mod:`hps_core.updates.consumer`): the overlay of a new process is empty.
            kafka_options: further librdkafka settings.
            settle_s: see :class:`ModelUpdater`.

        Returns:
            The running updates, or ``None`` when ``update_source.type`` is ``null`` or no
            table of the model takes updates (no consumer is made).

        Raises:
            UpdateSourceError: the consumer cannot be created.
        """
        if not receives_updates(lookup.config):
            return None
        model = lookup.model
        topics = updated_tables(lookup.config, model.name)
        if not topics:
            filters = update_filters(lookup.config)
            logger.info(
                "model %s: no Kafka consumer: none of its tables takes online updates (%s)",
                model.name,
                f"update_filters {' '.join(filters)} match none of "
                + ", ".join(table_tag(model.name, t.name) for t in model.tables)
                if filters
                else "the databases' update_filters are empty",
            )
            return None
        updater = ModelUpdater(lookup, settle_s, topics)
        try:
            consumer = UpdateConsumer(
                lookup.config.update_source,
                updater.tags,
                updater,
                group_id=group_id,
                dims=updater.dims,
                key_bytes=8 if lookup.config.supportlonglong else 4,
                kafka_options=kafka_options,
                replay=replay,
            )
        except BaseException:
            updater.close()
            raise
        consumer.start()
        logger.info(
            "model %s: applying online updates of %d table(s) from Kafka (group %s%s)",
            lookup.model.name,
            len(updater.tags),
            group_id,
            ", replaying the retained updates" if replay else "",
        )
        return cls(updater, consumer)

    @property
    def stats(self) -> UpdateStats:
        """The consumer's counters (messages and keys applied, malformed, errors)."""
        return self.consumer.stats

    def stop(self) -> None:
        """Stop the consumer (committing what was applied), then the updater (idempotent)."""
        try:
            self.consumer.stop()
        finally:
            self.updater.close()
