"""One gate: every way a tenant can make a sandbox run something passes the same policy.

Commands and terminals (``/v1`` and E2B's process service), a Jupyter client's
silent executes and user expressions, and held cells over the Jupyter
channels are decided, held and recorded exactly as a ``/v1`` cell is; the
same code sent over HTTP and over the channels leaves the same history.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest
from helpers import (
    Canary,
    canary_session,
    closed,
    e2b_env,
    execute_request,
    full_history,
    run,
    short_tmpdir,
    wait_for,
)
from tornado.httpclient import HTTPClientError
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.docker
T = TypeVar("T")

TOKENS = {"strict": "strict-token", "acme": "acme-token", "approver": "approver-token"}
STRICT = 'mode = "enforce"\n[rules]\nshell = "deny"\nsecrets = "deny"\n'
HOLDING = 'mode = "enforce"\n[rules]\nshell = "hold"\n'
SHELL = "import os\nprint(os.system('true'))"
SLEEP = "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"


@pytest.fixture(scope="module")
def gated(start_gateway):
    """A gateway where tenant strict refuses shells and tenant acme holds them."""
    data_dir = short_tmpdir()
    (data_dir / "tokens.toml").write_text(
        '[[tokens]]\ntenant = "strict"\ntoken = "strict-token"\n\n'
        '[[tokens]]\ntenant = "acme"\ntoken = "acme-token"\n\n'
        '[[tokens]]\ntenant = "acme"\ntoken = "approver-token"\napprover = true\n'
    )
    policies = data_dir / "policies"
    policies.mkdir()
    (policies / "strict.toml").write_text(STRICT)
    (policies / "acme.toml").write_text(HOLDING)
    gw = start_gateway(
        "--tokens-file", str(data_dir / "tokens.toml"), "--approval-timeout", "30",
        data_dir=data_dir,
    )  # fmt: skip
    clients = {
        name: httpx.Client(base_url=gw.url, timeout=120, headers={"Authorization": f"Bearer {t}"})
        for name, t in TOKENS.items()
    }
    with canary_session(gw) as canary:
        yield gw, clients, canary
    for client in clients.values():
        client.close()


def new_session(api: httpx.Client) -> str:
    r = api.post("/v1/sessions", json={})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def channels_url(gw, sid: str, token: str) -> str:
    return gw.url.replace("http://", "ws://") + f"/api/kernels/{sid}/channels?token={token}"


async def exchange(ws, *requests: dict, timeout: float = 90) -> list[dict[str, dict]]:
    """Send requests; each one's messages by type (``idle`` its idle status), in reply order."""
    for request in requests:
        ws.write_message(json.dumps(request))
    seen: dict[str, dict[str, dict]] = {r["header"]["msg_id"]: {} for r in requests}
    order: list[str] = []
    deadline = time.monotonic() + timeout
    while len(order) < len(requests) or not all("idle" in s for s in seen.values()):
        text = await asyncio.wait_for(ws.read_message(), max(0.1, deadline - time.monotonic()))
        assert text is not None, "the channels closed"
        msg = json.loads(text)
        mine = seen.get(msg.get("parent_header", {}).get("msg_id"))
        if mine is None:
            continue
        kind = msg["msg_type"]
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            kind = "idle"
        if kind == "execute_reply":
            order.append(msg["parent_header"]["msg_id"])
        mine[kind] = msg
    return [seen[msg_id] for msg_id in order]


def _workspace_names(api: httpx.Client, sid: str) -> set[str]:
    listing = api.get(f"/v1/sessions/{sid}/files").json()
    return {f["name"] for f in listing.get("files", listing.get("entries", []))}


