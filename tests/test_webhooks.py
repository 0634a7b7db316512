"""Lifecycle webhooks end to end: a real receiver on 127.0.0.1 gets a session's events, signed,
in order, after a failed first attempt is retried, and a replay (docs/webhooks.md)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest
from helpers import tenant_gateway

from gateway.sessions.webhooks import secret_key, verify

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TOKEN = "webhooks-test-token-acme"


class Receiver(http.server.ThreadingHTTPServer):
    """Records every POST; the first one is answered 503, the rest 204."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(503 if len(self.server.got) == 1 else 204)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def hooked(start_gateway) -> Iterator:
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    table = f'[[tenants.acme.webhooks]]\nname = "ops"\nurl = "{url}"\nsecret = "{SECRET}"\n'
    flags = ("--webhook-allow-ranges", "127.0.0.0/8", "--webhook-backoff", "0.2")
    with tenant_gateway(start_gateway, {"acme": TOKEN}, *flags, tenants=table) as (_, clients):
        yield receiver, clients["acme"]
    receiver.shutdown()
    receiver.server_close()


def received(receiver: Receiver, count: int) -> list[tuple[dict[str, str], dict]]:
    deadline = time.monotonic() + 30
    while len(receiver.got) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(receiver.got) >= count, [json.loads(b)["type"] for _, b in receiver.got]
    for headers, body in receiver.got:
        verify(secret_key(SECRET), headers, body)
    return [(headers, json.loads(body)) for headers, body in receiver.got]


def test_a_sessions_events_arrive_signed_in_order_and_a_delivery_replays(hooked):
    receiver, api = hooked
    assert api.get("/v1/webhooks").json()["endpoints"][0]["name"] == "ops"
    sid = api.post("/v1/sessions", json={}).json()["id"]
    assert api.post(f"/v1/sessions/{sid}/pause", json={}).status_code == 200
    assert api.post(f"/v1/sessions/{sid}/resume", json={}).status_code == 200
    assert api.delete(f"/v1/sessions/{sid}").status_code == 204
    events = received(receiver, 5)  # the first event twice: its first attempt got a 503
    types = [event["type"].rsplit(".", 1)[1] for _, event in events]
    assert types == ["created", "created", "paused", "resumed", "killed"]
    assert {event["session_id"] for _, event in events} == {sid}
    assert events[-1][1]["eventData"]["reason"] == "deleted by client"
    assert events[0][0]["webhook-id"] == events[1][0]["webhook-id"]

    page = api.get("/v1/webhooks/deliveries", params={"state": "delivered"}).json()
    created = next(d for d in page["deliveries"] if d["type"].endswith("created"))
    assert [a["status"] for a in created["log"]] == [503, 204]
    again = api.post(f"/v1/webhooks/deliveries/{created['id']}/replay")
    assert again.status_code == 202 and again.json()["replay_of"] == created["id"]
    headers, event = received(receiver, 6)[-1]
    assert headers["webhook-id"] == created["event_id"] and event["session_id"] == sid
    missing = api.post(f"/v1/webhooks/deliveries/{'0' * 32}/replay")
    assert missing.status_code == 404
