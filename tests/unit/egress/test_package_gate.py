"""The package and npm gates read hostile requests strictly, as a sandbox's code may send them.

Each test drives a real ``PackageGate`` on its Unix sockets, in front of a stand-in
cache (a loopback server recording every request head it is sent): only what pip
and npm send reaches the cache, a tenant's lists decide every package file
however its target is written, and one session's connections are bounded while
another session's gate keeps answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.egress.npm import NpmCache
from gateway.egress.packages import PackageCache, PackageGate, PackagePolicy

WHEEL = "/root/sbx/+f/472/1f391ed90541f/six-1.17.0-py2.py3-none-any.whl"
TARBALL = "/is-number/-/is-number-7.0.0.tgz"


class Upstream:
    """The cache's stand-in: records each request head, answers 200 (or waits for ``held``)."""

    def __init__(self) -> None:
        self.heads: list[str] = []
        self.held: asyncio.Event | None = None
        self.body = b"package bytes"
        self.ended = 0  # connections the cache saw end
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            self.heads.append((await reader.readuntil(b"\r\n\r\n")).decode("latin-1"))
            if self.held is not None:
                await self.held.wait()
            body = self.body
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        writer.close()
        self.ended += 1


@dataclasses.dataclass
class Gates:
    gate: PackageGate
    upstream: Upstream
    sockets: dict[str, Path]

    async def ask(self, raw: bytes, session: str = "s1", pause: float = 0) -> tuple[int, str]:
        """Send ``raw`` (at once, or a byte each ``pause``) and read the answer."""
        return status_of(await asyncio.to_thread(exchange, self.sockets[session], raw, pause))


