"""The egress proxy over real sockets: tunnels, plain HTTP, credentials, denials."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import socket
import ssl
import threading

import pytest

from gateway.egress.policy import AddressGuard, NetworkPolicy
from gateway.egress.proxy import EgressDenial, EgressProxy
from gateway.egress.sni import server_name

LOOPBACK = [ipaddress.ip_network("127.0.0.0/8")]


class Harness:
    """A proxy on loopback, one session admitted, and an upstream that records requests."""

    def __init__(self, allow: list[str], ranges=LOOPBACK) -> None:
        self.allow = allow
        self.ranges = ranges
        self.denials: list[EgressDenial] = []
        self.received: list[bytes] = []
        self.clients: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Harness:
        self.upstream = await asyncio.start_server(self._upstream, "127.0.0.1", 0)
        self.up_port = self.upstream.sockets[0].getsockname()[1]
        self.proxy = EgressProxy(AddressGuard(self.ranges, set()), b"k" * 32, self.denials.append)
        self.port = await self.proxy.start("127.0.0.1", range(0, 1))
        self.token = self.proxy.admit("s1", NetworkPolicy.parse({"allow": self.allow}))
        return self

    async def __aexit__(self, *exc) -> None:
        for writer in self.clients:
            writer.close()
            await asyncio.gather(writer.wait_closed(), return_exceptions=True)
        await self.proxy.stop()
        self.upstream.close()
        await self.upstream.wait_closed()

    async def _upstream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.received.append(head)
        if head.startswith(b"PING"):  # a raw protocol through a tunnel: echo lines
            writer.write(head)
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            await writer.drain()
        writer.close()

    def auth(self, token: str | None = None) -> str:
        creds = base64.b64encode(f"s1:{token or self.token}".encode()).decode()
        return f"Proxy-Authorization: Basic {creds}\r\n"

    async def ask(self, head: str) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.clients.append(writer)
        writer.write(head.encode())
        await writer.drain()
        reply = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        return reply, reader, writer


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_connect_tunnels_bytes_both_ways_to_a_listed_address():
    async def go():
        async with Harness(["127.0.0.1"]) as h:
            target = f"127.0.0.1:{h.up_port}"
            reply, reader, writer = await h.ask(f"CONNECT {target} HTTP/1.1\r\n{h.auth()}\r\n")
            assert reply.startswith(b"HTTP/1.1 200"), reply
            writer.write(b"PING\r\n\r\nline two\n")
            assert await reader.readuntil(b"\r\n\r\n") == b"PING\r\n\r\n"
            assert await reader.readline() == b"line two\n"
            writer.close()
            assert h.denials == []

    run(go())


def test_plain_http_is_forwarded_without_the_proxy_credentials():
    async def go():
        async with Harness(["127.0.0.1"]) as h:
            records = []
            h.proxy.on_connection = records.append
            url = f"http://127.0.0.1:{h.up_port}/data?x=1"
            head = (
                f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1\r\n{h.auth()}Connection: keep-alive\r\n\r\n"
            )
            reply, reader, _ = await h.ask(head)
            assert reply.startswith(b"HTTP/1.1 200 OK"), reply
            assert await reader.read() == b"hello"
            sent = h.received[0].decode().lower()
            assert sent.startswith("get /data?x=1 http/1.1\r\n"), sent
            assert "proxy-authorization" not in sent and "connection: close" in sent
            assert "keep-alive" not in sent
            for _ in range(100):
                if records:
                    break
                await asyncio.sleep(0.05)
            (record,) = records
            assert record.bytes_up == len(h.received[0]), "the request sent up was not counted"
            assert record.bytes_down == len(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")

    run(go())


def test_missing_or_wrong_credentials_get_407_and_are_reported():
    async def go():
        async with Harness(["127.0.0.1"]) as h:
            for auth in ("", h.auth("forged"), "Proxy-Authorization: Basic !!!\r\n"):
                reply, _, _ = await h.ask(f"CONNECT 127.0.0.1:{h.up_port} HTTP/1.1\r\n{auth}\r\n")
                assert reply.startswith(b"HTTP/1.1 407"), reply
                assert b'Proxy-Authenticate: Basic realm="sbx"' in reply
            assert [d.session_id for d in h.denials] == [None, None, None]
            assert h.received == [], "an unauthenticated request reached the upstream"

    run(go())


def test_a_host_off_the_list_is_refused_before_any_lookup():
    async def go():
        async with Harness(["allowed.example"]) as h:
            reply, reader, _ = await h.ask(
                f"CONNECT unlisted.invalid:443 HTTP/1.1\r\n{h.auth()}\r\n"
            )
            assert reply.startswith(b"HTTP/1.1 403"), reply
            body = await reader.read()
            assert b"unlisted.invalid:443 is not on this session's allowlist" in body
            (denial,) = h.denials
            assert (denial.session_id, denial.method) == ("s1", "CONNECT")
            assert denial.target == "unlisted.invalid:443" and "allowlist" in denial.reason

    run(go())


def test_a_listed_name_resolving_to_loopback_is_refused_without_an_operator_range():
    async def go():
        async with Harness(["localhost", "127.0.0.1"], ranges=[]) as h:
            for target in (f"localhost:{h.up_port}", f"127.0.0.1:{h.up_port}"):
                reply, reader, _ = await h.ask(f"CONNECT {target} HTTP/1.1\r\n{h.auth()}\r\n")
                assert reply.startswith(b"HTTP/1.1 403"), reply
                assert b"loopback, which sandboxes may not reach" in await reader.read()
            assert h.received == [] and len(h.denials) == 2

    run(go())


def test_the_gateways_own_ports_are_refused_even_in_an_allowed_range():
    async def go():
        async with Harness(["127.0.0.1"]) as h:
            h.proxy.guard.own_ports.add(h.up_port)
            for port in (h.up_port, h.port):
                reply, reader, _ = await h.ask(
                    f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n{h.auth()}\r\n"
                )
                assert reply.startswith(b"HTTP/1.1 403"), reply
                assert b"is the gateway itself" in await reader.read()

    run(go())


def test_release_cuts_open_tunnels_and_revokes_the_credentials():
    async def go():
        async with Harness(["127.0.0.1"]) as h:
            target = f"127.0.0.1:{h.up_port}"
            reply, reader, writer = await h.ask(f"CONNECT {target} HTTP/1.1\r\n{h.auth()}\r\n")
            assert reply.startswith(b"HTTP/1.1 200")
            writer.write(b"PING\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            h.proxy.release("s1")
            assert await asyncio.wait_for(reader.read(), 5) == b"", "the tunnel outlived release"
            reply, _, _ = await h.ask(f"CONNECT {target} HTTP/1.1\r\n{h.auth()}\r\n")
            assert reply.startswith(b"HTTP/1.1 407"), reply

    run(go())


def test_a_denial_flood_is_counted_not_logged_line_by_line():
    async def go():
        async with Harness([]) as h:
            for _ in range(30):
                reply, _, writer = await h.ask(f"CONNECT a.invalid:443 HTTP/1.1\r\n{h.auth()}\r\n")
                assert reply.startswith(b"HTTP/1.1 403")
                writer.close()
            assert len(h.denials) == h.proxy.reports_per_second
            await asyncio.sleep(1.05)
            await h.ask(f"CONNECT a.invalid:443 HTTP/1.1\r\n{h.auth()}\r\n")
            assert h.denials[-1].suppressed == 30 - h.proxy.reports_per_second

    run(go())


def test_an_upstream_that_never_answers_is_reported_as_timed_out():
    async def go():
        async with Harness(["127.0.0.1"]) as h:
            h.proxy.connect_timeout = 0.5
            # A listener whose accept queue is full: Linux drops further SYNs, so connects hang.
            with socket.socket() as full:
                full.bind(("127.0.0.1", 0))
                full.listen(0)
                port = full.getsockname()[1]
                queued = [socket.socket() for _ in range(3)]
                try:
                    for client in queued:
                        client.setblocking(False)
                        client.connect_ex(("127.0.0.1", port))
                    await asyncio.sleep(0.1)
                    reply, reader, _ = await h.ask(
                        f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n{h.auth()}\r\n"
                    )
                    body = await reader.read()
                finally:
                    for client in queued:
                        client.close()
            assert reply.startswith(b"HTTP/1.1 502"), reply
            assert body.strip().endswith(f"127.0.0.1:{port}: timed out".encode()), (
                f"the sandbox was told {body!r}, not that the connection timed out"
            )

    run(go())


def test_malformed_requests_get_400():
    async def go():
        async with Harness(["127.0.0.1"]) as h:
            for head in ("NONSENSE\r\n\r\n", f"GET https://x/ HTTP/1.1\r\n{h.auth()}\r\n"):
                reply, _, _ = await h.ask(head)
                assert reply.startswith(b"HTTP/1.1 400"), reply

    run(go())


def test_one_address_cannot_hold_more_than_its_share_of_connections():
    async def go():
        async with Harness(["127.0.0.1"]) as h:
            h.proxy.max_connections = 5
            for _ in range(5):  # idle connections that never send a request head
                _, writer = await asyncio.open_connection("127.0.0.1", h.port)
                h.clients.append(writer)
            reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
            h.clients.append(writer)
            assert await asyncio.wait_for(reader.read(), 5) == b"", "a sixth connection was served"
            for writer in h.clients:
                writer.close()
            await asyncio.sleep(0.2)
            reply, _, _ = await h.ask(f"CONNECT 127.0.0.1:{h.up_port} HTTP/1.1\r\n{h.auth()}\r\n")
            assert reply.startswith(b"HTTP/1.1 200"), "closed connections still counted"

    run(go())


def test_a_nul_in_the_target_cannot_cut_the_name_short_to_an_unlisted_host():
    """libc reads ``localhost\\0.allowed.example`` as ``localhost``: refused before matching."""

    async def go():
        async with Harness(["*.allowed.example"]) as h:
            target = f"localhost\x00.allowed.example:{h.up_port}"
            reply, reader, _ = await h.ask(f"CONNECT {target} HTTP/1.1\r\n{h.auth()}\r\n")
            assert reply.startswith(b"HTTP/1.1 400"), f"the sandbox reached localhost: {reply!r}"
            assert b"U+0000" in await reader.read()
            assert h.received == []
            (denial,) = h.denials
            assert denial.target == f"localhost\\x00.allowed.example:{h.up_port}", denial
            assert denial.target.isprintable() and "U+0000" in denial.reason

    run(go())


def test_bad_hosts_and_ports_in_targets_get_400_saying_why():
    async def go():
        async with Harness(["127.0.0.1", "*.allowed.example"]) as h:
            port = h.up_port
            for line, reason in [
                (f"CONNECT [allowed.example]:{port}", b"IPv6"),
                (f"CONNECT a..allowed.example:{port}", b"empty label"),
                (f"CONNECT user:pw@127.0.0.1:{port}", b"userinfo"),
                ("CONNECT 127.0.0.1:99999", b"port"),
                ("GET http://127.0.0.1:99999/ ", b"port"),
                (f"GET http://127.0.0.1:{port}:{port}/ ", b"':'"),
                (f"GET http://user@127.0.0.1:{port}/ ", b"userinfo"),
                (f"GET http://a\tb.allowed.example:{port}/ ", b"U+0009"),
            ]:
                reply, reader, _ = await h.ask(f"{line.strip()} HTTP/1.1\r\n{h.auth()}\r\n")
                assert reply.startswith(b"HTTP/1.1 400"), (line, reply)
                body = await reader.read()
                assert reason in body, (line, body)
            assert h.received == [] and len(h.denials) == 8

    run(go())


def test_an_ip_literal_in_another_notation_reaches_only_the_listed_address():
    async def go():
        async with Harness(["127.0.0.1"]) as h:
            for target in ("2130706433", "0x7f.1", "017700000001", "127.1", "[::ffff:127.0.0.1]"):
                reply, _, writer = await h.ask(
                    f"CONNECT {target}:{h.up_port} HTTP/1.1\r\n{h.auth()}\r\n"
                )
                assert reply.startswith(b"HTTP/1.1 200"), (target, reply)
                writer.close()
            reply, _, _ = await h.ask(f"CONNECT 127.2:{h.up_port} HTTP/1.1\r\n{h.auth()}\r\n")
            assert reply.startswith(b"HTTP/1.1 403"), reply

    run(go())


def test_plain_http_sends_the_checked_host_not_the_clients_host_header():
    """Else a listed address on a shared server would serve any virtual host it has."""

    async def go():
        async with Harness(["127.0.0.1"]) as h:
            url = f"http://127.0.0.1:{h.up_port}/"
            reply, reader, _ = await h.ask(
                f"GET {url} HTTP/1.1\r\nHost: evil.example\r\n{h.auth()}\r\n"
            )
            assert reply.startswith(b"HTTP/1.1 200"), reply
            await reader.read()
            sent = h.received[0].decode().lower()
            assert f"\r\nhost: 127.0.0.1:{h.up_port}\r\n" in sent, sent
            assert "evil.example" not in sent, f"the upstream was asked for evil.example: {sent}"

    run(go())


def test_slow_name_lookups_cannot_starve_the_gateways_worker_threads(monkeypatch):
    """A sandbox resolving names that never answer ties up the proxy's few resolver threads only."""
    release = threading.Event()
    real = socket.getaddrinfo
    lookups = {"now": 0, "most": 0}

    def resolver(host, *args, **kw):  # the system resolver, facing a black hole for slow.example
        if host != "slow.example":
            return real(host, *args, **kw)
        lookups["now"] += 1
        lookups["most"] = max(lookups["most"], lookups["now"])
        release.wait(30)
        lookups["now"] -= 1
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", resolver)

    async def go():
        async with Harness(["slow.example"]) as h:
            h.proxy.dns_timeout = 1.0
            try:
                asks = [
                    h.ask(f"CONNECT slow.example:443 HTTP/1.1\r\n{h.auth()}\r\n") for _ in range(40)
                ]
                pending = asyncio.gather(*asks)
                await asyncio.sleep(0.3)
                loop = asyncio.get_running_loop()
                started = loop.time()
                await asyncio.wait_for(loop.run_in_executor(None, lambda: None), 10)
                waited = loop.time() - started
                replies = await pending
            finally:
                release.set()
            assert waited < 0.5, (
                f"a worker-thread call of another session waited {waited:.1f} s behind "
                "a sandbox's slow name lookups"
            )
            for reply, reader, _ in replies:
                assert reply.startswith(b"HTTP/1.1 504"), reply
                assert b"slow.example" in await reader.read()
            assert lookups["most"] <= EgressProxy.DNS_THREADS, lookups

    run(go())


