"""The settings the session layer reads: its defaults, maximums and timings, as values.

``wiring.session_options`` builds them from ``Settings``; the manager and the
lifecycle are handed these, never the whole settings object.
"""

from __future__ import annotations

import dataclasses

from ..limits import Limits


@dataclasses.dataclass(frozen=True)
class SessionOptions:
    data_dir: str  # where the sessions' directories (and kernel sockets) live
    max_sessions: int
    default_limits: Limits
    max_limits: Limits
    default_ttl: float
    max_ttl: float
    default_idle_timeout: float
    max_idle_timeout: float
    idle_action: str  # "end" or "pause" once the idle timeout passes
    kernel_start_timeout: float
    lease_ttl: float  # how long a lease on a session lasts when gateways share the store
