"""The Redis tier: embedding tables in a Redis cluster (ps.json ``volatile_db`` of type
``redis_cluster``), through redis-py's cluster client.

The layout is HugeCTR's (``HugeCTR/src/hps/redis_backend.cpp``), so a cluster filled by either
can be read by the other:

- A table (HPS's tag ``hps_et.<model>.<table>``) is split over ``num_partitions`` partitions
  by HugeCTR's key hash (Pelle Evensen's ``rrxmrrxmsx_0`` mixer of the key as uint64, modulo
  ``num_partitions``). Partition ``p`` is the Redis hash ``hps_et{<table>/p<p>}v``: field =
  the 8 bytes of the int64 key (little-endian), value = the ``dim`` float32 of the vector
  (little-endian). The braces are a Redis hash tag: a partition and its metadata hash
  ``hps_et{<table>/p<p>}t`` sit on the same node.
- ``num_partitions`` must never change once a table is written (keys would be looked for in
  the wrong partition). Its default, ``min(16, CPU cores)``, depends on the machine: give it
  explicitly when machines of different sizes share a cluster.
- Access metadata as HugeCTR keeps it: nothing for ``evict_random``; for ``evict_oldest`` the
  time of the last insert or hit (seconds, 8-byte little-endian ``time_t``); for
  ``evict_least_used`` a decimal counter (``HINCRBY``). Hits are recorded by a background
  worker after the lookup has answered, as HugeCTR does.
- Reads and writes go in batches of at most ``max_batch_size`` keys of one partition
  (``HMGET``/``HSET``); the batches bound for one node go as one pipeline, the nodes in
  parallel.
- Connections: at most ``num_node_connections`` per node carry this process's reads, writes
  and evictions, as HugeCTR's connection pool; a sender that finds them all busy waits for
  one (at most ``socket_timeout``, then its keys fail like a slow node's, without marking the
  node down). redis-py may open one more per node for the cluster's topology queries.
- Overflow: after a batch leaves a partition with more than ``overflow_margin`` entries, it is
  shrunk to ``overflow_margin * overflow_resolution_target`` (rounded) by the policy: random
  keys, the oldest, or the least used first (then the surviving counters are halved). Two
  differences from HugeCTR: it draws ``evict_random`` victims from the metadata hash, which
  that policy never fills, so it never evicts (here they come from the partition itself); and
  it deletes whole ``max_batch_size`` batches of victims, overshooting the target (here only
  the excess goes).

Failures: a node that does not answer (refused, timed out, down) costs one bounded wait
(``connect_timeout``/``socket_timeout``); its keys are reported not found, the failure is
counted in :attr:`RedisClusterStore.errors`, and the node is skipped for ``retry_after`` seconds
before it is tried again. Meanwhile the slot map is refreshed (at most once per
``retry_after``), so a replica promoted in its place or the node coming back is picked up
without a restart. Only when no node answered does a lookup raise
:class:`~hps_core.errors.TierUnavailableError`. The cluster's nodes need
``cluster-require-full-coverage no`` for the others to keep answering while one is down.

TLS (``enable_tls``), as HugeCTR (redis++ over hiredis): the CA certificates
(``tls_ca_certificate``, a bundle file or a hashed folder), the client certificate and key;
every connection, to a seed for the topology queries as to a node for the data, asks for
``tls_server_name_identification`` as its SNI, whatever the node's address. The server's
chain must lead to one of those CAs; its host name is not checked (hiredis, HugeCTR's client,
checks none). Python sends no SNI for an empty name (HugeCTR neither) or an IP address
literal (OpenSSL would).

Secrets: the password and the TLS files are handed to redis-py only; they appear in no log,
``repr`` or error message of this module (the files by path only).
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hps_core.config import OverflowPolicy, VolatileDBConfig
from hps_core.config.parse_tiers import redis_seeds
from hps_core.errors import ConfigError, ModelFileError, Problem, RequestError, TierUnavailableError
from hps_core.hashing import partition_of
from hps_core.log_every import LogEvery
from hps_core.tiers.backing import copy_sparse_folder, key_bytes

logger = logging.getLogger(__name__)
_EVERY = LogEvery(60.0)  # other failures of a table's lookups: a line a minute, not per request

CLIENT_NAME = "hps-triton"
"""The name this tier's connections give themselves (``CLIENT SETNAME``)."""

