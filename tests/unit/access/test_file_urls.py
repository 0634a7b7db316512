"""Signed file URLs: one operation on one path, expiring within a day, revocable across restarts."""

from __future__ import annotations

import asyncio
import urllib.parse

import pytest
from e2b.sandbox.signature import get_signature

from gateway.access.file_urls import MAX_LIFETIME, FileUrls
from gateway.access.sandbox_tokens import SandboxTokens
from gateway.errors import BadRequest, Unauthorized

NOW = 1_000_000.0
TOKENS = SandboxTokens(b"k" * 32)
HOLDERS = ("maker", "peer")


def url(path: str, operation: str, holder: str = "maker", lifetime: int | None = 60) -> str:
    """A query as the stock SDK signs it, with the token handed to ``holder``."""
    token = TOKENS.issue("sbx", holder)
    signature = get_signature(path, operation, None, token, lifetime)
    query = {"path": path, "signature": signature["signature"]}
    if signature["expiration"] is not None:
        query["signature_expiration"] = str(signature["expiration"])
    return urllib.parse.urlencode(query)


@pytest.fixture
def urls(monkeypatch, tmp_path) -> FileUrls:
    monkeypatch.setattr("time.time", lambda: NOW)  # the SDK's clock too
    return FileUrls(TOKENS, tmp_path / "revoked.json", clock=lambda: NOW)


def test_a_url_grants_its_operation_and_path_to_its_holder(urls: FileUrls) -> None:
    grant = urls.grant("sbx", "POST", url("a.txt", "write", "peer"), HOLDERS)
    assert (grant.operation, grant.path, grant.holder) == ("write", "a.txt", "peer")
    with pytest.raises(Unauthorized, match="not valid"):
        urls.grant("sbx", "GET", url("a.txt", "write"), HOLDERS)  # a write URL does not read
    with pytest.raises(Unauthorized, match="not valid"):
        urls.grant("other", "GET", url("a.txt", "read"), HOLDERS)  # another sandbox's
    with pytest.raises(Unauthorized, match="not valid"):
        urls.grant("sbx", "GET", url("a.txt", "read", "stranger"), HOLDERS)
    with pytest.raises(Unauthorized, match="GET"):
        urls.grant("sbx", "DELETE", url("a.txt", "read"), HOLDERS)


def test_a_second_path_argument_is_refused(urls: FileUrls) -> None:
    with pytest.raises(BadRequest, match="once"):
        urls.grant("sbx", "GET", url("a.txt", "read") + "&path=b.txt", HOLDERS)


@pytest.mark.parametrize(
    ("lifetime", "words"),
    [(None, "use_signature_expiration"), (MAX_LIFETIME + 60, "a day"), (-1, "expired")],
)
def test_a_url_expires_within_a_day(urls: FileUrls, lifetime, words) -> None:
    with pytest.raises(Unauthorized, match=words):
        urls.grant("sbx", "GET", url("a.txt", "read", lifetime=lifetime), HOLDERS)


def test_a_revoked_url_stays_revoked_after_a_restart(urls: FileUrls, tmp_path) -> None:
    revoked, kept = url("a.txt", "read"), url("a.txt", "read", lifetime=61)
    asyncio.run(urls.revoke("sbx", f"http://x/files?{revoked}", HOLDERS))
    restarted = FileUrls(TOKENS, tmp_path / "revoked.json", clock=lambda: NOW)
    for instance in (urls, restarted):
        with pytest.raises(Unauthorized, match="revoked"):
            instance.grant("sbx", "GET", revoked, HOLDERS)
        assert instance.grant("sbx", "GET", kept, HOLDERS).holder == "maker"
    later = FileUrls(TOKENS, tmp_path / "revoked.json", clock=lambda: NOW + 120)
    assert later.revoked == {}  # expired: forgotten


def test_only_a_signed_url_of_the_sandbox_can_be_revoked(urls: FileUrls) -> None:
    for bad in (None, "http://x/files?path=a.txt", f"http://x/files?{url('a', 'read', 'nobody')}"):
        with pytest.raises(BadRequest, match="url must be"):
            asyncio.run(urls.revoke("sbx", bad, HOLDERS))


def test_a_sandbox_token_names_its_holder() -> None:
    token = TOKENS.issue("sbx", "maker")
    assert TOKENS.holder("sbx", token) == "maker"
    assert TOKENS.holder("other", token) is None
    assert TOKENS.holder("sbx", token.replace("maker", "peer")) is None  # a holder changed
    assert TOKENS.holder("sbx", None) is None and TOKENS.holder("sbx", "é.x") is None
