"""How late the event loop runs: a blocking call on it holds up every session at once.

A timer asks to run every ``interval``; how much later than asked it runs is
the loop's lag at that moment. The worst of the last minute is what
``/metrics`` shows, and a stall past the threshold is logged as it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

log = logging.getLogger(__name__)


class LoopLagMonitor:
    """Samples the running loop's lateness; keeps the worst of the last ``window`` seconds."""

    def __init__(self, warn_after: float, interval: float = 0.25, window: float = 60.0) -> None:
        self.warn_after = warn_after
        self.interval = interval
        self.window = window
        self._samples: deque[tuple[float, float]] = deque()  # (loop time, lag), oldest first
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        """Start sampling on the running loop; the gateway calls it as it starts."""
        self._loop = asyncio.get_running_loop()
        self._schedule()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def max_lag(self) -> float:
        """The longest stall of the last ``window`` seconds, in seconds."""
        if self._loop is None:
            return 0.0
        cutoff = self._loop.time() - self.window
        return max((lag for at, lag in self._samples if at >= cutoff), default=0.0)

    def _schedule(self) -> None:
        assert self._loop is not None
        self._due = self._loop.time() + self.interval
        self._timer = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        lag = max(0.0, now - self._due)
        self._samples.append((now, lag))
        while self._samples[0][0] < now - self.window:
            self._samples.popleft()
        if lag > self.warn_after:
            log.warning(
                "the event loop was blocked for %.0f ms (loop_lag_warning is %.0f ms): every "
                "request and session waited; something ran on it that belongs in a thread",
                lag * 1000,
                self.warn_after * 1000,
            )
        self._schedule()
