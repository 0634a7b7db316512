"""Credentials brokered at egress, against a real HTTPS origin with its own authority:
the header goes in only on the bound host, a placeholder elsewhere stays a string."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import pytest
import requests
from helpers import origin_authority

from gateway.egress.credentials import (
    Broker,
    Credential,
    SessionCA,
    placeholder,
    upstream_context,
)
from gateway.egress.policy import AddressGuard, NetworkPolicy
from gateway.egress.proxy import EgressConnection, EgressProxy
from gateway.errors import BadRequest

KEY = b"k" * 32
SECRET = "sk-live-0123456789abcdef"
LOOPBACK = [ipaddress.ip_network("127.0.0.0/8")]


class World:
    """An HTTPS origin echoing what it received, a plain one, and the proxy between, on a loop
    of their own (the clients under test block)."""

    def __init__(self, tmp: Path, trust_origin: bool = True) -> None:
        self.tmp = tmp
        self.trust_origin = trust_origin
        self.received: list[dict] = []
        self.records: list[EgressConnection] = []
        self.loop = asyncio.new_event_loop()

    def __enter__(self) -> World:
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _stop(self) -> None:
        await self.proxy.stop()
        for server in (self.https, self.plain):
            server.close()
            await server.wait_closed()

    async def _start(self) -> None:
        ca_file, server = origin_authority(self.tmp)
        self.https = await asyncio.start_server(self._echo, "127.0.0.1", 0, ssl=server)
        self.plain = await asyncio.start_server(self._echo, "127.0.0.1", 0)
        self.https_port = self.https.sockets[0].getsockname()[1]
        self.plain_port = self.plain.sockets[0].getsockname()[1]
        self.proxy = EgressProxy(AddressGuard(LOOPBACK, set()), KEY)
        self.proxy.on_connection = self.records.append
        self.port = await self.proxy.start("127.0.0.1", range(0, 1))
        ca = SessionCA(KEY, "s1", upstream_context(ca_file if self.trust_origin else None))
        self.placeholder = placeholder(KEY, "s1", "gh")
        bound = Credential.parse(
            {"secret": "gh", "hosts": ["localhost"], "format": "Bearer {value}"}
        )
        broker = Broker((bound,), {"gh": SECRET}, {"gh": self.placeholder}, ca)
        policy = NetworkPolicy.parse({"allow": ["localhost", "127.0.0.1"]})
        self.token = self.proxy.admit("s1", policy, broker)
        self.bundle = self.tmp / "bundle.pem"
        self.bundle.write_bytes(ca.bundle())
        self.ca = ca

    async def _echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._answer(reader, writer)
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            # Not TLS's orderly close, which waits for the client's reply through the tunnel:
            # the origin ends the connection, as a server answering Connection: close does.
            writer.transport.abort()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        lines = head.split("\r\n")
        pairs = (line.split(": ", 1) for line in lines[1:] if ": " in line)
        headers = {name.lower(): value for name, value in pairs}
        length = int(headers.get("content-length", 0))
        body = (await reader.readexactly(length)).decode() if length else ""
        seen = {"line": lines[0], "headers": headers, "body": body}
        self.received.append(seen)
        reply = json.dumps(seen).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        writer.write(b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(reply), reply))
        await writer.drain()

    @property
    def proxy_url(self) -> str:
        return f"http://s1:{self.token}@127.0.0.1:{self.port}"


@pytest.fixture
def world(tmp_path):
    with World(tmp_path) as w:
        yield w


def via_urllib(w: World, url: str, headers: dict) -> dict:
    context = ssl.create_default_context(cafile=str(w.bundle))
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"https": w.proxy_url, "http": w.proxy_url}),
        urllib.request.HTTPSHandler(context=context),
    )
    with opener.open(urllib.request.Request(url, headers=headers), timeout=10) as reply:
        return json.load(reply)


def via_requests(w: World, url: str, headers: dict) -> dict:
    proxies = {"https": w.proxy_url, "http": w.proxy_url}
    return requests.get(
        url, headers=headers, proxies=proxies, verify=str(w.bundle), timeout=10
    ).json()


def via_httpx(w: World, url: str, headers: dict) -> dict:
    context = ssl.create_default_context(cafile=str(w.bundle))
    with httpx.Client(proxy=w.proxy_url, verify=context, timeout=10) as client:
        return client.get(url, headers=headers).json()


def via_curl(w: World, url: str, headers: dict) -> dict:
    args = ["curl", "-sS", "--max-time", "10", "--proxy", w.proxy_url, "--cacert", str(w.bundle)]
    for name, value in headers.items():
        args += ["-H", f"{name}: {value}"]
    return json.loads(subprocess.run([*args, url], capture_output=True, check=True).stdout)


def via_node(w: World, url: str, headers: dict) -> dict:
    """Node's fetch through the proxy: a CONNECT by hand, then TLS over it (no agent package)."""
    script = f"""
const net = require('net'), tls = require('tls');
const u = new URL({json.dumps(url)});
const s = net.connect({w.port}, '127.0.0.1', () => s.write(
  `CONNECT ${{u.host}} HTTP/1.1\\r\\nProxy-Authorization: Basic ` +
  Buffer.from('s1:{w.token}').toString('base64') + `\\r\\n\\r\\n`));
s.once('data', () => {{
  const t = tls.connect({{socket: s, servername: u.hostname}}, () => {{
    const h = {json.dumps(headers)};
    let req = `GET ${{u.pathname}} HTTP/1.1\\r\\nHost: ${{u.host}}\\r\\n`;
    for (const k in h) req += `${{k}}: ${{h[k]}}\\r\\n`;
    t.write(req + '\\r\\n');
  }});
  let out = '';
  t.on('data', d => out += d);
  t.on('end', () => console.log(out.split('\\r\\n\\r\\n')[1]));
}});
"""
    env = {"NODE_EXTRA_CA_CERTS": str(w.bundle), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["node", "-e", script], capture_output=True, env=env, timeout=20)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("client", [via_urllib, via_requests, via_httpx, via_curl, via_node])
