"""A sandbox's MCP token opens that sandbox's MCP URL (port 50005) and nothing else, checked from
the headers before a body is read; its sandbox token does not open the MCP URL. What checks it
is in the sandbox's session record, so a restarted gateway (or another on the shared store)
checks it alike, and it dies with the session."""

from __future__ import annotations

import uuid

import pytest
from tornado import httputil

from gateway.access.auth import Authenticator, Principal, Quota
from gateway.access.file_urls import FileUrls
from gateway.access.sandbox_tokens import SandboxTokens
from gateway.api.e2b.base import Credentials

KEY = SandboxTokens(b"k" * 32)
ACME = Principal(tenant="acme", token_id="acme-id")
AUTH = Authenticator({"digest": ACME}, {}, Quota(1, 1, 1))
SBX, OTHER = str(uuid.uuid4()), str(uuid.uuid4())
HOLDERS = {SBX: ("acme-id",), OTHER: ("acme-id",)}


def gateway(records: dict[str, dict[str, str]]) -> Credentials:
    """A gateway's credentials over ``records`` (sessions' MCP registrations, as stored)."""
    return Credentials(
        KEY, FileUrls(KEY), lambda s: HOLDERS.get(s, ()), AUTH.principal_of, records.get
    )


@pytest.fixture
def records() -> dict[str, dict[str, str]]:
    return {}


@pytest.fixture
def credentials(records) -> Credentials:
    return gateway(records)


def register(credentials: Credentials, records: dict, sandbox_id: str, holder: str) -> str:
    """What the SDK's mcp-gateway command does: a fresh UUID made the sandbox's MCP token."""
    token = str(uuid.uuid4())
    records[sandbox_id] = credentials.mcp_tokens.registration(sandbox_id, token, holder)
    return token


def accepts(credentials: Credentials, host: str, path: str = "/mcp", **headers: str) -> bool:
    start = httputil.RequestStartLine("POST", path, "HTTP/1.1")
    return credentials.accepts(start, httputil.HTTPHeaders({"Host": host, **headers}))


def test_an_mcp_token_names_its_holder_for_its_sandbox_only(credentials, records) -> None:
    tokens, token = credentials.mcp_tokens, register(credentials, records, SBX, "acme-id")
    assert tokens.holder(SBX, token) == "acme-id"
    assert tokens.holder(OTHER, token) is None
    assert tokens.holder(SBX, token.upper()) is None and tokens.holder(SBX, None) is None
    assert token not in repr(records)  # only its HMAC is kept
    del records[SBX]  # its session ended
    assert tokens.holder(SBX, token) is None


def test_a_guessable_mcp_token_is_refused(credentials) -> None:
    with pytest.raises(ValueError, match="at least 32"):
        credentials.mcp_tokens.registration(SBX, "a", "acme-id")


def test_the_edge_lets_an_mcp_body_in_only_with_that_sandboxs_mcp_token(
    credentials, records
) -> None:
    mine = register(credentials, records, SBX, "acme-id")
    theirs = register(credentials, records, OTHER, "acme-id")
    host = f"50005-{SBX}.sandbox.invalid"
    assert accepts(credentials, host, Authorization=f"Bearer {mine}")
    assert not accepts(credentials, host, Authorization=f"Bearer {theirs}")  # another sandbox's
    assert not accepts(credentials, host)
    assert not accepts(credentials, host, **{"X-Access-Token": KEY.issue(SBX, "acme-id")})
    bearer_sandbox_token = f"Bearer {KEY.issue(SBX, 'acme-id')}"
    assert not accepts(credentials, host, Authorization=bearer_sandbox_token)


def test_an_mcp_token_opens_no_other_port_of_its_sandbox(credentials, records) -> None:
    token = register(credentials, records, SBX, "acme-id")
    issued = credentials.mcp_tokens.issue(SBX, "acme-id")
    for port, path in ((49983, "/files"), (49999, "/execute")):
        host = f"{port}-{SBX}.sandbox.invalid"
        for each in (token, issued):
            assert not accepts(credentials, host, path, Authorization=f"Bearer {each}")
            assert not accepts(credentials, host, path, **{"X-Access-Token": each})


def test_an_mcp_token_stops_working_once_its_holder_no_longer_acts_for_the_sandbox(
    credentials, records
) -> None:
    token = register(credentials, records, SBX, "gone-id")  # its API token left the tokens file
    assert not accepts(credentials, f"50005-{SBX}.x", Authorization=f"Bearer {token}")
    issued = credentials.mcp_tokens.issue(SBX, "gone-id")
    assert not accepts(credentials, f"50005-{SBX}.x", Authorization=f"Bearer {issued}")


def test_an_mcp_token_outlives_the_gateway_that_took_it(records) -> None:
    """A restarted gateway (or another on the shared store) has a fresh Credentials over the
    same key and the same session records: the token the agent holds still opens the URL."""
    token, host = register(gateway(records), records, SBX, "acme-id"), f"50005-{SBX}.x"
    restarted = gateway(records)
    assert accepts(restarted, host, Authorization=f"Bearer {token}")


def test_the_token_a_connected_sdk_reads_opens_the_url_while_the_registration_lasts(
    credentials, records
) -> None:
    """get_mcp_token() after connect: a token of the gateway's for the reader, good on any
    gateway of the store, and not on a later session of the same id."""
    register(credentials, records, SBX, "acme-id")
    issued = credentials.mcp_tokens.issue(SBX, "acme-id")
    host = f"50005-{SBX}.x"
    assert issued is not None and accepts(gateway(records), host, Authorization=f"Bearer {issued}")
    assert credentials.mcp_tokens.issue(OTHER, "acme-id") is None  # registered none
    register(credentials, records, OTHER, "acme-id")
    assert not accepts(credentials, f"50005-{OTHER}.x", Authorization=f"Bearer {issued}")
    del records[SBX]  # ended...
    assert not accepts(credentials, host, Authorization=f"Bearer {issued}")
    register(credentials, records, SBX, "acme-id")  # ...and a new session took its id
    assert not accepts(credentials, host, Authorization=f"Bearer {issued}")
    forged = f"acme-id.{KEY.mac(f'mcp{chr(0)}{SBX}{chr(0)}', 'acme-id')}"  # without the digest
    assert not accepts(credentials, host, Authorization=f"Bearer {forged}")
