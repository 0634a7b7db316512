"""Executes held for a person's decision: requested, listed, approved or denied, timed out.

An approval lives in the store from the moment it is requested, so every
decision (who, when, why) outlives the gateway. A pending request does not
survive a restart as pending: the execute waiting for it was cut with the
process that held it, so the next start ends it as ``denied`` with that reason
(``close_orphans``); the agent sends its execute again.

Only an approver (a token with ``approver = true``, of the same tenant, or an
admin) may decide, and never on a request its own token made, directly or
through a sandbox token it was handed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..access.auth import Principal
from ..errors import (
    AlreadyDecided,
    ApprovalNotFound,
    BadRequest,
    Forbidden,
    OwnerUnavailable,
    SessionEnded,
)
from ..store.base import Store
from ..timestamps import iso
from .model import Decision

log = logging.getLogger(__name__)

STATES = ("pending", "approved", "denied")
MAX_REASON = 2000  # characters of an approver's reason kept
PENDING_MAX = 10_000  # pending requests read from the store at once

Listener = Callable[[dict[str, Any]], None]  # hears every approval as it changes


@dataclasses.dataclass
class Approval:
    """One held execute and, once made, its decision."""

    id: str
    tenant: str
    session_id: str
    requested_by: str  # the requesting token's id
    code: str
    language: str
    decision: dict[str, Any]  # the policy's Decision (reasons, findings) as JSON
    created_at: float
    expires_at: float
    state: str = "pending"
    decided_by: str | None = None  # a token id, or "gateway" for timeouts and endings
    decided_at: float | None = None
    reason: str | None = None
    settled: asyncio.Event = dataclasses.field(default_factory=asyncio.Event, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "session_id": self.session_id,
            "requested_by": self.requested_by,
            "code": self.code,
            "language": self.language,
            "reasons": self.decision["reasons"],
            "findings": self.decision["findings"],
            "state": self.state,
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "decided_by": self.decided_by,
            "decided_at": iso(self.decided_at) if self.decided_at else None,
            "reason": self.reason,
        }

    def record(self) -> dict[str, Any]:
        """What the execution's history keeps of the decision."""
        return {k: v for k, v in self.to_json().items() if k not in ("code", "findings")}


