"""The pipeline's choice between two schedules by timing them (no GPU needed)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hps_core.infer.gpu import schedule
from hps_core.infer.gpu.schedule import BucketSchedules, ScheduleTrial


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


class _Bucket:
    """What :meth:`BucketSchedules.scoring` reads of a bucket: where it keeps its trial."""

    by_part: ScheduleTrial | None = None


@pytest.mark.parametrize("setting", [None, True, False])
def test_staging_trials_follow_the_setting_and_large_batches_always_stage_in_parts(
    monkeypatch: pytest.MonkeyPatch, setting: bool | None
) -> None:
    monkeypatch.setattr(schedule, "_STAGED_IN_PARTS", setting)
    schedules = BucketSchedules("m", 0)
    limit = schedule._PARTS_TRIAL_KEY_BYTES
    assert schedules.staging(8192, limit + 1) is None  # too large to stage whole
    trial = schedules.staging(8192, limit)
    if setting is True:
        assert trial is None and schedules.chosen()
        return
    assert trial is not None and schedules.staging(8192, limit) is trial  # one per size
    if setting is False:
        assert trial.chosen is False and schedules.staged_whole(8192)
        return
    assert not schedules.chosen() and not schedules.staged_whole(8192)
    while trial.chosen is None:  # in parts 1 s a batch, whole 2 s
        run = trial.next()
        schedules.record(trial, run, 1.0 if run else 2.0, 8192, "stages", "in parts")
    assert trial.chosen is True and schedules.chosen() and not schedules.staged_whole(8192)
    schedules.clear()
    assert schedules.staging(8192, limit) is not trial


def test_scoring_trials_are_kept_by_their_bucket_and_counted_when_asked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(schedule, "_DENSE_BY_PART", None)
    monkeypatch.setattr(schedule, "_SCHEDULE_TRIALS", 2)
    schedules = BucketSchedules("dlrm", 3)
    serving, other = _Bucket(), _Bucket()
    trial = schedules.scoring(serving)  # type: ignore[arg-type]
    assert serving.by_part is trial and schedules.scoring(serving) is trial  # type: ignore[arg-type]
    schedules.scoring(other, counted=False)  # type: ignore[arg-type]
    assert not schedules.chosen()
    with caplog.at_level("INFO", logger="hps_core"):
        while trial.chosen is None:
            run = trial.next()
            schedules.record(trial, run, 0.5 if run else 1.0, 4096, "scores", "by parts")
    assert schedules.chosen()  # the uncounted bucket's trial waits, and does not count
    assert caplog.messages == [
        "model dlrm on GPU 3: batch bucket 4096 scores by parts (median 500.00 ms by parts, "
        "1000.00 ms whole)"
    ]