def test_a_bound_host_gets_the_credential_from_each_usual_client(world, client):
    url = f"https://localhost:{world.https_port}/user"
    seen = client(world, url, {"X-Api-Key": world.placeholder, "Authorization": "mine"})
    assert seen["headers"]["authorization"] == f"Bearer {SECRET}"  # the sandbox's is replaced
    assert seen["headers"]["x-api-key"] == SECRET  # the placeholder is swapped
    _wait(world)
    (record,) = world.records
    assert record.intercepted and record.injected == ["gh"] and record.unresolved == []


def test_a_placeholder_sent_to_an_unbound_host_is_never_resolved_and_is_recorded(world):
    url = f"http://127.0.0.1:{world.plain_port}/q?token={world.placeholder}"
    proxies = {"http": world.proxy_url}
    body = f"payload={world.placeholder}"
    seen = requests.post(
        url, data=body, headers={"X-Api-Key": world.placeholder}, proxies=proxies, timeout=10
    ).json()
    assert SECRET not in json.dumps(seen)
    assert seen["headers"]["x-api-key"] == world.placeholder and world.placeholder in seen["body"]
    _wait(world)
    (record,) = world.records
    assert not record.intercepted and record.injected == [] and record.unresolved == ["gh"]


def test_a_placeholder_cut_across_two_chunks_of_a_body_is_still_seen(world):
    with socket.create_connection(("127.0.0.1", world.port), timeout=10) as s:
        auth = f"Proxy-Authorization: Basic {_basic(world)}\r\n"
        half = len(world.placeholder) // 2
        s.sendall(
            f"POST http://127.0.0.1:{world.plain_port}/ HTTP/1.1\r\n{auth}"
            f"Content-Length: {len(world.placeholder)}\r\n\r\n{world.placeholder[:half]}".encode()
        )
        time.sleep(0.2)
        s.sendall(world.placeholder[half:].encode())
        assert b"200 OK" in s.recv(4096)
    _wait(world)
    assert world.records[0].unresolved == ["gh"]


