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
    start_concurrency: int = 2  # cold starts at once (starts.py)
    start_queue: int = 64  # creates that may wait for one
    start_queue_per_tenant: int = 16
    start_wait: float = 60.0  # seconds a create waits for one
    host_id: str = ""  # this host, in the claims that count a host's sessions
    host_max_sessions: int = 0  # live sessions of every gateway on this host (0: no cap)
    host_max_memory: int = 0  # their memory limits added up (0: no cap)
    pause_frozen_for: float = 300.0  # a pause's first tier, frozen (0: saved at once)
    checkpoint_idle_after: float = 2.0  # survive_crashes: idle seconds before a checkpoint
    checkpoint_every: float = 30.0  # and seconds between two at least
    checkpoint_max_size: int = 2**30  # a larger namespace is not checkpointed
