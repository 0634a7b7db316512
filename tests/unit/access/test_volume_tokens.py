"""A volume's token opens that volume's content API and nothing else, checked from the headers."""

from __future__ import annotations

import pytest
from tornado import httputil

from gateway.access.auth import Authenticator, Principal, Quota
from gateway.access.file_urls import FileUrls
from gateway.access.preview_links import PreviewLinks
from gateway.access.sandbox_tokens import SandboxTokens
from gateway.access.volume_tokens import VolumeTokens
from gateway.api.e2b.base import Credentials
from gateway.errors import Unauthorized

KEY = SandboxTokens(b"k" * 32)
VOLUMES = VolumeTokens(KEY)
VOL, OTHER = "a" * 32, "b" * 32
ACME = Principal(tenant="acme", token_id="acme-id")
AUTH = Authenticator({"digest": ACME}, {}, Quota(1, 1, 1))
CREDENTIALS = Credentials(
    KEY, FileUrls(KEY), lambda sandbox_id: ("acme-id",), AUTH.principal_of, lambda s: None
)


def accepts(method: str, path: str, **headers: str) -> bool:
    start = httputil.RequestStartLine(method, path, "HTTP/1.1")
    return CREDENTIALS.accepts(start, httputil.HTTPHeaders(headers))


def test_a_volume_token_names_its_holder_for_its_volume_only() -> None:
    token = VOLUMES.issue(VOL, "acme-id")
    assert VOLUMES.holder(VOL, token) == "acme-id"
    assert VOLUMES.holder(OTHER, token) is None
    assert VOLUMES.holder(VOL, VOLUMES.issue(OTHER, "acme-id")) is None
    assert VOLUMES.holder(VOL, "zeta-id." + token.rpartition(".")[2]) is None  # holder swapped
    assert VOLUMES.holder(VOL, None) is None and VOLUMES.holder(VOL, "") is None


def test_a_volume_token_is_no_sandbox_token_preview_link_or_api_token() -> None:
    token = VOLUMES.issue(VOL, "acme-id")
    assert KEY.holder(VOL, token) is None  # a sandbox that had the volume's id
    assert VOLUMES.holder(VOL, KEY.issue(VOL, "acme-id")) is None  # nor the reverse
    assert not PreviewLinks(KEY).valid(token.rpartition(".")[2], VOL, 8080)
    assert AUTH.principal_of("acme-id") == ACME
    with pytest.raises(Unauthorized, match="not valid"):
        AUTH.authenticate(token)


def test_the_edge_lets_a_body_in_only_with_the_named_volumes_token() -> None:
    token = VOLUMES.issue(VOL, "acme-id")
    bearer = {"Authorization": f"Bearer {token}"}
    for route in ("dir", "path", "file"):
        assert accepts("PUT", f"/volumecontent/{VOL}/{route}?path=a", **bearer)
        assert not accepts("PUT", f"/volumecontent/{OTHER}/{route}?path=a", **bearer)
    assert not accepts("PUT", f"/volumecontent/{VOL}/file")  # no token
    assert not accepts("PUT", f"/volumecontent/{VOL}/other", **bearer)  # no such route
    assert not accepts("PUT", f"/volumecontent/{VOL}/file/../../v1/sessions", **bearer)
    assert not accepts("POST", f"/v1/volumes/{VOL}/files/a", **bearer)  # not the tenant's API
    sandbox = {"E2b-Sandbox-Id": VOL, "E2b-Sandbox-Port": "49983"}
    assert not accepts("POST", "/files", **sandbox, **{"X-Access-Token": token})  # nor a session
    assert accepts("POST", "/files", **sandbox, **{"X-Access-Token": KEY.issue(VOL, "acme-id")})
    sandbox_token = KEY.issue(VOL, "acme-id")
    assert not accepts("PUT", f"/volumecontent/{VOL}/file", Authorization=f"Bearer {sandbox_token}")


def test_a_volume_token_whose_api_token_is_gone_is_refused_at_the_edge(tmp_path) -> None:
    credentials = Credentials.in_data_dir(tmp_path, AUTH, lambda s: None, lambda s: None)
    start = httputil.RequestStartLine("PUT", f"/volumecontent/{VOL}/file?path=a", "HTTP/1.1")

    def accepted(holder: str) -> bool:
        token = credentials.volumes.issue(VOL, holder)
        return credentials.accepts(start, httputil.HTTPHeaders(Authorization=f"Bearer {token}"))

    assert accepted("acme-id")
    assert not accepted("gone-id")  # its API token left the tokens file: no body past the edge
