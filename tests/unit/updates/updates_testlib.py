"""Helpers of the update tests: consumers with fast group joins, a dict as apply target."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from kafka_broker import FAST_GROUP_OPTIONS

from hps_core.config.enums import UpdateSourceType
from hps_core.config.schema import UpdateSourceConfig
from hps_core.updates import UpdateConsumer


def source_config(brokers: str, **overrides: Any) -> UpdateSourceConfig:
    """An ``update_source`` for the test broker; short poll timeout so tests are quick."""
    values: dict[str, Any] = {
        "type": UpdateSourceType.KAFKA_MESSAGE_QUEUE,
        "brokers": brokers,
        "poll_timeout_ms": 100,
        "failure_backoff_ms": 20,
    }
    values.update(overrides)
    return UpdateSourceConfig(**values)


class Collector:
    """An ``apply`` callback that keeps the last vector of every key, per table, and the
    number of rows each call brought."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[int, np.ndarray]] = {}
        self.calls: list[tuple[str, int]] = []
        self.fail_next = 0

    def __call__(self, tag: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("tier unavailable (test)")
        assert keys.dtype == np.int64 and vectors.dtype == np.float32
        assert vectors.flags.c_contiguous and vectors.flags.writeable
        table = self.rows.setdefault(tag, {})
        table.update(zip(keys.tolist(), vectors, strict=True))
        self.calls.append((tag, len(keys)))

    def count(self, tag: str) -> int:
        return len(self.rows.get(tag, {}))

    def keys_applied(self) -> int:
        return sum(n for _, n in self.calls)


def make_consumer(
    brokers: str, tables: list[Any], apply: Callable[..., None], **kwargs: Any
) -> UpdateConsumer:
    """An :class:`UpdateConsumer` that joins its group in about a second on tansu."""
    config = kwargs.pop("config", None) or source_config(brokers)
    options = {**FAST_GROUP_OPTIONS, **kwargs.pop("kafka_options", {})}
    return UpdateConsumer(config, tables, apply, kafka_options=options, **kwargs)


def poll_until(consumer: UpdateConsumer, done: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll synchronously until ``done()``; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"updates did not arrive in {timeout_s} s: {consumer.stats}")
        consumer.poll_once()


def rows(n: int, dim: int, seed: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` keys from ``start`` (spread over the int64 range) and random vectors."""
    rng = np.random.default_rng(seed)
    keys = (np.arange(start, start + n, dtype=np.int64) * 7919) - 2**40
    return keys, rng.standard_normal((n, dim), dtype=np.float32)
