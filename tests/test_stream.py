"""The agent stream WebSocket: events as they happen, queueing, disconnects."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from helpers import closed, wait_for
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.docker


class Stream:
    """A test client for /v1/sessions/{id}/stream that timestamps every event."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.events: list[tuple[float, dict]] = []

    async def __aenter__(self) -> Stream:
        self.ws = await websocket_connect(self.url)
        return self

    async def __aexit__(self, *exc) -> None:
        await closed(self.ws)

    def send(self, **message) -> None:
        self.ws.write_message(json.dumps(message))

    async def until(self, kind: str, request_id: str | None = None, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            raw = await asyncio.wait_for(self.ws.read_message(), deadline - time.monotonic())
            assert raw is not None, "the server closed the stream"
            event = json.loads(raw)
            self.events.append((time.monotonic(), event))
            if event["type"] == kind and (request_id is None or event.get("id") == request_id):
                return event
        raise AssertionError(f"no {kind} event within {timeout} s; got {self.events}")


def stream_url(gateway, sid: str) -> str:
    return gateway.ws_url(f"/v1/sessions/{sid}/stream")


def test_outputs_arrive_as_they_happen(gateway, session):
    code = "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(1)"

    async def scenario():
        async with Stream(stream_url(gateway, session["id"])) as s:
            s.send(type="execute", id="c1", code=code)
            first = await s.until("stream", "c1")
            first_at = time.monotonic()
            done = await s.until("done", "c1")
            return first, first_at, done, s.events

    first, first_at, done, events = asyncio.run(scenario())
    assert first["name"] == "stdout" and first["text"].startswith("tick 0")
    done_at = events[-1][0]
    assert done_at - first_at > 2, "the first line came only at the end, not as it was printed"
    assert done["status"] == "ok" and done["execution_count"] == 1
    kinds = [e["type"] for _, e in events]
    assert kinds[0] == "status" and kinds[-2:] == ["status", "done"]
    assert "".join(e.get("text", "") for _, e in events) == "".join(f"tick {i}\n" for i in range(4))


def test_rich_outputs_and_errors_are_events(gateway, session):
    async def scenario():
        async with Stream(stream_url(gateway, session["id"])) as s:
            s.send(
                type="execute", id="r", code="from IPython.display import HTML\nHTML('<b>x</b>')"
            )
            result = await s.until("execute_result", "r")
            await s.until("done", "r")
            s.send(type="execute", id="e", code="1/0")
            error = await s.until("error", "e")
            done = await s.until("done", "e")
            return result, error, done

    result, error, done = asyncio.run(scenario())
    assert result["data"]["text/html"] == "<b>x</b>"
    assert error["ename"] == "ZeroDivisionError" and error["traceback"]
    assert done["status"] == "error"


def test_executes_are_queued_not_interleaved(gateway, session):
    async def scenario():
        async with Stream(stream_url(gateway, session["id"])) as s:
            s.send(type="execute", id="a", code="import time; time.sleep(1); print('a')")
            s.send(type="execute", id="b", code="print('b')")
            await s.until("done", "b")
            return [(e["type"], e.get("id")) for _, e in s.events]

    order = asyncio.run(scenario())
    assert order.index(("done", "a")) < order.index(("status", "b")), order


def test_interrupt_message_and_bad_messages(gateway, session):
    async def scenario():
        async with Stream(stream_url(gateway, session["id"])) as s:
            s.send(type="execute", id="long", code="import time; time.sleep(60)")
            await s.until("status", "long")
            s.send(type="interrupt")
            done = await s.until("done", "long")
            s.ws.write_message("not json")
            bad = await s.until("rejected")
            s.send(type="launch", id="x")
            unknown = await s.until("rejected", "x")
            s.send(type="execute", id="y", code=5)
            wrong = await s.until("rejected", "y")
            return done, bad, unknown, wrong

    done, bad, unknown, wrong = asyncio.run(scenario())
    assert done["status"] == "interrupted"
    assert bad["error"]["code"] == "bad_request"
    assert "unknown message type" in unknown["error"]["message"]
    assert "code must be a string" in wrong["error"]["message"]


def test_disconnect_interrupts_the_running_cell(gateway, session, api):
    sid = session["id"]

    async def scenario():
        async with Stream(stream_url(gateway, sid)) as s:
            s.send(type="execute", id="gone", code="x = 1\nimport time; time.sleep(60)")
            await s.until("status", "gone")

    asyncio.run(scenario())

    def interrupted():
        history = api.get(f"/v1/sessions/{sid}/history").json()["executions"]
        return history and history[-1]["status"] == "interrupted"

    assert wait_for(interrupted, timeout=10), "the abandoned cell kept running"
    assert api.get(f"/v1/sessions/{sid}").json()["state"] == "idle"


def test_unknown_session_is_refused_before_upgrade(gateway):
    from tornado.httpclient import HTTPClientError

    async def scenario():
        await websocket_connect(stream_url(gateway, "nope"))

    with pytest.raises(HTTPClientError) as caught:
        asyncio.run(scenario())
    assert caught.value.code == 404


def test_open_stream_counts_as_activity(gateway, new_session, api):
    sid = new_session(idle_timeout=2)["id"]

    async def scenario():
        async with Stream(stream_url(gateway, sid)):
            await asyncio.sleep(4)
            return api.get(f"/v1/sessions/{sid}").json()["state"]

    assert asyncio.run(scenario()) == "idle", "a session with an open stream was culled"
