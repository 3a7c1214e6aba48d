"""Progress reports for long reads and conversions of embedding tables.

A table of a billion rows takes minutes to read, so long operations report how far they are:
a ``tqdm`` bar when a person watches the terminal (stderr is a TTY), otherwise a log line on
the ``hps_core`` logger tree every ~10 % with the rate in rows per second, which is what a
server log or a CI job wants to keep.
"""

from __future__ import annotations

import logging
import sys
import time
from types import TracebackType

from tqdm import tqdm

logger = logging.getLogger(__name__)

# Below this size an operation is over in about a second: reporting it only adds noise.
LARGE_TABLE_BYTES = 256 * 1024 * 1024


def wants_progress(progress: bool | None, total_bytes: int) -> bool:
    """Decide whether an operation should report progress.

    Args:
        progress: ``True`` or ``False`` forces the choice; ``None`` reports only for
            operations over ``LARGE_TABLE_BYTES``.
        total_bytes: bytes the operation reads or writes.

    Returns:
        Whether to create an enabled :class:`RowProgress`.
    """
    if progress is None:
        return total_bytes >= LARGE_TABLE_BYTES
    return progress


class RowProgress:
    """Counts rows done out of a known total and reports them (context manager).

    Args:
        total_rows: rows the operation will handle.
        label: what is being done, e.g. ``"reading /models/0_sparse_model"``.
        enabled: ``False`` makes every method a no-op.
        row_bytes: bytes read per row; given, the report says GB/s too (a bar counts bytes).

    Example:
        >>> with RowProgress(1000, "reading t", enabled=False) as bar:
        ...     bar.update(1000)
    """

    def __init__(self, total_rows: int, label: str, enabled: bool, row_bytes: int = 0) -> None:
        self.total_rows = total_rows
        self.label = label
        self.done_rows = 0
        self.row_bytes = row_bytes
        self._enabled = enabled and total_rows > 0
        self._start = time.monotonic()
        self._next_tenth = 1
        self._bar: tqdm | None = None
        if self._enabled and sys.stderr.isatty():
            if row_bytes:
                self._bar = tqdm(
                    total=total_rows * row_bytes, desc=label, unit="B", unit_scale=True,
                    file=sys.stderr,
                )  # fmt: skip
            else:
                self._bar = tqdm(
                    total=total_rows, desc=label, unit="rows", unit_scale=True, file=sys.stderr
                )

    def update(self, rows: int) -> None:
        """Record that ``rows`` more rows are done.

        Args:
            rows: rows finished since the previous call.
        """
        if not self._enabled:
            return
        self.done_rows += rows
        if self._bar is not None:
            self._bar.update(rows * self.row_bytes if self.row_bytes else rows)
            return
        tenth = self.done_rows * 10 // self.total_rows
        if tenth >= self._next_tenth:
            self._next_tenth = tenth + 1
            elapsed = max(time.monotonic() - self._start, 1e-9)
            rate = f"{self.done_rows / elapsed:,.0f} rows/s"
            if self.row_bytes:
                rate += f", {self.done_rows * self.row_bytes / elapsed / 1e9:.2f} GB/s"
            logger.info(
                "%s: %d%% (%s/%s rows, %s)",
                self.label,
                self.done_rows * 100 // self.total_rows,
                f"{self.done_rows:,}",
                f"{self.total_rows:,}",
                rate,
            )

    def close(self) -> None:
        """Finish the bar (if any); log lines need no closing."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> RowProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
