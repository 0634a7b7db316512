"""Preview URLs: servers a kernel starts, reached through the gateway with no inbound network.

One gateway (small preview caps) and one session serve the module: its
kernel runs a plain ``http.server`` and a Tornado app with a WebSocket.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets.sync.client
from helpers import Canary, GatewayProcess, canary_session, e2b_env, run

from gateway.client import AsyncClient, Client

MAX_CONNECTIONS = 6
MAX_BYTES = 8 * 2**20  # a minute's, per session
PLAIN, APP = 8000, 8001

# Started in the kernel: http.server on PLAIN, a Tornado app on APP (echo, stream, ws, page).
SERVERS = textwrap.dedent(f"""
    import asyncio, functools, http.server, json, os, threading, tornado.web, tornado.websocket
    os.makedirs("/tmp/site", exist_ok=True)
    open("/tmp/site/hello.txt", "w").write("hello from the sandbox")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/tmp/site")
    plain = http.server.ThreadingHTTPServer(("127.0.0.1", {PLAIN}), handler)
    threading.Thread(target=plain.serve_forever, daemon=True).start()

    class Echo(tornado.web.RequestHandler):
        def get(self):
            self.write({{"path": self.request.uri, "headers": dict(self.request.headers)}})
        post = get

    class Stream(tornado.web.RequestHandler):
        async def get(self):
            for i in range(3):
                self.write(f"part {{i}}\\n")
                await self.flush()
                await asyncio.sleep(0.3)

    class Socket(tornado.websocket.WebSocketHandler):
        def check_origin(self, origin):
            return True
        def on_message(self, message):
            self.write_message("echo " + message)

    PAGE = '''<!doctype html><title>waiting</title><script>
    const ws = new WebSocket(location.href.replace(/^http/, "ws").replace(/[?#].*$/, "")
                             .replace(/\\/[^\\/]*$/, "/ws"));
    ws.onopen = () => ws.send("from the page");
    ws.onmessage = (e) => {{ document.title = e.data; }};
    </script>'''

    class Page(tornado.web.RequestHandler):
        def get(self):
            self.write(PAGE)

    async def _serve_app():
        tornado.web.Application([("/echo", Echo), ("/stream", Stream), ("/ws", Socket),
                                 ("/", Page), ("/page", Page)]).listen({APP}, "127.0.0.1")
    asyncio.get_event_loop().create_task(_serve_app())
