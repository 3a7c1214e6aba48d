"""Fixtures of the update tests: one in-memory Kafka broker for the session, a fresh model
name per test, so topics and consumer groups never mix between tests, and every
shared-memory segment in a private folder of the test."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_broker import kafka_broker
from private_shm import private_shm_dir

_names = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[str]:
    """``host:port`` of a tansu broker shared by the tests of this session."""
    yield from kafka_broker()


@pytest.fixture
def model() -> str:
    """A model name no other test uses, so topics and groups never mix between tests."""
    return f"m{next(_names)}_{time.monotonic_ns() % 10**9}"


@pytest.fixture(autouse=True)
def shm_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Segments of this test in a private folder, never /dev/shm."""
    return private_shm_dir(tmp_path, monkeypatch)
