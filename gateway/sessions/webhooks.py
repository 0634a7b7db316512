"""Lifecycle webhooks: each tenant's endpoints, signed deliveries, retries, and their log.

An event (``events.py``) becomes one row per endpoint of its tenant that wants
it, in the store (``store/webhooks.py``), on the store's writer: telling never
waits for a receiver, or for the database. A worker of each gateway claims due
rows (one gateway per attempt, in order per session and endpoint), POSTs them
with a bounded timeout, a few at once, and records every attempt; a failure is
retried with exponential backoff and jitter until ``attempts`` is spent. Rows
outlive the process: a restart resumes what was pending, and another gateway
takes over a dead one's claims once their lease runs out.

Signatures follow Standard Webhooks: ``webhook-id`` (the event's id, the same on
every attempt and replay), ``webhook-timestamp`` (seconds, fresh on each
attempt) and ``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``;
a receiver checks it and refuses old timestamps (replays). An endpoint's URL
must be http(s); the addresses its name resolves to pass the egress proxy's
``AddressGuard`` (no loopback, private, link-local or the gateway's own port
unless ``webhook_allow_ranges`` says so), and the request goes to exactly the
address checked. Names are resolved on the webhooks' own few threads, one lookup per
host at a time: a tenant's name server that never answers holds those, never the
loop's default executor that every Docker call shares.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import logging
import random
import socket
import time
import tomllib
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from ..access.auth import Principal
from ..egress.policy import AddressGuard
from ..errors import BadRequest, ConfigError, NotFound
from ..store.base import Store
from ..tasks import TaskSet
from ..timestamps import iso
from .events import TYPES

log = logging.getLogger(__name__)

STATES = ("pending", "sending", "delivered", "failed", "dropped")
TOLERANCE = 300  # seconds a receiver should accept a timestamp off by (Standard Webhooks)
PAGE = 100


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where one tenant's events go, and the key they are signed with."""

    tenant: str
    name: str
    url: str
    secret: bytes = dataclasses.field(repr=False)
    events: frozenset[str] = frozenset()  # empty: every type

    def wants(self, kind: str) -> bool:
        return not self.events or kind in self.events

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "name": self.name, "url": self.url,
                "events": sorted(self.events) or sorted(TYPES.values())}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class WebhookOptions:
    timeout: float = 5.0  # seconds one attempt may take, connecting to the last byte
    attempts: int = 8  # attempts before a delivery fails
    backoff: float = 5.0  # seconds before the first retry; doubled each time
    backoff_max: float = 3600.0
    concurrency: int = 4  # attempts in flight per gateway
    queue: int = 1000  # deliveries waiting per endpoint; more are dropped (and logged)
    poll: float = 1.0  # seconds between looks for due deliveries
    keep: float = 7 * 86400.0  # seconds finished deliveries are kept
    allow_ranges: tuple[Any, ...] = ()  # private ranges endpoints may resolve into


def secret_key(text: str) -> bytes:
    """The HMAC key of a secret: a ``whsec_`` one is base64 (Standard Webhooks) of at least 16
    bytes (ValueError otherwise: a stray character is no quietly different key), else its text."""
    if not text.startswith("whsec_"):
        return text.encode()
    key = base64.b64decode(text.removeprefix("whsec_"), validate=True)
    if len(key) < 16:
        raise ValueError(f"it decodes to {len(key)} bytes, fewer than 16")
    return key


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header's value."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify(key: bytes, headers: Mapping[str, str], body: bytes, now: float | None = None) -> None:
    """What a receiver does (docs/webhooks.md): raise ValueError unless the signature holds and
    the timestamp is within ``TOLERANCE`` seconds of ``now``."""
    msg_id, stamp = headers.get("webhook-id", ""), headers.get("webhook-timestamp", "")
    if not stamp.isdigit() or abs((now or time.time()) - int(stamp)) > TOLERANCE:
        raise ValueError("webhook-timestamp is missing or too old (a replay?)")
    expected = sign(key, msg_id, int(stamp), body)
    offered = headers.get("webhook-signature", "").split()
    if not any(hmac.compare_digest(expected, s) for s in offered):
        raise ValueError("webhook-signature does not match")