class ApprovalDesk:
    """Pending approvals, their decisions, and who may make them."""

    def __init__(
        self, store: Store, timeout: float, live: Callable[[str], bool], clock=time.time
    ) -> None:
        """``live``: whether a session id is of a live session (approving an ended one is a 409)."""
        self.store = store
        self.timeout = timeout
        self.live = live
        self.clock = clock
        self.pending: dict[str, Approval] = {}
        self.listeners: list[Listener] = []
        # Hears each request and decision, with who made it (the audit log).
        self.on_change: Callable[[dict[str, Any], Principal | None], None] | None = None

    async def close_orphans(self, owner: str, of: set[str] | None = None) -> int:
        """Deny what a previous process left pending: the executes waiting for it are gone.

        Not those of sessions another live gateway (not ``owner``, this one)
        holds, whose executes still wait: that gateway decides them. ``of``:
        only those of these sessions (just taken over from a gateway that died).
        """
        docs = await self.store.approvals(state="pending", limit=PENDING_MAX)
        docs = [d for d in docs if of is None or d["session_id"] in of]
        now = iso(self.clock())
        holders = await asyncio.gather(*(self.store.owner_address(d["session_id"]) for d in docs))
        docs = [d for d, held in zip(docs, holders, strict=True) if not held or held[0] == owner]
        for doc in docs:
            doc.update(
                state="denied",
                decided_by="gateway",
                decided_at=now,
                reason="the gateway restarted while this request was pending; send it again",
            )
            await self.store.save_approval(doc)
        return len(docs)

    async def request(
        self, session_id: str, tenant: str, who: Principal, code: str, language: str,
        decision: Decision,
    ) -> Approval:  # fmt: skip
        """Open a request for a held execute, stored before anyone hears of it."""
        now = self.clock()
        approval = Approval(
            id=uuid.uuid4().hex,
            tenant=tenant,
            session_id=session_id,
            requested_by=who.answerable,  # a sandbox token's holder, not the sandbox
            code=code,
            language=language,
            decision=decision.to_json(),
            created_at=now,
            expires_at=now + self.timeout,
        )
        await self.store.save_approval(approval.to_json())
        self.pending[approval.id] = approval
        self._tell(approval, who)
        log.info("execute in session %s held for approval %s", session_id, approval.id)
        return approval

    async def wait(self, approval: Approval, ended: asyncio.Event) -> Approval:
        """Wait for a decision; the timeout, the session's end (``ended``) or a stop denies it."""
        ending = asyncio.ensure_future(ended.wait())
        settled = asyncio.ensure_future(approval.settled.wait())
        why = f"no decision within {self.timeout:g} s (approval_timeout)"
        try:
            await asyncio.wait(
                (ending, settled),
                timeout=max(0.0, approval.expires_at - self.clock()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if ended.is_set():
                why = "the session ended while the request was pending"
        except asyncio.CancelledError:
            why = "the gateway stopped (or the client left) while the request was pending"
            raise
        finally:
            for waiter in (ending, settled):
                waiter.cancel()
            if approval.state == "pending":
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._settle(approval, "denied", None, why))
        return approval

    async def decide(
        self, approval_id: str, who: Principal, approve: bool, reason: Any
    ) -> Approval:
        """Approve or deny a pending request, as ``who``."""
        if reason is not None and not isinstance(reason, str):
            raise BadRequest("reason must be a string")
        approval = self.pending.get(approval_id)
        if approval is None or not who.owns(approval.tenant):
            doc = await self.get(approval_id, who)  # 404 unless it exists and is theirs
            if doc["state"] == "pending":  # another gateway's, which did not take it
                raise OwnerUnavailable(
                    f"approval {approval_id} waits on another gateway, which does not answer "
                    "right now: try again shortly"
                )
            raise AlreadyDecided(
                f"approval {approval_id} was already {doc['state']} ({doc.get('reason')})"
            )
        if not (who.approver or who.admin):
            raise Forbidden("deciding approvals is for approver tokens (approver = true)")
        if who.answerable == approval.requested_by:
            raise Forbidden(
                "a token cannot decide on an execute it asked for; use another approver's token"
            )
        if not self.live(approval.session_id):
            raise SessionEnded(f"session {approval.session_id} has ended; nothing is left to run")
        state = "approved" if approve else "denied"
        await self._settle(approval, state, who, (reason or "")[:MAX_REASON] or None)
        return approval

    async def held_elsewhere(self, approval_id: str, who: Principal) -> str | None:
        """The session of a request still pending that this gateway does not hold (another
        gateway's execute waits for it, and that gateway decides it); None otherwise."""
        if approval_id in self.pending:
            return None
        doc = await self.get(approval_id, who)
        return doc["session_id"] if doc["state"] == "pending" else None

    async def get(self, approval_id: str, who: Principal) -> dict[str, Any]:
        """One approval, pending or decided, if ``who``'s tenant may see it."""
        approval = self.pending.get(approval_id)
        doc = approval.to_json() if approval else await self.store.get_approval(approval_id)
        if doc is None or not who.owns(doc["tenant"]):
            raise ApprovalNotFound(f"no approval {approval_id!r} for this tenant")
        return doc

    async def list(self, who: Principal, state: str | None) -> list[dict[str, Any]]:
        """Approvals ``who`` may see (its tenant's; an admin's: all), oldest first."""
        if state is not None and state not in STATES:
            raise BadRequest(f"state must be one of {', '.join(STATES)}, not {state!r}")
        tenant = None if who.admin else who.tenant
        if state == "pending":  # live: the store's copy may lag a decision by a write
            found = {a.id: a.to_json() for a in self.pending.values() if who.owns(a.tenant)}
            if self.store.SHARED:  # and other gateways' requests, as they stored them
                others = await self.store.approvals(tenant, "pending", PENDING_MAX)
                found = {doc["id"]: doc for doc in others} | found
            return sorted(found.values(), key=lambda doc: doc["created_at"])
        return await self.store.approvals(tenant, state)

    async def _settle(
        self, approval: Approval, state: str, who: Principal | None, reason: str | None
    ) -> None:
        if approval.state != "pending":
            return
        approval.state = state
        approval.decided_by = who.token_id if who else "gateway"
        approval.decided_at = self.clock()
        approval.reason = reason
        self.pending.pop(approval.id, None)
        approval.settled.set()  # the execute goes on at once; the record follows
        self._tell(approval, who)
        await self.store.save_approval(approval.to_json())

    def _tell(self, approval: Approval, who: Principal | None) -> None:
        doc = approval.to_json()
        if self.on_change is not None:
            self.on_change(doc, who)
        for listener in list(self.listeners):
            listener(doc)
