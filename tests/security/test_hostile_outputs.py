"""Hostile outputs: whatever a kernel sends, the gateway's memory stays bounded by its settings.

Each attack is session code (or raw messages a kernel sends on its own
iopub socket). While it runs, a canary session on the same gateway keeps
answering a trivial cell and the gateway's peak RSS is read; the attack's
outputs come back cut at the cap with the truncation marker, and the
session still works afterwards.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from helpers import (
    Canary,
    canary_session,
    closed,
    execute_request,
    run,
    run_over_channels,
    text_of,
    wait_for,
)
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.docker

CANARY_SECONDS = 2.0  # a liveness bound, not a performance claim
# The default max_kernel_message is 32 MiB; a few of them in flight at once, not a GiB.
RSS_GROWTH_MIB = 256
CAP = 1024 * 1024


@pytest.fixture(scope="module")
def output_gateway(start_gateway):
    return start_gateway("--interrupt-grace", "2")


@pytest.fixture(scope="module")
def bystander(output_gateway):
    with canary_session(output_gateway) as sid:
        yield sid


@pytest.fixture
def attacker(output_gateway):
    body = {"limits": {"memory": "3g", "output_bytes": "1m", "timeout": 120}}
    r = output_gateway.client.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    yield r.json()["id"]
    output_gateway.client.delete(f"/v1/sessions/{r.json()['id']}")


RAW = (
    "k = get_ipython().kernel\n"
    "def raw(content, buffers=(), kind='stream'):\n"
    "    k.session.send(k.iopub_socket, kind, content, parent=k.get_parent(), buffers=buffers)\n"
)

ATTACKS = {
    "one huge print": "print('x' * 300_000_000)",
    "one huge display": "display({'text/plain': 'x' * 300_000_000}, raw=True)",
    "update_display loop": (
        "h = display({'text/plain': 'small'}, raw=True, display_id=True)\n"
        "for i in range(25):\n"
        "    h.update({'text/plain': str(i) * 20_000_000}, raw=True)"
    ),
    "clear_output loop": (
        "from IPython.display import clear_output\n"
        "for i in range(60):\n"
        "    clear_output()\n"
        "    print(str(i % 10) * 900_000)"
    ),
    "comm messages": (
        "from comm import create_comm\n"
        "c = create_comm(target_name='sbx-attack')\n"
        "for _ in range(25):\n"
        "    c.send({'blob': 'x' * 20_000_000})"
    ),
    "many small streams": "for i in range(300_000):\n    print(i)",
    "input_request": RAW + "for _ in range(25):\n"
    "    raw({'prompt': 'x' * 20_000_000, 'password': False}, kind='input_request')",
    "raw oversized frame": RAW + "raw({'name': 'stdout', 'text': 'raw'}, [b'x' * 300_000_000])",
    "raw oversized content": RAW + "raw({'name': 'stdout', 'text': 'y' * 300_000_000})",
    # Each frame under max_kernel_message, the message 40 times over: sent from 30 MB held once.
    "raw message of many frames": RAW
    + "b = b'x' * 30_000_000\nraw({'name': 'stdout', 'text': 'raw'}, [b] * 40)",
    # Each frame a few bytes on the wire, each costing the gateway far more to hold and read.
    "raw message of many tiny frames": RAW
    + "raw({'name': 'stdout', 'text': 'raw'}, [b'xy'] * 3_000_000)",
}


def check(reply: dict, canary: Canary) -> None:
    print(canary)
    assert reply["truncated"] is True, f"nothing was cut: {reply['outputs'][-1:]}"
    size = len(json.dumps(reply))
    assert size < CAP + 256 * 1024, f"the reply carried {size} bytes despite a 1 MiB cap"
    marker = reply["outputs"][-1]
    assert marker["name"] == "stderr" and "[sbx: output truncated" in marker["text"], marker
    assert canary.worst < CANARY_SECONDS, f"the canary took {canary.worst:.2f} s to answer"
    assert canary.grown_mib < RSS_GROWTH_MIB, f"the gateway grew by {canary.grown_mib:.0f} MiB"


@pytest.mark.parametrize("code", ATTACKS.values(), ids=ATTACKS.keys())
def test_outputs_are_accounted_and_the_gateway_stays_bounded(
    output_gateway, bystander, attacker, code
):
    api = output_gateway.client
    run(api, attacker, "print('warm')")
    with Canary(output_gateway, bystander) as watch:
        started = time.monotonic()
        reply = run(api, attacker, code + "\nprint('done')", timeout=120)
        took = time.monotonic() - started
    assert reply["status"] == "ok", reply["error"]
    assert took < 60, f"the attack's execute took {took:.0f} s: it waited for a timeout"
    check(reply, watch)
    assert text_of(run(api, attacker, "print('still here')")) == "still here\n"


def test_a_huge_error_is_cut_too(output_gateway, bystander, attacker):
    api = output_gateway.client
    code = "def f(): raise ValueError('v' * 12_000_000)\nf()"  # twice in the message: < 32 MiB
    with Canary(output_gateway, bystander) as watch:
        reply = run(api, attacker, code, timeout=120)
    assert reply["status"] == "error"
    assert reply["error"]["ename"] == "ValueError"
    check(reply, watch)


def test_a_jupyter_client_that_does_not_read_is_disconnected(output_gateway, bystander):
    """The relay forwards raw kernel messages; what waits for a stalled client is bounded."""
    api = output_gateway.client
    kernel_id = api.post("/api/kernels", json={"env": {}}).json()["id"]
    url = output_gateway.ws_url(f"/api/kernels/{kernel_id}/channels")
    # Flushed one by one: the kernel holds one chunk at a time, the gateway would hold them all.
    code = "for _ in range(100):\n    print('x' * 10_000_000, flush=True)\n"

    def closed_by_gateway() -> bool:
        return any("does not read" in line for line in output_gateway.log)

    async def stalled_client() -> tuple[int | None, str | None]:
        ws = await websocket_connect(url, max_message_size=2**30)
        ws.write_message(json.dumps(execute_request(code)))
        await asyncio.to_thread(wait_for, closed_by_gateway, 90, 0.5)  # never reading meanwhile
        while await asyncio.wait_for(ws.read_message(), 60) is not None:
            pass
        await closed(ws)
        return ws.close_code, ws.close_reason

    with Canary(output_gateway, bystander) as watch:
        code_, reason = asyncio.run(stalled_client())
    print(watch, "close", code_, reason)
    # 1 GB sent; what waits is client_write_buffer (64 MiB) plus the messages being
    # encoded for it, each held as bytes, text and JSON at once (CI saw 263 MiB).
    bound = RSS_GROWTH_MIB + 64
    assert watch.grown_mib < bound, f"the gateway grew by {watch.grown_mib:.0f} MiB"
    assert watch.worst < CANARY_SECONDS, f"the canary took {watch.worst:.2f} s to answer"
    assert closed_by_gateway(), "the gateway did not close the client, or did not say why"
    assert code_ in (None, 1008), f"closed with {code_} {reason}"
    api.delete(f"/api/kernels/{kernel_id}")


def test_a_session_keeps_no_more_output_than_its_session_cap(start_gateway):
    """Many executes, each under its own cap, add up to no more than the session's cap."""
    gw = start_gateway("--session-output-bytes", "200k")
    api = gw.client
    sid = api.post("/v1/sessions", json={"limits": {"output_bytes": "100k"}}).json()["id"]
    outputs = [run(api, sid, "print('x' * 60_000)") for _ in range(5)]
    kept = [len(text_of(reply)) for reply in outputs]
    assert sum(kept) <= 200 * 1024 + 5 * 200, kept
    assert kept[:3] == [60_001] * 3 and kept[-1] < 1000, kept
    last = outputs[-1]
    assert last["truncated"] and "this session's output limit of 200 KiB" in text_of(last, "stderr")
    assert api.get(f"/v1/sessions/{sid}").json()["output_bytes"] >= 200 * 1024 - 1000
    # Errors still come back whole enough to act on, and a fresh session has a fresh budget.
    assert run(api, sid, "1/0")["error"]["ename"] == "ZeroDivisionError"
    other = api.post("/v1/sessions", json={}).json()["id"]
    assert text_of(run(api, other, "print('y' * 60_000)")) == "y" * 60_000 + "\n"


