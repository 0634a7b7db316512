"""A session's CPU use over an interval, from the cumulative CPU seconds its sandbox reports.

E2B reports CPU as a share over its sampling interval; a sandbox tells only
the CPU seconds used since it started. So each session's last reading is
kept (for at most ``MAX_SAMPLES`` sessions, the oldest dropped: sessions
long gone), and a share is what was used since then.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .model import Session

MAX_SAMPLES = 4096


class CpuShares:
    """Each session's last CPU reading; the share used since, of its CPU limit."""

    def __init__(self, clock: Callable[[], float] = time.time, bound: int = MAX_SAMPLES) -> None:
        self.clock = clock
        self.bound = bound
        self.samples: dict[str, tuple[float, float]] = {}  # session id: (when, CPU seconds)

    def sample(self, session: Session, cpu_seconds: float) -> tuple[float, float]:
        """When this reading was taken, and the percent of the limit used since the last.

        The first reading of a session counts from its creation; a count that
        went down (a restarted sandbox) counts from zero.
        """
        now = self.clock()
        before = self.samples.pop(session.id, (session.created_at, 0.0))
        self.samples[session.id] = (now, cpu_seconds)
        while len(self.samples) > self.bound:  # the oldest first
            del self.samples[next(iter(self.samples))]
        elapsed = max(now - before[0], 1e-3)
        used = cpu_seconds - before[1] if cpu_seconds >= before[1] else cpu_seconds
        share = 100.0 * used / elapsed / max(session.limits.cpus, 1e-3)
        return now, round(min(share, 100.0), 2)
