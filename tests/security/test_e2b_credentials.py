"""Credentials scoped to what they were made for, and file rules on every route (issue 35, 4-5).

A signed file URL is for one file operation on ``/files``, expires, can be
revoked, and never stands in for a sandbox token elsewhere; a held execute
asked for through a sandbox token is its holder's, who may not approve it; no
credential shows in the gateway's log. The tenant's file rules (no deleting,
at most ``max_upload`` bytes an upload) hold on every route that deletes,
moves or writes, counting what arrives, chunked or not. A canary session on
the same gateway answers throughout.
"""

from __future__ import annotations

import threading
import time
import urllib.parse

import httpx
import pytest
from e2b_code_interpreter import Sandbox
from helpers import Canary, GatewayProcess, canary_session, e2b_env, short_tmpdir, wait_for

pytestmark = pytest.mark.docker

TOKENS = {"maker": "approver = true", "peer": "approver = true"}
POLICY = """mode: enforce
rules:
  shell: hold
files:
  max_upload: 1k
  delete: deny
"""
OVER = b"x" * 4096  # past max_upload


@pytest.fixture(scope="module")
def gw(start_gateway) -> GatewayProcess:
    data_dir = short_tmpdir()
    (data_dir / "tokens.toml").write_text(
        "".join(
            f'[[tokens]]\ntenant = "acme"\ntoken = "{name}-token"\n{extra}\n'
            for name, extra in TOKENS.items()
        )
    )
    (data_dir / "policies").mkdir()
    (data_dir / "policies" / "acme.yaml").write_text(POLICY)
    return start_gateway(
        "--tokens-file", str(data_dir / "tokens.toml"), "--approval-timeout", "30",
        data_dir=data_dir,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sandbox(gw: GatewayProcess):
    with pytest.MonkeyPatch.context() as mp:
        for name, value in e2b_env(gw, "maker-token").items():
            mp.setenv(name, value)
        made = Sandbox.create()
        yield made
        made.kill()


@pytest.fixture
def watched(gw: GatewayProcess):
    with canary_session(gw) as sid, Canary(gw, sid) as watch:
        yield watch


def api(gw: GatewayProcess, who: str) -> httpx.Client:
    return httpx.Client(
        base_url=gw.url, timeout=60, headers={"Authorization": f"Bearer {who}-token"}
    )


def by_host(gw: GatewayProcess, sandbox: Sandbox, port: int = 49983) -> httpx.Client:
    """A client naming the sandbox by Host only, as a signed URL's holder does."""
    host = {"Host": f"{port}-{sandbox.sandbox_id}.sandbox.example.org"}
    return httpx.Client(base_url=gw.url, headers=host, timeout=60)


def envd(gw: GatewayProcess, sandbox: Sandbox) -> httpx.Client:
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sandbox._envd_access_token,
    }
    return httpx.Client(base_url=gw.url, headers=headers, timeout=60)


def query_of(url: str) -> str:
    return urllib.parse.urlsplit(url).query


# Item 4: credentials scoped to what they were made for.


def test_a_signed_url_is_no_sandbox_token_on_other_routes_or_ports(
    gw: GatewayProcess, sandbox: Sandbox, watched: Canary
) -> None:
    """An upload link does not run code or list files; a download link reads nothing else."""
    upload = query_of(sandbox.upload_url("shared.txt", use_signature_expiration=60))
    download = query_of(sandbox.download_url("shared.txt", use_signature_expiration=60))
    with by_host(gw, sandbox) as client:  # what they were made for
        r = client.post(f"/files?{upload}", files={"file": ("shared.txt", b"hello")})
        assert r.status_code == 200, r.text
        assert client.get(f"/files?{download}").content == b"hello"
        listing = client.post(
            f"/filesystem.Filesystem/ListDir?{upload}",
            json={"path": "/home/user"},
            headers={"Content-Type": "application/json"},
        )
        assert listing.status_code == 401, listing.text
        assert "signed" in listing.json()["message"]
    with by_host(gw, sandbox, 49999) as client:
        r = client.post(f"/execute?{upload}", json={"code": "1 + 1"})
        assert r.status_code == 401, r.text
        assert client.get(f"/contexts?{download}").status_code == 401


def test_a_signed_url_needs_an_expiry_within_a_day(
    gw: GatewayProcess, sandbox: Sandbox, watched: Canary
) -> None:
    sandbox.files.write("forever.txt", "x")
    with by_host(gw, sandbox) as client:
        r = client.get(f"/files?{query_of(sandbox.download_url('forever.txt'))}")
        assert r.status_code == 401 and "use_signature_expiration" in r.json()["message"]
        far = sandbox.download_url("forever.txt", use_signature_expiration=30 * 86400)
        r = client.get(f"/files?{query_of(far)}")
        assert r.status_code == 401 and "a day" in r.json()["message"], r.text


