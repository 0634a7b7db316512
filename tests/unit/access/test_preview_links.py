"""Signed preview links: one port of one session, until they expire, and nothing else."""

from __future__ import annotations

import pytest

from gateway.access.preview_links import MAX_LIFETIME, PreviewLinks, cookie_name
from gateway.access.sandbox_tokens import SandboxTokens
from gateway.errors import BadRequest

NOW = 1_000_000.0
TOKENS = SandboxTokens(b"k" * 32)


def links(at: float = NOW) -> PreviewLinks:
    return PreviewLinks(TOKENS, clock=lambda: at)


def test_a_link_opens_its_port_of_its_session_until_it_expires():
    signature, expires = links().sign("sess", 8000, 60)
    assert expires == NOW + 60
    assert links().valid(signature, "sess", 8000)
    assert not links().valid(signature, "sess", 8001)
    assert not links().valid(signature, "other", 8000)
    assert not links(NOW + 60).valid(signature, "sess", 8000)


def test_a_link_cannot_be_stretched_forged_or_taken_from_a_sandbox_token():
    signature, expires = links().sign("sess", 8000, 60)
    mac = signature.partition(".")[2]
    assert not links().valid(f"{expires + 3600}.{mac}", "sess", 8000)  # a later expiry
    assert not links().valid(f"{expires}.{'0' * 64}", "sess", 8000)
    for junk in (None, "", ".", "x.y", f"{expires}", "9" * 40 + "." + mac):
        assert not links().valid(junk, "sess", 8000)
    # A sandbox's access token is not a link, nor a link a sandbox token.
    token = TOKENS.issue("sess", "holder")
    assert not links().valid(f"{expires}.{token.rpartition('.')[2]}", "sess", 8000)
    assert TOKENS.holder("sess", f"link.{mac}") is None


def test_lifetimes_are_bounded_and_cookies_named_per_session_and_port():
    for bad in (0, -1, MAX_LIFETIME + 1):
        with pytest.raises(BadRequest, match="expires_in"):
            links().sign("sess", 8000, bad)
    assert cookie_name("a", 1) != cookie_name("a", 2) != cookie_name("b", 1)


@pytest.mark.parametrize("expires", ["\u00b2", "1\u0663", "\uff11"])
def test_a_unicode_digit_in_a_signature_is_refused_not_a_500(expires):
    """``str.isdigit`` takes superscripts and other scripts' digits, which ``int`` refuses."""
    assert not links().valid(f"{expires}.x", "sess", 8000)
