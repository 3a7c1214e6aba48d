"""Broker outages in the log (``hps_core.updates.broker_watch``): a stream of librdkafka
events as a lost broker produces them (log lines of every attempt, ``_TRANSPORT`` errors,
``_ALL_BROKERS_DOWN``, statistics) makes one WARNING line when every broker is down and one
INFO line when one is back, however many clients of the process see it; then a real consumer
against a tansu broker that is killed and started again: nothing of librdkafka's reaches
stderr, two lines reach the log, and the consumer applies what is published after the
return."""

from __future__ import annotations

import json
import logging
import threading
import time

import numpy as np
import pytest
from confluent_kafka import KafkaError
from kafka_broker import persistent_kafka_broker
from updates_testlib import Collector, make_consumer, poll_until, rows, source_config

from hps_core.updates import UpdateProducer, topic_for
from hps_core.updates.broker_watch import DOWN_REPORTS, BrokerWatch, watch_for
from hps_core.updates.consumer import consumer_lag

pytestmark = pytest.mark.timeout(120)

BROKERS = "127.0.0.1:46002"
WATCH_LOGGER = "hps_core.updates.broker_watch"
FAIL = (
    "[thrd:127.0.0.1:46002/bootstrap]: 127.0.0.1:46002/bootstrap: Connect to "
    "ipv4#127.0.0.1:46002 failed: Connection refused (after 0ms in state CONNECT)"
)


class Clock:
    """Seconds that the test moves on."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stats(broker: str, coordinator: str) -> str:
    """librdkafka statistics: the broker's connection and the group coordinator's (logical)
    one in these states."""
    brokers = {
        f"{BROKERS}/1": {"state": broker, "source": "learned"},
        "GroupCoordinator": {"state": coordinator, "source": "logical"},
    }
    return json.dumps({"brokers": brokers})


def attempt(link) -> None:
    """One failed reconnection as librdkafka reports it: a log line and an error."""
    link.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-2", FAIL)
    link.on_error(KafkaError(KafkaError._TRANSPORT, FAIL.split("]: ", 1)[1]))


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """The records at INFO and above: what a server's log shows."""
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]


def test_an_outage_makes_one_line_when_it_begins_and_one_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    watch = BrokerWatch(BROKERS, clock)
    link = watch.link("update consumer g")
    caplog.set_level(logging.DEBUG, logger=WATCH_LOGGER)

    link.log(logging.INFO, "%s [%s] %s", "FAIL", "rdkafka#consumer-2", "[thrd:x]: Disconnected")
    for _ in range(50):
        attempt(link)
    link.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    link.on_stats(stats("UP", "UP"))  # taken as the outage began: no end yet
    link.on_stats(stats("INIT", "UP"))  # the coordinator's connection goes a moment later
    for _ in range(300):  # 115 lines a second, for a while
        attempt(link)
        link.on_stats(stats("INIT", "INIT"))
    link.log(logging.WARNING, "%s [%s] %s", "SESSTMOUT", "c", "[thrd:main]: session timed out")
    link.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert not watch.reachable and watch.outages == 1
    watch.count_applied(3)  # messages fetched before the outage, applied during it
    clock.now += 14.0
    link.on_stats(stats("UP", "UP"))  # once: might be a snapshot of before
    assert not watch.reachable
    link.on_stats(stats("UP", "UP"))  # twice in a row: back
    for _ in range(5):
        attempt(link)  # a late report of the outage: counted, never a new line

    assert lines(caplog) == [
        (
            logging.WARNING,
            f"kafka: brokers {BROKERS} unreachable (Connect to ipv4#127.0.0.1:46002 failed: "
            "Connection refused (after 0ms in state CONNECT)); retrying with back-off, no line "
            "per attempt until they are back",
        ),
        (
            logging.INFO,
            f"kafka: brokers {BROKERS} reachable again after 14.0 s (301 connection errors; 3 "
            "update messages applied since they went; updates resume from the last commit)",
        ),
    ]
    assert watch.reachable and watch.outages == 1 and watch.connection_errors == 357
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) > 600  # kept, not shown


