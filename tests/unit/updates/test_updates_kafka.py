"""Producer -> tansu broker -> consumer: rows applied exactly as published, malformed
messages skipped and counted, failed applies retried, offsets resumed after a restart, and
every server (consumer group) receiving every update."""

from __future__ import annotations

import time

import numpy as np
import pytest
from confluent_kafka import Producer
from updates_testlib import Collector, make_consumer, poll_until, rows, source_config

from hps_core.formats.sparse_writer import SparseTableWriter
from hps_core.updates import UpdateProducer, topic_for
from hps_core.updates.consumer import default_group_id
from hps_core.updates.messages import encode_beacon, encode_message

pytestmark = pytest.mark.timeout(120)


def publish(broker: str, model: str, table: str, keys, vectors, **kwargs) -> UpdateProducer:
    producer = UpdateProducer(broker, linger_ms=5, **kwargs)
    with producer:
        producer.publish(model, table, keys, vectors)
    return producer


def expected(*batches) -> dict[int, np.ndarray]:
    out: dict[int, np.ndarray] = {}
    for keys, vectors in batches:
        out.update(zip(keys.tolist(), vectors, strict=True))
    return out


def assert_same(got: dict[int, np.ndarray], want: dict[int, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for key, vector in want.items():
        assert np.array_equal(got[key].view(np.uint32), vector.view(np.uint32)), key


def test_published_rows_are_applied_exactly(broker, model):
    t0, t1 = topic_for(model, "t0"), topic_for(model, "t1")
    a = rows(5000, 16, seed=1)
    b = rows(300, 128, seed=2)
    # An update of 100 existing keys published later: the newest vector must win.
    a2 = (a[0][:100], a[1][:100] + 1)
    target = Collector()
    consumer = make_consumer(broker, [(model, "t0"), t1], target, group_id=f"{model}.g")
    try:
        producer = UpdateProducer(broker, linger_ms=5, max_batch_size=700)
        with producer:
            producer.publish(model, "t0", *a)
            producer.publish(model, "t1", *b)
            producer.flush()
            producer.publish(model, "t0", *a2)
        poll_until(consumer, lambda: target.keys_applied() == 5000 + 300 + 100)
        assert_same(target.rows[t0], expected(a, a2))
        assert_same(target.rows[t1], expected(b))
        # One call per message, never more rows than the producer put in one.
        assert max(n for _, n in target.calls) <= 700
        stats = consumer.stats
        assert stats.messages_applied == len(target.calls) == producer.messages_sent
        assert (stats.keys_applied, stats.malformed, stats.errors) == (5400, 0, 0)
        # librdkafka's next statistics report (every second) says nothing is left to read.
        poll_until(consumer, lambda: consumer.stats.lag == 0, timeout_s=10)
    finally:
        consumer.stop()


def test_malformed_messages_are_skipped_counted_and_committed(broker, model):
    tag = topic_for(model, "t")
    good = rows(10, 4, seed=3)
    raw = Producer({"bootstrap.servers": broker})
    # All to one partition, in order: good, truncated, wrong dim, keyed, beacon, good.
    payloads = [
        (encode_message(good[0][:5], good[1][:5]), None),
        (encode_message(good[0][:2], good[1][:2])[:-1], None),
        (encode_message(good[0][:2], np.ones((2, 3), np.float32)), None),
        (encode_message(good[0][:2], good[1][:2]), b"k"),
        (encode_beacon(), None),
        (encode_message(good[0][5:], good[1][5:]), None),
    ]
    UpdateProducer(broker).partitions(tag)  # create the topic with our partition count
    for value, key in payloads:
        raw.produce(tag, value, key=key, partition=0)
    assert raw.flush(10) == 0
    target = Collector()
    consumer = make_consumer(broker, [tag], target, group_id=f"{model}.g", dims={tag: 4})
    try:
        poll_until(consumer, lambda: target.keys_applied() == 10)
        poll_until(consumer, lambda: consumer.stats.commits > 0)
        stats = consumer.stats
        assert (stats.messages_applied, stats.malformed, stats.beacons) == (2, 3, 1)
        # The last malformed one was the keyed message, at offset 3.
        assert f"topic '{tag}' partition 0 offset 3: has a message key" in stats.last_error
        assert_same(target.rows[tag], expected(good))
    finally:
        consumer.stop()
    # The malformed ones were committed past: a restart applies nothing again.
    again = Collector()
    consumer = make_consumer(broker, [tag], again, group_id=f"{model}.g", dims={tag: 4})
    try:
        for _ in range(15):
            consumer.poll_once()
        assert again.calls == [] and consumer.stats.malformed == 0
    finally:
        consumer.stop()


def test_failed_apply_is_retried_in_order(broker, model):
    tag = topic_for(model, "t")
    first = rows(50, 8, seed=4)
    second = (first[0], first[1] * 2)  # same keys, newer vectors
    producer = UpdateProducer(broker, linger_ms=5, num_key_groups=1)
    with producer:
        producer.publish(model, "t", *first)
        producer.flush()
        producer.publish(model, "t", *second)
    target = Collector()
    target.fail_next = 3
    consumer = make_consumer(broker, [tag], target, group_id=f"{model}.g")
    try:
        poll_until(consumer, lambda: target.keys_applied() == 100)
        assert consumer.stats.errors == 3 and "retrying" in consumer.stats.last_error
        assert_same(target.rows[tag], expected(second))  # the older never overtook
        assert [n for _, n in target.calls] == [50, 50]
    finally:
        consumer.stop()


def test_resume_from_committed_offsets_after_restart(broker, model):
    tag = topic_for(model, "t")
    group = default_group_id("volatile", host=f"{model}-server")
    a, b, c = rows(2000, 16, 5), rows(2000, 16, 6, start=2000), rows(2000, 16, 7, start=4000)

    publish(broker, model, "t", *a)
    first = Collector()
    consumer = make_consumer(broker, [tag], first, group_id=group)
    poll_until(consumer, lambda: first.count(tag) == 2000)
    consumer.stop()  # commits what it applied

    publish(broker, model, "t", *b)
    second = Collector()
    # No commit at a partition's end here, so that the crash below finds work uncommitted.
    consumer = make_consumer(
        broker,
        [tag],
        second,
        group_id=group,
        config=source_config(broker, max_commit_interval=10_000),
        kafka_options={"enable.partition.eof": False},
    )
    try:
        poll_until(consumer, lambda: second.count(tag) == 2000)
        # Clean stop: exactly once, nothing from before the restart again.
        assert_same(second.rows[tag], expected(b))
        assert second.keys_applied() == 2000
        poll_until(consumer, lambda: consumer.stats.commits == 1)  # committed when idle
        # A crash: applied, never committed (the interval is not reached, no idle poll).
        publish(broker, model, "t", *c)
        while second.count(tag) < 4000:
            consumer.poll_once(timeout_ms=3000)
            if consumer.stats.commits > 1 or consumer._in_flight is not None:
                pytest.skip("an idle poll committed before the simulated crash")
        # The process dies: what was applied since the last commit is never committed (a
        # real crash would not even run the revoke callback that commits on a clean leave).
        consumer._pending.clear()
        consumer._consumer.close()
        consumer._closed = True
    finally:
        consumer.stop()

    third = Collector()
    consumer = make_consumer(broker, [tag], third, group_id=group)
    try:
        # At least once: the uncommitted messages come again, and nothing else is lost.
        # An idle poll may have committed while only part of b was applied (the broker can
        # hand b over in several fetches): b's uncommitted rest may come again, with b's
        # values; nothing of a (committed at the clean stop) does.
        want_b, want_c = expected(b), expected(c)
        poll_until(consumer, lambda: want_c.keys() <= third.rows.get(tag, {}).keys())
        got = third.rows[tag]
        assert_same({k: got[k] for k in want_c}, want_c)
        again = got.keys() - want_c.keys()
        assert again <= want_b.keys()
        assert_same({k: got[k] for k in again}, {k: want_b[k] for k in again})
    finally:
        consumer.stop()


def test_every_server_receives_every_update(broker, model):
    tag = topic_for(model, "t")
    servers = [Collector(), Collector()]
    consumers = [
        make_consumer(broker, [tag], target, group_id=default_group_id(host=f"{model}-{i}"))
        for i, target in enumerate(servers)
    ]
    try:
        for c in consumers:
            c.start()
        data = rows(3000, 32, seed=8)
        publish(broker, model, "t", *data)
        end = time.monotonic() + 20
        while min(t.count(tag) for t in servers) < 3000 and time.monotonic() < end:
            time.sleep(0.05)
        for target in servers:
            assert_same(target.rows[tag], expected(data))
    finally:
        for c in consumers:
            c.stop()
    assert all(c.stats.errors == 0 for c in consumers)


def test_publish_only_changed_keys(broker, model, tmp_path):
    tag = topic_for(model, "t")
    keys, vectors = rows(1000, 8, seed=9)
    with SparseTableWriter(tmp_path / "old") as w:
        w.append(keys, vectors)
    new_vectors = vectors.copy()
    new_vectors[10:20] += 1  # changed
    new_vectors[30, 0] = -0.0 if vectors[30, 0] == 0 else vectors[30, 0]  # unchanged
    new_keys = np.concatenate([keys[5:], [10**12, 10**12 + 1]])  # 5 removed, 2 added
    new_vectors = np.concatenate([new_vectors[5:], np.ones((2, 8), np.float32)])
    with SparseTableWriter(tmp_path / "new") as w:
        w.append(new_keys, new_vectors)

    producer = UpdateProducer(broker, linger_ms=5)
    with producer:
        report = producer.publish_changed(model, "t", tmp_path / "old", tmp_path / "new")
    assert (report.rows, report.added, report.changed, report.removed) == (997, 2, 10, 5)
    assert report.unchanged == 985 and report.sent == 12

    target = Collector()
    consumer = make_consumer(broker, [tag], target, group_id=f"{model}.g")
    try:
        poll_until(consumer, lambda: target.count(tag) == 12)
        want = expected((new_keys, new_vectors))
        assert_same(
            target.rows[tag], {k: want[k] for k in [*keys[10:20].tolist(), 10**12, 10**12 + 1]}
        )
    finally:
        consumer.stop()