def test_a_policy_that_refuses_shells_refuses_commands_on_every_route(gated, monkeypatch):
    import e2b
    from e2b_code_interpreter import Sandbox

    gw, c, canary = gated
    with Canary(gw, canary):
        sid = new_session(c["strict"])
        r = c["strict"].post(f"/v1/sessions/{sid}/commands", json={"command": "id"})
        assert r.status_code == 403, f"a refused shell ran as a command: {r.status_code} {r.text}"
        assert "shell" in r.json()["error"]["message"], r.text
        for name, value in e2b_env(gw, "strict-token").items():
            monkeypatch.setenv(name, value)
        sandbox = Sandbox.create()
        try:
            with pytest.raises(Exception, match="refused") as refused:
                sandbox.commands.run("echo ran > ran.txt")
            print("e2b commands:", refused.value)
            with pytest.raises(Exception, match="refused"):
                sandbox.pty.create(size=e2b.PtySize(rows=24, cols=80))
            with pytest.raises(e2b.NotFoundException):
                sandbox.files.read("ran.txt")
            history = full_history(c["strict"], sandbox.sandbox_id)
        finally:
            sandbox.kill()
    commands = [e for e in full_history(c["strict"], sid) if e["status"] == "denied"]
    assert [e["code"] for e in commands] == ["/bin/sh -c id"], commands
    assert commands[0]["review"]["kind"] == "command"
    assert [e["status"] for e in history] == ["denied", "denied"], history


def test_silent_executes_and_user_expressions_pass_the_gate(gated):
    gw, c, canary = gated
    sid = new_session(c["strict"])
    url = channels_url(gw, sid, "strict-token")
    silent = execute_request("import os\nos.system('touch silent-ran')")
    silent["content"].update(silent=True, store_history=False)
    expressions = execute_request("import os")
    expressions["content"]["user_expressions"] = {"x": "os.system('touch expr-ran')"}

    async def scenario() -> tuple[dict, dict, dict]:
        ws = await websocket_connect(url)
        try:
            return (
                *await exchange(ws, silent),
                *await exchange(ws, expressions),
                *await exchange(ws, execute_request("print('still here')")),
            )
        finally:
            await closed(ws)

    with Canary(gw, canary):
        refused_silent, refused_expressions, after = asyncio.run(scenario())
    for refused in (refused_silent, refused_expressions):
        reply = refused["execute_reply"]["content"]
        assert reply["status"] == "error" and reply["ename"] == "Denied", reply
        assert refused["error"]["content"]["ename"] == "Denied"
    assert after["execute_reply"]["content"]["status"] == "ok", after
    names = _workspace_names(c["strict"], sid)
    assert not names & {"silent-ran", "expr-ran"}, f"refused code ran: {names}"
    history = full_history(c["strict"], sid)
    assert [e["status"] for e in history] == ["denied", "denied", "ok"], history
    assert history[0]["review"]["kind"] == "silent"
    assert "expr-ran" in history[1]["code"], "the user expression is not in the record"


def _approve_when_held(api: httpx.Client, approver: httpx.Client, sid: str) -> str:
    """Wait for the session's pending approval and approve it; its id."""

    def pending():
        found = api.get("/v1/approvals", params={"state": "pending"}).json()["approvals"]
        return next((a for a in found if a["session_id"] == sid), None)

    approval = wait_for(pending, 30)
    assert approval, "nothing was held for an approver"
    r = approver.post(f"/v1/approvals/{approval['id']}/approve", json={})
    assert r.status_code == 200, r.text
    return approval["id"]


def _interrupt_soon(api: httpx.Client, sid: str, path: str) -> None:
    def go() -> None:
        time.sleep(2)
        api.post(path.format(sid=sid))

    threading.Thread(target=go, daemon=True).start()


def test_the_same_code_over_http_and_the_jupyter_channels_leaves_the_same_record(gated):
    gw, c, canary = gated
    over_http, over_channels = new_session(c["acme"]), new_session(c["acme"])

    # Over HTTP: a cell, a held cell approved, a cell interrupted.
    assert run(c["acme"], over_http, "print(6 * 7)")["status"] == "ok"
    held = c["acme"].post(f"/v1/sessions/{over_http}/execute", json={"code": SHELL})
    assert held.status_code == 202, held.text
    _approve_when_held(c["acme"], c["approver"], over_http)
    wait_for(lambda: len(full_history(c["acme"], over_http)) == 2 and
             full_history(c["acme"], over_http)[1]["status"] != "running", 30)  # fmt: skip
    _interrupt_soon(c["acme"], over_http, "/v1/sessions/{sid}/interrupt")
    assert run(c["acme"], over_http, SLEEP)["status"] == "interrupted"

    # Over the channels: the same three, the held one waiting in the relay.
    async def scenario() -> list[dict]:
        ws = await websocket_connect(channels_url(gw, over_channels, "acme-token"))
        try:
            [first] = await exchange(ws, execute_request("print(6 * 7)"))
            approving = asyncio.create_task(
                asyncio.to_thread(_approve_when_held, c["acme"], c["approver"], over_channels)
            )
            [second] = await exchange(ws, execute_request(SHELL))
            await approving
            _interrupt_soon(c["acme"], over_channels, "/api/kernels/{sid}/interrupt")
            [third] = await exchange(ws, execute_request(SLEEP))
            return [first, second, third]
        finally:
            await closed(ws)

    with Canary(gw, canary):
        replies = asyncio.run(scenario())
    assert [r["execute_reply"]["content"]["status"] for r in replies] == ["ok", "ok", "error"]

    def record(sid: str) -> list[tuple]:
        return [
            (e["code"], e["status"], (e["review"] or {}).get("approval", {}).get("state"))
            for e in full_history(c["acme"], sid)
        ]

    expected = [
        ("print(6 * 7)", "ok", None),
        (SHELL, "ok", "approved"),
        (SLEEP, "interrupted", None),
    ]
    assert record(over_http) == expected
    assert record(over_channels) == expected, "the channels recorded the same code differently"