def test_clients_of_one_process_share_one_line_each_way(caplog: pytest.LogCaptureFixture) -> None:
    watch = BrokerWatch(BROKERS, Clock())
    consumer, producer = watch.link("update consumer g"), watch.link("update producer")
    caplog.set_level(logging.INFO, logger=WATCH_LOGGER)
    down = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")

    consumer.on_error(down)
    producer.on_error(down)
    for _ in range(2):
        producer.on_stats(stats("UP", "UP"))  # the producer is back, the consumer not yet
    assert not watch.reachable and len(lines(caplog)) == 1
    consumer.reached()  # a message came: the outage is over for it too
    assert watch.reachable and len(lines(caplog)) == 2
    consumer.reached()  # outside an outage: nothing to say

    consumer.on_error(down)  # a second outage
    consumer.close()  # closed during it: nothing left to tell its end, no line
    assert watch.reachable and watch.outages == 2 and len(lines(caplog)) == 3


def test_a_consumer_whose_librdkafka_never_says_all_brokers_down_still_has_its_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """librdkafka can skip ``_ALL_BROKERS_DOWN`` (its count of brokers down must meet its count
    of brokers with an address at the moment one goes down): a consumer's statistics tell."""
    clock = Clock()
    watch = BrokerWatch(BROKERS, clock)
    consumer = watch.link("update consumer g", steady=True)
    producer = watch.link("update producer")
    caplog.set_level(logging.INFO, logger=WATCH_LOGGER)

    for _ in range(DOWN_REPORTS + 2):  # connecting for the first time: not an outage
        consumer.on_stats(stats("CONNECT", "INIT"))
        producer.on_stats(stats("INIT", "INIT"))  # an idle producer's closed connections
    assert watch.reachable
    consumer.on_stats(stats("UP", "UP"))
    for _ in range(DOWN_REPORTS - 1):
        attempt(consumer)
        consumer.on_stats(stats("INIT", "UP"))
    consumer.on_stats(stats("UP", "UP"))  # a broker back before the third report: no outage
    for _ in range(DOWN_REPORTS - 1):
        consumer.on_stats(stats("TRY_CONNECT", "DOWN"))
    assert watch.reachable and lines(caplog) == []
    consumer.on_stats(stats("DOWN", "DOWN"))
    assert not watch.reachable and watch.outages == 1
    consumer.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))  # late
    clock.now += 7.0
    consumer.on_stats(stats("UP", "UP"))
    consumer.on_stats(stats("UP", "UP"))

    assert lines(caplog) == [
        (
            logging.WARNING,
            f"kafka: brokers {BROKERS} unreachable (Connect to ipv4#127.0.0.1:46002 failed: "
            "Connection refused (after 0ms in state CONNECT)); retrying with back-off, no line "
            "per attempt until they are back",
        ),
        (
            logging.INFO,
            f"kafka: brokers {BROKERS} reachable again after 7.0 s (1 connection errors; 0 "
            "update messages applied since they went; updates resume from the last commit)",
        ),
    ]
    assert watch.reachable and watch.outages == 1


