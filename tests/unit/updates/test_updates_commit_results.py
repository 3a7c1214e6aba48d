"""The poll loop's asynchronous commits (``UpdateConsumer._commit_async``, ``_on_commit``)
against a stand-in for librdkafka's consumer whose results the test hands back: one commit at
a time; offsets leave the pending set only when their commit is confirmed; a failure, a
failure reported without its partitions, or a result that never comes frees the loop to
commit again, and the offsets are committed again."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition
from updates_testlib import make_consumer

from hps_core.updates import consumer as consumer_module


class StandIn:
    """librdkafka's consumer as the poll loop uses it: no messages, commits recorded."""

    def __init__(self) -> None:
        self.commits: list[tuple[dict[tuple[str, int], int], bool]] = []

    def poll(self, timeout: float) -> None:
        return None

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> list[Any] | None:
        self.commits.append(({(tp.topic, tp.partition): tp.offset for tp in offsets}, asynchronous))
        return None if asynchronous else offsets


@pytest.fixture
def loop():
    """A consumer (of a broker nobody listens on) whose librdkafka is the stand-in."""
    consumer = make_consumer("127.0.0.1:1", [("m", "t0")], lambda *a: None, topic_partitions=None)
    real, stand_in = consumer._consumer, StandIn()
    consumer._consumer = stand_in
    yield consumer, stand_in
    consumer._consumer = real
    consumer._pending.clear()
    consumer.stop()


def applied(consumer: Any, offsets: dict[tuple[str, int], int]) -> None:
    """As if messages up to these offsets were applied."""
    consumer._pending.update(offsets)
    consumer._uncommitted += len(offsets)


def answer(consumer: Any, offsets: dict[tuple[str, int], int], err: Any = None) -> None:
    """librdkafka's on_commit for these offsets."""
    consumer._on_commit(err, [TopicPartition(t, p, o) for (t, p), o in offsets.items()])


def test_one_commit_at_a_time_and_offsets_leave_when_confirmed(loop) -> None:
    consumer, librdkafka = loop
    applied(consumer, {("a", 0): 5})
    consumer.poll_once(0)
    assert librdkafka.commits == [({("a", 0): 5}, True)]
    applied(consumer, {("a", 1): 3})
    consumer.poll_once(0)
    assert len(librdkafka.commits) == 1  # the first is under way
    answer(consumer, {("a", 0): 5})
    assert consumer._pending == {("a", 1): 3}
    assert consumer.stats.commits == 1
    consumer.poll_once(0)
    assert librdkafka.commits[-1] == ({("a", 1): 3}, True)


def test_a_failed_commit_keeps_its_offsets_for_the_next(loop) -> None:
    consumer, librdkafka = loop
    applied(consumer, {("a", 0): 5})
    consumer.poll_once(0)
    answer(consumer, {("a", 0): 5}, KafkaError(KafkaError._TIMED_OUT, "timed out"))
    assert consumer._pending == {("a", 0): 5}
    assert consumer.stats.commits == 0 and consumer.stats.errors == 1
    consumer.poll_once(0)
    assert librdkafka.commits[-1] == ({("a", 0): 5}, True) and len(librdkafka.commits) == 2


def test_a_failure_reported_without_its_partitions_frees_the_loop(loop) -> None:
    consumer, librdkafka = loop
    applied(consumer, {("a", 0): 5})
    consumer.poll_once(0)
    consumer._on_commit(KafkaError(KafkaError._NO_OFFSET, "no offset"), [])
    consumer.poll_once(0)
    assert len(librdkafka.commits) == 2 and consumer._pending == {("a", 0): 5}


def test_another_commits_result_does_not_end_the_one_under_way(loop) -> None:
    consumer, librdkafka = loop
    applied(consumer, {("a", 0): 5})
    consumer.poll_once(0)
    answer(consumer, {("a", 0): 4})  # e.g. an earlier synchronous commit's
    consumer.poll_once(0)
    assert len(librdkafka.commits) == 1 and consumer._pending == {("a", 0): 5}


def test_a_result_that_never_comes_is_given_up(loop, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer, librdkafka = loop
    now = [1000.0]
    monkeypatch.setattr(consumer_module.time, "monotonic", lambda: now[0])
    applied(consumer, {("a", 0): 5})
    consumer.poll_once(0)
    now[0] += consumer_module.COMMIT_RESULT_WAIT_S - 1
    consumer.poll_once(0)
    assert len(librdkafka.commits) == 1
    now[0] += 2
    consumer.poll_once(0)
    assert len(librdkafka.commits) == 2 and consumer.stats.errors == 1
    assert "no result of a commit" in consumer.stats.last_error
    # The late result of the given-up commit changes nothing; the new one's counts.
    answer(consumer, {("a", 0): 5})
    assert consumer._pending == {} and consumer.stats.commits == 1