def test_a_cell_held_over_the_channels_and_denied_gets_a_jupyter_error(gated):
    gw, c, _ = gated
    sid = new_session(c["acme"])

    def deny() -> None:
        def pending():
            found = c["acme"].get("/v1/approvals", params={"state": "pending"}).json()
            return next((a for a in found["approvals"] if a["session_id"] == sid), None)

        approval = wait_for(pending, 30)
        c["approver"].post(f"/v1/approvals/{approval['id']}/deny", json={"reason": "no"})

    async def scenario() -> list[dict]:
        ws = await websocket_connect(channels_url(gw, sid, "acme-token"))
        try:
            denying = asyncio.create_task(asyncio.to_thread(deny))
            # The second is sent while the first waits: it runs after it, never before.
            replies = await exchange(ws, execute_request(SHELL), execute_request("print('after')"))
            await denying
            return replies
        finally:
            await closed(ws)

    denied, after = asyncio.run(scenario())  # in the order they were answered
    assert denied["execute_reply"]["content"]["ename"] == "Denied", denied
    assert after["execute_reply"]["content"]["status"] == "ok"
    statuses = [e["status"] for e in full_history(c["acme"], sid)]
    assert statuses == ["denied", "ok"], statuses


def test_a_second_execute_while_the_first_is_held_is_answered_at_once(gated):
    gw, c, canary = gated
    sid = new_session(c["acme"])
    held = c["acme"].post(f"/v1/sessions/{sid}/execute", json={"code": SHELL})
    assert held.status_code == 202, held.text
    with Canary(gw, canary):
        started = time.monotonic()
        second = c["acme"].post(f"/v1/sessions/{sid}/execute", json={"code": "print(1)"})
        waited = time.monotonic() - started
    assert waited < 5, f"the second execute waited {waited:.1f} s for the first's approval"
    assert second.status_code == 409, second.text
    error = second.json()["error"]
    assert held.json()["approval_id"] in error["message"], error
    r = c["approver"].post(f"/v1/approvals/{held.json()['approval_id']}/deny", json={})
    assert r.status_code == 200, r.text
    assert wait_for(lambda: run(c["acme"], sid, "print(2)")["status"] == "ok", 30)


async def over_channels(url: str, talk: Callable[[Any], Awaitable[T]]) -> T:
    """``talk`` on a channels WebSocket of its own, closed after."""
    ws = await websocket_connect(url)
    try:
        return await talk(ws)
    finally:
        await closed(ws)


def test_an_execute_sent_on_the_control_channel_passes_the_gate(gated):
    """ipykernel runs an execute_request on the control channel as on shell."""
    gw, c, canary = gated
    sid = new_session(c["strict"])
    url = channels_url(gw, sid, "strict-token")
    on_control = execute_request("import os\nos.system('touch control-ran')")
    on_control["channel"] = "control"

    async def talk(ws) -> list[str]:
        ws.write_message(json.dumps(on_control))
        answers = []  # what came back for it, until a refusal or its reply
        while True:
            msg = json.loads(await asyncio.wait_for(ws.read_message(), 60))
            if msg.get("channel") == "error":
                answers.append(msg["error"])
                break
            if msg.get("parent_header", {}).get("msg_id") == on_control["header"]["msg_id"]:
                answers.append(msg["msg_type"])
                if msg["msg_type"] == "execute_reply":
                    break
        [after] = await exchange(ws, execute_request("print('still here')"))
        assert after["execute_reply"]["content"]["status"] == "ok", after
        return answers

    with Canary(gw, canary):
        answers = asyncio.run(over_channels(url, talk))
    assert "control-ran" not in _workspace_names(c["strict"], sid), "a refused shell ran"
    assert "shell channel" in answers[-1], answers