def exchange(path: Path, raw: bytes, pause: float) -> bytes:
    """A plain socket's exchange: what the gate answered is read even after it stopped reading."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        with contextlib.suppress(OSError):
            for piece in [raw[i : i + 1] for i in range(len(raw))] if pause else [raw]:
                sock.sendall(piece)
                time.sleep(pause)
        answer = b""
        with contextlib.suppress(OSError):
            while data := sock.recv(65536):
                answer += data
        return answer


def status_of(answer: bytes) -> tuple[int, str]:
    """The status and reason phrase of an answer; 0 for none (the connection just closed)."""
    line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ", 2)
    return (int(parts[1]), parts[2] if len(parts) > 2 else "") if len(parts) > 1 else (0, "")


def get(target: str, *headers: str, method: str = "GET") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1:3141", *headers, "", ""]
    return "\r\n".join(lines).encode("latin-1")


@contextlib.asynccontextmanager
async def gates(
    tmp_path: Path, npm: bool = False, policy: PackagePolicy | None = None, **bounds: float
) -> AsyncIterator[Gates]:
    """A gate for sessions ``s1`` and ``canary`` in front of a stand-in cache."""
    upstream = Upstream()
    cache = (NpmCache if npm else PackageCache)(tmp_path / "cache")
    cache.port = await upstream.start()
    gate = PackageGate(cache, lambda _: policy or PackagePolicy(), **bounds)
    sockets = {}
    for session in ("s1", "canary"):
        run_dir = tmp_path / session / "run"
        run_dir.mkdir(parents=True)
        await gate.open(session, run_dir)
        sockets[session] = run_dir / cache.socket_name
    try:
        yield Gates(gate, upstream, sockets)
    finally:
        gate.stop()
        assert upstream.server is not None
        upstream.server.close()


def run(test, tmp_path: Path, **kwargs):
    async def main():
        async with gates(tmp_path, **kwargs) as g:
            return await test(g)

    return asyncio.run(main())


# -- only the requests pip and npm send ------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_only_get_and_head_reach_the_cache(tmp_path, method):
    async def test(g: Gates):
        status, reason = await g.ask(get("/root/sbx/+simple/six/", method=method))
        assert (status, g.upstream.heads) == (405, []), reason
        assert "GET and HEAD" in reason
        assert (await g.ask(get("/root/sbx/+simple/six/", method="HEAD")))[0] == 200

    run(test, tmp_path)


@pytest.mark.parametrize(
    "line",
    [
        f"GET http://127.0.0.1:3141{WHEEL} HTTP/1.1",  # absolute-form: the cache would serve it
        "GET 127.0.0.1:3141 HTTP/1.1",  # authority-form
        "CONNECT 127.0.0.1:3141 HTTP/1.1",
        "GET * HTTP/1.1",
        f"GET {WHEEL} HTTP/2.0",
        f"GET {WHEEL}",
        f"GET  {WHEEL} HTTP/1.1",
        f"GET {WHEEL}#frag HTTP/1.1",
    ],
)
def test_only_origin_form_http1_requests_reach_the_cache(tmp_path, line):
    async def test(g: Gates):
        status, reason = await g.ask(f"{line}\r\nHost: x\r\n\r\n".encode())
        assert status in (400, 405) and not g.upstream.heads, (status, reason, g.upstream.heads)

    run(test, tmp_path, policy=PackagePolicy(deny=("six",)))


@pytest.mark.parametrize(
    "headers",
    [
        ("Content-Length: 5",),
        ("Transfer-Encoding: chunked",),
        ("Content-Length: 0", "Content-Length: 5"),
    ],
)
def test_a_request_with_a_body_is_refused(tmp_path, headers):
    async def test(g: Gates):
        status, reason = await g.ask(get("/root/sbx/+simple/six/", *headers) + b"hello")
        assert status in (400, 413) and not g.upstream.heads, (status, reason)
        assert "bod" in reason.lower() or "content-length" in reason.lower()

    run(test, tmp_path)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([f"X-Pad-{i}: {i}" for i in range(150)], 431),  # more than 100 header lines
        ([f"X-Pad: {'a' * 20000}"], 431),  # a head over 16 KiB
        (["X-Folded: a", " b"], 400),  # an obsolete line fold
        (["No colon here"], 400),
        (["Bad Name: x"], 400),
        (["X-Bare: a\nX-Smuggled: b"], 400),  # a bare LF inside the head
    ],
)
def test_malformed_or_oversized_heads_are_refused(tmp_path, headers, status):
    async def test(g: Gates):
        answer = await g.ask(get("/root/sbx/+simple/six/", *headers))
        assert answer[0] == status and not g.upstream.heads, answer

    run(test, tmp_path)


def test_headers_that_speak_to_the_cache_itself_are_not_forwarded(tmp_path):
    async def test(g: Gates):
        extra = ("X-Devpi-Auth: cm9vdDp4", "X-Outside-Url: http://elsewhere", "Authorization: x")
        assert (await g.ask(get("/root/sbx/+simple/six/", "Accept: text/html", *extra)))[0] == 200
        (head,) = g.upstream.heads
        assert head.startswith("GET /root/sbx/+simple/six/ HTTP/1.1\r\n")
        assert "Accept: text/html" in head
        for header in ("X-Devpi-Auth", "X-Outside-Url", "Authorization"):
            assert header.lower() not in head.lower()

    run(test, tmp_path)


def test_a_head_trickled_in_slowly_is_cut_off_with_408(tmp_path):
    async def test(g: Gates):
        started = time.monotonic()
        status, reason = await g.ask(get("/root/sbx/+simple/six/"), pause=0.05)
        assert status == 408 and not g.upstream.heads, (status, reason)
        assert time.monotonic() - started < 1.5

    run(test, tmp_path, head_timeout=0.5)


def test_an_answer_the_sandbox_never_reads_lets_the_cache_go(tmp_path):
    async def test(g: Gates):
        g.upstream.body = b"x" * (16 << 20)
        _, writer = await asyncio.open_unix_connection(str(g.sockets["s1"]))
        writer.write(get(WHEEL))  # and never read
        await asyncio.sleep(2)
        assert g.upstream.ended == 1, "the cache's connection is still held"
        writer.close()

    run(test, tmp_path, idle_timeout=0.5)


@pytest.mark.parametrize(
    "target",
    ["/+api", "/+login", "/root/pypi/+simple/six/", "/root/sbx", "/root/sbx/+simple/",
     "/root/sbx/+e/https_files/six-1.17.0-py2.py3-none-any.whl"],
)  # fmt: skip
def test_only_the_mirror_index_pip_is_given_is_served(tmp_path, target):
    async def test(g: Gates):
        status, reason = await g.ask(get(target))
        assert status == 404 and not g.upstream.heads, (status, reason)

    run(test, tmp_path)


@pytest.mark.parametrize(
    "target",
    ["/-/whoami", "/-/npm/v1/security/advisories/bulk", "/-/v1/login", "/is-number/7.0.0/x"],
)
def test_only_packuments_and_tarballs_reach_the_npm_cache(tmp_path, target):
    async def test(g: Gates):
        status, reason = await g.ask(get(target))
        assert status == 404 and not g.upstream.heads, (status, reason)
        assert (await g.ask(get("/-/ping")))[0] == 200

    run(test, tmp_path, npm=True)


# -- the lists decide every package file, however its target is written ----------------------


@pytest.mark.parametrize(
    "target",
    [
        WHEEL,
        WHEEL + "?x=1",
        WHEEL.replace("+f", "%2Bf"),
        WHEEL.replace("six-", "%73ix-"),
        WHEEL.replace("six-", "SIX-"),
        WHEEL.replace("/root/sbx", "/root//sbx"),
        WHEEL.replace("/472/", "/472/../472/"),
        WHEEL.replace("/472/", "/472/./"),
        WHEEL.replace("/472/", "/472%2F..%2F472/"),
        WHEEL + "/",
        WHEEL + "%00",
        WHEEL.replace("six-", "six%252F"),
        WHEEL.replace("six-1.17.0-py2.py3-none-any.whl", "six.whl"),  # names no version
        WHEEL + ".metadata",
        f"http://127.0.0.1:3141{WHEEL}",
    ],
)
def test_a_denied_pip_package_file_never_reaches_the_cache(tmp_path, target):
    async def test(g: Gates):
        status, reason = await g.ask(get(target))
        assert status in (400, 403, 404) and not g.upstream.heads, (status, reason)

    run(test, tmp_path, policy=PackagePolicy(deny=("six",)))


def test_project_names_compare_as_pep_503_folds_them(tmp_path):
    async def test(g: Gates):
        target = "/root/sbx/+f/abc/0123456789abc/Zope_Interface-6.0.tar.gz"
        status, reason = await g.ask(get(target))
        assert status == 403 and "zope-interface is on the deny list" in reason, reason
        assert not g.upstream.heads

    run(test, tmp_path, policy=PackagePolicy(deny=("zope.interface",)))


@pytest.mark.parametrize(
    "target",
    [
        TARBALL,
        TARBALL + "?cache=bust",
        TARBALL.replace("/is-number/", "/IS-NUMBER/"),
        TARBALL.replace("/is-number/-/", "/is-number%2F-%2F"),
        "/" + TARBALL,
        "/x/.." + TARBALL,
        TARBALL.replace("/-/", "/-/./"),
        "/@acme/secret/-/secret-1.0.0.tgz",
        "/@acme%2fsecret/-/secret-1.0.0.tgz",
        "/@ACME%2Fsecret/-/secret-1.0.0.tgz",
        "/@acme%252fsecret/-/secret-1.0.0.tgz",
        "/is-number/-/other-7.0.0.tgz",  # a tarball named for another package
    ],
)
def test_a_denied_npm_tarball_never_reaches_the_cache(tmp_path, target):
    async def test(g: Gates):
        status, reason = await g.ask(get(target))
        assert status in (400, 403, 404) and not g.upstream.heads, (status, reason)

    run(test, tmp_path, npm=True, policy=PackagePolicy(deny=("is-number", "@acme/secret")))


def test_a_pinned_npm_package_is_refused_a_tarball_its_name_does_not_date(tmp_path):
    async def test(g: Gates):
        for target in ("/is-number/-/x.tgz", "/is-number/-/is-number.tgz"):
            status, reason = await g.ask(get(target))
            assert status == 403 and not g.upstream.heads, (target, status, reason)
        assert (await g.ask(get("/is-number/-/is-number-6.0.0.tgz")))[0] == 200

    run(test, tmp_path, npm=True, policy=PackagePolicy(allow=("is-number@6.0.0",)))


def test_what_npm_sends_is_forwarded_as_npm_sends_it(tmp_path):
    async def test(g: Gates):
        for target in ("/@types%2fnode", "/@types/node/-/node-22.0.0.tgz", "/is-number"):
            assert (await g.ask(get(target, "Accept: application/vnd.npm.install-v1+json")))[
                0
            ] == 200
        assert [h.split("\r\n", 1)[0] for h in g.upstream.heads] == [
            "GET /@types%2fnode HTTP/1.1",
            "GET /@types/node/-/node-22.0.0.tgz HTTP/1.1",
            "GET /is-number HTTP/1.1",
        ]

    run(test, tmp_path, npm=True)


# -- one session's share ---------------------------------------------------------------------


def test_one_sessions_connections_are_bounded_and_another_session_keeps_its_gate(tmp_path):
    async def test(g: Gates):
        g.upstream.held = asyncio.Event()
        held = []
        for _ in range(8):  # in flight at the cache, waiting for it
            reader, writer = await asyncio.open_unix_connection(str(g.sockets["s1"]))
            writer.write(get("/root/sbx/+simple/six/"))
            held.append((reader, writer))
        for _ in range(8):  # idle: no head yet
            held.append(await asyncio.open_unix_connection(str(g.sockets["s1"])))
        await asyncio.sleep(0.2)
        status, reason = await g.ask(get("/root/sbx/+simple/six/"))
        assert status in (429, 503), (status, reason)
        assert "connections" in reason
        assert len(g.upstream.heads) <= 8
        canary = asyncio.create_task(g.ask(get("/root/sbx/+simple/six/"), session="canary"))
        await asyncio.sleep(0.2)
        g.upstream.held.set()  # the canary's request reached the cache beside s1's
        assert (await canary)[0] == 200
        for _, writer in held:
            writer.close()
        await asyncio.sleep(0.2)
        assert (await g.ask(get("/root/sbx/+simple/six/")))[0] == 200  # s1 again, once done

    run(test, tmp_path)
