"""The pipeline's choice between two schedules by timing them (no GPU needed)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hps_core.infer.gpu.schedule import ScheduleTrial


@pytest.mark.parametrize("trials", [1, 2, 4, 7])  # odd counts round up
@pytest.mark.parametrize("faster", [True, False])
def test_the_faster_schedule_is_kept_despite_a_trend(trials: int, faster: bool) -> None:
    """Each schedule runs its trials, in an order that a steady trend (batches slowing down by
    far more than the gap between the schedules) does not turn against the faster one; the
    faster one runs every batch after that."""
    trial = ScheduleTrial(trials)
    runs = []
    for batch in itertools.count():
        if trial.chosen is not None:
            break
        schedule = trial.next()
        runs.append(schedule)
        trial.record(schedule, 1.0 + 0.5 * batch - 0.1 * (schedule == faster))
    even = trials + trials % 2
    assert runs.count(True) == runs.count(False) == even
    assert trial.chosen is faster
    assert [trial.next() for _ in range(5)] == [faster] * 5


def test_the_medians_decide_and_a_tie_keeps_the_first_schedule() -> None:
    """One slow outlier does not decide (medians, not means); equal medians choose ``True``."""
    rng = np.random.default_rng(3)
    trial = ScheduleTrial(5)
    while trial.chosen is None:
        schedule = trial.next()
        outlier = schedule and len(trial.times[True]) == 0
        trial.record(
            schedule, 100.0 if outlier else (1.0 if schedule else 1.2) + rng.random() / 100
        )
    assert trial.chosen is True
    tie = ScheduleTrial(2)
    while tie.chosen is None:
        tie.record(tie.next(), 1.0)
    assert tie.chosen is True


def test_a_fixed_choice_records_nothing() -> None:
    trial = ScheduleTrial(0, chosen=False)
    trial.record(False, 1.0)
    assert trial.next() is False and trial.times == ([], [])


def test_the_trial_runs_again_and_may_change_its_choice() -> None:
    """After ``again_after`` batches of the chosen schedule both are timed again (the first
    choice kept as ``previous``); a schedule that became faster is then chosen."""
    trial = ScheduleTrial(2, again_after=10)
    while trial.chosen is None:
        schedule = trial.next()
        trial.record(schedule, 1.0 if schedule else 2.0)
    assert trial.chosen is True and trial.previous is None
    assert [trial.next() for _ in range(10)] == [True] * 10
    runs = []
    while trial.chosen is None or not runs:
        schedule = trial.next()
        runs.append(schedule)
        trial.record(schedule, 2.0 if schedule else 1.0)  # whole is faster now
    assert runs.count(True) == runs.count(False) == 2
    assert trial.chosen is False and trial.previous is True
    never = ScheduleTrial(2)
    never.chosen = True
    assert all(never.next() for _ in range(10_000))
