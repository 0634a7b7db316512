"""The MCP token the SDK's ``mcp-gateway`` command registers is forgotten when its sandbox ends:
the gateway keeps no digest of a sandbox that is gone (one per sandbox created with mcp=)."""

from __future__ import annotations

import uuid

from gateway.access.auth import Principal
from gateway.access.mcp_tokens import McpTokens
from gateway.api.e2b.process import ProcessService

WHO = Principal(tenant="t1", token_id="sandbox:x", acting_for="acme-id")


class Session:
    def __init__(self) -> None:
        self.on_end: set = set()


class Sessions:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, session_id: str, who: Principal) -> Session:
        return self.session


class Executions:
    def __init__(self, session: Session) -> None:
        self.sessions = Sessions(session)


def test_a_sandboxs_mcp_token_is_forgotten_when_it_ends():
    session, tokens, token = Session(), McpTokens(), str(uuid.uuid4())
    service = ProcessService(Executions(session), "sbx", WHO, tokens)  # type: ignore[arg-type]
    service._register_mcp(token)
    assert tokens.holder("sbx", token) == "acme-id"
    for tell in list(session.on_end):
        tell("killed")
    assert tokens.holder("sbx", token) is None and tokens._digests == {}
