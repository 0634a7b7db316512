"""Whether a new session fits: this gateway's maximum, and its tenant's quota.

The gateway's maximum is checked and registered in one step with no await
between, so simultaneous creates count each other and a client-chosen id is
taken by one of them. The tenant's quota is the deployment's: each create
claims its share in the store (``store/claims.py``), where every gateway's
sessions are counted, before anything starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from ..access.auth import Quota
from ..errors import Conflict, GatewayError, QuotaExceeded, TooManySessions
from ..limits import format_size
from ..store.base import Store
from ..tasks import end_task
from .leases import Leases
from .model import Session

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HostCaps:
    """What all the gateways on one host may hold together (0: no cap)."""

    host: str = ""
    max_sessions: int = 0
    max_memory: int = 0


UNSHARED_CLAIM = 3600.0  # seconds a claim stays fresh where nobody else counts it (SQLite)
ADVICE = {
    "sessions": "delete one it no longer needs",
    "memory": "ask for less memory or delete a session",
    "cpus": "ask for fewer CPUs or delete a session",
    "disk": "ask for a smaller workspace (limits.disk) or delete a session",
    "per_minute": "try again within a minute",
    "host_sessions": "try again once sessions end, or another host",
    "host_memory": "ask for less memory, or try again once sessions end",
}


class Admission:
    """Admits new sessions into the registry (``sessions``, shared with the manager)."""

    def __init__(
        self,
        sessions: dict[str, Session],
        quota: Callable[[str], Quota],
        max_sessions: int,
        store: Store,
        leases: Leases,
        host: HostCaps | None = None,
    ) -> None:
        self.sessions = sessions
        self.host = host or HostCaps()
        self.quota = quota
        self.max_sessions = max_sessions
        self.store = store
        self.leases = leases
        self._in_flight: set[str] = set()  # creates in flight, pooled templates: kept fresh
        self._extender: asyncio.Task | None = None

    @property
    def claim_ttl(self) -> float:
        """How long a claim in flight counts unless extended: a lease's time when shared."""
        return self.leases.ttl if self.leases.shared else UNSHARED_CLAIM

    def reserve(self, new: Session) -> None:
        """Check this gateway's limit and register the session in one step, no await inside."""
        if new.id in self.sessions:
            raise Conflict(f"session id {new.id} is in use; ids are never reused")
        if len(self.sessions) >= self.max_sessions:
            raise TooManySessions(
                f"the gateway runs its maximum of {self.max_sessions} sessions; "
                "delete one you no longer need or try again later",
                retry_after=30,
            )
        self.sessions[new.id] = new

    async def claim(self, new: Session) -> None:
        """Claim the session's share of its tenant's quota, for the whole deployment.

        A refusal unregisters it and says which cap it would pass. Until
        ``done``, the claim is kept fresh, so a gateway that dies mid-create
        gives it back a lease's time later.
        """
        quota = self.quota(new.tenant)
        caps = {"sessions": quota.max_sessions, "memory": quota.max_memory,
                "cpus": quota.max_cpus, "disk": quota.max_disk,
                "per_minute": quota.creates_per_minute,
                "host_sessions": self.host.max_sessions,
                "host_memory": self.host.max_memory}  # fmt: skip
        claim = {"session_id": new.id, "tenant": new.tenant, "owner": self.leases.owner,
                 "host": self.host.host,
                 "memory": new.limits.memory, "cpus": new.limits.cpus,
                 "disk": new.limits.disk}  # fmt: skip
        try:
            refused = await self.store.claim_quota(claim, caps, self.claim_ttl)
        except BaseException:
            self.sessions.pop(new.id, None)
            raise
        if refused is not None:
            self.sessions.pop(new.id, None)
            raise _refusal(new, refused)
        self._in_flight.add(new.id)

    async def let_go(self, pooled_id: str) -> None:
        """A template's pooled sandbox no longer holds its tenant's quota (taken or removed)."""
        self._in_flight.discard(pooled_id)
        await asyncio.shield(self.store.release_claim(pooled_id))

    def rebind(self, old_id: str, new_id: str) -> None:
        """The claim made as ``old_id`` is ``new_id``'s now (a warm sandbox's id)."""
        if old_id != new_id:
            self._in_flight.discard(old_id)
            self._in_flight.add(new_id)
            self.store.rebind_claim(old_id, new_id).add_done_callback(_logged)

    async def done(self, session: Session, started: bool) -> None:
        """The create is over: its session's record holds the claim, or it never started."""
        self._in_flight.discard(session.id)
        if not started:  # shielded: a create cut short still gives its claim back
            if self.sessions.get(session.id) is session:  # refused before it was ever saved
                del self.sessions[session.id]
            await asyncio.shield(self.leases.release(session.id))  # if it got one
            await asyncio.shield(self.store.release_claim(session.id))

    def start(self) -> None:
        """Keep the claims in flight fresh: creates' (others sharing the store count them) and
        templates' pooled sandboxes' (which no session record holds, even here alone)."""
        self._extender = asyncio.create_task(self._extend_forever(), name="sbx-claims")

    async def stop(self) -> None:
        await end_task(self._extender)

    async def _extend_forever(self) -> None:
        while True:
            await asyncio.sleep(self.claim_ttl / 3)
            if self._in_flight:
                try:
                    await self.store.extend_claims(sorted(self._in_flight), self.claim_ttl)
                except Exception as e:  # they count until their time runs out
                    log.warning("could not extend the quota claims of creates in flight: %s", e)


def _refusal(new: Session, refused: dict) -> GatewayError:
    what, used, cap = refused["what"], refused["used"], refused["cap"]
    tenant = new.tenant
    if what == "id":
        return Conflict(f"session id {new.id} was used before; ids are never reused")
    if what.startswith("host_"):
        held = (
            f"hold {used} live sessions" if what == "host_sessions"
            else f"would reserve {format_size(used + refused['wanted'])} of memory"
        )  # fmt: skip
        limit = f"{cap:g}" if what == "host_sessions" else format_size(cap)
        return TooManySessions(
            f"this host's gateways together {held}, its cap of {limit} "
            f"({what.replace('_', '_max_')}); {ADVICE[what]}",
            retry_after=30,
        )
    if what == "sessions":
        held = f"holds {used} live sessions, its quota of {cap:g}"
    elif what == "per_minute":
        held = f"made {used} sessions in the last minute, its quota of {cap:g} a minute"
    else:
        show = (lambda n: f"{n:g}") if what == "cpus" else format_size
        held = (
            f"would use {show(used + refused['wanted'])} of {what}, over its quota of "
            f"{show(cap)} ({show(used)} in use)"
        )
    return QuotaExceeded(
        f"tenant {tenant!r} {held} across the deployment; {ADVICE[what]}",
        # Only the rate frees itself: a held quota frees when the tenant ends a session
        # (a Retry-After there made the E2B SDK wait it out before failing).
        retry_after=60 if what == "per_minute" else None,
    )


def _logged(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("a quota claim kept its old session id: %s", future.exception())
