"""Which sessions this gateway owns, while gateways share one store.

A session is owned through a lease in the database: claimed in one
statement (the database serialises rival claims, so there is never a
split), renewed for every held session in one statement each third of the
lease's time, given up when the session ends. The gateway counts a lease
as held only until ``ttl`` after it *asked* for it, by its own monotonic
clock: the database's expiry is later than that, so the gateway has let go
before anyone else can take over. A lease not renewed (taken over, or the
database did not answer in time) is lost: ``on_lost`` hears of it at once
and the gateway stops acting for that session.

With a store nobody else uses (SQLite), every session is this gateway's:
nothing is written and nothing can be lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..store.base import Store
from ..tasks import end_task

log = logging.getLogger(__name__)


class Leases:
    """This gateway's leases on its sessions."""

    def __init__(self, store: Store, ttl: float, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self.owner = ""  # the gateway's id, set by the manager at start
        self.shared = store.SHARED
        self._held: dict[str, float] = {}  # session id -> when this gateway stops counting on it
        self._renewer: asyncio.Task | None = None
        self._on_lost: Callable[[str], None] = lambda session_id: None

    async def claim(self, session_id: str) -> bool:
        """Own a session unless another gateway's lease on it still runs."""
        if not self.shared:
            return True
        asked = self.clock()
        if not await self.store.claim_lease(session_id, self.owner, self.ttl):
            return False
        self._held[session_id] = asked + self.ttl
        return True

    def holds(self, session_id: str) -> bool:
        """Whether this gateway may act for the session now."""
        return not self.shared or self._held.get(session_id, 0.0) > self.clock()

    async def release(self, session_id: str) -> None:
        """Give up an ended session's lease."""
        if self.shared and self._held.pop(session_id, None) is not None:
            await self.store.release_lease(session_id, self.owner)

    def start(self, on_lost: Callable[[str], None]) -> None:
        """Renew held leases in the background; ``on_lost`` is called for each one lost."""
        self._on_lost = on_lost
        if self.shared:
            self._renewer = asyncio.create_task(self._renew_forever(), name="sbx-leases")

    async def stop(self) -> None:
        """Stop renewing: the leases run out unless this gateway starts again first."""
        await end_task(self._renewer)

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            await self.renew()

    async def renew(self) -> None:
        """Extend every held lease; whatever was not extended, or ran out, is lost."""
        asked, asking = self.clock(), set(self._held)  # claimed later: not in this round
        taken: set[str] = set()
        try:
            renewed = await self.store.renew_leases(self.owner, self.ttl)
        except Exception as e:  # held until their time runs out; the next round may reach it
            log.warning("could not renew this gateway's session leases: %s", e)
        else:
            taken = asking - renewed
            for session_id in renewed & self._held.keys():
                self._held[session_id] = asked + self.ttl
        now = self.clock()
        lost = [s for s, until in self._held.items() if until <= now or s in taken]
        for session_id in lost:
            del self._held[session_id]
            self._on_lost(session_id)
