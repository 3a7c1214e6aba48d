"""Log lines of one kind at most once per period, saying how many were held back.

A Redis node or a Kafka broker that stays down would otherwise write a line per request, per
retry or per reconnection to the server's log (hundreds a minute), burying everything else.
The first line of a kind goes out at once; the next ones within the period are counted, and
the first line after it says how many there were.

Example:
    >>> import logging
    >>> every = LogEvery(10.0)
    >>> every.log(logging.getLogger("hps_core"), logging.WARNING, "node a", "node %s down", "a")
    True
    >>> every.log(logging.getLogger("hps_core"), logging.WARNING, "node a", "node %s down", "a")
    False
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any


class LogEvery:
    """At most one line per ``key`` every ``period_s`` seconds (thread-safe).

    Args:
        period_s: seconds between two lines of one key.
    """

    def __init__(self, period_s: float = 10.0) -> None:
        self.period_s = period_s
        self._lock = threading.Lock()
        self._state: dict[Any, list[float]] = {}  # key -> [time of the next line, held back]

    def log(self, logger: logging.Logger, level: int, key: Any, message: str, *args: Any) -> bool:
        """Log ``message % args`` unless a line of ``key`` went out within the period.

        Returns:
            Whether the line was written.
        """
        now = time.monotonic()
        with self._lock:
            state = self._state.get(key)
            if state is not None and now < state[0]:
                state[1] += 1
                return False
            held = int(state[1]) if state is not None else 0
            self._state[key] = [now + self.period_s, 0]
        if held:
            message += " (%d more like it held back)"
            args = (*args, held)
        logger.log(level, message, *args)
        return True
