"""One log line when the Kafka brokers go away, one when they are back.

librdkafka retries a lost broker on its own and, left to itself, writes a line to stderr at
every attempt of every client: a broker outage wrote 3,455 lines in 30 s to the log of a
server with four stub processes (issue 47), ``%3|...|FAIL|rdkafka#consumer-2| ... Connection
refused`` mostly, burying everything else. Each Kafka client of this package (update
consumers, update producers) is made with the settings of a :class:`KafkaLink` instead, which
reports to the :class:`BrokerWatch` of its broker list, one per process
(:func:`watch_for`):

- librdkafka's log lines reach Python logging (``logger``), never stderr directly. Those about
  connections (facility ``FAIL`` and the like) are kept at DEBUG: the outage lines below say
  it all. During an outage every other line is part of it too (a consumer group's session
  times out, commits fail) and goes to DEBUG; outside one, a line is logged at its level, at
  most one per facility every 10 s.
- Connection errors (``error_cb``: ``_TRANSPORT``, a coordinator that does not answer, ...)
  are counted (:attr:`BrokerWatch.connection_errors`) and logged at DEBUG.
- The outage begins when a client says that every broker of its list is down
  (``_ALL_BROKERS_DOWN``; librdkafka says it again every 10 s or so while the outage lasts,
  which changes nothing), or, for a client that keeps its connections open (a consumer: its
  group coordinator and fetches never idle), when :data:`DOWN_REPORTS` statistics reports in
  a row show no broker connection up after one was: librdkafka raises ``_ALL_BROKERS_DOWN``
  only when its count of brokers down reaches its count of brokers with an address at the
  moment one goes down, and the group coordinator losing its address in between can skip
  that moment for good (a consumer under load never said it in a CI run). One WARNING
  line names the brokers and the last failure. It ends when every client that said so sees a
  broker up again in two statistics reports in a row (``stats_cb``, every
  :data:`STATS_INTERVAL_MS`; outside an outage read only for clients that keep their
  connections) or hears from one
  (:meth:`KafkaLink.reached`): one INFO line says how
  long it lasted, the connection errors and the update messages applied meanwhile.
  :attr:`BrokerWatch.outages` counts the outages.
- Reconnections back off from 1 s (``reconnect.backoff.ms``; librdkafka's 0.1 s made a
  consumer try 20 times a second, now about twice) up to 10 s, so a returning broker is seen
  within a few seconds plus a statistics interval.

A client closed during an outage is forgotten: the outage ends, without a line, when no client
that saw it is left.

Example:
    >>> link = watch_for("127.0.0.1:9092").link("update consumer hps.volatile.node7")
    >>> conf = {"bootstrap.servers": "127.0.0.1:9092", **link.settings()}  # doctest: +SKIP
    >>> link.close()
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from hps_core.log_every import LogEvery

log = logging.getLogger(__name__)

STATS_INTERVAL_MS = 1000
"""librdkafka's statistics interval: how late the end of an outage is seen, at most."""

DOWN_REPORTS = 3
"""Statistics reports in a row without a broker connection up that make an outage of a client
that keeps its connections, when librdkafka does not say ``_ALL_BROKERS_DOWN`` itself."""

RECONNECT_BACKOFF = {"reconnect.backoff.ms": 1000, "reconnect.backoff.max.ms": 10_000}
"""librdkafka's reconnection back-off (the first wait, doubled up to the second)."""

# librdkafka's log facilities about connections to brokers: a broker lost, refused, timed out.
CONNECTION_FACILITIES = frozenset({"FAIL", "CONNECT", "BROKERFAIL", "REQTMOUT"})

# KafkaError names of a broker or coordinator that cannot be reached (librdkafka retries).
CONNECTION_ERRORS = frozenset(
    {
        "_ALL_BROKERS_DOWN",
        "_TRANSPORT",
        "_RESOLVE",
        "_TIMED_OUT",
        "_WAIT_COORD",
        "COORDINATOR_NOT_AVAILABLE",
        "NOT_COORDINATOR",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "REQUEST_TIMED_OUT",
        "NETWORK_EXCEPTION",
    }
)

# "[thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap: Connect to ..." -> "Connect to ...";
# also "GroupCoordinator: 127.0.0.1:9092: Disconnected ..." -> "Disconnected ...".
_PREFIX = re.compile(
    r"^(?:\[thrd:[^\]]*\]:\s*)?(?:GroupCoordinator:\s*)?(?:\S+?:\d+(?:/(?:\d+|bootstrap))?:\s+)?"
)


def _text(err: Any) -> str:
    """A KafkaError's message without its code (``str()``), or the object as text."""
    text = err.str() if hasattr(err, "str") else str(err)
    return _PREFIX.sub("", text)


