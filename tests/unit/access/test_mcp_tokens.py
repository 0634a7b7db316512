"""A sandbox's MCP token opens that sandbox's MCP URL (port 50005) and nothing else, checked from
the headers before a body is read; its sandbox token does not open the MCP URL."""

from __future__ import annotations

import uuid

import pytest
from tornado import httputil

from gateway.access.auth import Authenticator, Principal, Quota
from gateway.access.file_urls import FileUrls
from gateway.access.mcp_tokens import McpTokens
from gateway.access.sandbox_tokens import SandboxTokens
from gateway.api.e2b.base import Credentials

KEY = SandboxTokens(b"k" * 32)
ACME = Principal(tenant="acme", token_id="acme-id")
AUTH = Authenticator({"digest": ACME}, {}, Quota(1, 1, 1))
SBX, OTHER = str(uuid.uuid4()), str(uuid.uuid4())
HOLDERS = {SBX: ("acme-id",), OTHER: ("acme-id",)}


@pytest.fixture
def credentials() -> Credentials:
    return Credentials(KEY, FileUrls(KEY), lambda s: HOLDERS.get(s, ()), AUTH.principal_of)


def accepts(credentials: Credentials, host: str, path: str = "/mcp", **headers: str) -> bool:
    start = httputil.RequestStartLine("POST", path, "HTTP/1.1")
    return credentials.accepts(start, httputil.HTTPHeaders({"Host": host, **headers}))


def test_an_mcp_token_names_its_holder_for_its_sandbox_only() -> None:
    tokens, token = McpTokens(), str(uuid.uuid4())
    tokens.register(SBX, token, "acme-id")
    assert tokens.holder(SBX, token) == "acme-id"
    assert tokens.holder(OTHER, token) is None
    assert tokens.holder(SBX, token.upper()) is None and tokens.holder(SBX, None) is None
    tokens.forget(SBX)
    assert tokens.holder(SBX, token) is None


def test_a_guessable_mcp_token_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 32"):
        McpTokens().register(SBX, "a", "acme-id")


def test_the_edge_lets_an_mcp_body_in_only_with_that_sandboxs_mcp_token(credentials) -> None:
    mine, theirs = str(uuid.uuid4()), str(uuid.uuid4())
    credentials.mcp_tokens.register(SBX, mine, "acme-id")
    credentials.mcp_tokens.register(OTHER, theirs, "acme-id")
    host = f"50005-{SBX}.sandbox.invalid"
    assert accepts(credentials, host, Authorization=f"Bearer {mine}")
    assert not accepts(credentials, host, Authorization=f"Bearer {theirs}")  # another sandbox's
    assert not accepts(credentials, host)
    assert not accepts(credentials, host, **{"X-Access-Token": KEY.issue(SBX, "acme-id")})
    bearer_sandbox_token = f"Bearer {KEY.issue(SBX, 'acme-id')}"
    assert not accepts(credentials, host, Authorization=bearer_sandbox_token)


def test_an_mcp_token_opens_no_other_port_of_its_sandbox(credentials) -> None:
    token = str(uuid.uuid4())
    credentials.mcp_tokens.register(SBX, token, "acme-id")
    for port, path in ((49983, "/files"), (49999, "/execute")):
        host = f"{port}-{SBX}.sandbox.invalid"
        assert not accepts(credentials, host, path, Authorization=f"Bearer {token}")
        assert not accepts(credentials, host, path, **{"X-Access-Token": token})


def test_an_mcp_token_stops_working_once_its_holder_no_longer_acts_for_the_sandbox(
    credentials,
) -> None:
    token = str(uuid.uuid4())
    credentials.mcp_tokens.register(SBX, token, "gone-id")  # its API token left the tokens file
    assert not accepts(credentials, f"50005-{SBX}.x", Authorization=f"Bearer {token}")