_KEY = np.dtype("<i8")
_VALUE = np.dtype("<f4")
# Redis's replies to a missing or wrong password (redis-py wraps them at cluster open).
_AUTH_REPLIES = ("WRONGPASS", "NOAUTH", "username-password", "authenticated", "Authentication")
# How a node's refusal of our certificate shows after a TLS 1.3 handshake (or an alert).
_TLS_REFUSALS = (
    "EOF occurred in violation of protocol",
    "ALERT",
    "reset by peer",
    "Broken pipe",
    "closed by server",
)
_TIME = struct.Struct("<q")  # HugeCTR writes the raw time_t: 8 bytes, little-endian on x86/ARM


def partition_key(table: str, part: int, suffix: str = "v") -> str:
    """HugeCTR's Redis key of a partition: ``hps_et{<table>/p<part>}<suffix>``.

    ``suffix`` ``v`` is the hash of vectors, ``t`` the hash of access metadata.

    Example:
        >>> partition_key("hps_et.dlrm.t0", 3)
        'hps_et{hps_et.dlrm.t0/p3}v'
    """
    return f"hps_et{{{table}/p{part}}}{suffix}"


def sni_connection_class(server_name: str) -> type:
    """A redis-py ``SSLConnection`` class whose TLS handshakes ask for ``server_name`` (SNI).

    redis-py hands the connection's ``host`` (the node's address) to
    ``SSLContext.wrap_socket`` as ``server_hostname``, which is both the SNI and, under
    ``ssl_check_hostname`` (off here), the name checked. The class sets ``host`` to
    ``server_name`` (``None`` when empty: no SNI) for that call only; a connection is in one
    thread's hands while it connects, so nothing else sees the swap. Used as the
    ``connection_class`` of every node's pool, it covers the data connections and the
    cluster client's topology queries alike.

    Example:
        >>> sni_connection_class("redis.localhost").server_name  # doctest: +SKIP
        'redis.localhost'
    """
    from redis.connection import SSLConnection

    class SniSSLConnection(SSLConnection):
        def _wrap_socket_with_ssl(self, sock: Any) -> Any:
            address, self.host = self.host, server_name or None
            try:
                return super()._wrap_socket_with_ssl(sock)
            finally:
                self.host = address

    SniSSLConnection.server_name = server_name  # type: ignore[attr-defined]
    return SniSSLConnection


class _PoolBusy(Exception):
    """Every connection this process may hold to a node stayed busy (``num_node_connections``)."""


@dataclass
class _Job:
    """Commands for one partition, sent together in the pipeline of the partition's node."""

    hkey: str
    commands: list[tuple[Any, ...]]
    rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    replies: list[Any] | None = None
    error: str = ""
    node: str = ""  # the node it was last sent to
    node_down: bool = False  # it failed because its node does not answer (said once per outage)


