"""``--auth none`` serves this machine's own programs, not the web pages its user opens.

Without tokens, whatever reaches the port is an admin. A browser is such a
thing: a page of any site may POST a form to ``127.0.0.1`` (no preflight for
a form's content types) or open a WebSocket to it, and a page whose DNS
name is rebound to ``127.0.0.1`` reads the answers too, as its own origin.
So an open gateway refuses a foreign ``Origin`` on state-changing requests
and WebSockets, a ``Host`` that is a name other than localhost or its own,
and a JSON body sent under another content type (issue 35, item 8).
"""

from __future__ import annotations

import socket
import urllib.parse

import httpx
import pytest
from helpers import GatewayProcess, e2b_env

from gateway.client import Client

pytestmark = pytest.mark.docker

SECRET = {"name": "OPEN_GATEWAY_PROBE", "value": "v"}


@pytest.fixture(scope="module")
def open_gateway(start_gateway) -> GatewayProcess:
    return start_gateway("--auth", "none")


@pytest.fixture
def anonymous(open_gateway):
    with httpx.Client(base_url=open_gateway.url, timeout=30) as client:
        yield client
        client.delete(f"/v1/secrets/{SECRET['name']}")


def port_of(gw: GatewayProcess) -> int:
    return urllib.parse.urlsplit(gw.url).port or 80


def secret_exists(client: httpx.Client) -> bool:
    names = [s["name"] for s in client.get("/v1/secrets").json()["secrets"]]
    return SECRET["name"] in names


def refused(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, f"answered {r.status_code}: {r.text}"
    message = r.json()["error"]["message"]
    assert all(w in message for w in words), message


def test_a_page_of_another_site_cannot_change_anything(open_gateway, anonymous) -> None:
    for origin in ("https://evil.example", "null", f"http://evil.example:{port_of(open_gateway)}"):
        r = anonymous.post("/v1/secrets", json=SECRET, headers={"Origin": origin})
        refused(r, 403, "Origin", "--auth none")
    assert not secret_exists(anonymous)
    # The gateway's own pages (same host and port) and programs that send no Origin may.
    own = open_gateway.url.rstrip("/")
    assert anonymous.post("/v1/secrets", json=SECRET, headers={"Origin": own}).status_code == 201


def test_a_rebound_dns_name_is_refused(open_gateway, anonymous) -> None:
    port = port_of(open_gateway)
    r = anonymous.get("/v1/secrets", headers={"Host": f"attacker.example:{port}"})
    refused(r, 403, "Host", "attacker.example")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
        assert anonymous.get("/v1/secrets", headers={"Host": host}).status_code == 200, host


def upgrade(gw: GatewayProcess, host: str, origin: str) -> bytes:
    """The status line of a WebSocket upgrade with this Host and Origin."""
    with socket.create_connection(("127.0.0.1", port_of(gw)), timeout=10) as sock:
        sock.sendall(
            f"GET /api/kernels/nope/channels HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode()
        )
        return sock.recv(4096).split(b"\r\n", 1)[0]


def test_a_websocket_from_a_rebound_page_is_refused(open_gateway) -> None:
    rebound = f"attacker.example:{port_of(open_gateway)}"
    assert b" 403 " in upgrade(open_gateway, rebound, f"http://{rebound}")
    own = f"127.0.0.1:{port_of(open_gateway)}"
    assert b" 404 " in upgrade(open_gateway, own, f"http://{own}")  # past the checks


def test_a_json_body_needs_a_json_content_type(open_gateway, anonymous) -> None:
    body = '{"name": "OPEN_GATEWAY_PROBE", "value": "v"}'
    # What a form posts: text/plain can carry a JSON-looking body (name={"...": "...}).
    for form in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {"Content-Type": form} if form else {}
        r = anonymous.post("/v1/secrets", content=body, headers=headers)
        refused(r, 415, "Content-Type: application/json", "--auth none")
    assert not secret_exists(anonymous)
    r = anonymous.post(
        "/v1/secrets", content=body, headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert r.status_code == 201, r.text


def test_this_machines_programs_keep_working(open_gateway) -> None:
    """The SDK (and so the CLI and MCP): JSON bodies, and its agent stream's WebSocket."""
    with Client(open_gateway.url, token="") as sdk:
        session = sdk.create_session()
        try:
            assert session.run("print(6 * 7)").stdout == "42\n"
            session.set_timeout(600)
            session.files.write("a.txt", b"x")
            assert session.files.rename("a.txt", "b.txt").path.endswith("b.txt")
        finally:
            session.delete()


def test_the_stock_e2b_sdk_keeps_working(open_gateway, monkeypatch) -> None:
    """Its control API, the code interpreter (JSON) and envd (Connect) on an open gateway."""
    from e2b_code_interpreter import Sandbox

    for name, value in e2b_env(open_gateway, "any-key").items():
        monkeypatch.setenv(name, value)
    sandbox = Sandbox.create()
    try:
        assert sandbox.run_code("print(6 * 7)").logs.stdout == ["42\n"]
        sandbox.files.write("a.txt", "x")
        assert sandbox.commands.run("cat a.txt").stdout == "x"
    finally:
        sandbox.kill()


def test_the_start_line_says_what_is_and_is_not_protected(open_gateway) -> None:
    line = next(line for line in open_gateway.log if "AUTHENTICATION IS OFF" in line)
    for words in ("any program on this machine", "web pages", "Origin", "Host", "Content-Type"):
        assert words in line, line


def test_with_tokens_curl_d_still_works(start_gateway) -> None:
    """The README's curl examples send JSON as a form; a token already stops a page's form."""
    gw = start_gateway()
    r = gw.client.post(
        f"{gw.url}/v1/secrets",
        content='{"name": "CURL_D", "value": "v"}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 201, r.text
