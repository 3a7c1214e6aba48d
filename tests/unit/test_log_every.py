"""LogEvery: one line per kind and period, the next one saying how many were held back."""

from __future__ import annotations

import logging

import pytest

from hps_core.log_every import LogEvery


def test_one_line_per_key_and_period_then_the_count_held_back(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr("hps_core.log_every.time.monotonic", lambda: now[0])
    every = LogEvery(10.0)
    log = logging.getLogger("hps_core.test_log_every")
    with caplog.at_level(logging.WARNING, logger=log.name):
        written = [every.log(log, logging.WARNING, "a", "node %s down", "a") for _ in range(5)]
        assert every.log(log, logging.WARNING, "b", "node %s down", "b")  # another kind
        now[0] += 10.0
        assert every.log(log, logging.WARNING, "a", "node %s down", "a")
        now[0] += 10.0
        assert every.log(log, logging.WARNING, "a", "node %s down", "a")
    assert written == [True, False, False, False, False]
    assert [r.getMessage() for r in caplog.records] == [
        "node a down",
        "node b down",
        "node a down (4 more like it held back)",
        "node a down",
    ]
