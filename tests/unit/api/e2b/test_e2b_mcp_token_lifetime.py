"""The MCP token the SDK's ``mcp-gateway`` command registers goes into its session's record, saved
before the command answers: a gateway restarted right after create (or another taking the
session over) checks it from there, and it ends with the session (one per sandbox created with
mcp=)."""

from __future__ import annotations

import asyncio
import json
import uuid

from gateway.access.auth import Principal
from gateway.access.mcp_tokens import McpTokens
from gateway.access.sandbox_tokens import SandboxTokens
from gateway.api.e2b.process import ProcessService
from gateway.limits import Limits
from gateway.sessions import model

WHO = Principal(tenant="t1", token_id="sandbox:x", acting_for="acme-id")


class Session:
    mcp_token: dict[str, str] | None = None


class Sessions:
    def __init__(self, session: Session) -> None:
        self.session, self.saved = session, []

    def get(self, session_id: str, who: Principal) -> Session:
        return self.session

    async def save(self, session: Session) -> None:
        self.saved.append(dict(session.mcp_token or {}))


class Executions:
    def __init__(self, session: Session) -> None:
        self.sessions = Sessions(session)


def test_a_sandboxs_mcp_token_is_saved_with_its_session_and_ends_with_it():
    session, token = Session(), str(uuid.uuid4())
    live: dict[str, Session] = {"sbx": session}
    tokens = McpTokens(SandboxTokens(b"k" * 32), lambda s: getattr(live.get(s), "mcp_token", None))
    executions = Executions(session)
    service = ProcessService(executions, "sbx", WHO, tokens)  # type: ignore[arg-type]
    asyncio.run(service._register_mcp(token))
    assert executions.sessions.saved == [session.mcp_token]  # stored, as an HMAC only
    assert token not in repr(session.mcp_token)
    assert tokens.holder("sbx", token) == "acme-id"
    del live["sbx"]  # the session ended
    assert tokens.holder("sbx", token) is None


def test_the_registration_comes_back_from_the_store_with_its_session_and_stays_out_of_its_view():
    """What a restarted gateway (or another on the store) takes over: the record as stored."""
    key, token = SandboxTokens(b"k" * 32), str(uuid.uuid4())
    limits = Limits(2**30, 1.0, 256, 2**30, 30.0, 2**20)
    session = model.Session("python3", "img", limits, 60, 60, {}, {})
    first = McpTokens(key, lambda s: session.mcp_token)
    session.mcp_token = first.registration(session.id, token, "acme-id")
    stored = json.loads(json.dumps(session.record()))
    assert token not in json.dumps(stored) and "mcp_token" not in model.public_view(stored)
    back = model.Session.from_record(stored)
    assert McpTokens(key, lambda s: back.mcp_token).holder(back.id, token) == "acme-id"
