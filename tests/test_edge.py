"""The HTTP edge before authentication: what a caller without a token can make the gateway do.

Attacks come from raw sockets (a client library would not send what an
attacker sends). While they run, a canary session on the same gateway keeps
answering a trivial execute, and the gateway's memory is read from /proc.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import threading
import time
import urllib.parse

import httpx
import pytest
from helpers import Canary, GatewayProcess, memory_kib, wait_for

pytestmark = pytest.mark.docker

MiB = 2**20
SENTINEL = "edge-sentinel-3e9b1c7d"  # a token-shaped secret that must never reach the log


@pytest.fixture(scope="module")
def gw(start_gateway) -> GatewayProcess:
    # Environment settings, as an operator would set them (a gateway that lacks one ignores it).
    return start_gateway(
        env={"SBX_IDLE_CONNECTION_TIMEOUT": "2", "SBX_BODY_TIMEOUT": "2"},
    )


def connect(gw: GatewayProcess) -> socket.socket:
    url = urllib.parse.urlsplit(gw.url)
    return socket.create_connection((url.hostname, url.port), timeout=10)


def read_answer(sock: socket.socket, timeout: float = 10) -> bytes:
    """What the gateway sent back until it closed or went quiet (b"" if it reset)."""
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and b'"error"' in data:
                break
    return data


def post_headers(path: str, length: int, token: str | None = None, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{auth}{extra}\r\n"
    ).encode()


def blind_upload(gw: GatewayProcess, size: int, token: str | None, box: dict) -> None:
    """Send a whole body without waiting for an answer, as a naive client does."""
    sent = 0
    sock = connect(gw)
    try:
        sock.sendall(post_headers("/v1/sessions", size, token))
        block = b" " * MiB
        with contextlib.suppress(OSError):  # the gateway may stop reading and hang up
            while sent < size:
                sent += sock.send(block[: size - sent])
        box["answer"] = read_answer(sock)
    finally:
        box["sent"] = sent
        sock.close()


@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_anonymous_bodies_are_refused_without_being_buffered(gw, canary, token):
    before = memory_kib(gw.pid)
    boxes: list[dict] = [{} for _ in range(4)]
    senders = [
        threading.Thread(target=blind_upload, args=(gw, 60 * MiB, token, box)) for box in boxes
    ]
    with Canary(gw, canary):
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(120)
    after = memory_kib(gw.pid)
    grown = (after["VmHWM"] - before["VmRSS"]) // 1024
    print(f"gateway RSS {before['VmRSS'] // 1024} MiB before, peak {after['VmHWM'] // 1024} MiB")
    assert grown < 32, (
        f"four anonymous 60 MiB bodies made the gateway grow by {grown} MiB: "
        "it buffered bodies of callers it had not authenticated"
    )
    for box in boxes:
        answer = box.get("answer", b"")
        # The refusal comes from the headers: either the client read it, or the gateway
        # hung up long before the whole body was in (and never read the rest).
        assert answer.startswith(b"HTTP/1.1 401") or box["sent"] < 60 * MiB, (
            f"an anonymous 60 MiB body was read in full and answered {answer[:200]!r}"
        )
        if answer:
            assert answer.startswith(b"HTTP/1.1 401"), answer[:300]
            assert b'"unauthorized"' in answer and b"token" in answer, answer[:300]


def test_an_anonymous_client_that_waits_for_100_continue_gets_its_401_at_once(gw):
    sock = connect(gw)
    with sock:
        sock.sendall(post_headers("/v1/sessions", 60 * MiB, extra="Expect: 100-continue\r\n"))
        answer = read_answer(sock, timeout=5)
    assert answer.startswith(b"HTTP/1.1 401"), (
        f"the gateway asked for a 60 MiB body from a caller without a token: {answer[:200]!r}"
    )
    assert b"www-authenticate: bearer" in answer.lower() and b'"unauthorized"' in answer, answer


def test_a_small_anonymous_body_still_gets_a_json_401(gw):
    r = httpx.post(gw.url + "/v1/sessions", json={"kernel": "python3"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", r.text


def test_an_authenticated_oversized_body_is_answered_not_reset(gw):
    # The answer after the whole body: a client that sends it all still reads the 413.
    r = gw.client.post("/v1/sessions/x/execute", content=b" " * (17 * MiB))
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large", r.text


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the gateway closes the connection within ``seconds``."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_slow_headers_and_stalled_bodies_are_cut_off(gw):
    slow_headers = connect(gw)
    stalled_body = connect(gw)
    with slow_headers, stalled_body:
        slow_headers.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: 1")
        stalled_body.sendall(post_headers("/v1/sessions", 1000, extra="") + b"{")
        started = time.monotonic()
        assert closed_within(slow_headers, 8), "a connection sending headers forever stays open"
        assert closed_within(stalled_body, 8), "an anonymous body that never ends keeps its socket"
        assert time.monotonic() - started < 8


def test_authentication_failures_are_folded_per_address_and_minute(start_gateway):
    gw = start_gateway()
    for n in range(40):
        r = httpx.get(gw.url + "/v1/sessions", headers={"Authorization": f"Bearer bad-{n}"})
        assert r.status_code == 401
    time.sleep(0.5)  # the log is read from the gateway's stderr by a thread
    lines = [line for line in gw.log if "auth.failure" in line or " 401 " in line]
    r = gw.client.get("/v1/audit", params={"action": "auth.failure"})
    assert r.status_code == 200
    events = r.json()["events"]
    assert len(events) == 1, f"40 failures from one address made {len(events)} audit events"
    assert len(lines) <= 2, "40 failures from one address made these log lines:\n" + "".join(lines)
    gw.stop()  # the minute's tally is written when it ends, or when the gateway stops
    with contextlib.closing(sqlite3.connect(gw.data_dir / "gateway.sqlite3")) as db:
        rows = db.execute(
            "SELECT detail FROM audit WHERE action = 'auth.failure' ORDER BY rowid"
        ).fetchall()
    assert len(rows) == 2, rows
    assert '"count": 39' in rows[1][0], rows


def test_a_token_never_reaches_the_log(gw):
    before = len(gw.log)
    # A valid token in a query whose key is percent-encoded authenticates...
    r = httpx.get(gw.url + "/v1/sessions?%74oken=" + gw.token)
    assert r.status_code == 200, r.text
    # ...bytes that are not UTF-8 make Tornado refuse the argument, with its value...
    r = httpx.get(gw.url + "/v1/sessions?token=%FF" + SENTINEL)
    assert r.status_code == 400, r.text
    r = httpx.get(
        gw.url + "/v1/sessions/nope/stream?token=%FF" + SENTINEL,
        headers={"Connection": "Upgrade", "Upgrade": "websocket"},
    )
    assert r.status_code == 400, r.text
    r = httpx.get(gw.url + "/v1/sessions?token=" + SENTINEL)
    assert r.status_code == 401, r.text
    # ...and a header Tornado cannot parse is quoted in its "Malformed HTTP message" line.
    sock = connect(gw)
    with sock:
        header = f"Authorization: Bearer {SENTINEL}\x01"
        sock.sendall(f"GET /v1/sessions HTTP/1.1\r\nHost: g\r\n{header}\r\n\r\n".encode())
        read_answer(sock, timeout=5)
    wait_for(lambda: len(gw.log) > before + 3, timeout=5)
    time.sleep(0.5)
    logged = "".join(gw.log[before:])
    assert gw.token not in logged and SENTINEL not in logged, (
        "a token reached the gateway's log:\n" + logged
    )
