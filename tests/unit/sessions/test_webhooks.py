"""Lifecycle webhooks without Docker: signatures, backoff, retries, bounds, restarts.

Receivers are ``httpx.MockTransport`` handlers; the store is SQLite in a temporary
directory (its claims: tests/unit/store/test_webhook_deliveries.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import ipaddress
import json
import re
import socket
import threading
import time

import httpx
import pytest

from gateway.access.auth import Principal
from gateway.egress.policy import AddressGuard
from gateway.errors import ConfigError
from gateway.policy.approvals import ApprovalDesk
from gateway.policy.model import Decision
from gateway.sessions.events import SessionEvents, event
from gateway.sessions.webhooks import (
    Endpoint,
    WebhookOptions,
    Webhooks,
    backoff,
    read_endpoints,
    secret_key,
    sign,
    verify,
)
from gateway.store.sqlite import SQLiteStore

KEY = b"a-secret-of-sixteen+"
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


def endpoints(url: str = "http://127.0.0.1:9/hook", **extra) -> dict:
    return {"acme": (Endpoint("acme", "main", url, KEY, **extra),)}


def hooks(store, handler, allow=LOOPBACK, found=None, **options) -> Webhooks:
    options = {"timeout": 1.0, "backoff": 0.01, "poll": 0.02, "allow_ranges": allow} | options
    opts = WebhookOptions(**options)
    guard = AddressGuard(list(opts.allow_ranges), set())
    return Webhooks(store, found or endpoints(), opts, guard, httpx.MockTransport(handler))


def lifecycle(kind: str = "created", session_id: str = "s1", tenant: str = "acme") -> dict:
    return event(kind, tenant, session_id, "python3", {"state": "idle"})


async def opened(path) -> SQLiteStore:
    store = SQLiteStore(path / "db.sqlite3")
    await store.open()
    return store


async def until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def states(store, tenant="acme"):
    async def read():
        page = await store.deliveries(tenant, None, None, 100)
        return [row["state"] for row in reversed(page)]

    return read


def test_a_signature_verifies_and_a_changed_body_an_old_stamp_or_another_key_do_not():
    body = b'{"type": "sandbox.lifecycle.created"}'
    now = int(time.time())
    headers = {"webhook-id": "e1", "webhook-timestamp": str(now),
               "webhook-signature": sign(KEY, "e1", now, body)}  # fmt: skip
    verify(KEY, headers, body)
    for key, wrong_body, at in ((KEY, body + b" ", now), (b"other-key-0123456", body, now),
                                (KEY, body, now + 301)):  # fmt: skip
        with pytest.raises(ValueError):
            verify(key, headers, wrong_body, at)
    # Standard Webhooks' own test vector: a whsec_ secret is its base64 bytes.
    key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    vector = sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert vector == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_backoff_doubles_to_its_cap_with_jitter_in_the_second_half():
    assert [backoff(n, 5, 60, lambda: 0.0) for n in (1, 2, 3, 4, 5)] == [2.5, 5, 10, 20, 30]
    assert [backoff(n, 5, 60, lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [5, 10, 20, 40, 60]


def test_endpoints_are_read_from_the_tokens_file_and_bad_ones_refused(tmp_path):
    path = tmp_path / "tokens.toml"
    path.write_text(
        '[[tenants.acme.webhooks]]\nurl = "https://hooks.example/sbx"\n'
        'secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"\n'
        'events = ["sandbox.lifecycle.killed"]\n'
    )
    (found,) = read_endpoints(str(path))["acme"]
    assert found.url == "https://hooks.example/sbx" and found.name == "1"
    assert found.wants("sandbox.lifecycle.killed") and not found.wants("sandbox.lifecycle.created")
    assert "secret" not in json.dumps(found.to_json())
    secret = 'secret = "0123456789abcdef"'
    for bad in (f'url = "file:///etc/passwd"\n{secret}', 'url = "https://h.example"\nsecret = "s"',
                f'url = "https://h.example"\n{secret}\nevents = ["x"]'):  # fmt: skip
        path.write_text(f"[[tenants.acme.webhooks]]\n{bad}\n")
        with pytest.raises(ConfigError):
            read_endpoints(str(path))


def test_a_whsec_secret_must_be_strict_base64_of_at_least_16_bytes(tmp_path):
    """A whsec_ secret with a stray character decoded quietly to another key, and one of a few
    bytes passed as long enough (its text had 16 characters)."""
    path = tmp_path / "tokens.toml"
    short = "whsec_" + base64.b64encode(b"8 bytes!").decode()  # 18 characters, an 8-byte key
    for bad in ("whsec_MfKQ9r8G*KYqrTwjUPD8ILPZIo2LaLaSw", short):
        path.write_text(f'[[tenants.acme.webhooks]]\nname = "ops"\nurl = "https://h.example"\n'
                        f'secret = "{bad}"\n')  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape("tenants.acme.webhooks #1 (ops)")):
            read_endpoints(str(path))


def test_a_cancelled_queueing_is_logged_not_raised(tmp_path):
    async def scenario():
        store = await opened(tmp_path)
        webhooks = hooks(store, lambda r: httpx.Response(204))
        queued = asyncio.get_running_loop().create_future()
        queued.cancel()
        webhooks._queued(queued)  # raised CancelledError, asking a cancelled future why
        await webhooks.stop()
        await store.close()

    asyncio.run(scenario())


def test_events_are_delivered_signed_in_order_after_a_failure_is_retried(tmp_path):
    got: list[httpx.Request] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        got.append(request)
        return httpx.Response(503 if len(got) == 1 else 204)

    async def scenario():
        store = await opened(tmp_path)
        webhooks = hooks(store, receiver)
        await webhooks.start("g1")
        for kind in ("created", "paused", "resumed", "ended"):
            webhooks.publish(lifecycle(kind))
        await until(lambda: _all(store, "delivered", 4))
        await webhooks.stop()
        page = (await store.deliveries("acme", None, None, 10))[::-1]
        await store.close()
        return page, webhooks.outcomes

    page, outcomes = asyncio.run(scenario())
    assert outcomes == {"retried": 1, "delivered": 4}
    types = [json.loads(r.content)["type"] for r in got]
    assert types == ["sandbox.lifecycle.created"] * 2 + [
        "sandbox.lifecycle.paused",
        "sandbox.lifecycle.resumed",
        "sandbox.lifecycle.killed",
    ]  # the failed first event held back the rest of its session: order kept
    for request in got:
        verify(KEY, request.headers, request.content)
        assert request.headers["host"] == "127.0.0.1:9" and request.url.path == "/hook"
    assert [len(r["log"]) for r in page] == [2, 1, 1, 1]
    assert page[0]["log"][0]["status"] == 503 and page[0]["log"][1]["status"] == 204


def test_a_receiver_that_never_answers_does_not_hold_the_publisher_and_is_cut(tmp_path):
    async def never(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def scenario():
        store = await opened(tmp_path)
        found = {"acme": tuple(Endpoint("acme", n, "http://127.0.0.1:9/", KEY) for n in "abc")}
        webhooks = hooks(store, never, found=found, timeout=0.2, concurrency=2, backoff=60)
        await webhooks.start("g1")
        started = time.monotonic()
        for n in range(10):
            webhooks.publish(lifecycle(session_id=f"s{n}"))
        published = time.monotonic() - started
        await asyncio.sleep(0.1)
        in_flight = webhooks.sending
        await until(lambda: _count(store, "pending", 10, attempted=True))
        webhooks.options = dataclasses.replace(webhooks.options, timeout=3600)
        webhooks.publish(lifecycle(session_id="cut"))  # its attempt is in flight at the stop
        await until(lambda: _count(store, "sending", 1))
        stopping = time.monotonic()
        await webhooks.stop()
        stopped = time.monotonic() - stopping
        cut = (await store.deliveries("acme", None, None, 1))[0]
        await store.close()
        return published, in_flight, stopped, cut

    published, in_flight, stopped, cut = asyncio.run(scenario())
    assert published < 0.05  # telling never waits on a receiver
    assert in_flight == 2  # bounded concurrency (three endpoints, one attempt each at most)
    assert stopped < 2 and cut["state"] == "pending"  # a stop waits for no receiver


def test_a_tenants_receiver_that_never_answers_holds_back_no_other_tenant(tmp_path):
    """The attacker's repro: 40 events to a silent receiver took every slot, oldest first, so
    another tenant's event waited about five seconds (ten rounds of timeouts)."""
    got: dict[str, float] = {}

    async def receiver(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/evil":
            await asyncio.sleep(10)
        got[request.url.path] = time.monotonic()
        return httpx.Response(204)

    async def scenario():
        store = await opened(tmp_path)
        found = {"evil": (Endpoint("evil", "e", "http://127.0.0.1:9/evil", KEY),),
                 "good": (Endpoint("good", "g", "http://127.0.0.1:9/good", KEY),)}  # fmt: skip
        webhooks = hooks(store, receiver, found=found, timeout=0.5, backoff=0.2, concurrency=4)
        for n in range(40):
            webhooks.publish(lifecycle(session_id=f"s{n}", tenant="evil"))
        await asyncio.sleep(0.1)
        webhooks.publish(lifecycle(session_id="g1", tenant="good"))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await webhooks.start("g1")
        with contextlib.suppress(AssertionError):
            await until(lambda: _count(store, "delivered", 1, tenant="good"), timeout=2.0)
        in_flight = webhooks.sending
        await webhooks.stop()
        await store.close()
        return started, in_flight

    started, in_flight = asyncio.run(scenario())
    assert "/good" in got and got["/good"] - started < 1.0, "it waited behind the other tenant"
    assert in_flight == 1  # the silent receiver's one attempt


def test_attempts_run_out_and_a_replay_sends_the_same_event_again(tmp_path):
    answers = iter([500, 500, 200])
    got: list[httpx.Request] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        got.append(request)
        return httpx.Response(next(answers))

    async def scenario():
        store = await opened(tmp_path)
        webhooks = hooks(store, receiver, attempts=2)
        await webhooks.start("g1")
        webhooks.publish(lifecycle())
        await until(lambda: _all(store, "failed", 1))
        (first,) = (await webhooks.deliveries(_acme(), None, None, None))["deliveries"]
        again = await webhooks.replay(first["id"], _acme())
        await until(lambda: _count(store, "delivered", 1))
        await webhooks.stop()
        await store.close()
        return first, again

    first, again = asyncio.run(scenario())
    assert first["attempts"] == 2 and [a["status"] for a in first["log"]] == [500, 500]
    assert again["replay_of"] == first["id"]
    assert len({r.headers["webhook-id"] for r in got}) == 1  # one event, three sends


def test_an_endpoint_resolving_to_a_private_address_is_refused_unless_allowed(tmp_path):
    def receiver(request: httpx.Request) -> httpx.Response:
        raise AssertionError("the guard let a request through")

    async def scenario():
        store = await opened(tmp_path)
        found = endpoints("http://169.254.169.254/latest/meta-data")
        webhooks = hooks(store, receiver, allow=(), found=found)
        await webhooks.start("g1")
        webhooks.publish(lifecycle())
        await until(lambda: _all(store, "failed", 1))
        await webhooks.stop()
        page = await store.deliveries("acme", None, None, 10)
        await store.close()
        return page[0]

    row = asyncio.run(scenario())
    assert row["attempts"] == 1 and "link-local" in row["log"][0]["error"]


def test_a_name_is_resolved_checked_and_its_checked_address_is_the_one_called(
    tmp_path, monkeypatch
):
    """A name with one private address among public ones is refused; a public one is called
    at that address, with its name in Host and for TLS (a later DNS answer is never used)."""
    answers = {"hooks.example": ["93.184.216.34"], "mixed.example": ["93.184.216.34", "10.0.0.7"]}
    got: list[httpx.Request] = []

    def resolve(host, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answers[host]]

    def receiver(request: httpx.Request) -> httpx.Response:
        got.append(request)
        return httpx.Response(200)

    async def scenario():
        store = await opened(tmp_path)
        found = {"acme": (Endpoint("acme", "ok", "https://hooks.example/in", KEY),
                          Endpoint("acme", "mixed", "https://mixed.example/in", KEY))}  # fmt: skip
        webhooks = hooks(store, receiver, allow=(), found=found)
        await webhooks.start("g1")
        webhooks.publish(lifecycle())
        await until(lambda: _count(store, "delivered", 1))
        await until(lambda: _count(store, "failed", 1))
        await webhooks.stop()
        failed = await store.deliveries("acme", "failed", None, 10)
        await store.close()
        return failed[0]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    failed = asyncio.run(scenario())
    (request,) = got
    assert str(request.url) == "https://93.184.216.34/in"
    assert request.headers["host"] == "hooks.example"
    assert request.extensions["sni_hostname"] == "hooks.example"
    assert (
        failed["endpoint"] == "mixed" and "10.0.0.7 is a private range" in failed["log"][0]["error"]
    )


def test_a_name_server_that_never_answers_holds_only_the_webhooks_own_resolver(
    tmp_path, monkeypatch
):
    """The attacker's repro: lookups ran on the loop's default executor, which every Docker
    call shares, one per attempt, so a tenant's silent name server could fill it. Now they run
    on threads of their own, one per host at a time (another attempt meanwhile fails, and is
    retried later)."""
    release = threading.Event()
    lookups: list[str] = []

    def resolve(host, port, *args, **kwargs):
        lookups.append(threading.current_thread().name)
        release.wait(10)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))]

    async def scenario():
        store = await opened(tmp_path)
        url = "https://hooks.evil.example/in"
        found = {"acme": tuple(Endpoint("acme", f"e{n}", url, KEY) for n in range(8))}
        webhooks = hooks(store, lambda r: httpx.Response(204), allow=(), found=found,
                         timeout=0.3, backoff=60, concurrency=8)  # fmt: skip
        await webhooks.start("g1")
        webhooks.publish(lifecycle())
        await until(lambda: _count(store, "pending", 8, attempted=True))
        started = time.monotonic()
        await asyncio.to_thread(lambda: None)  # what a Docker call waits for
        waited = time.monotonic() - started
        await webhooks.stop()
        page = await store.deliveries("acme", None, None, 10)
        await store.close()
        return waited, [row["log"][0]["error"] for row in page]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    try:
        waited, errors = asyncio.run(scenario())
    finally:
        release.set()
    assert waited < 0.5 and lookups == ["sbx-webhook-dns_0"], lookups
    assert sorted(errors)[0] == "OSError: hooks.evil.example is still being resolved", errors
    assert sum("still being resolved" in e for e in errors) == 7, errors