def backoff(
    attempt: int, base: float, cap: float, draw: Callable[[], float] = random.random
) -> float:
    """Seconds before the retry after ``attempt`` (1-based): doubling, capped, the second half
    drawn at random so receivers coming back are not hit by every gateway at once."""
    delay = min(cap, base * 2 ** (attempt - 1))
    return delay / 2 + draw() * delay / 2


def read_endpoints(path: str) -> dict[str, tuple[Endpoint, ...]]:
    """Each tenant's endpoints from the tokens file's ``[[tenants.<name>.webhooks]]``."""
    if not path:
        return {}
    try:
        tenants = tomllib.loads(Path(path).read_text()).get("tenants", {})
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read tokens file {path}: {e}") from e
    found = {}
    for tenant, values in tenants.items():
        entries = values.get("webhooks", [])
        endpoints = tuple(_endpoint(tenant, n, e, path) for n, e in enumerate(entries, start=1))
        if len({e.name for e in endpoints}) < len(endpoints):
            raise ConfigError(f"{path}: tenant {tenant}'s webhooks need different names")
        if endpoints:
            found[tenant] = endpoints
    return found


def _endpoint(tenant: str, n: int, entry: Any, path: str) -> Endpoint:
    where = f"{path}: tenants.{tenant}.webhooks #{n}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a table with url and secret")
    url = httpx.URL(str(entry.get("url", "")))
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"{where}: url must be an http:// or https:// URL, not {url!s:.80}")
    secret = entry.get("secret")
    if not isinstance(secret, str) or len(secret) < 16:
        raise ConfigError(f"{where}: secret must be a string of at least 16 characters")
    events = entry.get("events", [])
    unknown = set(events) - set(TYPES.values()) if isinstance(events, list) else {events}
    if unknown:
        raise ConfigError(f"{where}: unknown events {sorted(map(str, unknown))}; known: "
                          f"{', '.join(TYPES.values())}")  # fmt: skip
    name = str(entry.get("name", n))
    try:
        key = secret_key(secret)
    except ValueError as e:
        raise ConfigError(f"{where} ({name}): a whsec_ secret must be base64 of at least 16"
                          f" random bytes ({e})") from e  # fmt: skip
    return Endpoint(tenant, name, str(url), key, frozenset(events))


class Refused(Exception):
    """An endpoint's address is one webhooks may not reach."""