def test_other_librdkafka_lines_are_logged_at_most_once_per_facility_every_10_s(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = BrokerWatch(BROKERS, Clock())
    link = watch.link("update consumer g")
    caplog.set_level(logging.DEBUG, logger=WATCH_LOGGER)

    for _ in range(3):
        link.log(logging.WARNING, "%s [%s] %s", "MAXPOLL", "c", "[thrd:main]: poll interval")
        link.log(logging.ERROR, "%s [%s] %s", "FAIL", "c", FAIL)  # one broker of several
        link.log(logging.DEBUG, "%s [%s] %s", "PROTOERR", "c", "[thrd:main]: detail")
        assert not link.on_error(KafkaError(KafkaError._FATAL, "fatal"))  # the caller's

    assert lines(caplog) == [(logging.WARNING, "kafka update consumer g: MAXPOLL: poll interval")]
    assert watch.reachable and watch.outages == 0


def test_a_real_consumer_outage_writes_two_lines_and_nothing_to_stderr(
    model: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """librdkafka's own lines would reach stderr (fd 2) directly, not through Python."""
    tag = topic_for(model, "t")
    target = Collector()
    caplog.set_level(logging.INFO, logger="hps_core")
    brokers = persistent_kafka_broker()  # topics and offsets outlive a restart, as Kafka's
    broker = next(brokers)
    try:
        consumer = make_consumer(broker.address, [tag], target, group_id=f"{model}.g")
        consumer.start()
        try:
            time.sleep(2.0)  # joined its group
            broker.stop(crash=True)
            _wait(lambda: not consumer.stats.reachable, 20)
            time.sleep(3.0)  # attempts go on
            broker.start()
            _wait(lambda: consumer.stats.reachable, 30)
            keys, vectors = rows(50, 8, seed=5)
            with UpdateProducer(broker.address, linger_ms=5) as producer:
                producer.publish(model, "t", keys, vectors)
                producer.flush(20)
            _wait(lambda: target.count(tag) == 50, 40)
        finally:
            consumer.stop()
    finally:
        brokers.close()
    got = target.rows[tag]
    assert all(np.array_equal(got[k], v) for k, v in zip(keys.tolist(), vectors, strict=True))
    watch_lines = [m for r in caplog.records if (m := r.getMessage()).startswith("kafka: ")]
    assert len(watch_lines) == 2, watch_lines
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == watch_lines[:1]
    assert watch_lines[0].startswith(f"kafka: brokers {broker.address} unreachable (")
    assert watch_lines[1].startswith(f"kafka: brokers {broker.address} reachable again after ")
    stats = consumer.stats
    assert stats.outages == 1 and stats.errors > 0
    assert watch_for(broker.address).outages == 1
    err = capfd.readouterr().err
    assert "rdkafka" not in err and "%3|" not in err, err[:2000]


def test_a_commit_under_way_when_the_broker_dies_holds_nothing_up(model: str) -> None:
    """A synchronous commit in flight when its broker dies waits for the broker's return,
    and with it the poll loop that sees the outage; the loop's commits do not wait, and the
    consumer goes on after the return."""
    tag = topic_for(model, "t")
    target = Collector()
    brokers = persistent_kafka_broker()
    broker = next(brokers)
    try:
        config = source_config(broker.address, max_commit_interval=10_000)
        no_eof = {"enable.partition.eof": False}  # no commit at a partition's end
        consumer = make_consumer(
            broker.address, [tag], target, group_id=f"{model}.c", config=config,
            kafka_options=no_eof,
        )  # fmt: skip
        try:
            keys, vectors = rows(200, 8, seed=3)
            with UpdateProducer(broker.address, linger_ms=5) as producer:
                producer.publish(model, "t", keys, vectors)
                producer.flush(20)
            poll_until(consumer, lambda: target.count(tag) == 200)
            if not consumer._pending:  # an idle poll between fetches committed them all
                pytest.skip("nothing left to commit when the broker dies")
            # The broker dies as the next idle poll commits.
            threading.Timer(0.0, broker.stop, kwargs={"crash": True}).start()
            began = time.monotonic()
            consumer.poll_once(timeout_ms=1)
            poll_until(consumer, lambda: not consumer.stats.reachable, 30)
            assert time.monotonic() - began < 30
            broker.start()
            poll_until(consumer, lambda: consumer.stats.reachable, 40)
            # It goes on: rows published after the return are applied (the offsets it could
            # not commit are committed then, or, where the group lost its partitions, their
            # messages come again: at least once).
            more, more_vectors = rows(50, 8, seed=4, start=200)
            with UpdateProducer(broker.address, linger_ms=5) as producer:
                producer.publish(model, "t", more, more_vectors)
                producer.flush(20)
            poll_until(consumer, lambda: set(more.tolist()) <= target.rows[tag].keys(), 60)
        finally:
            consumer.stop()
    finally:
        brokers.close()


def _wait(done, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s")
        time.sleep(0.1)


def test_the_consumer_lag_sums_the_partitions_that_know_theirs() -> None:
    """librdkafka's statistics: each assigned partition's consumer_lag (-1 until it knows
    it; partition "-1" is its placeholder for messages not yet partitioned)."""
    report = {
        "brokers": {},
        "topics": {
            "hps_et.m.t0": {"partitions": {"0": {"consumer_lag": 7}, "1": {"consumer_lag": 0},
                                           "-1": {"consumer_lag": -1}}},
            "hps_et.m.t1": {"partitions": {"0": {"consumer_lag": -1}, "2": {"consumer_lag": 5}}},
        },
    }  # fmt: skip
    assert consumer_lag(json.dumps(report)) == 12
    unknown = {"topics": {"t": {"partitions": {"0": {"consumer_lag": -1}}}}}
    assert consumer_lag(json.dumps(unknown)) is None
    assert consumer_lag(json.dumps({"brokers": {}})) is None
    assert consumer_lag("not json") is None
