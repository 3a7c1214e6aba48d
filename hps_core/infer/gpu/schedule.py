"""The choice between two schedules of the same work, made by timing them on real batches.

Some choices of the pipeline's schedule win on one model and lose on another (scoring a large
batch part by part of its rows beside the lookup, or whole after it): which one is faster
depends on how long the lookup, the copies and the dense network take, and so on the model,
its cache's hit rate and the batch size. A bucket times both on its first batches, keeps the
faster, and times both again from time to time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


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
