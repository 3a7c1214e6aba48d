"""``read_ahead`` (offline scoring reads the next batches on a thread of its own): the same
items in the same order, the source's error after the items before it, and a source closed
and a thread ended when the consumer stops early."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from hps_core.errors import ModelFileError
from hps_core.offline.dataset import read_ahead


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


@pytest.mark.parametrize("count", [0, 1, 2, 3, 50])
@pytest.mark.parametrize("depth", [1, 2, 4])
def test_every_item_in_order(count: int, depth: int) -> None:
    assert list(read_ahead(iter(range(count)), depth)) == list(range(count))
    assert threads_named("hps-read-ahead") == []


def test_the_sources_error_comes_after_the_items_before_it() -> None:
    def source() -> Iterator[int]:
        yield from range(3)
        raise ModelFileError("part-1.parquet: column 'I3' is null at row 7")

    got = []
    with pytest.raises(ModelFileError, match="column 'I3' is null at row 7"):
        for item in read_ahead(source()):
            got.append(item)
    assert got == [0, 1, 2]


def test_a_consumer_that_stops_early_closes_the_source_and_ends_the_thread() -> None:
    closed = threading.Event()
    produced = []

    def source() -> Iterator[int]:
        try:
            for i in range(1000):
                produced.append(i)
                yield i
        finally:
            closed.set()

    items = read_ahead(source(), depth=2)
    assert [next(items), next(items)] == [0, 1]
    items.close()  # what a `break` out of a for loop does
    assert closed.is_set()
    assert threads_named("hps-read-ahead") == []
    assert len(produced) <= 2 + 2 + 1  # consumed, queued, and at most one more in hand


def test_items_are_produced_before_the_consumer_asks_for_them() -> None:
    produced = []

    def source() -> Iterator[int]:
        for i in range(10):
            produced.append(i)
            yield i

    items = read_ahead(source(), depth=3)
    assert next(items) == 0
    deadline = time.monotonic() + 10
    while len(produced) < 4 and time.monotonic() < deadline:  # item 0, then 3 queued
        time.sleep(0.01)
    time.sleep(0.1)
    # Item 0, three queued, at most one more in the producer's hands: the queue holds depth.
    assert 4 <= len(produced) <= 5
    assert list(items) == list(range(1, 10))
