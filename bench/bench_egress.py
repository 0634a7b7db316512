"""Egress: a brokered credential's interception against a plain tunnel and a direct request,
and the time from a rules change to the rules holding.

Usage: .venv/bin/python bench/bench_egress.py [--n 300]

An HTTPS origin with its own authority runs on this machine's loopback, and
the gateway's egress proxy in this process on a loop of its own. Each request
is a fresh connection and one ``GET`` (an intercepted tunnel carries one
request), taken three ways in alternation: straight to the origin (the floor:
TCP, TLS, the request), through a plain ``CONNECT`` tunnel (TLS end to end),
and through a tunnel to a bound host (the proxy ends TLS with the session's
authority, adds the header, opens TLS to the origin). Then the rules are
narrowed and widened ``n`` times, each time timing ``update`` and the first
connection after it that the new rules decide (refused, or let through).
With ``--gateway`` it also times ``PATCH /v1/sessions/{id}/network`` on a real
gateway and session (Docker): the rules hold when it answers.
Writes the table into docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ipaddress
import socket
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import ROOT, Gateway, median, pct, write_section

sys.path.insert(0, str(ROOT / "tests"))
from helpers import origin_authority  # the tests' HTTPS origin and its authority

from gateway.egress.credentials import Broker, Credential, SessionCA, placeholder, upstream_context
from gateway.egress.policy import AddressGuard, NetworkPolicy
from gateway.egress.proxy import EgressProxy

KEY = b"b" * 32
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


class Bench:
    """The origin and the proxy on a loop thread; blocking clients time them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.call(self._start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self) -> None:
        self.ca_file, server = origin_authority(self.tmp)
        origin = await asyncio.start_server(self._answer, "127.0.0.1", 0, ssl=server)
        self.origin_port = origin.sockets[0].getsockname()[1]
        guard = AddressGuard([ipaddress.ip_network("127.0.0.0/8")], set())
        self.proxy = EgressProxy(guard, KEY, max_connections=1024)
        self.port = await self.proxy.start("127.0.0.1", range(0, 1))
        ca = SessionCA(KEY, "s1", upstream_context(self.ca_file))
        bound = Credential.parse(
            {"secret": "T", "hosts": ["localhost"], "format": "Bearer {value}"}
        )
        broker = Broker((bound,), {"T": "v" * 40}, {"T": placeholder(KEY, "s1", "T")}, ca)
        self.wide = NetworkPolicy.parse({"allow": ["localhost", "127.0.0.1"]})
        self.narrow = NetworkPolicy.parse({"allow": ["localhost"]})
        token = self.proxy.admit("s1", self.wide, broker)
        self.auth = base64.b64encode(f"s1:{token}".encode()).decode()
        (self.tmp / "bundle.pem").write_bytes(ca.bundle())
        self.trust_origin = ssl.create_default_context(cafile=str(self.ca_file))
        self.trust_session = ssl.create_default_context(cafile=str(self.tmp / "bundle.pem"))

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(ANSWER)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        writer.transport.abort()

    def _tunnel(self, target: str) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port))
        s.sendall(
            f"CONNECT {target} HTTP/1.1\r\nProxy-Authorization: Basic {self.auth}\r\n\r\n".encode()
        )
        reply = s.recv(100)
        if b" 200 " not in reply:
            s.close()
            raise ConnectionRefusedError(reply.split(b"\r\n")[0].decode())
        return s

    def get(self, how: str) -> float:
        """Milliseconds for one fresh connection and one GET, ``how``: direct, tunnel, bound."""
        t0 = time.perf_counter()
        if how == "direct":
            raw, name, context = (
                socket.create_connection(("127.0.0.1", self.origin_port)),
                "localhost",
                self.trust_origin,
            )
        elif how == "tunnel":
            raw, name, context = (
                self._tunnel(f"127.0.0.1:{self.origin_port}"),
                "localhost",
                self.trust_origin,
            )
        else:
            raw, name, context = (
                self._tunnel(f"localhost:{self.origin_port}"),
                "localhost",
                self.trust_session,
            )
        with context.wrap_socket(raw, server_hostname=name) as s:
            s.sendall(f"GET / HTTP/1.1\r\nHost: localhost:{self.origin_port}\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        assert data.endswith(b"ok"), data
        return (time.perf_counter() - t0) * 1000

    def change(self, policy: NetworkPolicy, expect_refused: bool) -> tuple[float, float]:
        """Microseconds for ``update``, and milliseconds until a connection it decides."""
        t0 = time.perf_counter()
        update = self.call(self._update(policy))
        try:
            self._tunnel(f"127.0.0.1:{self.origin_port}").close()
            refused = False
        except ConnectionRefusedError:
            refused = True
        assert refused is expect_refused
        return update, (time.perf_counter() - t0) * 1000

    async def _update(self, policy: NetworkPolicy) -> float:
        """Microseconds ``update`` takes on the proxy's loop."""
        t0 = time.perf_counter()
        self.proxy.update("s1", policy)
        return (time.perf_counter() - t0) * 1e6


def patch_round_trips(n: int) -> list[float]:
    """Milliseconds of PATCH /v1/sessions/{id}/network on a real gateway (the rules hold
    when it answers), narrowing and widening in turn."""
    with tempfile.TemporaryDirectory() as data, Gateway(data) as gw:
        sid = gw.client.post("/v1/sessions", json={"network": {"allow": ["a.example"]}}).json()[
            "id"
        ]
        times = []
        for i in range(n):
            body = {"allow": ["a.example", "b.example"] if i % 2 else ["a.example"]}
            t0 = time.perf_counter()
            assert gw.client.patch(f"/v1/sessions/{sid}/network", json=body).status_code == 200
            times.append((time.perf_counter() - t0) * 1000)
        gw.client.delete(f"/v1/sessions/{sid}")
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="requests each way")
    parser.add_argument("--gateway", action="store_true", help="also time PATCH on a gateway")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp))
        times: dict[str, list[float]] = {"direct": [], "tunnel": [], "bound": []}
        for how in times:  # warm: the leaf certificate is made on the first bound tunnel
            bench.get(how)
        for _ in range(args.n):
            for how in times:
                times[how].append(bench.get(how))
        updates, holds = [], []
        for i in range(args.n):
            update, hold = bench.change(bench.narrow if i % 2 == 0 else bench.wide, i % 2 == 0)
            updates.append(update)
            holds.append(hold)
    labels = {
        "direct": "fresh connection + GET, straight to the origin (the floor)",
        "tunnel": "the same through a plain CONNECT tunnel (TLS end to end)",
        "bound": "the same through a tunnel to a bound host (intercepted, header added)",
    }
    measured = [(label, times[how], "ms", 2) for how, label in labels.items()]
    measured += [
        ("`update` on the proxy's loop: a session's rules swapped", updates, "µs", 1),
        ("from a change to a connection the new rules decided", holds, "ms", 2),
    ]
    if args.gateway:
        label = "`PATCH .../network` on a gateway (the rules hold when it answers)"
        measured.append((label, patch_round_trips(args.n), "ms", 2))
    rows = ["| measure | median | p95 |", "| --- | --- | --- |"]
    for label, values, unit, places in measured:
        middle, high = median(values), pct(values, 95)
        rows.append(f"| {label} | {middle:.{places}f} {unit} | {high:.{places}f} {unit} |")
    cost = median(times["bound"]) - median(times["tunnel"])
    rows.insert(
        5, f"| interception's cost per request (bound minus tunnel, medians) | {cost:.2f} ms | |"
    )
    for row in rows:
        print(row)
    about = (
        f"{args.n} requests each way, in alternation, each on a fresh connection; the origin "
        "and the proxy on this machine's loopback (no network in between: the cost measured is "
        "the proxy's own). Target: the rules hold within one second of a change."
    )
    write_section("bench_egress", "Egress: brokered credentials and live rule changes", about, rows)


if __name__ == "__main__":
    main()