# Signed with the kernel's own key (a sandbox has it), well-formed JSON, wrong shapes.
MALFORMED = RAW + (
    "header = k.get_parent()['header']\n"
    "for parent, content in (([1], b'{}'), ({'msg_id': [1]}, b'{}'), ('text', b'{}'),\n"
    "                        (header, b'[1, 2]'), (header, b'\"text\"'), (header, b'null')):\n"
    "    m = k.session.msg('stream', content={})\n"
    "    m['parent_header'], m['content'] = parent, content\n"
    "    k.session.send(k.iopub_socket, m)\n"
    "print('after')"
)


def test_malformed_kernel_messages_are_dropped_on_every_path(output_gateway, attacker):
    """What a kernel sends is hostile: wrong shapes are dropped, never raised in the gateway."""
    before = len(output_gateway.log)
    reply = run(output_gateway.client, attacker, MALFORMED)
    assert reply["status"] == "ok" and text_of(reply) == "after\n", reply
    url = output_gateway.ws_url(f"/api/kernels/{attacker}/channels")
    seen = asyncio.run(run_over_channels(url, MALFORMED))
    texts = [m["content"].get("text") for m in seen if m["msg_type"] == "stream"]
    assert texts == ["after\n"], seen
    raised = [line for line in output_gateway.log[before:] if "Traceback" in line]
    assert raised == [], "".join(output_gateway.log[before:][-60:])