class RedisClusterStore:
    """A Redis cluster of embedding tables in HugeCTR's layout (a :class:`BackingStore`).

    Args:
        config: ps.json ``volatile_db`` (``address``, ``user_name``, ``password``,
            ``num_partitions``, ``max_batch_size``, the ``overflow_*`` and ``tls_*`` fields).
        connect_timeout: seconds to wait for a node's TCP (and TLS) connection.
        socket_timeout: seconds to wait for a node's reply.
        retry_after: seconds a node that failed is skipped (its keys reported not found)
            before it is tried again; also the least time between two slot-map refreshes.

    Raises:
        ConfigError: the address does not parse, a batch size is below 1, the cluster
            refused ``user_name``/``password`` (named by user, never the password), the TLS
            files do not load, or the CA certificates do not verify the nodes' certificate.
        TierUnavailableError: no seed of ``address`` answered (the message names them).

    Example:
        >>> with RedisClusterStore(config) as store:  # doctest: +SKIP
        ...     store.load_sparse("hps_et.dlrm.t0", "0_sparse_model", dim=128)
        ...     vectors, found = store.lookup("hps_et.dlrm.t0", keys, dim=128)
    """

    reports_unanswered = True
    """:meth:`lookup` says which keys' node did not answer (its ``unanswered`` mask)."""

    def __init__(
        self,
        config: VolatileDBConfig,
        *,
        connect_timeout: float = 1.0,
        socket_timeout: float = 2.0,
        retry_after: float = 1.0,
    ) -> None:
        from redis.backoff import NoBackoff
        from redis.cluster import ClusterNode, RedisCluster
        from redis.exceptions import AuthenticationError, RedisClusterException, RedisError
        from redis.retry import Retry

        self.kind = "redis_cluster"
        self.errors = 0
        #: What the last failed request's nodes answered (or why they did not).
        self.last_failure = ""
        self.address = config.address
        self.user_name = config.user_name
        self.num_partitions = config.resolved_num_partitions
        self.max_batch_size = config.max_batch_size
        self.num_node_connections = config.num_node_connections
        self.overflow_margin = config.overflow_margin
        self.overflow_policy = config.overflow_policy
        self.retry_after = retry_after
        self._secrets = tuple(s for s in (config.password,) if s)
        for name in ("num_partitions", "max_batch_size", "num_node_connections"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    Problem(f"volatile_db.{name}", f"must be at least 1, got {getattr(self, name)}")
                )
        try:
            seeds = redis_seeds(config.address)
        except ValueError as exc:
            raise ConfigError(Problem("volatile_db.address", str(exc))) from None
        # HugeCTR's target: margin * target, rounded half up (VolatileBackendParams).
        self._resolution_margin = (
            None
            if self.overflow_margin is None
            else int(self.overflow_margin * config.overflow_resolution_target + 0.5)
        )
        self._lock = threading.Lock()
        self._slots: dict[str, threading.BoundedSemaphore] = {}  # node -> free connections
        self._slot_wait_s = socket_timeout
        self._down_until: dict[str, float] = {}
        self._next_refresh = 0.0
        self._pool: ThreadPoolExecutor | None = None
        self._background = ThreadPoolExecutor(1, thread_name_prefix="hps-redis-meta")
        self._pending: list[Future[None]] = []
        self._clock: Callable[[], float] = time.time  # tests set it to order insert times

        kwargs: dict[str, Any] = {
            "socket_connect_timeout": connect_timeout,
            "socket_timeout": socket_timeout,
            "socket_keepalive": True,  # as HugeCTR's keep_alive
            "client_name": CLIENT_NAME,  # who holds a connection, in CLIENT LIST
            # The per-node pool's bound; senders never need more than num_node_connections
            # (see _connection), the one more is for redis-py's own topology queries.
            "max_connections": config.num_node_connections + 1,
        }
        if config.password:
            kwargs["username"] = config.user_name or None
            kwargs["password"] = config.password
        if config.enable_tls:
            kwargs.update(self._tls_kwargs(config))
            # redis-py hands connection_class to each node's connection pool only on its
            # from-URL path (elsewhere Redis() rejects it); a plain redis:// URL of the
            # first seed selects that path and nothing else (the TLS comes from the class).
            host, port = seeds[0]
            kwargs["url"] = f"redis://{f'[{host}]' if ':' in host else host}:{port}"
        try:
            self._rc: Any = RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in seeds],
                require_full_coverage=False,
                # A few quick retries on topology changes; no backoff: a lookup must not wait.
                retry=Retry(NoBackoff(), 1),
                **kwargs,
            )
        except (RedisError, RedisClusterException) as exc:
            reason = self._redact(str(exc))
            if isinstance(exc, AuthenticationError) or any(m in reason for m in _AUTH_REPLIES):
                raise ConfigError(
                    Problem(
                        "volatile_db.password",
                        f"the Redis cluster at '{self.address}' refused user "
                        f"'{self.user_name}' (wrong user_name or password, or none given; "
                        "the password is not shown)",
                    )
                ) from None
            if config.enable_tls and "CERTIFICATE_VERIFY_FAILED" in reason:
                raise ConfigError(
                    Problem(
                        "volatile_db.tls_ca_certificate",
                        f"the Redis cluster at '{self.address}' presented a certificate that "
                        f"'{config.tls_ca_certificate}' does not verify: {reason}",
                    )
                ) from None
            if config.enable_tls and any(m in reason for m in _TLS_REFUSALS):
                reason += (
                    " (over TLS: the node ended the connection after the handshake; does it "
                    f"trust tls_client_certificate '{config.tls_client_certificate}'?)"
                )
            raise TierUnavailableError(
                f"volatile_db.address '{self.address}': cannot open the Redis cluster: {reason}"
            ) from None
        logger.info(
            "volatile_db: Redis cluster at %s (%d nodes, %d partitions per table)",
            self.address,
            len(self._rc.get_primaries()),
            self.num_partitions,
        )

    @staticmethod
    def _tls_kwargs(config: VolatileDBConfig) -> dict[str, Any]:
        """redis-py's TLS settings from HugeCTR's (``redis_backend.cpp``: redis++
        ``ConnectionOptions::tls``, i.e. hiredis ``redisCreateSSLContext``).

        - ``tls_ca_certificate``: a folder is a hashed CA folder (``capath``), else a bundle.
        - ``tls_client_certificate``/``tls_client_key``: presented to every node.
        - ``tls_server_name_identification``: the SNI of every handshake, through
          :func:`sni_connection_class` (redis-py would send the node's address).
        - The chain is verified (``SSL_VERIFY_PEER``), the host name not: hiredis checks
          none, so a certificate need not name the nodes' addresses.

        Raises:
            ConfigError: the CA certificates, or the client certificate and key, do not load
                (named by field and path, never by contents).
        """
        ca = str(config.tls_ca_certificate)
        # Load the files once here, so that a missing or broken one is named by its field
        # (redis-py would only fail at the first connection, as "cannot connect").
        context = ssl.create_default_context()
        try:
            context.load_verify_locations(**{"capath" if os.path.isdir(ca) else "cafile": ca})
        except (OSError, ssl.SSLError) as exc:  # the messages carry no file contents
            raise ConfigError(
                Problem("volatile_db.tls_ca_certificate", f"cannot load '{ca}': {exc}")
            ) from None
        try:
            context.load_cert_chain(str(config.tls_client_certificate), str(config.tls_client_key))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                Problem(
                    "volatile_db.tls_client_certificate",
                    f"cannot load '{config.tls_client_certificate}' with tls_client_key "
                    f"'{config.tls_client_key}': {exc}",
                )
            ) from None
        tls: dict[str, Any] = {
            "connection_class": sni_connection_class(config.tls_server_name_identification),
            "ssl_cert_reqs": "required",
            "ssl_check_hostname": False,
            "ssl_certfile": str(config.tls_client_certificate),
            "ssl_keyfile": str(config.tls_client_key),
        }
        tls["ssl_ca_path" if os.path.isdir(ca) else "ssl_ca_certs"] = ca
        return tls

    def __repr__(self) -> str:
        return (
            f"RedisClusterStore(address={self.address!r}, user_name={self.user_name!r}, "
            f"num_partitions={self.num_partitions}, errors={self.errors})"
        )

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    # -- routing ---------------------------------------------------------------------------

    def _run(self, jobs: Sequence[_Job]) -> int:
        """Send each job to its partition's node (one pipeline per node, the nodes in
        parallel); fills ``replies`` or ``error`` of each job. Jobs MOVED or ASKed elsewhere
        are sent once more after a slot-map refresh. Returns how many nodes failed."""
        from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError

        failed = self._send(jobs)
        redirected = [
            job
            for job in jobs
            if job.replies is not None
            and any(isinstance(r, MovedError | AskError | TryAgainError) for r in job.replies)
        ]
        if redirected:
            self._refresh(force=True)
            for job in redirected:
                job.replies = None
            failed += self._send(redirected)
        for job in jobs:
            if job.replies is None:
                continue
            bad = next((r for r in job.replies if isinstance(r, Exception)), None)
            if isinstance(bad, ClusterDownError | MovedError | AskError | TryAgainError):
                # The node that answered so is the one its slot map named: say which.
                reason = f"node {job.node}: {type(bad).__name__}: {bad}"
                job.replies, job.error = None, self._redact(reason)
            elif bad is not None:
                raise RequestError(f"volatile_db '{self.address}': Redis replied {bad}")
        return failed

    def _send(self, jobs: Sequence[_Job]) -> int:
        by_node: dict[str, tuple[Any, list[_Job]]] = {}
        for job in jobs:
            try:
                node = self._rc.get_node_from_key(job.hkey)
            except Exception as exc:  # slot not covered: no node serves this partition
                job.error = self._redact(f"no node serves {job.hkey}: {exc}")
                continue
            job.node = node.name
            by_node.setdefault(node.name, (node, []))[1].append(job)
        now = time.monotonic()
        batches = []
        for name, (node, node_jobs) in by_node.items():
            if self._down_until.get(name, 0.0) > now:
                for job in node_jobs:
                    job.error = f"node {name} is down (retried after {self.retry_after} s)"
                    job.node_down = True
                continue
            batches.append((name, node, node_jobs))
        if len(batches) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(8, thread_name_prefix="hps-redis")
            outcomes = list(self._pool.map(lambda b: self._send_node(*b), batches))
        else:
            outcomes = [self._send_node(*b) for b in batches]
        failed = sum(1 for ok in outcomes if not ok)
        failed += sum(1 for name in by_node if name not in {b[0] for b in batches})
        if failed:
            self._refresh()
        return failed

    @contextlib.contextmanager
    def _connection(self, name: str) -> Iterator[None]:
        """Hold one of node ``name``'s ``num_node_connections`` for this thread's commands.

        Raises:
            _PoolBusy: none came free within ``socket_timeout``.
        """
        with self._lock:
            slot = self._slots.get(name)
            if slot is None:
                slot = self._slots[name] = threading.BoundedSemaphore(self.num_node_connections)
        if not slot.acquire(timeout=self._slot_wait_s):
            raise _PoolBusy(
                f"node {name}: all {self.num_node_connections} connections "
                f"(num_node_connections) busy for {self._slot_wait_s} s"
            )
        try:
            yield
        finally:
            slot.release()

    def _send_node(self, name: str, node: Any, jobs: list[_Job]) -> bool:
        from redis.exceptions import ConnectionError, TimeoutError

        try:
            with self._connection(name):
                pipe = self._rc.get_redis_connection(node).pipeline(transaction=False)
                for job in jobs:
                    for command in job.commands:
                        pipe.execute_command(*command)
                replies = pipe.execute(raise_on_error=False)
        except _PoolBusy as exc:  # the node answers; this process is busy with it
            logger.warning("volatile_db: %s", exc)
            for job in jobs:
                job.error = str(exc)
            return False
        except (ConnectionError, TimeoutError, OSError) as exc:
            reason = self._redact(f"{type(exc).__name__}: {exc}")
            with self._lock:
                was_down = name in self._down_until
                self._down_until[name] = time.monotonic() + self.retry_after
            # One line per outage: the node is tried again every retry_after while it lasts.
            logger.log(
                logging.DEBUG if was_down else logging.WARNING,
                "volatile_db: Redis node %s failed: %s; its keys go to the tiers below until it "
                "answers again",
                name,
                reason,
            )
            for job in jobs:
                job.error = f"node {name}: {reason}"
                job.node_down = True
            return False
        with self._lock:
            was_down = self._down_until.pop(name, None) is not None
        if was_down:
            logger.warning("volatile_db: Redis node %s answers again", name)
        start = 0
        for job in jobs:
            job.replies = replies[start : start + len(job.commands)]
            start += len(job.commands)
        return True

    def _refresh(self, force: bool = False) -> None:
        """Reload the slot map from the nodes that answer (at most once per ``retry_after``
        unless forced): picks up promoted replicas and moved slots."""
        now = time.monotonic()
        with self._lock:
            if not force and now < self._next_refresh:
                return
            self._next_refresh = now + self.retry_after
        try:
            self._rc.nodes_manager.initialize()
        except Exception as exc:  # every seed down: keep the old map, try again later
            logger.warning("volatile_db: Redis slot map refresh failed: %s", self._redact(str(exc)))

    def _failed(self, jobs: Sequence[_Job], failed_nodes: int, what: str) -> str:
        """Count the failed nodes; return a summary of the errors (empty if none)."""
        errors = sorted({job.error for job in jobs if job.error})
        if not errors:
            return ""
        with self._lock:
            self.errors += max(failed_nodes, 1)
            self.last_failure = "; ".join(errors)
        return f"volatile_db '{self.address}': {what}: " + self.last_failure

    # -- BackingStore ----------------------------------------------------------------------

    def _grouped(self, keys: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``(partition, rows)`` batches of at most ``max_batch_size`` rows of one partition,
        ordered by round (every partition's first batch, then every second one, ...)."""
        parts = partition_of(keys, self.num_partitions)
        order = np.argsort(parts, kind="stable")
        bounds = np.searchsorted(parts[order], np.arange(self.num_partitions + 1))
        batches: list[tuple[int, int, np.ndarray]] = []
        for part in range(self.num_partitions):
            rows = order[bounds[part] : bounds[part + 1]]
            for n, start in enumerate(range(0, rows.shape[0], self.max_batch_size)):
                batches.append((n, part, rows[start : start + self.max_batch_size]))
        batches.sort(key=lambda b: (b[0], b[1]))
        return [(part, rows) for _, part, rows in batches]

    def down_nodes(self) -> list[str]:
        """The nodes that did not answer lately (skipped until their ``retry_after`` ends)."""
        with self._lock:
            return sorted(self._down_until)

    def failure_reason(self) -> str:
        """Why requests fail now: the nodes down, else the last failure's errors."""
        down = self.down_nodes()
        return f"node {', '.join(down)} down" if down else self.last_failure

    @property
    def primary_nodes(self) -> int:
        """Primary nodes of the cluster, as last discovered."""
        return len(self._rc.get_primaries())

    def tables(self) -> list[str]:
        """The tables with at least one partition in the cluster, sorted.

        Raises:
            TierUnavailableError: no node answered.
        """
        names: set[str] = set()
        nodes = self._rc.get_primaries()
        failed = 0
        for node in nodes:
            try:
                with self._connection(node.name):
                    client = self._rc.get_redis_connection(node)
                    for raw in client.scan_iter(match="hps_et{*/p*}v", count=1000):
                        name = raw.decode(errors="replace")[len("hps_et{") :]
                        names.add(name[: name.rfind("/p")])
            except Exception as exc:
                failed += 1
                logger.warning(
                    "volatile_db: Redis node %s failed: %s", node.name, self._redact(str(exc))
                )
        if failed:
            with self._lock:
                self.errors += failed
            self._refresh()
            if failed == len(nodes):
                raise TierUnavailableError(
                    f"volatile_db '{self.address}': no Redis node answered a table listing"
                )
        return sorted(names)

    def insert_missing(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """:meth:`insert` of the rows whose keys ``table`` does not hold (``HSETNX``): a
        write-up of a lower tier's rows never replaces a row an update wrote meanwhile."""
        self.insert(table, keys, vectors, replace=False)

    def insert(
        self, table: str, keys: np.ndarray, vectors: np.ndarray, replace: bool = True
    ) -> None:
        """Write rows, replacing any stored under the same keys; then shrink every partition
        that grew past ``overflow_margin`` (see the module docstring).

        Args:
            table: the table, e.g. :func:`table_tag`.
            keys: int64 ``[n]``.
            vectors: float32 ``[n, dim]``.
            replace: replace stored rows (``HSET``); else keep them (``HSETNX``).

        Raises:
            RequestError: the shapes disagree.
            TierUnavailableError: a node did not take its rows (counted in :attr:`errors`;
                the other nodes' rows are written).
        """
        keys = np.ascontiguousarray(keys, dtype=_KEY)
        vectors = np.ascontiguousarray(vectors, dtype=_VALUE)
        if vectors.ndim != 2 or vectors.shape[0] != keys.shape[0]:
            raise RequestError(
                f"table '{table}': {keys.shape[0]} keys need vectors [n, dim], got {vectors.shape}"
            )
        if keys.shape[0] == 0:
            return
        raw_keys = key_bytes(keys)
        width = vectors.shape[1] * _VALUE.itemsize
        raw_values = vectors.tobytes()
        stamp = _TIME.pack(int(self._clock()))
        batches = self._grouped(keys)
        # One round = at most one batch per partition; overflow is resolved between rounds,
        # as HugeCTR does after each batch, so a partition never grows far past its margin.
        rounds: list[list[tuple[int, np.ndarray]]] = []
        seen: dict[int, int] = {}
        for part, rows in batches:
            n = seen[part] = seen.get(part, -1) + 1
            if n == len(rounds):
                rounds.append([])
            rounds[n].append((part, rows))
        problems = []
        for round_batches in rounds:
            jobs = []
            for part, rows in round_batches:
                hv, hm = partition_key(table, part, "v"), partition_key(table, part, "t")
                fields = [raw_keys[i] for i in rows.tolist()]
                pairs: list[bytes] = []
                for i, key in zip(rows.tolist(), fields, strict=True):
                    pairs += (key, raw_values[i * width : (i + 1) * width])
                commands: list[tuple[Any, ...]] = (
                    [("HSET", hv, *pairs)]
                    if replace
                    else [("HSETNX", hv, pairs[j], pairs[j + 1]) for j in range(0, len(pairs), 2)]
                )
                if self.overflow_policy is OverflowPolicy.EVICT_OLDEST:
                    commands.append(("HSET", hm, *[b for k in fields for b in (k, stamp)]))
                elif self.overflow_policy is OverflowPolicy.EVICT_LEAST_USED:
                    commands += [("HINCRBY", hm, k, 1) for k in fields]
                commands.append(("HLEN", hv))
                jobs.append(_Job(hv, commands))
            failed = self._run(jobs)
            problem = self._failed(jobs, failed, f"insert into '{table}' failed")
            if problem:
                problems.append(problem)
            if self.overflow_margin is not None:
                for (part, _), job in zip(round_batches, jobs, strict=True):
                    if job.replies is not None and job.replies[-1] > self.overflow_margin:
                        self._resolve_overflow(table, part, int(job.replies[-1]))
        if problems:
            raise TierUnavailableError(problems[0])

    def load_sparse(self, table: str, folder: str | os.PathLike[str], dim: int) -> int:
        """Copy a HugeCTR sparse model folder (``key``, ``emb_vector``) into ``table``.

        Args:
            table: the table to fill.
            folder: the sparse model folder (local path or URI).
            dim: floats per vector.

        Returns:
            Rows written.

        Raises:
            ModelFileError: the folder is invalid or ends early.
            TierUnavailableError: a node did not take its rows.
        """
        return copy_sparse_folder(self, table, folder, dim)

    def lookup(
        self,
        table: str,
        keys: np.ndarray,
        dim: int,
        default: float = 0.0,
        unanswered: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The stored vectors of ``keys``.

        Keys of a node that does not answer are reported not found and the failure is
        counted in :attr:`errors`.

        Args:
            table: the table to read (an unknown table has no rows).
            keys: int64 ``[n]``, any order, repeats allowed.
            dim: floats per vector.
            default: the value of every float of a key not found.
            unanswered: a bool ``[n]`` array set True here for the keys of a node that did
                not answer (not found, and not known to be absent); left as it is for the
                others.

        Returns:
            float32 ``[n, dim]`` vectors and a bool ``[n]`` mask of the keys found.

        Raises:
            TierUnavailableError: no node answered.
            ModelFileError: a stored value is not ``dim`` floats long.
        """
        keys = np.ascontiguousarray(keys, dtype=_KEY)
        out = np.full((keys.shape[0], dim), default, dtype=np.float32)
        found = np.zeros(keys.shape[0], dtype=bool)
        if keys.shape[0] == 0:
            return out, found
        # Each distinct key is asked for once; repeats are filled in from it.
        unique, inverse = np.unique(keys, return_inverse=True)
        raw_keys = key_bytes(unique)
        jobs = []
        for part, rows in self._grouped(unique):
            hv = partition_key(table, part, "v")
            job = _Job(hv, [("HMGET", hv, *[raw_keys[i] for i in rows.tolist()])], rows)
            jobs.append(job)
        failed = self._run(jobs)
        width = dim * _VALUE.itemsize
        unique_out = np.full((unique.shape[0], dim), default, dtype=np.float32)
        unique_found = np.zeros(unique.shape[0], dtype=bool)
        touched: list[tuple[int, list[bytes]]] = []
        unique_lost = np.zeros(unique.shape[0], dtype=bool)
        for part_job in jobs:
            if part_job.replies is None:
                unique_lost[part_job.rows] = True
                continue
            values = part_job.replies[0]
            hits = [i for i, value in enumerate(values) if value is not None]
            stored = b"".join(values[i] for i in hits)
            if len(stored) != len(hits) * width:
                self._wrong_width(table, unique[part_job.rows], values, width, dim)
            rows = part_job.rows[np.asarray(hits, dtype=np.int64)]
            unique_out[rows] = np.frombuffer(stored, dtype=_VALUE).reshape(len(hits), dim)
            unique_found[rows] = True
            if hits and self.overflow_policy is not OverflowPolicy.EVICT_RANDOM:
                touched.append((part_job, [raw_keys[i] for i in rows.tolist()]))
        problem = self._failed(jobs, failed, f"lookup in '{table}'")
        if problem:
            if all(job.replies is None for job in jobs):
                raise TierUnavailableError(problem + " (no node answered)")
            if not all(job.node_down for job in jobs if job.error):  # a node down is said once
                _EVERY.log(logger, logging.WARNING, ("lookup", table),
                           "%s; those keys go to the tiers below", problem)  # fmt: skip
        if touched:
            self._touch(table, touched)
        out[:] = unique_out[inverse]
        found[:] = unique_found[inverse]
        if unanswered is not None:
            unanswered |= unique_lost[inverse]
        return out, found

    def _wrong_width(
        self, table: str, keys: np.ndarray, values: list[bytes | None], width: int, dim: int
    ) -> None:
        for key, value in zip(keys.tolist(), values, strict=False):
            if value is not None and len(value) != width:
                raise ModelFileError(
                    f"volatile_db '{self.address}', table '{table}': key {key} holds "
                    f"{len(value)} bytes, dim {dim} needs {width}"
                )

    # -- access metadata and overflow ------------------------------------------------------

    def _touch(self, table: str, touched: list[Any]) -> None:
        """Record hits in the background (HugeCTR's queue_metadata_refresh_): the time for
        ``evict_oldest``, one more use for ``evict_least_used``."""
        stamp = _TIME.pack(int(self._clock()))
        jobs = []
        for job, fields in touched:
            hm = job.hkey[:-1] + "t"
            if self.overflow_policy is OverflowPolicy.EVICT_OLDEST:
                commands = [("HSET", hm, *[b for k in fields for b in (k, stamp)])]
            else:
                commands = [("HINCRBY", hm, k, 1) for k in fields]
            jobs.append(_Job(hm, commands))

        def refresh() -> None:
            try:
                failed = self._run(jobs)
                problem = self._failed(jobs, failed, f"access metadata of '{table}'")
                if problem:
                    logger.warning("%s", problem)
            except Exception as exc:  # bookkeeping only: never fails a lookup
                logger.warning("volatile_db: access metadata: %s", self._redact(str(exc)))

        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._background.submit(refresh))

    def synchronize(self) -> None:
        """Wait until the access metadata of past lookups is written (HugeCTR's
        ``VolatileBackend::synchronize``)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def _resolve_overflow(self, table: str, part: int, size: int) -> None:
        """Shrink partition ``part`` to the resolution margin by the overflow policy (left to
        a later insert when no connection to its node comes free)."""
        node = self._rc.get_node_from_key(partition_key(table, part, "v"))
        try:
            with self._connection(node.name):
                self._shrink(self._rc.get_redis_connection(node), table, part, size)
        except _PoolBusy as exc:
            logger.warning("volatile_db: overflow of %s/%d not resolved: %s", table, part, exc)

    def _shrink(self, client: Any, table: str, part: int, size: int) -> None:
        assert self._resolution_margin is not None
        hv, hm = partition_key(table, part, "v"), partition_key(table, part, "t")
        logger.debug(
            "volatile_db: partition %s/%d overflows (%d > %s)",
            table, part, size, self.overflow_margin,
        )  # fmt: skip
        if self.overflow_policy is OverflowPolicy.EVICT_RANDOM:
            victims = list(client.hkeys(hv))
            np.random.default_rng().shuffle(victims)  # type: ignore[arg-type]
        else:
            meta = client.hgetall(hm)
            if self.overflow_policy is OverflowPolicy.EVICT_OLDEST:
                rank = {k: _TIME.unpack(v)[0] if len(v) == 8 else 0 for k, v in meta.items()}
            else:
                rank = {k: int(v) if v.isdigit() else 0 for k, v in meta.items()}
            victims = sorted(rank, key=rank.__getitem__)
        evicted = 0
        while evicted < len(victims) and size > self._resolution_margin:
            # Only the excess goes (HugeCTR drops whole max_batch_size batches, which can
            # empty a partition when the batch size is near the margin).
            take = min(self.max_batch_size, size - self._resolution_margin)
            batch = victims[evicted : evicted + take]
            pipe = client.pipeline(transaction=False)
            pipe.hdel(hm, *batch)
            pipe.hdel(hv, *batch)
            pipe.hlen(hv)
            replies = pipe.execute()
            evicted += len(batch)
            size = int(replies[-1])
        if size > self._resolution_margin:  # rows without metadata: drop random ones
            extra = list(client.hkeys(hv))[: size - self._resolution_margin]
            if extra:
                client.hdel(hv, *extra)
        if self.overflow_policy is OverflowPolicy.EVICT_LEAST_USED and evicted < len(victims):
            # HugeCTR's decay: the survivors' counters become half the least survivor's.
            survivors = victims[evicted:]
            count = str(rank[survivors[0]] // 2).encode()
            for start in range(0, len(survivors), self.max_batch_size):
                batch = survivors[start : start + self.max_batch_size]
                client.hset(hm, mapping=dict.fromkeys(batch, count))

    # -- housekeeping ------------------------------------------------------------------------

    def partition_sizes(self, table: str) -> list[int]:
        """Rows in each partition of ``table`` (``HLEN``), by partition index."""
        jobs = [
            _Job(partition_key(table, p), [("HLEN", partition_key(table, p))])
            for p in range(self.num_partitions)
        ]
        failed = self._run(jobs)
        problem = self._failed(jobs, failed, f"sizes of '{table}'")
        if problem:
            raise TierUnavailableError(problem)
        return [int(job.replies[0]) for job in jobs if job.replies is not None]

    def count(self, table: str) -> int:
        """Rows of ``table`` (HugeCTR's ``size``)."""
        return sum(self.partition_sizes(table))

    def evict(self, table: str) -> int:
        """Delete ``table`` (every partition and its metadata); returns the rows it had."""
        jobs = []
        for p in range(self.num_partitions):
            hv, hm = partition_key(table, p, "v"), partition_key(table, p, "t")
            jobs.append(_Job(hv, [("HLEN", hv), ("DEL", hv), ("DEL", hm)]))
        failed = self._run(jobs)
        problem = self._failed(jobs, failed, f"evict '{table}'")
        if problem:
            raise TierUnavailableError(problem)
        return sum(int(job.replies[0]) for job in jobs if job.replies is not None)

    def close(self) -> None:
        """Wait for background bookkeeping, then close every connection (idempotent)."""
        if self._rc is None:
            return
        with contextlib.suppress(Exception):  # already logged by the worker
            self.synchronize()
        self._background.shutdown(wait=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._rc.close()
        self._rc = None

    def __enter__(self) -> RedisClusterStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