def test_user_expressions_are_judged_each_on_its_own(gated):
    """Joined into one text, expressions of unclosed quotes hid a shell call between them."""
    gw, c, canary = gated
    sid = new_session(c["strict"])
    hidden = execute_request("import os")
    hidden["content"]["user_expressions"] = {
        "a": "'''",
        "b": "os.system('touch hidden-ran')",
        "c": "'''",
    }

    url = channels_url(gw, sid, "strict-token")
    with Canary(gw, canary):
        [reply] = asyncio.run(over_channels(url, lambda ws: exchange(ws, hidden)))
    assert "hidden-ran" not in _workspace_names(c["strict"], sid), "a hidden shell call ran"
    assert reply["execute_reply"]["content"]["ename"] == "Denied", reply


async def refusals(ws, replies_too: bool = False) -> tuple[int, str]:
    """Refusals the gateway sends until it falls silent for 3 s: how many, and the first.

    ``replies_too``: an execute_reply's error counts as one as well.
    """
    refused, first = 0, ""
    while True:
        try:
            text = await asyncio.wait_for(ws.read_message(), 3)
        except TimeoutError:
            return refused, first
        assert text is not None, "the channels closed"
        msg = json.loads(text)
        error = msg.get("error")
        if replies_too and msg.get("msg_type") == "execute_reply":
            error = error or msg["content"].get("evalue")
        refused += bool(error)
        first = first or error


def test_requests_queued_behind_a_held_cell_are_bounded(gated):
    """A client flooding the relay while its cell is held gets refusals, not a growing queue."""
    gw, c, canary = gated
    sid = new_session(c["acme"])
    filler = "x" * 2**20  # 1 MiB of code a request
    sent = 300

    async def flood(ws) -> tuple[int, str]:
        ws.write_message(json.dumps(execute_request(SHELL)))
        await asyncio.sleep(2)  # held by now
        for _ in range(sent):
            await ws.write_message(json.dumps(execute_request(f"# {filler}")))
        return await refusals(ws, replies_too=True)

    url = channels_url(gw, sid, "acme-token")
    with Canary(gw, canary, max_rss_growth=200 * 2**20) as watch:
        refused, first = asyncio.run(over_channels(url, flood))
    print(f"{refused} of {sent} refused; first: {first}; {watch}")
    assert refused > 0, "every request was queued behind the held cell"
    assert "held" in first, first


def debug_request(seq: int, command: str, arguments: dict) -> dict:
    """A DAP request over the control channel, as JupyterLab's debugger sends one."""
    request = execute_request("")
    request["header"].update(msg_type="debug_request", msg_id=uuid.uuid4().hex)
    request["channel"] = "control"
    request["content"] = {"seq": seq, "type": "request", "command": command, "arguments": arguments}
    return request


async def debug_session(ws, code: str, marker: str) -> list[dict]:
    """Breakpoint conditions and the console evaluate code: each answer of the debugger."""

    async def ask(request: dict, reply: str = "debug_reply") -> dict:
        ws.write_message(json.dumps(request))
        while True:
            msg = json.loads(await asyncio.wait_for(ws.read_message(), 60))
            parent = msg.get("parent_header", {}).get("msg_id")
            if parent == request["header"]["msg_id"] and msg["msg_type"] == reply:
                return msg["content"]

    shell = f"__import__('os').system('touch {marker}')"
    info = debug_request(0, "", {})
    info.update(channel="shell", content={})
    info["header"]["msg_type"] = "kernel_info_request"
    kernel = await ask(info, "kernel_info_reply")
    offered = "debugger" in kernel.get("supported_features", ()) or kernel.get("debugger", False)
    answers = [
        {"success": offered, "what": "kernel_info_reply offers a debugger"},
        await ask(debug_request(1, "initialize", {"adapterID": "python", "linesStartAt1": True})),
        await ask(debug_request(2, "attach", {})),
        await ask(debug_request(3, "dumpCell", {"code": code})),
    ]
    path = (answers[-1].get("body") or {}).get("sourcePath", "/tmp/cell.py")
    breakpoint = {"line": 2, "condition": f"{shell} == 12345"}
    answers.append(
        await ask(
            debug_request(
                4, "setBreakpoints", {"source": {"path": path}, "breakpoints": [breakpoint]}
            )
        )
    )
    answers.append(await ask(debug_request(5, "configurationDone", {})))
    [ran] = await exchange(ws, execute_request(code))
    assert ran["execute_reply"]["content"]["status"] == "ok", ran
    answers.append(
        await ask(debug_request(6, "evaluate", {"expression": shell, "context": "repl"}))
    )
    return answers


