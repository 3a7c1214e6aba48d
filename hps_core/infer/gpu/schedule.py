"""The choice between two schedules of the same work, made by timing them on real batches.

Some choices of the pipeline's schedule win on one model and lose on another (scoring a large
batch part by part of its rows beside the lookup, or whole after it): which one is faster
depends on how long the lookup, the copies and the dense network take, and so on the model,
its cache's hit rate and the batch size. A bucket times both on its first batches, keeps the
faster, and times both again from time to time. :class:`BucketSchedules` holds the trials of
one pipeline's buckets and the settings that fix a choice instead (the module's ``_`` names,
which benchmarks and tests set).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hps_core.infer.gpu.buckets import Bucket

logger = logging.getLogger("hps_core")

_DENSE_BY_PART: bool | None = None
"""Score a large sample-major host batch part by part of its rows (``GpuRankingPipeline._run``):
each part's dense network runs on the main stream as soon as its lookup is done, beside the next
part's copy and lookup (``False``: the whole batch's dense network after every lookup; ``None``:
whichever of the two a bucket's timed batches run faster by, see :class:`ScheduleTrial`).
Neither wins everywhere (H200, 0.2 cache, fresh batches, ``ranking_kernel_profile.py``, medians
of 9): the one-hot DLRM's batch of 65,536 (FP16 storage) took 6.24 ms by parts against 6.92
whole in TF32, 9.60 against 10.05 in FP32; DLRM-v2's of 16,384, whose lookup is longer than its
copies, 9.89 against 9.59 in TF32 and 17.5 against 15.5 in FP32. On a stream of the lookup's
priority, below the main stream's, the parts took longer still (10.11, 6.48, 10.42, 19.1 ms)."""
_STAGED_IN_PARTS: bool | None = None
"""Stage, copy and look up a host batch of a large bucket (``_GROUPED_STAGING_SAMPLES`` samples
and more) in parts, so that each part's lookup runs while the host fills the next (``True``),
whole as a smaller batch (``False``), or (``None``) whichever of the two the bucket's timed
batches run faster by, where its keys take at most ``_PARTS_TRIAL_KEY_BYTES`` (larger ones always
in parts). Neither wins everywhere (H200, TF32, 16,384 samples, two alternations,
``zoo_kernel_profile.py`` and ``ranking_kernel_profile.py``, 8d63895): whole, the zoo's small
models ran 1.1-2.2x faster (NCF 0.73-0.79 -> 0.33-0.40 ms a batch, MMoE 1.36-1.57 -> 1.06-1.08),
their parts' own costs (a copy, a find and a pooling each) exceeding the host's fill of a part;
the one-hot MLPerf DLRM, whose lookup reads its misses over PCIe, 1.77-1.99 ms in parts against
2.22-2.30 whole."""
_PARTS_TRIAL_KEY_BYTES = 8 << 20
"""... (a larger batch's fill takes a millisecond or more, which parts hide: DLRM-v2's 16,384
samples, 28 MB of keys, took 9.53 ms in parts against 11.07 after the whole copy, e2a9b18; and
the bucket that runs whole doubles the buffers of its size)."""
_SCHEDULE_TRIALS = 4
"""Batches each schedule runs before a bucket chooses (the first batch of a bucket is not
timed)..."""
_SCHEDULE_AGAIN_AFTER = 4096
"""... and batches of the chosen schedule before it times both again (8 batches in 4,096 run
the slower one: what a wrong choice would cost on every batch, as a cache warms up or the load
shifts, is worth more)."""


@dataclass
class ScheduleTrial:
    """Which of two schedules a bucket runs its batches by, chosen on its first real batches:
    each schedule runs ``trials`` of them (rounded up to an even number), in the order ABBA
    ABBA ... (so that a steady trend, such as a cache warming up, weighs on both alike), and
    the one whose median time is lower runs the batches after that (``True`` on a tie). With
    ``again_after``, the trial runs again once that many batches ran the chosen schedule: the
    winner may change as a cache warms up or the load shifts.

    Example:
        >>> trial = ScheduleTrial(trials=2)
        >>> for seconds in (3.0, 1.0, 1.1, 2.9):
        ...     trial.record(trial.next(), seconds)
        >>> trial.next()
        False
    """

    trials: int
    chosen: bool | None = None
    again_after: int = 0  # batches; 0: never again
    times: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    previous: bool | None = None  # the choice before the trial that runs again
    _since: int = 0  # batches run by the chosen schedule since the choice

    def __post_init__(self) -> None:
        self.trials += self.trials % 2

    def next(self) -> bool:
        """The schedule the next batch runs by (each call is a batch that runs by it)."""
        if self.chosen is not None:
            self._since += 1
            if not self.again_after or self._since <= self.again_after:
                return self.chosen
            self.previous, self.chosen, self._since = self.chosen, None, 0
            self.times = ([], [])
        done = len(self.times[0]) + len(self.times[1])
        return done % 4 in (0, 3)

    def record(self, schedule: bool, seconds: float) -> None:
        """A batch run by ``schedule`` took ``seconds``; chooses once each has its trials."""
        if self.chosen is not None:
            return
        self.times[schedule].append(seconds)
        if min(map(len, self.times)) >= self.trials:
            self.chosen = statistics.median(self.times[True]) <= statistics.median(
                self.times[False]
            )