class Webhooks:
    """Queues events for each tenant's endpoints and delivers them in the background."""

    def __init__(
        self,
        store: Store,
        endpoints: dict[str, tuple[Endpoint, ...]],
        options: WebhookOptions,
        guard: AddressGuard,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``guard`` refuses addresses (with the gateway's port); ``transport``: tests' own."""
        self.store = store
        self.endpoints = endpoints
        self.options = options
        self.guard = guard
        self.owner = ""
        self.client = httpx.AsyncClient(
            transport=transport,
            timeout=options.timeout,
            follow_redirects=False,
            trust_env=False,  # a proxy would connect to what the guard never saw
            limits=httpx.Limits(max_connections=options.concurrency),
        )
        self.tasks = TaskSet()  # the worker and its attempts in flight
        self._resolver = ThreadPoolExecutor(
            options.concurrency, thread_name_prefix="sbx-webhook-dns"
        )
        self._resolving: set[str] = set()  # hosts with a lookup running, cut or not
        self.sending = 0  # attempts in flight
        self.outcomes: collections.Counter[str] = (
            collections.Counter()
        )  # delivered, retried, failed
        self._wake = asyncio.Event()
        self._pruned = 0.0

    # -- telling -------------------------------------------------------------------------

    def publish(self, event: dict[str, Any]) -> None:
        """Queue ``event`` for its tenant's endpoints that want it; never waits."""
        rows = [
            {"id": uuid.uuid4().hex, "event_id": event["id"], "type": event["type"],
             "tenant": event["tenant"], "endpoint": endpoint.name,
             "session_id": event["session_id"], "body": json.dumps(event)}
            for endpoint in self.endpoints.get(event["tenant"], ())
            if endpoint.wants(event["type"])
        ]  # fmt: skip
        if rows:
            self._queue(rows)

    def _queue(self, rows: list[dict[str, Any]]) -> None:
        queued = self.store.add_deliveries(rows, self.options.queue)
        queued.add_done_callback(self._queued)

    def _queued(self, queued: asyncio.Future) -> None:
        if queued.cancelled():
            log.warning("webhook events were not queued: cancelled")
        elif queued.exception() is not None:
            log.warning("webhook events were not queued: %s", queued.exception())
        else:
            self._wake.set()

    # -- the worker ----------------------------------------------------------------------

    async def start(self, owner: str) -> None:
        """Deliver as ``owner`` (this gateway's id), first what it was sending when it stopped."""
        self.owner = owner
        released = await self.store.release_deliveries(owner)
        if released:
            log.info("webhooks: %d deliveries cut by the last stop are due again", released)
        if self.endpoints:  # none configured: nothing is ever queued
            self.tasks.spawn(self._run())

    async def stop(self) -> None:
        """Stop at once: attempts cut short are due again (this gateway's next start, or
        another's once their lease runs out), then the client closes."""
        await self.tasks.cancel(timeout=1.0)
        with contextlib.suppress(Exception):
            await self.store.release_deliveries(self.owner)
        await self.client.aclose()
        self._resolver.shutdown(wait=False, cancel_futures=True)  # a lookup may hang for long

    async def _run(self) -> None:
        while True:
            try:
                claimed = await self.step()
            except Exception as e:  # the database is away: later
                log.warning("webhooks: could not claim deliveries: %s", e)
                claimed = 0
            if not claimed:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.options.poll):
                        await self._wake.wait()

    async def step(self) -> int:
        """Claim what is due, as many as free slots, and send each; how many were claimed."""
        if time.monotonic() - self._pruned > 3600:
            self._pruned = time.monotonic()
            await self.store.prune_deliveries(self.options.keep)
        free = self.options.concurrency - self.sending
        if free <= 0:
            return 0
        lease = self.options.timeout * 2 + 10  # an attempt ends well within it
        rows = await self.store.claim_deliveries(self.owner, free, lease)
        self.sending += len(rows)
        for row in rows:
            self.tasks.spawn(self._in_slot(row))
        return len(rows)

    async def _in_slot(self, row: dict[str, Any]) -> None:
        try:
            await self.deliver(row)
        finally:
            self.sending -= 1
            self._wake.set()  # a slot is free, and the next event of its session may be due

    async def deliver(self, row: dict[str, Any]) -> None:
        """One attempt at a claimed delivery, recorded whatever happens."""
        endpoint = next(
            (e for e in self.endpoints.get(row["tenant"], ()) if e.name == row["endpoint"]), None
        )
        started, status, error, final = time.monotonic(), None, None, False
        try:
            if endpoint is None:
                final, error = True, f"endpoint {row['endpoint']!r} is no longer configured"
            else:
                status = await self._post(endpoint, row)
        except Refused as e:
            final, error = True, str(e)
        except Exception as e:  # whatever the receiver did, the attempt is recorded
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        ok = status is not None and 200 <= status < 300
        if status is not None and not ok:
            error = f"the receiver answered {status}"
        attempt = {"at": iso(time.time()), "status": status, "error": error, "gateway": self.owner,
                   "ms": round((time.monotonic() - started) * 1000, 1)}  # fmt: skip
        state, retry_in = "delivered", 0.0
        if not ok:
            state = "failed" if final or row["attempts"] >= self.options.attempts else "pending"
            retry_in = backoff(row["attempts"], self.options.backoff, self.options.backoff_max)
        self.outcomes["retried" if state == "pending" else state] += 1
        try:
            await self.store.finish_attempt(row["id"], attempt, state, retry_in)
        except Exception as e:  # the database is away: the claim's lease brings it back
            log.warning("webhooks: attempt at %s not recorded: %s", row["id"], e)

    async def _post(self, endpoint: Endpoint, row: dict[str, Any]) -> int:
        """POST a delivery's body, signed now, to the address checked; its status."""
        body, stamp = row["body"].encode(), int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": "sandbox-gateway-webhooks",
            "webhook-id": row["event_id"],
            "webhook-timestamp": str(stamp),
            "webhook-signature": sign(endpoint.secret, row["event_id"], stamp, body),
            "sbx-delivery-id": row["id"],
            "sbx-event-type": row["type"],
        }
        async with asyncio.timeout(self.options.timeout):
            url, extensions = await self._pinned(httpx.URL(endpoint.url))
            headers["host"] = httpx.URL(endpoint.url).netloc.decode()
            request = self.client.build_request(
                "POST", url, content=body, headers=headers, extensions=extensions
            )
            response = await self.client.send(request, stream=True)
            await response.aclose()  # its body is never read: a receiver cannot flood us
        return response.status_code

    async def _pinned(self, url: httpx.URL) -> tuple[httpx.URL, dict[str, Any]]:
        """``url`` with its host replaced by an address the guard allows (TLS still checks
        the name): what the name resolves to after this check is never used."""
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            infos = await self._resolve(url.host, port)
        except socket.gaierror as e:
            raise OSError(f"{url.host} does not resolve ({e})") from e
        addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
        for address in addresses:
            refusal = self.guard.refusal(address, port)
            if refusal is not None:
                raise Refused(f"{url.host} resolves to {address} ({refusal.split(', which')[0]}):"
                              " not called unless webhook_allow_ranges allows it")  # fmt: skip
        extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
        return url.copy_with(host=str(addresses[0])), extensions

    async def _resolve(self, host: str, port: int) -> list[Any]:
        """``getaddrinfo`` on the webhooks' own threads; a host whose last lookup still runs
        (its attempt timed out, not the lookup) fails this attempt, to be retried later."""
        if host in self._resolving:
            raise OSError(f"{host} is still being resolved")
        lookup = self._resolver.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        self._resolving.add(host)
        lookup.add_done_callback(lambda _: self._resolving.discard(host))  # its thread's end
        return await asyncio.wrap_future(lookup)

    # -- the log -------------------------------------------------------------------------

    def endpoints_of(self, who: Principal) -> list[dict[str, Any]]:
        """The endpoints ``who`` may see (its tenant's; an admin's: all), without secrets."""
        return [e.to_json() for t, found in sorted(self.endpoints.items()) if who.owns(t)
                for e in found]  # fmt: skip

    async def deliveries(
        self, who: Principal, state: str | None, before: int | None, limit: int | None
    ) -> dict[str, Any]:
        """A page of ``who``'s deliveries, newest first, and where the next page starts."""
        if state is not None and state not in STATES:
            raise BadRequest(f"state must be one of {', '.join(STATES)}, not {state!r}")
        limit = PAGE if limit is None else limit
        if not 1 <= limit <= 1000:
            raise BadRequest("limit must be between 1 and 1000")
        if before is not None and not 0 < before < 2**63:
            raise BadRequest("before must be a delivery's seq from an earlier page's next")
        tenant = None if who.admin else who.tenant
        rows = await self.store.deliveries(tenant, state, before, limit)
        nxt = rows[-1]["seq"] if len(rows) == limit else None
        return {"deliveries": [public_delivery(r) for r in rows], "next": nxt}

    async def delivery(self, delivery_id: str, who: Principal) -> dict[str, Any]:
        """One of ``who``'s deliveries, with every attempt."""
        return public_delivery(await self._owned(delivery_id, who))

    async def _owned(self, delivery_id: str, who: Principal) -> dict[str, Any]:
        row = await self.store.get_delivery(delivery_id)
        if row is None or not who.owns(row["tenant"]):
            raise NotFound(f"no webhook delivery {delivery_id!r} for this tenant")
        return row

    async def replay(self, delivery_id: str, who: Principal) -> dict[str, Any]:
        """Send a delivery's event again, as a new delivery (the same ``webhook-id``)."""
        row = await self._owned(delivery_id, who)
        again = {key: row[key] for key in
                 ("event_id", "type", "tenant", "endpoint", "session_id", "body")}  # fmt: skip
        again.update(id=uuid.uuid4().hex, replay_of=row["id"])
        await self.store.add_deliveries([again], self.options.queue)
        self._wake.set()
        found = await self.store.get_delivery(again["id"])
        assert found is not None
        return public_delivery(found)


def public_delivery(row: dict[str, Any]) -> dict[str, Any]:
    """A delivery as the API shows it: the event it carries, parsed."""
    doc = {k: v for k, v in row.items() if k not in ("body", "due_at")}
    doc.update(
        event=json.loads(row["body"]),
        created_at=iso(row["created_at"]),
        finished_at=iso(row["finished_at"]),
        next_attempt_at=iso(row["due_at"]) if row["state"] == "pending" else None,
    )
    return doc
