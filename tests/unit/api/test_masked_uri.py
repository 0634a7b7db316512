"""The access log masks every credential a query can carry, however it is encoded."""

from __future__ import annotations

from gateway.api.base import masked_uri


def test_credentials_in_a_query_are_masked() -> None:
    line = masked_uri(
        "/files",
        "path=a.txt&signature=v1_abc%2Bdef&signature_expiration=9&TOKEN=t0k&access_token=a&api_key=k",
    )
    for secret in ("v1_abc", "t0k", "access_token=a&", "api_key=k"):
        assert secret not in line
    assert "path=a.txt" in line and "signature_expiration=9" in line


def test_a_preview_links_signature_is_masked() -> None:
    line = masked_uri("/v1/sessions/s/ports/8000/", "sbx_preview=1700000000.abc123&x=1")
    assert "abc123" not in line and "x=1" in line
