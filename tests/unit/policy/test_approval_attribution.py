"""A held execute asked for through a sandbox token is its holder's: the holder cannot decide it."""

from __future__ import annotations

import asyncio

import pytest

from gateway.access.auth import Principal
from gateway.errors import Forbidden
from gateway.policy.approvals import ApprovalDesk
from gateway.policy.model import Decision

MAKER = Principal(tenant="acme", token_id="maker", approver=True)
PEER = Principal(tenant="acme", token_id="peer", approver=True)
THROUGH_SANDBOX = Principal(tenant="acme", token_id="sandbox:1234abcd", acting_for="maker")


class Store:
    async def save_approval(self, doc) -> None:
        pass


def requested(who: Principal):
    desk = ApprovalDesk(Store(), timeout=60, live=lambda session_id: True)
    decision = Decision("hold", "hold", "enforce", ("line 1: shell",))
    return desk, asyncio.run(desk.request("s1", "acme", who, "!ls", "python", decision))


def test_a_sandbox_tokens_request_is_its_holders() -> None:
    desk, approval = requested(THROUGH_SANDBOX)
    assert approval.requested_by == "maker"
    with pytest.raises(Forbidden, match="asked for"):
        asyncio.run(desk.decide(approval.id, MAKER, True, None))
    assert asyncio.run(desk.decide(approval.id, PEER, True, "ok")).state == "approved"


def test_a_sandbox_token_has_no_rights_to_decide() -> None:
    desk, approval = requested(PEER)
    with pytest.raises(Forbidden, match="approver tokens"):
        asyncio.run(desk.decide(approval.id, THROUGH_SANDBOX, True, None))
