"""Whether a new session fits: the gateway's maximum and its tenant's quota.

Checked and registered in one step with no await between, so simultaneous
creates count each other, and a client-chosen id is taken by one of them.
"""

from __future__ import annotations

from collections.abc import Callable

from ..access.auth import Quota
from ..errors import Conflict, QuotaExceeded, TooManySessions
from ..limits import format_size
from .model import Session


class Admission:
    """Admits new sessions into the registry (``sessions``, shared with the manager)."""

    def __init__(
        self, sessions: dict[str, Session], quota: Callable[[str], Quota], max_sessions: int
    ) -> None:
        self.sessions = sessions
        self.quota = quota
        self.max_sessions = max_sessions

    def reserve(self, new: Session) -> None:
        """Check the limits and register the session in one step, with no await inside.

        Registered at once, so simultaneous creates count each other against
        the server's limit and the tenant's quota, and a client-chosen id is
        taken by exactly one of them.
        """
        if new.id in self.sessions:
            raise Conflict(f"session id {new.id} is in use; ids are never reused")
        if len(self.sessions) >= self.max_sessions:
            raise TooManySessions(
                f"the gateway runs its maximum of {self.max_sessions} sessions; "
                "delete one you no longer need or try again later"
            )
        self._check_quota(new)
        self.sessions[new.id] = new

    def _check_quota(self, new: Session) -> None:
        quota = self.quota(new.tenant)
        held = [s for s in self.sessions.values() if s.tenant == new.tenant]
        if len(held) >= quota.max_sessions:
            raise QuotaExceeded(
                f"tenant {new.tenant!r} holds {len(held)} live sessions, its quota of "
                f"{quota.max_sessions}; delete one it no longer needs"
            )
        for what, limit, advice in (
            ("memory", quota.max_memory, "ask for less memory"),
            ("disk", quota.max_disk, "ask for a smaller workspace (limits.disk)"),
        ):
            used = sum(getattr(s.limits, what) for s in held)
            wanted = getattr(new.limits, what)
            if used + wanted > limit:
                raise QuotaExceeded(
                    f"tenant {new.tenant!r} would use {format_size(used + wanted)} of {what}, "
                    f"over its quota of {format_size(limit)} ({format_size(used)} in use); "
                    f"{advice} or delete a session"
                )
