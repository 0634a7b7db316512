"""The deployment's open sessions as one list, whichever gateway is asked.

With a store nobody else shares, the list is this gateway's registry. With
one several gateways share, it is the store's open sessions a page at a
time: this gateway's own shown live, another's as its owner last saved it,
with ``confirmed_at``, when that owner last renewed its lease (a stale time
says the owner stopped answering: another gateway adopts it soon, or it
answers again once that owner is back).
"""

from __future__ import annotations

import base64
import binascii
import heapq
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..access.auth import Principal
from ..errors import BadRequest
from ..store.base import Store
from ..timestamps import iso, parse_iso
from .leases import Leases
from .model import LIVE_STATES, Session, public_view

PAGE = 100  # sessions in a page unless asked otherwise
PAGE_MAX = 1000
SCAN = 500  # open sessions read from the store at a time while a metadata filter drops some


class Listing:
    """Lists live sessions for a caller, a page at a time."""

    def __init__(
        self,
        sessions: Mapping[str, Session],
        store: Store,
        leases: Leases,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sessions = sessions
        self.store = store
        self.leases = leases
        self.clock = clock

    async def page(
        self,
        who: Principal,
        state: str | None = None,
        metadata: dict[str, str] | None = None,
        tenant: str | None = None,
        after: str | None = None,
        limit: int = PAGE,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Live sessions ``who`` may see, oldest first, and the token of the next page.

        An admin sees every tenant's (``tenant`` narrows it); anyone else
        its own tenant's. ``metadata``: every key given must match.
        """
        if state is not None and state not in LIVE_STATES:
            raise BadRequest(f"state must be one of {', '.join(LIVE_STATES)}, not {state!r}")
        if not 1 <= limit <= PAGE_MAX:
            raise BadRequest(f"limit must be 1 to {PAGE_MAX}")
        if not who.admin:
            if tenant is not None and tenant != who.tenant:
                return [], None
            tenant = who.tenant
        if tenant is not None and "\x00" in tenant:
            raise BadRequest("tenant must be a tenant's name")
        cursor = _cursor(after)
        # Going busy and back is not recorded: those two are told from the live view.
        live = state in ("idle", "busy")
        size = SCAN if metadata or live else limit
        found: list[dict[str, Any]] = []
        while len(found) < limit:
            batch = await self._open(tenant, None if live else state, cursor, size)
            found += [
                v for v in batch if _matches(v, metadata) and (state is None or v["state"] == state)
            ]
            if len(batch) < size:
                return found[:limit], None
            cursor = (batch[-1]["created_at"], batch[-1]["id"])
        found = found[:limit]
        return found, _token(found[-1])

    async def _open(
        self, tenant: str | None, state: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[dict[str, Any]]:
        if not self.leases.shared:
            return self._registry(tenant, state, after, limit)
        views = []
        for doc, owner, renewed_at in await self.store.open_page(tenant, state, after, limit):
            live = self.sessions.get(doc["id"])
            if live is not None and self.leases.holds(live.id):
                views.append(self._live(live))
            else:
                confirmed = iso(renewed_at) if renewed_at is not None else None
                views.append({**public_view(doc), "gateway": owner, "confirmed_at": confirmed})
        return views

    def _registry(
        self, tenant: str | None, state: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[dict[str, Any]]:
        # Views of the page's sessions only: building all of 10,000 took 260 ms a page.
        since = parse_iso(after[0]) - 0.001 if after is not None else None
        chosen = heapq.nsmallest(
            limit,
            (
                s
                for s in self.sessions.values()
                if (tenant is None or s.tenant == tenant)
                and (state is None or s.state == state)
                and (since is None or (s.created_at >= since and _order(s) > after))
            ),
            key=_order,
        )
        return [self._live(s) for s in chosen]

    def _live(self, session: Session) -> dict[str, Any]:
        return {
            **session.to_json(),
            "gateway": self.leases.owner,
            "confirmed_at": iso(self.clock()),
        }


def _order(session: Session) -> tuple[str, str]:
    """A live session's place in the list: its view's created_at and id."""
    return iso(session.created_at), session.id


def _matches(view: dict[str, Any], metadata: dict[str, str] | None) -> bool:
    found = view["metadata"]
    return not metadata or all(k in found and str(found[k]) == v for k, v in metadata.items())


def _token(view: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(f"{view['created_at']}|{view['id']}".encode()).decode()


def _cursor(token: str | None) -> tuple[str, str] | None:
    """Where a page token says the next page starts."""
    if not token:
        return None
    try:
        created_at, _, session_id = base64.urlsafe_b64decode(token).decode().partition("|")
        parse_iso(created_at)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        created_at = session_id = ""
    if not created_at or not session_id or "\x00" in session_id:
        raise BadRequest("after must be the next cursor a page of sessions answered with")
    return created_at, session_id