def test_a_signed_url_can_be_revoked(gw: GatewayProcess, sandbox: Sandbox, watched: Canary) -> None:
    sandbox.files.write("revoked.txt", "secret")
    url = sandbox.download_url("revoked.txt", use_signature_expiration=600)
    other = sandbox.download_url("revoked.txt", use_signature_expiration=601)
    with by_host(gw, sandbox) as client, api(gw, "maker") as maker, api(gw, "peer") as peer:
        assert client.get(f"/files?{query_of(url)}").status_code == 200
        revoke = f"/v1/sessions/{sandbox.sandbox_id}/file-urls/revoke"
        assert maker.post(revoke, json={"url": "not a signed url"}).status_code == 400
        r = peer.post(revoke, json={"url": url})  # the same tenant may revoke it
        assert r.status_code == 204, r.text
        r = client.get(f"/files?{query_of(url)}")
        assert r.status_code == 401 and "revoked" in r.json()["message"]
        assert client.get(f"/files?{query_of(other)}").status_code == 200  # only that one


def test_a_held_execute_through_a_sandbox_token_is_its_holders(
    gw: GatewayProcess, sandbox: Sandbox, watched: Canary
) -> None:
    """The approver who made the sandbox cannot approve the shell code run through its token."""
    ran: dict = {}

    def run() -> None:
        try:
            ran["result"] = sandbox.run_code("import os\nos.system('true')", timeout=60)
        except Exception as e:  # denied: the SDK's error
            ran["error"] = e

    worker = threading.Thread(target=run)
    worker.start()
    with api(gw, "maker") as maker, api(gw, "peer") as peer:
        pending = wait_for(
            lambda: maker.get("/v1/approvals", params={"state": "pending"}).json()["approvals"],
            timeout=30,
        )
        (approval,) = pending
        assert approval["session_id"] == sandbox.sandbox_id
        refused = maker.post(f"/v1/approvals/{approval['id']}/approve", json={})
        assert refused.status_code == 403, refused.text
        assert "asked for" in refused.json()["error"]["message"], approval
        r = peer.post(f"/v1/approvals/{approval['id']}/deny", json={"reason": "no"})
        assert r.status_code == 200, r.text
    worker.join(60)
    assert "result" not in ran or ran["result"].error is not None


def test_a_sandbox_token_is_no_api_token(gw: GatewayProcess, sandbox: Sandbox) -> None:
    """It reaches its sandbox's ports only: not /v1 (approvals included), not the control API."""
    token = sandbox._envd_access_token
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        bearer = {"Authorization": f"Bearer {token}"}
        assert client.get("/v1/sessions", headers=bearer).status_code == 401
        assert client.get("/v1/approvals", headers=bearer).status_code == 401
        assert client.get("/sandboxes", headers={"X-API-Key": token}).status_code == 401


def test_no_credential_shows_in_the_log(
    gw: GatewayProcess, sandbox: Sandbox, watched: Canary
) -> None:
    sandbox.files.write("logged.txt", "x")
    url = sandbox.download_url("logged.txt", use_signature_expiration=60)
    signature = dict(urllib.parse.parse_qsl(query_of(url)))["signature"]
    with by_host(gw, sandbox) as client:
        assert client.get(f"/files?{query_of(url)}").status_code == 200
        client.get("/files?path=logged.txt&signature=v1_guessed&signature_expiration=1")
    with api(gw, "maker") as maker:
        maker.get("/v1/sessions", params={"token": "maker-token"})
        maker.get(f"/v1/sessions?access_token={sandbox._envd_access_token}")
    time.sleep(0.5)  # the log lines are read on a thread
    log = "".join(gw.log)
    for credential in (signature, "v1_guessed", sandbox._envd_access_token, "maker-token"):
        assert urllib.parse.quote(credential, safe="") not in log
        assert credential not in log


# Item 5: file rules on every route.


def test_deleting_and_moving_are_refused_on_the_e2b_filesystem_too(
    gw: GatewayProcess, sandbox: Sandbox, watched: Canary
) -> None:
    sandbox.files.write("kept.txt", "x")
    with pytest.raises(Exception, match="refuses deleting"):
        sandbox.files.remove("kept.txt")
    with pytest.raises(Exception, match="refuses deleting"):
        sandbox.files.rename("kept.txt", "moved.txt")
    assert sandbox.files.exists("kept.txt") and not sandbox.files.exists("moved.txt")


def chunks(data: bytes):
    for start in range(0, len(data), 512):
        yield data[start : start + 512]


def test_a_chunked_upload_counts_what_arrives(
    gw: GatewayProcess, sandbox: Sandbox, watched: Canary
) -> None:
    octets = {"Content-Type": "application/octet-stream"}
    with envd(gw, sandbox) as client:
        r = client.post("/files?path=small.bin", content=chunks(b"y" * 1000), headers=octets)
        assert r.status_code == 200, r.text  # under the limit, chunked
        r = client.post("/files?path=big.bin", content=chunks(OVER), headers=octets)
        assert r.status_code == 403 and "upload" in r.json()["message"], r.text
        boundary = "b0und"
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="m.bin"\r\n'
                f"Content-Type: application/octet-stream\r\n\r\n"
            ).encode()
            + OVER
            + f"\r\n--{boundary}--\r\n".encode()
        )
        multipart = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        r = client.post("/files?path=m.bin", content=chunks(body), headers=multipart)
        assert r.status_code == 403, r.text
    with api(gw, "maker") as maker:
        r = maker.put(f"/v1/sessions/{sandbox.sandbox_id}/files/v1.bin", content=chunks(OVER))
        assert r.status_code == 403, r.text
    for name in ("big.bin", "m.bin", "v1.bin"):
        assert not sandbox.files.exists(name)
    assert sandbox.files.read("small.bin") == "y" * 1000