def test_the_kernel_debugger_is_off_under_a_policy_that_gates_code(gated):
    """The debugger evaluated a breakpoint's condition and its console's input, unscanned."""
    gw, c, canary = gated
    sid = new_session(c["strict"])
    code = "y = 1\ny = 2\n"

    def scenario(url: str, marker: str) -> list[dict]:
        return asyncio.run(over_channels(url, lambda ws: debug_session(ws, code, marker)))

    with Canary(gw, canary):
        refused = scenario(channels_url(gw, sid, "strict-token"), "debug-ran")
    assert "debug-ran" not in _workspace_names(c["strict"], sid), "the debugger ran a shell"
    assert not any(a["success"] for a in refused), refused
    assert "debugger" in refused[1]["message"], refused[1]
    # A policy that only reports keeps the debugger.
    open_sid = new_session(gw.client)
    allowed = scenario(channels_url(gw, open_sid, gw.token), "allowed-ran")
    assert all(a["success"] for a in allowed), allowed


def test_an_approver_sees_the_environment_a_held_command_runs_with(gated):
    """BASH_ENV made an approved ``bash -c true`` run a script the approver never saw."""
    gw, c, canary = gated
    sid = new_session(c["acme"])
    script = c["acme"].put(f"/v1/sessions/{sid}/files/x.sh", content=b"touch env-ran\n")
    assert script.status_code == 201, script.text
    env = {"BASH_ENV": "/workspace/x.sh"}
    body = {"command": "bash -c true", "env": env}
    ran: list[httpx.Response] = []
    command = threading.Thread(
        target=lambda: ran.append(c["acme"].post(f"/v1/sessions/{sid}/commands", json=body))
    )
    with Canary(gw, canary):
        command.start()
        approval = _approve_when_held(c["acme"], c["approver"], sid)
        command.join(60)
    held = c["approver"].get(f"/v1/approvals/{approval}").json()
    assert ran and ran[0].status_code == 200, ran
    assert "BASH_ENV=/workspace/x.sh" in held["code"], f"the approver was shown {held['code']!r}"
    [record] = [e for e in full_history(c["acme"], sid) if e["review"].get("kind") == "command"]
    assert "BASH_ENV=/workspace/x.sh" in record["code"], record
    assert "env-ran" in _workspace_names(c["acme"], sid), "what was approved did not run"
    # A cell's environment for one run, the same way: its approver is told of it.
    cell = "import subprocess\nsubprocess.run(['bash', '-c', 'true'])"
    r = c["acme"].post(f"/v1/sessions/{sid}/execute", json={"code": cell, "env": env})
    assert r.status_code == 202, r.text
    held = c["approver"].get(f"/v1/approvals/{r.json()['approval_id']}").json()
    c["approver"].post(f"/v1/approvals/{held['id']}/deny", json={})
    assert any("BASH_ENV=/workspace/x.sh" in reason for reason in held["reasons"]), held


