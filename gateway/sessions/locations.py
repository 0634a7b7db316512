"""Where a session lives when gateways share one store: this gateway or another one.

A request for a session another gateway owns is passed on to it (``api``
asks ``locate``); an answer is remembered for a third of a lease, since a
session changes owner only once its lease has run out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..errors import OwnerUnavailable
from ..store.base import Store
from .leases import Leases

LOCATIONS_KEPT = 10_000  # other gateways' sessions whose owner is remembered, at most


class Locations:
    """Finds the gateway that owns a session this one does not hold."""

    def __init__(self, sessions: Mapping[str, Any], leases: Leases, store: Store) -> None:
        """``sessions``: the live sessions this gateway holds (the manager's registry)."""
        self.sessions = sessions
        self.leases = leases
        self.store = store
        self._known: dict[str, tuple[str, float]] = {}  # session id -> (where, until)

    def may_be_elsewhere(self, session_id: str) -> bool:
        """Whether another gateway may own the session (``locate`` finds out)."""
        return self.leases.shared and session_id not in self.sessions

    async def locate(self, session_id: str) -> str | None:
        """Where the other gateway that owns the session answers; None if none does.

        Raises OwnerUnavailable while an open session's lease has run out and
        nobody has adopted it yet: it is not gone, and a retry finds it.
        """
        now = time.monotonic()
        known = self._known.get(session_id)
        if known is not None and known[1] > now:
            return known[0]
        found = await self.store.owner_address(session_id)
        if found is None and await self.store.unheld(session_id):
            raise OwnerUnavailable(
                "the gateway that owned this session stopped answering; another one takes "
                "it over within seconds if it can reach its kernel, else it answers again "
                "once that gateway is back: try again"
            )
        if found is None or found[0] == self.leases.owner:
            self._known.pop(session_id, None)
            return None
        if len(self._known) > LOCATIONS_KEPT:
            self._known.clear()
        self._known[session_id] = (found[1], now + self.leases.ttl / 3)
        return found[1]

    def forget(self, session_id: str) -> None:
        """Drop where ``locate`` found the session: its owner did not have it."""
        self._known.pop(session_id, None)