def test_a_placeholder_sent_a_few_bytes_at_a_time_is_still_seen(world):
    """Reads shorter than a placeholder keep what came before them (an attacker's review
    sent it 4 bytes at a time and the record said nothing)."""
    with socket.create_connection(("127.0.0.1", world.port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        auth = f"Proxy-Authorization: Basic {_basic(world)}\r\n"
        mark = world.placeholder.encode()
        s.sendall(
            f"POST http://127.0.0.1:{world.plain_port}/ HTTP/1.1\r\n{auth}"
            f"Content-Length: {len(mark)}\r\n\r\n".encode()
        )
        for i in range(0, len(mark), 4):
            s.sendall(mark[i : i + 4])
            time.sleep(0.01)
        assert b"200 OK" in s.recv(4096)
    _wait(world)
    assert world.records[0].unresolved == ["gh"]


def test_a_value_that_cannot_go_in_a_header_is_refused_when_bound(world):
    bound = Credential.parse({"secret": "gh", "hosts": ["localhost"]})
    for value in ("tok\r\nX-Injected: yes", "t\u00f6ken", "tok\n"):
        with pytest.raises(BadRequest, match="cannot go in a header"):
            Broker((bound,), {"gh": value}, {"gh": "p"}, world.ca)


def test_leaves_made_at_once_on_several_threads_stay_within_the_cache():
    from concurrent.futures import ThreadPoolExecutor

    ca = SessionCA(KEY, "s9", upstream_context())
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(ca.leaf, [f"h{i % 80}.example" for i in range(240)]))
    assert len(ca._leaves) == 64


def test_hosts_without_a_binding_keep_their_tls_end_to_end(world, tmp_path):
    """The origin's own certificate reaches the client; the session's authority never signs."""
    url = f"https://127.0.0.1:{world.https_port}/"
    with pytest.raises(requests.exceptions.SSLError):
        via_requests(world, url, {})  # the session's bundle cannot vouch for the origin
    origin_ca = str(tmp_path / "origin-ca.pem")
    proxies = {"https": world.proxy_url}
    seen = requests.get(url, proxies=proxies, verify=origin_ca, timeout=10).json()
    assert "authorization" not in seen["headers"]
    assert not any(r.intercepted for r in world.records)


def test_a_client_hello_naming_a_bound_host_on_a_tunnel_to_another_address_is_not_opened(
    world, tmp_path
):
    """SNI says localhost, the tunnel goes to 127.0.0.1: the CONNECT target decides, so the
    client meets the origin's certificate and no credential is added."""
    context = ssl.create_default_context(cafile=str(tmp_path / "origin-ca.pem"))
    with _tunnel(world, "127.0.0.1") as s:
        with context.wrap_socket(s, server_hostname="localhost") as t:
            t.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            reply = t.recv(65536)
    assert SECRET.encode() not in reply
    _wait(world)
    (record,) = world.records
    assert record.sni == "localhost" and not record.intercepted and not record.injected


def test_an_origin_the_host_does_not_trust_is_refused(tmp_path):
    with World(tmp_path, trust_origin=False) as world:
        url = f"https://localhost:{world.https_port}/"
        with pytest.raises(requests.exceptions.HTTPError) as refused:
            proxies = {"https": world.proxy_url}
            requests.get(
                url, proxies=proxies, verify=str(world.bundle), timeout=10
            ).raise_for_status()
        assert refused.value.response.status_code == 502
        assert "certificate verify failed" in refused.value.response.text
        assert world.received == []  # the credential never left


@pytest.mark.parametrize(
    "head, status, says",
    [
        (b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n", b"421", b"must name Host"),
        (b"GET / HTTP/1.1\r\nHost: localhost\r\n folded\r\n\r\n", b"400", b"malformed header"),
        (
            b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            b"400",
            b"conflicting",
        ),
        (b"GET http://other/ HTTP/1.1\r\nHost: localhost\r\n\r\n", b"400", b"must be a path"),
        (b"TRACE / HTTP/1.1\r\nHost: localhost\r\n\r\n", b"405", b"TRACE is not sent"),
        (b"GET / HTTP/1.1\r\nHost: localhost\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", b"400", b""),
    ],
)
def test_malformed_and_oversized_requests_in_an_intercepted_tunnel_get_errors(
    world, head, status, says
):
    context = ssl.create_default_context(cafile=str(world.bundle))
    with _tunnel(world, "localhost") as s:
        with context.wrap_socket(s, server_hostname="localhost") as t:
            try:
                t.sendall(head)
            except OSError:
                pass  # the proxy may cut an oversized head before it is all sent
            reply = _read_all(t)
    assert reply.startswith(b"HTTP/1.1 " + status) and says in reply, reply[:200]
    assert world.received == []


def test_a_restarted_gateway_signs_with_the_same_authority(world):
    again = SessionCA(KEY, "s1", upstream_context())
    assert again.cert.public_key() == world.ca.cert.public_key()
    assert again.cert.subject == world.ca.cert.subject
    other = SessionCA(KEY, "s2", upstream_context())
    assert other.cert.public_key() != world.ca.cert.public_key()


@pytest.mark.parametrize(
    "raw, says",
    [
        ({"secret": "gh", "hosts": ["10.0.0.1"]}, "not addresses"),
        ({"secret": "gh", "hosts": []}, "hosts must list"),
        ({"secret": "gh", "hosts": ["a.example"], "format": "Bearer"}, "'{value}' once"),
        ({"secret": "gh", "hosts": ["a.example"], "header": "Bad Header"}, "not a header"),
        ({"secret": "gh", "hosts": ["a.example"], "header": "Host"}, "does not set Host"),
        ({"secret": "gh", "hosts": ["a.example"], "format": "x\r\n{value}"}, "line breaks"),
        ({"secret": "g h", "hosts": ["a.example"]}, "must name a sealed secret"),
    ],
)
def test_bad_bindings_are_400s_saying_why(raw, says):
    with pytest.raises(BadRequest) as refused:
        Credential.parse(raw)
    assert says in refused.value.message, refused.value.message


def _tunnel(world: World, host: str) -> socket.socket:
    """A socket through the proxy to ``host`` at the HTTPS origin's port, the tunnel granted."""
    s = socket.create_connection(("127.0.0.1", world.port), timeout=10)
    s.sendall(
        f"CONNECT {host}:{world.https_port} HTTP/1.1\r\n"
        f"Proxy-Authorization: Basic {_basic(world)}\r\n\r\n".encode()
    )
    assert b" 200 " in s.recv(100)
    return s


def _basic(world: World) -> str:
    import base64

    return base64.b64encode(f"s1:{world.token}".encode()).decode()


def _read_all(sock) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (OSError, ssl.SSLError):
        pass
    return data


def _wait(world: World) -> None:
    for _ in range(100):
        if world.records:
            return
        time.sleep(0.02)