def test_a_parked_relay_is_resumed_only_by_the_token_that_parked_it(gated):
    """Another token resuming it sent code as the first token's: its approver approved its own.

    A client's session id is no secret from its tenant: every connection to
    the kernel sees it in the parent headers on iopub.
    """
    gw, c, canary = gated
    sid = new_session(c["acme"])
    client_session = uuid.uuid4().hex
    held = execute_request("import os\nos.system('touch parked-ran')")

    async def park() -> None:
        url = channels_url(gw, sid, "acme-token") + f"&session_id={client_session}"
        [ran] = await over_channels(url, lambda ws: exchange(ws, execute_request("print(1)")))
        assert ran["execute_reply"]["content"]["status"] == "ok", ran

    async def resume_and_approve(ws) -> tuple[dict, int]:
        ws.write_message(json.dumps(held))
        approval = await asyncio.to_thread(
            wait_for, lambda: c["acme"].get(f"/v1/approvals/{pending(sid)}").json(), 30
        )
        decided = await asyncio.to_thread(
            c["approver"].post, f"/v1/approvals/{approval['id']}/approve", json={}
        )
        return approval, decided.status_code

    def pending(sid: str) -> str:
        found = c["acme"].get("/v1/approvals", params={"state": "pending"}).json()["approvals"]
        return next((a["id"] for a in found if a["session_id"] == sid), "none")

    with Canary(gw, canary):
        asyncio.run(park())
        url = channels_url(gw, sid, "approver-token") + f"&session_id={client_session}"
        try:
            approval, status = asyncio.run(over_channels(url, resume_and_approve))
        except HTTPClientError as e:  # refused at the upgrade
            approval, status = json.loads(e.response.body)["error"], e.code
    time.sleep(2)  # an approved cell would have run by now
    assert "parked-ran" not in _workspace_names(c["acme"], sid), (
        "its approver approved its own code"
    )
    assert status in (403, 409), f"the approver approved the code it sent: {status}, {approval}"
    print("refused:", status, approval)


def test_a_session_with_a_cell_still_held_answers_409_whichever_hold_ended_first(gated):
    """A channels cell held and denied beside a held /v1 cell cleared the session's hold."""
    gw, c, canary = gated
    sid = new_session(c["acme"])
    first = c["acme"].post(f"/v1/sessions/{sid}/execute", json={"code": SHELL})
    assert first.status_code == 202, first.text

    def pending() -> list[str]:
        found = c["acme"].get("/v1/approvals", params={"state": "pending"}).json()["approvals"]
        return [a["id"] for a in found if a["session_id"] == sid]

    async def hold_and_deny(ws) -> dict:
        ws.write_message(json.dumps(execute_request(SHELL)))
        assert await asyncio.to_thread(wait_for, lambda: len(pending()) == 2, 30)
        [second] = [a for a in pending() if a != first.json()["approval_id"]]
        c["approver"].post(f"/v1/approvals/{second}/deny", json={})
        while True:  # its refusal
            msg = json.loads(await asyncio.wait_for(ws.read_message(), 30))
            if msg["msg_type"] == "execute_reply":
                return msg["content"]

    with Canary(gw, canary):
        denied = asyncio.run(over_channels(channels_url(gw, sid, "acme-token"), hold_and_deny))
        assert denied["ename"] == "Denied", denied
        try:
            third = c["acme"].post(
                f"/v1/sessions/{sid}/execute", json={"code": "print(1)"}, timeout=5
            )
        finally:
            c["approver"].post(f"/v1/approvals/{first.json()['approval_id']}/deny", json={})
    assert third.status_code == 409, third.text
    assert first.json()["approval_id"] in third.json()["error"]["message"], third.text


def test_requests_to_a_kernel_that_reads_none_are_bounded(gated):
    """A stopped kernel reads nothing: what a client sent it waited in the gateway, unbounded."""
    gw, c, canary = gated
    sid = new_session(c["acme"])
    filler = "x" * 2**20  # 1 MiB a request
    sent = 400

    async def flood(ws) -> tuple[int, str]:
        stop = "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)"
        ws.write_message(json.dumps(execute_request(stop)))
        await asyncio.sleep(3)  # stopped by now
        for i in range(sent):
            request = execute_request("")
            request["header"]["msg_type"] = "kernel_info_request"
            request.update(channel="control" if i % 2 else "shell", content={"pad": filler})
            await ws.write_message(json.dumps(request))
        return await refusals(ws)

    url = channels_url(gw, sid, "acme-token")
    with Canary(gw, canary, max_rss_growth=150 * 2**20) as watch:
        refused, first = asyncio.run(over_channels(url, flood))
    print(f"{refused} of {sent} refused; first: {first}; {watch}")
    assert refused > 0, "every request waited in the gateway"
    assert "not reading" in first, first