# Right envelopes, contents of the wrong shape: each raised in the gateway's collector.
ODD_CONTENTS = RAW + (
    "for kind, content in (\n"
    "    ('error', {'ename': 5, 'evalue': 'x', 'traceback': []}), ('error', {}),\n"
    "    ('stream', {'text': 'no name'}), ('execute_result', {'data': {}, 'metadata': {}}),\n"
    "    ('display_data', {'data': {'text/plain': 'x'}, 'metadata': {}, 'transient': [1]}),\n"
    "    ('update_display_data', {'data': [1], 'transient': {'display_id': 'd'}}),\n"
    "    ('update_display_data', {'data': {}, 'metadata': [], 'transient': {'display_id': 'd'}}),\n"
    "    ('update_display_data', {'data': {}, 'metadata': {}, 'transient': 'd'}),\n"
    "    (['stream'], {'name': 'stdout', 'text': 'list type'}),\n"
    "    ('execute_input', {'execution_count': 'seven', 'code': ''}),\n"
    "):\n"
    "    raw(content, kind=kind)\n"
    "print('after')"
)


def test_contents_of_the_wrong_shape_never_fail_the_execute(output_gateway, attacker):
    """A kernel's odd output becomes a note or nothing; the execute and the session go on."""
    api, before = output_gateway.client, len(output_gateway.log)
    reply = run(api, attacker, ODD_CONTENTS)
    assert reply["status"] == "ok" and reply["error"] is None, reply
    assert text_of(reply) == "after\n", reply
    assert reply["execution_count"] is None or isinstance(reply["execution_count"], int), reply
    raised = [line for line in output_gateway.log[before:] if "Traceback" in line]
    assert raised == [], "".join(output_gateway.log[before:][-60:])
    assert text_of(run(api, attacker, "print('still here')")) == "still here\n"


# From the next cell on, every message with an execution count carries a dict instead.
ODD_COUNT = (
    "k = get_ipython().kernel\n"
    "_send = k.session.send\n"
    "def _odd(stream, msg_or_type, content=None, *args, **kwargs):\n"
    "    if isinstance(content, dict) and 'execution_count' in content:\n"
    "        content = {**content, 'execution_count': {'not': 'a count'}}\n"
    "    return _send(stream, msg_or_type, content, *args, **kwargs)\n"
    "k.session.send = _odd\n"
)


def test_an_execution_count_that_is_not_a_number_is_not_passed_on(output_gateway, attacker):
    """The API and the store type it as an integer: a kernel's dict there is no count."""
    api = output_gateway.client
    run(api, attacker, ODD_COUNT)
    reply = run(api, attacker, "print('next')")
    assert reply["status"] == "ok" and text_of(reply) == "next\n", reply
    assert reply["execution_count"] is None, reply
    url = output_gateway.ws_url(f"/api/kernels/{attacker}/channels")
    asyncio.run(run_over_channels(url, "print('relayed')"))

    def recorded() -> list[dict]:
        return api.get(f"/v1/sessions/{attacker}/history").json()["executions"]

    relayed = wait_for(lambda: any(e["code"] == "print('relayed')" for e in recorded()), 10, 0.2)
    assert relayed, "the relayed execution was not recorded"
    counts = [e["execution_count"] for e in recorded()]
    assert all(c is None or isinstance(c, int) for c in counts), counts