def test_pending_deliveries_survive_a_restart_and_a_cut_claim_is_sent_again(tmp_path):
    got: list[str] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        got.append(json.loads(request.content)["session_id"])
        return httpx.Response(200)

    async def scenario():
        store = await opened(tmp_path)
        await store.add_deliveries([_row("d1", "s1"), _row("d2", "s2")], 100)
        assert len(await store.claim_deliveries("g1", 1, 60)) == 1  # then g1 was killed
        await store.close()
        store = await opened(tmp_path)  # the same data dir, the same gateway id
        webhooks = hooks(store, receiver)
        await webhooks.start("g1")
        await until(lambda: _all(store, "delivered", 2))
        await webhooks.stop()
        await store.close()

    asyncio.run(scenario())
    assert sorted(got) == ["s1", "s2"]


def test_the_approval_desk_tells_a_request_and_its_decision_without_the_code():
    told: list[dict] = []
    events = SessionEvents()
    events.tell("created", object())  # type: ignore[arg-type]  # no sink: nothing is built
    events.sinks.append(told.append)

    class Store:
        async def save_approval(self, doc) -> None:
            pass

    async def scenario():
        desk = ApprovalDesk(Store(), timeout=60, live=lambda session_id: True)
        desk.listeners.append(events.approval)
        decision = Decision("hold", "hold", "enforce", ("line 1: shell",))
        asker = Principal(tenant="acme", token_id="agent")
        approval = await desk.request("s1", "acme", asker, "!cat ~/.netrc", "python", decision)
        approver = Principal(tenant="acme", token_id="person", approver=True)
        await desk.decide(approval.id, approver, False, "no")

    asyncio.run(scenario())
    assert [e["type"] for e in told] == ["sandbox.approval.pending", "sandbox.approval.decided"]
    decided = told[1]["eventData"]["approval"]
    assert decided["state"] == "denied" and decided["reason"] == "no"
    assert told[1]["session_id"] == "s1" and "netrc" not in json.dumps(told)


def _acme():
    return Principal(tenant="acme")


def _row(delivery_id: str, session_id: str) -> dict:
    body = json.dumps(lifecycle(session_id=session_id))
    return {"id": delivery_id, "event_id": "e" + delivery_id, "type": "sandbox.lifecycle.created",
            "tenant": "acme", "endpoint": "main", "session_id": session_id,
            "body": body}  # fmt: skip


async def _count(store, state: str, n: int, attempted: bool = False, tenant: str = "acme") -> bool:
    page = await store.deliveries(tenant, state, None, 1000)
    return len([r for r in page if r["attempts"] or not attempted]) >= n


async def _all(store, state: str, n: int) -> bool:
    page = await store.deliveries("acme", None, None, 1000)
    return len(page) == n and all(r["state"] == state for r in page)