""")


@pytest.fixture(scope="module")
def gw(start_gateway) -> GatewayProcess:
    return start_gateway(
        "--preview-max-connections", str(MAX_CONNECTIONS), "--preview-max-bytes", str(MAX_BYTES)
    )  # fmt: skip


@pytest.fixture(scope="module")
def sid(gw: GatewayProcess) -> Iterator[str]:
    r = gw.client.post("/v1/sessions", json={})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    run(gw.client, sid, SERVERS)
    yield sid
    gw.client.delete(f"/v1/sessions/{sid}")


def _path(gw: GatewayProcess, sid: str, port: int, rest: str = "/") -> str:
    return f"{gw.url}/v1/sessions/{sid}/ports/{port}{rest}"


def _host(sid: str, port: int, gw: GatewayProcess) -> str:
    return f"{port}-{sid}.localhost:{gw.url.rsplit(':', 1)[1]}"


def test_both_forms_reach_the_servers_without_the_gateways_credentials(gw, sid):
    plain = gw.client.get(_path(gw, sid, PLAIN, "/hello.txt"))
    assert plain.status_code == 200, plain.text
    assert plain.text == "hello from the sandbox"
    assert plain.headers["content-security-policy"].startswith("sandbox allow-scripts")
    assert "allow-same-origin" not in plain.headers["content-security-policy"]

    echo = gw.client.post(
        _path(gw, sid, APP, "/echo?x=1"), content=b"body", headers={"Cookie": "app=1"}
    )
    assert echo.status_code == 200, echo.text
    seen = {k.lower(): v for k, v in echo.json()["headers"].items()}
    assert echo.json()["path"] == "/echo?x=1"
    assert "authorization" not in seen and seen["cookie"] == "app=1"
    assert seen["x-forwarded-prefix"] == f"/v1/sessions/{sid}/ports/{APP}"

    host = gw.client.get(f"{gw.url}/echo", headers={"Host": _host(sid, APP, gw)})
    assert host.status_code == 200, host.text
    assert "content-security-policy" not in host.headers  # an origin of its own
    assert "authorization" not in {k.lower() for k in host.json()["headers"]}

    with gw.client.stream("GET", _path(gw, sid, APP, "/stream")) as streamed:
        parts = [(time.monotonic(), line) for line in streamed.iter_lines()]
    assert [line for _, line in parts] == ["part 0", "part 1", "part 2"]
    assert parts[-1][0] - parts[0][0] > 0.4  # each part came as it was written

    assert gw.client.get(_path(gw, sid, 9)).status_code == 502  # nothing listens there
    listed = gw.client.get(f"/v1/sessions/{sid}/ports").json()["ports"]
    assert {PLAIN, APP} <= {p["port"] for p in listed}


def test_websockets_pass_both_forms(gw, sid):
    auth = {"Authorization": f"Bearer {gw.token}"}
    path = _path(gw, sid, APP, "/ws").replace("http", "ws", 1)
    with websockets.sync.client.connect(path, additional_headers=auth) as ws:
        ws.send("one")
        assert ws.recv(timeout=10) == "echo one"
    host, port = "127.0.0.1", int(gw.url.rsplit(":", 1)[1])
    with websockets.sync.client.connect(
        f"ws://{_host(sid, APP, gw)}/ws",
        sock=socket.create_connection((host, port)),
        additional_headers=auth,
    ) as ws:
        ws.send("two")
        assert ws.recv(timeout=10) == "echo two"


def test_a_signed_link_opens_one_port_of_one_session(gw, sid):
    made = gw.client.post(f"/v1/sessions/{sid}/previews", json={"port": APP, "expires_in": 60})
    assert made.status_code == 200, made.text
    link = made.json()["path_url"]
    with httpx.Client(timeout=30) as browser:
        first = browser.get(link)
        assert first.status_code == 303 and "sbx_preview" not in first.headers["location"]
        cookie = first.headers["set-cookie"]
        assert "HttpOnly" in cookie and f"Path=/v1/sessions/{sid}/ports/{APP}/" in cookie
        page = browser.get(_path(gw, sid, APP, "/echo"), headers={"Sec-Fetch-Site": "same-origin"})
        assert page.status_code == 200, page.text
        assert "sbx_preview" not in json.dumps(page.json())  # the sandbox never sees it
        # Another site's page spending the viewer's cookie: refused.
        # Another page spending the viewer's cookie: another site's, another session's preview
        # (same site under a shared domain), a WebSocket from one, an old browser's Origin.
        other = f"http://{APP}-other.localhost"
        for spent in (
            {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"},
            {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Origin": other},
            {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "websocket", "Origin": other},
            {"Origin": other},
        ):
            assert browser.get(_path(gw, sid, APP, "/echo"), headers=spent).status_code == 401
        # The page's own form posts more than an anonymous caller may send (the edge's bound).
        posted = browser.post(
            _path(gw, sid, APP, "/echo"), content=b"x" * 200_000,
            headers={"Sec-Fetch-Site": "same-origin"},
        )  # fmt: skip
        assert posted.status_code == 200, posted.text
        # A person following a link from elsewhere (a top-level navigation) gets the page.
        navigate = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
        assert browser.get(_path(gw, sid, APP, "/echo"), headers=navigate).status_code == 200
        # ... but not another site framing it (clickjacking: an attacker's review found it).
        framed = {**navigate, "Sec-Fetch-Dest": "iframe"}
        assert browser.get(_path(gw, sid, APP, "/echo"), headers=framed).status_code == 401
        # A link's first visit sends the browser on within the preview, never to //elsewhere.
        host = _host(sid, APP, gw)
        with httpx.Client(timeout=30) as fresh:
            away = f"{gw.url}//evil.example/x?{link.split('?')[1]}"
            location = fresh.get(away, headers={"Host": host}).headers["location"]
        assert location == "/evil.example/x", location
        # The link is for APP only, and never for the API.
        signature = link.split("sbx_preview=")[1]
        other = browser.get(_path(gw, sid, PLAIN, f"/?sbx_preview={signature}"))
        assert other.status_code == 401
        assert browser.get(f"{gw.url}/v1/sessions/{sid}?sbx_preview={signature}").status_code == 401
        assert browser.get(f"{gw.url}/v1/sessions/{sid}/ports").status_code == 401


def test_a_signed_link_in_chromium_and_what_a_preview_page_cannot_reach(gw, sid):
    """Headless Chromium opens a link; the page's WebSocket reaches the app; the pages cannot
    read the gateway page's token nor call the API with the viewer's credentials."""
    port = gw.url.rsplit(":", 1)[1]
    local = f"http://localhost:{port}"
    with httpx.Client(base_url=local, headers=gw.client.headers, timeout=30) as by_name:
        host_link = by_name.post(f"/v1/sessions/{sid}/previews", json={"port": APP}).json()
    assert host_link["url"].startswith(f"http://{APP}-{sid}.localhost:{port}/?sbx_preview=")
    page_link = host_link["url"].replace("/?", "/page?")
    path_link = host_link["path_url"].replace(f"/{APP}/?", f"/{APP}/page?")
    browser = subprocess.run(
        ["node", "preview.mjs", page_link, path_link,
         f"{local}/approvals#token={gw.token}", f"{local}/v1/sessions"],
        cwd=Path(__file__).parent / "browser", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert browser.returncode == 0, browser.stderr[-3000:]
    seen = json.loads(browser.stdout.strip().splitlines()[-1])
    host, path = seen["host"], seen["path"]
    assert host["title"] == "echo from the page", host  # the page's WebSocket went both ways
    assert "sbx_preview" not in host["url"] and "sbx_preview" not in path["url"]
    assert host["api"].startswith("refused"), host  # another origin: no CORS, no cookie
    assert path["token"].startswith("refused: SecurityError"), path  # an opaque origin
    assert path["api"].startswith("refused"), path


def test_the_sdk_the_cli_and_the_e2b_sdk_find_the_preview(gw, sid):
    import asyncio

    from e2b import Sandbox

    with Client(gw.url, gw.token) as client:
        session = client.session(sid)
        assert {PLAIN, APP} <= {p.port for p in session.list_ports()}
        link = session.preview_link(APP, expires_in=30)
        assert link.port == APP and link.expires_at > time.time()
        assert session.preview_url(APP) == _path(gw, sid, APP)
        assert session.get_host(APP) == f"{APP}-{sid}.{gw.url.split('//')[1]}"

    async def from_async() -> list[int]:
        async with AsyncClient(gw.url, gw.token) as client:
            return [p.port for p in await client.session(sid).list_ports()]

    assert APP in asyncio.run(from_async())
    cli = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "ports", sid, "--url", gw.url, "--json"],
        env={"SBX_TOKEN": gw.token, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert APP in [p["port"] for p in json.loads(cli.stdout)["ports"]]
    # The stock E2B SDK: get_host names the port, its access token opens it.
    env = e2b_env(gw, gw.token)
    sandbox = Sandbox.connect(
        sid, api_key=env["E2B_API_KEY"], api_url=env["E2B_API_URL"], domain=env["E2B_DOMAIN"],
        sandbox_url=env["E2B_SANDBOX_URL"],
    )  # fmt: skip
    host = sandbox.get_host(APP)
    assert host == f"{APP}-{sid}.{env['E2B_DOMAIN']}"
    # As E2B's docs say for restricted public traffic: the sandbox's traffic access token.
    token = sandbox.traffic_access_token
    answer = httpx.get(f"{gw.url}/echo", headers={"Host": host, "e2b-traffic-access-token": token})
    assert answer.status_code == 200, answer.text
    assert "e2b-traffic-access-token" not in {k.lower() for k in answer.json()["headers"]}
    refused = httpx.get(f"{gw.url}/echo", headers={"Host": host, "X-Access-Token": "nope"})
    assert refused.status_code == 401


def test_an_image_without_python3_forwards_with_node(gw):
    """The JavaScript image has node and no python3: the forwarder runs in node there."""
    r = gw.client.post("/v1/sessions", json={"kernel": "javascript"})
    assert r.status_code == 201, r.text
    js = r.json()["id"]
    try:
        server = (
            "require('http').createServer((q, s) => s.end('node ' + q.url))"
            ".listen(8005, '127.0.0.1'); 1"
        )
        run(gw.client, js, server)
        answer = gw.client.get(_path(gw, js, 8005, "/here?x=1"))
        assert answer.status_code == 200 and answer.text == "node /here?x=1", answer.text
        assert 8005 in [
            p["port"] for p in gw.client.get(f"/v1/sessions/{js}/ports").json()["ports"]
        ]
        assert gw.client.get(_path(gw, js, 8006)).status_code == 502
    finally:
        gw.client.delete(f"/v1/sessions/{js}")


def test_an_image_with_neither_says_so_at_once(gw):
    """The R image has neither python3 nor node: a preview says why, without a timeout."""
    r = gw.client.post("/v1/sessions", json={"kernel": "ir"})
    assert r.status_code == 201, r.text
    try:
        t0 = time.monotonic()
        answer = gw.client.get(_path(gw, r.json()["id"], 8000))
        assert answer.status_code == 503, answer.text
        assert "python3 or node" in answer.json()["error"]["message"]
        assert time.monotonic() - t0 < 5  # not the 10 s a forwarder has to start
    finally:
        gw.client.delete(f"/v1/sessions/{r.json()['id']}")


def test_connection_cap_and_a_flooding_kernel_leave_the_canary_answering(gw, sid):
    # A server that accepts and never answers: previews pile up against the cap.
    run(
        gw.client,
        sid,
        textwrap.dedent("""
        import socket, threading
        _held = []
        _hold = socket.socket(); _hold.bind(("127.0.0.1", 8002)); _hold.listen(1000)
        def _accept():
            while True:
                _held.append(_hold.accept()[0])
        threading.Thread(target=_accept, daemon=True).start()
        # And a flood of junk on the relay's socket: connections nobody asked for, bad lines.
        def _flood():
            for i in range(3000):
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect("/run/sbx/preview.sock")
                    s.sendall(b"data " + b"0" * 32 + b"\\n" if i % 2 else b"x" * 100000)
                except OSError:
                    pass
                s.close()
        threading.Thread(target=_flood, daemon=True).start()
    """),
    )
    with canary_session(gw) as canary_id, Canary(gw, canary_id):
        clients = [httpx.Client(timeout=30, headers=gw.client.headers) for _ in range(10)]
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            held = [
                pool.submit(c.get, _path(gw, sid, 8002), timeout=httpx.Timeout(30, read=6))
                for c in clients
            ]
            deadline = time.monotonic() + 10
            while (refused := gw.client.get(_path(gw, sid, PLAIN, "/hello.txt"))).is_success:
                assert time.monotonic() < deadline, "the cap never held"
                time.sleep(0.1)
            assert refused.status_code == 429, refused.text
            assert "connections" in refused.json()["error"]["message"]
            for f in held:
                f.exception()
        for c in clients:
            c.close()
    # Once they ended, previews work again.
    deadline = time.monotonic() + 10
    while (r := gw.client.get(_path(gw, sid, PLAIN, "/hello.txt"))).status_code == 429:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)
    assert r.status_code == 200, r.text


def test_a_server_flooding_its_viewers_is_held_to_the_byte_cap(gw, sid):
    """Runs last (the session's minute is spent): an endless answer stops at the cap, the next
    preview is a 429 saying when to retry, and the canary answers meanwhile."""
    run(
        gw.client,
        sid,
        textwrap.dedent("""
        import socket, threading
        _flood = socket.socket(); _flood.bind(("127.0.0.1", 8003)); _flood.listen(8)
        def _serve():
            while True:
                c = _flood.accept()[0]
                c.recv(65536)
                c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\n")
                try:
                    while True:
                        c.sendall(b"x" * 65536)
                except OSError:
                    c.close()
        threading.Thread(target=_serve, daemon=True).start()
    """),
    )
    got = 0
    with canary_session(gw) as canary_id, Canary(gw, canary_id):
        with (
            httpx.Client(timeout=httpx.Timeout(30, read=3), headers=gw.client.headers) as viewer,
            viewer.stream("GET", _path(gw, sid, 8003)) as flood,
        ):
            with contextlib.suppress(httpx.ReadTimeout):
                for chunk in flood.iter_raw():
                    got += len(chunk)
        refused = gw.client.get(_path(gw, sid, PLAIN, "/hello.txt"))
    assert MAX_BYTES / 2 < got <= MAX_BYTES + 2**20, got
    assert refused.status_code == 429, refused.text
    assert "this minute" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 61