class BucketSchedules:
    """The two choices of one pipeline's buckets for large host batches, and their trials.

    - staging (per bucket size): a batch of a bucket that stages in parts by default is
      staged, copied and looked up in parts, or whole as a smaller batch (``_STAGED_IN_PARTS``);
    - scoring (per bucket): a sample-major batch looked up part by part of its rows is scored
      part by part too, or whole after every lookup (``_DENSE_BY_PART``).

    Args:
        model: the model's name, for the log.
        device_id: its GPU, for the log.
    """

    def __init__(self, model: str, device_id: int) -> None:
        self._model = model
        self._device_id = device_id
        self._staging: dict[int, ScheduleTrial] = {}
        self._scoring: list[ScheduleTrial] = []

    def staging(self, size: int, keys_bytes: int) -> ScheduleTrial | None:
        """How host batches of bucket size ``size``, with ``keys_bytes`` of keys at most,
        choose between staging in parts (``True``) and whole, or None where they always run
        in parts."""
        if _STAGED_IN_PARTS is True or keys_bytes > _PARTS_TRIAL_KEY_BYTES:
            return None
        trial = self._staging.get(size)
        if trial is None:
            if _STAGED_IN_PARTS is None:
                trial = ScheduleTrial(_SCHEDULE_TRIALS, again_after=_SCHEDULE_AGAIN_AFTER)
            else:
                trial = ScheduleTrial(0, chosen=False)
            self._staging[size] = trial
        return trial

    def scoring(self, bucket: Bucket, counted: bool = True) -> ScheduleTrial:
        """How ``bucket``'s sample-major host batches choose between scoring by parts
        (``True``) and whole (made on first use, kept by the bucket); ``counted``: the trial
        counts in :meth:`chosen` (the buckets that serve batches whole)."""
        if bucket.by_part is None:
            if _DENSE_BY_PART is None:
                bucket.by_part = ScheduleTrial(_SCHEDULE_TRIALS, again_after=_SCHEDULE_AGAIN_AFTER)
            else:
                bucket.by_part = ScheduleTrial(0, chosen=_DENSE_BY_PART)
            if counted:
                self._scoring.append(bucket.by_part)
        return bucket.by_part

    def record(
        self, trial: ScheduleTrial, schedule: bool, seconds: float, size: int, verb: str,
        parts_name: str,
    ) -> None:  # fmt: skip
        """Record a timed batch of ``trial`` that ran by ``schedule`` (True: ``parts_name``,
        False: whole) in ``seconds``; a choice is news (INFO) the first time and when it
        changes."""
        trial.record(schedule, seconds)
        if trial.chosen is None:
            return
        whole, parts = (1e3 * statistics.median(t) for t in trial.times)
        logger.log(
            logging.DEBUG if trial.chosen == trial.previous else logging.INFO,
            "model %s on GPU %d: batch bucket %d %s %s (median %.2f ms %s, %.2f ms whole)",
            self._model, self._device_id, size, verb,
            parts_name if trial.chosen else "whole", parts, parts_name, whole,
        )  # fmt: skip

    def chosen(self) -> bool:
        """Whether every trial made so far has chosen."""
        return all(t.chosen is not None for t in (*self._staging.values(), *self._scoring))

    def staging_trial(self, size: int) -> ScheduleTrial | None:
        """The choice between staging in parts and whole of bucket size ``size``, if host
        batches of that size made one."""
        return self._staging.get(size)

    def staged_whole(self, size: int) -> bool:
        """Whether host batches of bucket size ``size`` now run staged whole."""
        trial = self._staging.get(size)
        return trial is not None and trial.chosen is False

    def clear(self) -> None:
        """Forget every trial (their buckets are dropped)."""
        self._staging.clear()
        self._scoring.clear()