def error_name(err: Any) -> str | None:
    """The name of a ``KafkaError`` (``_TRANSPORT``), also when wrapped in a
    ``KafkaException``; ``None`` for anything else."""
    if not hasattr(err, "name") and getattr(err, "args", None):
        err = err.args[0]
    name = getattr(err, "name", None)
    return name() if callable(name) else None


def is_connection_error(err: Any) -> bool:
    """Whether a ``KafkaError`` (or ``KafkaException``) says a broker could not be reached."""
    return error_name(err) in CONNECTION_ERRORS


class BrokerWatch:
    """Whether one broker list is reachable from this process, said once per change.

    Args:
        brokers: the broker list (librdkafka's ``bootstrap.servers``), named in the lines.
        clock: seconds, for the outage's length.
    """

    def __init__(self, brokers: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.brokers = brokers
        self.outages = 0
        """Outages so far: times every broker became unreachable."""
        self.connection_errors = 0
        """Connection errors reported by the clients so far."""
        self.every = LogEvery()
        """Rate limit of the librdkafka lines logged outside an outage."""
        self._clock = clock
        self._lock = threading.Lock()
        self._down: set[int] = set()  # links that see every broker down
        self._ids = itertools.count()
        self._reason = ""
        self._since = 0.0
        self._errors_at_start = 0
        self._applied = 0
        self._applied_at_start = 0

    @property
    def reachable(self) -> bool:
        """False from the start of an outage to its end."""
        return not self._down

    def link(self, client: str, steady: bool = False) -> KafkaLink:
        """A new client's link to this watch.

        Args:
            client: names the client in its librdkafka lines (``update consumer GROUP``).
            steady: the client keeps a broker connection open while the brokers are up (a
                consumer in a group), so statistics without one up mean an outage. A
                producer's idle connections may be closed and not reopened until it sends.

        Returns:
            The link; :meth:`KafkaLink.settings` go into the client's configuration.
        """
        return KafkaLink(self, client, next(self._ids), steady)

    def is_down(self, link_id: int) -> bool:
        """Whether the link ``link_id`` saw every broker down and not one back since."""
        return link_id in self._down

    def count_applied(self, messages: int = 1) -> None:
        """Count update messages applied (said in the line that ends an outage)."""
        with self._lock:
            self._applied += messages

    def failure(self, text: str, counted: bool = True, reason: bool = True) -> None:
        """A connection failure: logged at DEBUG, kept as the reason of an outage.

        Args:
            text: what failed (``Connect to ipv4#127.0.0.1:9092 failed: Connection refused``).
            counted: whether it is a connection error to count (a log line that repeats an
                error reported on its own is not).
            reason: whether it says why (librdkafka's ``1/1 brokers are down`` does not).
        """
        with self._lock:
            if reason:
                self._reason = text
            if counted:
                self.connection_errors += 1
        log.debug("kafka %s: %s", self.brokers, text)

    def all_down(self, link_id: int, text: str) -> None:
        """A client sees every broker down: the outage begins, unless it has already."""
        with self._lock:
            if link_id in self._down:
                return
            begins = not self._down
            self._down.add(link_id)
            if not begins:
                return
            self.outages += 1
            self._since = self._clock()
            self._errors_at_start = self.connection_errors
            self._applied_at_start = self._applied
            # librdkafka's own words ("1/1 brokers are down", at times "0/1") say less.
            reason = self._reason or text
        log.warning(
            "kafka: brokers %s unreachable (%s); retrying with back-off, no line per attempt "
            "until they are back",
            self.brokers,
            reason,
        )

    def up(self, link_id: int) -> None:
        """A client that saw every broker down sees one up: the outage ends when no other
        client still sees them down."""
        with self._lock:
            if link_id not in self._down:
                return
            self._down.discard(link_id)
            if self._down:
                return
            seconds = self._clock() - self._since
            errors = self.connection_errors - self._errors_at_start
            applied = self._applied - self._applied_at_start
            self._reason = ""
        log.info(
            "kafka: brokers %s reachable again after %.1f s (%d connection errors; %d update "
            "messages applied since they went; updates resume from the last commit)",
            self.brokers,
            seconds,
            errors,
            applied,
        )

    def forget(self, link_id: int) -> None:
        """A client closed: it can no longer tell the end of an outage."""
        with self._lock:
            self._down.discard(link_id)


class KafkaLink:
    """One Kafka client's librdkafka events, reported to its :class:`BrokerWatch`.

    Made by :meth:`BrokerWatch.link`. Its methods run on the thread that polls the client
    (librdkafka queues its events until ``poll``, ``consume`` or ``flush``).

    Args:
        watch: the watch of the client's broker list.
        client: names the client in its lines.
        link_id: the link's number in the watch.
        steady: whether statistics without a broker up make an outage (see
            :meth:`BrokerWatch.link`).
    """

    def __init__(self, watch: BrokerWatch, client: str, link_id: int, steady: bool = False) -> None:
        self.watch = watch
        self.client = client
        self._id = link_id
        self._steady = steady
        self._up_before = False  # the last statistics during an outage showed a broker up
        self._seen_up = False  # a statistics report showed a broker up (a steady client)
        self._down_reports = 0  # reports in a row without one up since then

    def settings(self) -> dict[str, Any]:
        """librdkafka settings that route the client's logs and statistics here and back
        off its reconnections (the caller's ``error_cb`` should call :meth:`on_error`).

        Returns:
            ``logger``, ``stats_cb``, ``statistics.interval.ms`` and the back-off settings.
        """
        return {
            "logger": self,
            "stats_cb": self.on_stats,
            "statistics.interval.ms": STATS_INTERVAL_MS,
            **RECONNECT_BACKOFF,
        }

    def log(self, level: int, fmt: str, *args: Any) -> None:
        """confluent-kafka's ``logger`` interface: one librdkafka line.

        Args:
            level: the Python logging level of the line.
            fmt: ``"%s [%s] %s"`` (facility, client name, text) from confluent-kafka.
            args: the values of ``fmt``.
        """
        if len(args) == 3:
            facility, text = str(args[0]), _PREFIX.sub("", str(args[2]))
        else:
            facility, text = "", fmt % args
        if facility in CONNECTION_FACILITIES:
            # The same failure reaches on_error as an error; only its wording is kept.
            self.watch.failure(text, counted=False)
        elif not self.watch.reachable or level < logging.INFO:
            log.debug("kafka %s: %s: %s", self.client, facility, text)
        else:
            self.watch.every.log(
                log, level, facility, "kafka %s: %s: %s", self.client, facility, text
            )

    def on_error(self, err: Any) -> bool:
        """Take a client-level error (``error_cb``) if it is about reaching the brokers.

        Args:
            err: a ``KafkaError``.

        Returns:
            Whether it was a connection error (counted here, not to be logged by the caller).
        """
        name = error_name(err)
        if name not in CONNECTION_ERRORS:
            return False
        text = _text(err)
        down = name == "_ALL_BROKERS_DOWN"
        self.watch.failure(text, reason=not down)
        if down:
            self.watch.all_down(self._id, text)
        return True

    def on_stats(self, stats: str) -> None:
        """confluent-kafka's ``stats_cb``: during an outage, whether a broker is up again;
        outside one, for a steady client, whether every connection has been down for
        :data:`DOWN_REPORTS` reports.

        Args:
            stats: librdkafka's statistics (JSON); its ``brokers`` map holds each
                connection's ``state`` and ``source``.
        """
        down = self.watch.is_down(self._id)
        if not down:
            self._up_before = False
            if not self._steady:
                return  # the statistics of other clients are read only during an outage
        try:
            brokers = json.loads(stats).get("brokers", {})
        except ValueError:
            return
        # A broker's own connection (not the group coordinator's logical one, which mirrors
        # it and drops a moment later).
        up = any(b.get("state") == "UP" and b.get("source") != "logical" for b in brokers.values())
        if not down:
            self._outage_from_stats(up)
            return
        # Up in two reports in a row: one report may be a snapshot taken as the outage began.
        if up and self._up_before:
            self.watch.up(self._id)
            self._down_reports = 0
        self._up_before = up

    def _outage_from_stats(self, up: bool) -> None:
        """A steady client's report outside an outage: none up for long enough begins one."""
        if up:
            self._seen_up, self._down_reports = True, 0
            return
        if not self._seen_up:
            return  # still connecting for the first time: not an outage
        self._down_reports += 1
        if self._down_reports >= DOWN_REPORTS:
            self._down_reports = 0
            seconds = DOWN_REPORTS * STATS_INTERVAL_MS / 1000
            self.watch.all_down(self._id, f"no broker connection up for {seconds:g} s")

    def reached(self) -> None:
        """The client had an answer from a broker after it saw every broker down (a delivery
        report: librdkafka serves events in order): the outage is over for it, also when its
        statistics are turned off."""
        if self.watch.is_down(self._id):
            self.watch.up(self._id)

    def close(self) -> None:
        """The client is closed (idempotent)."""
        self.watch.forget(self._id)


_watches: dict[str, BrokerWatch] = {}
_watches_lock = threading.Lock()


def watch_for(brokers: str) -> BrokerWatch:
    """This process's watch of a broker list (made on first use).

    Args:
        brokers: librdkafka's ``bootstrap.servers`` (comma-separated ``host:port``).

    Returns:
        The same :class:`BrokerWatch` for every call with these brokers.
    """
    with _watches_lock:
        watch = _watches.get(brokers)
        if watch is None:
            watch = _watches[brokers] = BrokerWatch(brokers)
        return watch
