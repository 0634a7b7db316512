"""Requests a dead gateway's executes were held on end with the sessions taken over."""

from __future__ import annotations

import asyncio

from gateway.policy.approvals import ApprovalDesk
from gateway.store.sqlite import SQLiteStore


def pending(approval_id: str, session_id: str) -> dict:
    return {"id": approval_id, "tenant": "acme", "session_id": session_id, "state": "pending",
            "created_at": "2026-11-28T00:00:00.000Z", "expires_at": "2026-11-28T00:10:00.000Z",
            "requested_by": "agent", "code": "x", "language": "python", "reasons": [],
            "findings": [], "decided_by": None, "decided_at": None, "reason": None}  # fmt: skip


def test_taking_sessions_over_denies_only_their_pending_requests(tmp_path):
    async def scenario():
        store = SQLiteStore(tmp_path / "db.sqlite3")
        await store.open()
        for approval_id, session_id in (("a1", "s1"), ("a2", "s2")):
            await store.save_approval(pending(approval_id, session_id))
        desk = ApprovalDesk(store, 60, live=lambda session_id: True)
        assert await desk.close_orphans("me", of={"s1"}) == 1
        states = {a["id"]: a["state"] for a in await store.approvals()}
        reason = (await store.get_approval("a1"))["reason"]
        await store.close()
        return states, reason

    states, reason = asyncio.run(scenario())
    assert states == {"a1": "denied", "a2": "pending"}, states
    assert "send it again" in reason