def test_a_sessions_secret_in_a_denied_host_is_masked_in_logs_and_reports(caplog):
    secret = "s3cretvalue42"

    async def go():
        async with Harness(["allowed.example"]) as h:
            h.proxy.redact = lambda session_id, text: text.replace(secret, f"***{session_id}***")
            await h.ask(f"CONNECT {secret}.exfil.invalid:443 HTTP/1.1\r\n{h.auth()}\r\n")
            (denial,) = h.denials
            assert denial.target == "***s1***.exfil.invalid:443"
            assert secret not in denial.reason

    with caplog.at_level("DEBUG", logger="gateway.egress"):
        run(go())
    assert "***s1***" in caplog.text and secret not in caplog.text


def client_hello(server_name: str) -> bytes:
    """A real TLS ClientHello naming ``server_name``, from the ssl module."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_every_connection_is_recorded_with_its_rule_sni_bytes_and_decision():
    async def go():
        async with Harness(["127.0.0.1", "allowed.example"]) as h:
            records = []
            h.proxy.on_connection = records.append
            reply, reader, writer = await h.ask(
                f"CONNECT 127.0.0.1:{h.up_port} HTTP/1.1\r\n{h.auth()}\r\n"
            )
            assert reply.startswith(b"HTTP/1.1 200")
            hello = client_hello("sni.example")
            writer.write(hello + b"\r\n\r\n")
            await writer.drain()
            await reader.read(64)  # the upstream answers, then closes
            writer.close()
            await h.ask(f"CONNECT unlisted.invalid:443 HTTP/1.1\r\n{h.auth()}\r\n")
            for _ in range(100):
                if len(records) == 2:
                    break
                await asyncio.sleep(0.05)
            allowed, denied = records
            assert (allowed.session_id, allowed.method, allowed.host, allowed.port) == (
                "s1", "CONNECT", "127.0.0.1", h.up_port
            )  # fmt: skip
            assert allowed.decision == "allowed" and allowed.rule == "127.0.0.1"
            assert allowed.sni == "sni.example", "the TLS server name was not read"
            assert allowed.bytes_up == len(hello) + 4 and allowed.bytes_down > 0
            assert allowed.duration_ms > 0
            assert (denied.decision, denied.rule, denied.host) == (
                "denied",
                None,
                "unlisted.invalid",
            )
            assert "allowlist" in denied.reason and denied.bytes_up == denied.bytes_down == 0

    run(go())


@pytest.mark.parametrize("cut", [0, 5, 9, 40, 100])
def test_a_cut_or_garbled_client_hello_is_no_name(cut):
    hello = client_hello("sni.example")
    assert server_name(hello) == "sni.example"
    assert server_name(hello[:cut]) is None
    assert server_name(b"\x16\x03\x01\xff\xff" + b"\xff" * cut) is None


def test_a_first_connection_waits_for_the_host_hook_once_per_host():
    async def scenario():
        async with Harness(["127.0.0.1"]) as h:
            asked: list[str] = []
            answer = asyncio.get_running_loop().create_future()

            async def hook(session_id: str, target: str) -> bool:
                asked.append(f"{session_id} {target}")
                return await answer

            h.proxy.on_new_host = hook
            target = f"127.0.0.1:{h.up_port}"
            head = f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{h.auth()}\r\n"
            first = asyncio.ensure_future(h.ask(head))
            second = asyncio.ensure_future(h.ask(head))
            await asyncio.sleep(0.3)
            assert not first.done() and not second.done(), "the connections did not wait"
            answer.set_result(True)
            replies = [(await first)[0], (await second)[0]]
            third, _, _ = await h.ask(head)
            h.proxy.on_new_host = None
            return asked, replies, third

    asked, replies, third = run(scenario())
    assert len(asked) == 1 and asked[0].startswith("s1 127.0.0.1:"), asked
    assert all(r.startswith(b"HTTP/1.1 200") for r in [*replies, third]), replies


def test_a_host_the_hook_refuses_is_a_reported_403():
    async def scenario():
        async with Harness(["127.0.0.1"]) as h:

            async def hook(session_id: str, target: str) -> bool:
                return False

            h.proxy.on_new_host = hook
            target = f"127.0.0.1:{h.up_port}"
            reply, _, _ = await h.ask(f"CONNECT {target} HTTP/1.1\r\n{h.auth()}\r\n")
            return reply, h.denials, h.received

    reply, denials, received = run(scenario())
    assert reply.startswith(b"HTTP/1.1 403"), reply
    assert denials and "not approved" in denials[-1].reason
    assert received == [], "the refused host was connected to"
