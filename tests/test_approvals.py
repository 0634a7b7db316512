"""Approval gates against a real gateway: held, approved, denied, timed out, audited, recorded."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
from helpers import (
    ROOT,
    execute_in_background,
    full_history,
    run,
    screenshot_path,
    short_tmpdir,
    wait_for,
)
from mcp import Client as MCPClient
from mcp.client.stdio import StdioServerParameters
from mcp.types import ElicitResult
from test_cli import SBX, sbx
from test_isolation import FETCH, local_index  # noqa: F401 (a fixture)
from test_stream import Stream

from gateway.client import AsyncClient, Client, Denied
from gateway.timestamps import parse_iso

pytestmark = pytest.mark.docker

TOKENS = {
    "agent": ("acme", ""),
    "approver": ("acme", "approver = true"),
    "stranger": ("zeta", "approver = true"),
}
ACME_POLICY = """mode: enforce
rules:
  shell: hold
  network: hold
  secrets: deny
files:
  max_upload: 1k
  max_download: 2k
  delete: deny
"""
SHELL = "import os\nprint(os.system('true'))"


@pytest.fixture(scope="module")
def desk(start_gateway):
    """A gateway whose tenant acme enforces a policy, with an agent and two approvers."""
    data_dir = short_tmpdir()
    (data_dir / "tokens.toml").write_text(
        "".join(
            f'[[tokens]]\ntenant = "{tenant}"\ntoken = "{name}-token"\n{extra}\n'
            for name, (tenant, extra) in TOKENS.items()
        )
    )
    policies = data_dir / "policies"
    policies.mkdir()
    (policies / "acme.yaml").write_text(ACME_POLICY)
    gw = start_gateway(
        "--tokens-file", str(data_dir / "tokens.toml"), "--approval-timeout", "10",
        data_dir=data_dir,
    )  # fmt: skip
    clients = {
        name: httpx.Client(
            base_url=gw.url, timeout=120, headers={"Authorization": f"Bearer {name}-token"}
        )
        for name in TOKENS
    }
    yield gw, clients
    for client in clients.values():
        client.close()


@pytest.fixture
def acme_session(desk):
    _, c = desk
    sid = c["agent"].post("/v1/sessions", json={}).json()["id"]
    yield sid
    c["agent"].delete(f"/v1/sessions/{sid}")


def held(api: httpx.Client, sid: str, code: str) -> dict:
    r = api.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert r.status_code == 202, f"a risky execute was not held: {r.status_code} {r.text}"
    return r.json()


def test_allowed_code_runs_and_its_scan_is_in_the_history(desk, acme_session):
    _, c = desk
    assert run(c["agent"], acme_session, "x = 41\nx + 1")["status"] == "ok"
    (execution,) = full_history(c["agent"], acme_session)
    assert execution["review"]["decision"]["action"] == "allow"
    assert execution["review"]["decision"]["findings"] == []


def test_denied_code_never_runs_and_says_why(desk, acme_session):
    _, c = desk
    r = c["agent"].post(
        f"/v1/sessions/{acme_session}/execute",
        json={"code": "open('/etc/shadow').read()\nprint('ran')"},
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "denied", r.text
    assert "line 1: secrets" in r.json()["error"]["message"]
    (execution,) = full_history(c["agent"], acme_session)
    assert execution["status"] == "denied" and execution["outputs"] == []
    assert execution["review"]["decision"]["findings"][0]["line"] == 1


def test_a_held_execute_runs_after_approval_and_another_meanwhile_is_a_409(desk, acme_session):
    _, c = desk
    agent, approver = c["agent"], c["approver"]
    reply = held(agent, acme_session, SHELL)
    assert reply["state"] == "pending_approval" and reply["reasons"], reply
    assert any("shell" in reason for reason in reply["reasons"])
    session = agent.get(f"/v1/sessions/{acme_session}").json()
    assert session["state"] == "busy", "a session with a pending execute looked idle"
    meanwhile = agent.post(f"/v1/sessions/{acme_session}/execute", json={"code": "print(1)"})
    assert meanwhile.status_code == 409, "later work waited for, or ran before, the decision"
    assert reply["approval_id"] in meanwhile.json()["error"]["message"]

    pending = approver.get("/v1/approvals", params={"state": "pending"}).json()["approvals"]
    (request,) = [a for a in pending if a["id"] == reply["approval_id"]]
    assert request["code"] == SHELL and request["findings"][0]["line"] == 2
    assert c["stranger"].get("/v1/approvals", params={"state": "pending"}).json() == {
        "approvals": []
    }, "an approver of another tenant saw acme's requests"
    stranger = c["stranger"].post(f"/v1/approvals/{reply['approval_id']}/approve", json={})
    assert stranger.status_code == 404
    refused = agent.post(f"/v1/approvals/{reply['approval_id']}/approve", json={})
    assert refused.status_code == 403, "a plain agent token approved an execute"

    r = approver.post(f"/v1/approvals/{reply['approval_id']}/approve", json={"reason": "ok"})
    assert r.status_code == 200 and r.json()["state"] == "approved", r.text
    assert wait_for(lambda: full_history(agent, acme_session)[-1]["status"] == "ok", 60)
    assert run(agent, acme_session, "print('after')")["status"] == "ok"
    first, second = full_history(agent, acme_session)
    assert first["status"] == "ok" and "0" in first["outputs"][0]["text"]
    approval = first["review"]["approval"]
    assert approval["state"] == "approved" and approval["reason"] == "ok"
    lag = parse_iso(first["started_at"]) - parse_iso(approval["decided_at"])
    assert lag < 0.1, f"the approved execute started {lag * 1000:.0f} ms after its approval"
    assert second["outputs"][0]["text"] == "after\n"
    again = approver.post(f"/v1/approvals/{reply['approval_id']}/deny", json={})
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_decided"


def test_the_notebook_export_carries_each_cells_decision(desk, acme_session):
    _, c = desk
    reply = held(c["agent"], acme_session, SHELL)
    c["approver"].post(f"/v1/approvals/{reply['approval_id']}/approve", json={"reason": "yes"})
    assert wait_for(lambda: full_history(c["agent"], acme_session)[-1]["status"] == "ok")
    c["agent"].post(f"/v1/sessions/{acme_session}/execute", json={"code": "open('/etc/shadow')"})
    nb = c["agent"].get(f"/v1/sessions/{acme_session}/notebook").json()
    approved, denied = (
        cell["metadata"]["sbx"] for cell in nb["cells"] if cell["cell_type"] == "code"
    )
    assert approved["review"]["approval"]["state"] == "approved"
    assert approved["review"]["approval"]["reason"] == "yes"
    assert approved["review"]["decision"]["findings"][0]["rule"] == "shell"
    assert denied["status"] == "denied" and denied["review"]["decision"]["action"] == "deny"


def test_file_rules_refuse_big_transfers_and_deletions(desk, acme_session):
    _, c = desk
    files = f"/v1/sessions/{acme_session}/files"
    small = c["agent"].put(f"{files}/small.txt", content=b"x" * 100)
    assert small.status_code == 201, small.text
    big = c["agent"].put(f"{files}/big.txt", content=b"x" * 2000)
    assert big.status_code == 403 and "uploads over 1 KiB" in big.json()["error"]["message"]
    batch = c["agent"].post(files, files={"a": ("a.txt", b"y" * 1500)})
    assert batch.status_code == 403 and batch.json()["error"]["code"] == "denied"
    run(c["agent"], acme_session, "open('made.bin', 'wb').write(b'z' * 3000)")
    download = c["agent"].get(f"{files}/made.bin")
    assert download.status_code == 403 and "downloads over 2 KiB" in download.text
    assert c["agent"].get(f"{files}/small.txt").content == b"x" * 100
    archive = c["agent"].get(files, params={"path": "", "format": "zip"})
    assert archive.status_code == 413, "a directory archive got round the download limit"
    deleted = c["agent"].delete(f"{files}/small.txt")
    assert deleted.status_code == 403 and deleted.json()["error"]["code"] == "denied"


def test_an_approver_cannot_approve_its_own_request(desk, acme_session):
    _, c = desk
    sid = c["approver"].post("/v1/sessions", json={}).json()["id"]
    try:
        reply = held(c["approver"], sid, SHELL)
        r = c["approver"].post(f"/v1/approvals/{reply['approval_id']}/approve", json={})
        assert r.status_code == 403 and "cannot decide" in r.json()["error"]["message"]
    finally:
        c["approver"].delete(f"/v1/sessions/{sid}")


def test_denial_and_timeout_end_a_held_execute_on_the_stream(desk, acme_session):
    gw, c = desk
    url = gw.ws_url(f"/v1/sessions/{acme_session}/stream", token="agent-token")

    async def scenario():
        async with Stream(url) as s:
            s.send(type="execute", id="c1", code=SHELL)
            pending = await s.until("pending_approval", "c1")
            c["approver"].post(
                f"/v1/approvals/{pending['approval_id']}/deny", json={"reason": "not today"}
            )
            denied = await s.until("rejected", "c1")
            s.send(type="execute", id="c2", code="import socket")
            await s.until("pending_approval", "c2")
            started = time.monotonic()
            timed_out = await s.until("rejected", "c2", timeout=30)
            return denied, timed_out, time.monotonic() - started

    denied, timed_out, waited = asyncio.run(scenario())
    assert denied["error"]["code"] == "denied" and "not today" in denied["error"]["message"]
    assert (
        timed_out["error"]["code"] == "denied"
        and "approval_timeout" in timed_out["error"]["message"]
    )
    assert 8 < waited < 16, f"the approval timeout (10 s) took {waited:.1f} s"
    statuses = [e["status"] for e in full_history(c["agent"], acme_session)]
    assert statuses == ["denied", "denied"]


def test_an_approval_for_an_ended_session_is_a_409(desk):
    _, c = desk
    sid = c["agent"].post("/v1/sessions", json={}).json()["id"]
    reply = held(c["agent"], sid, SHELL)
    c["agent"].delete(f"/v1/sessions/{sid}")
    r = c["approver"].post(f"/v1/approvals/{reply['approval_id']}/approve", json={})
    assert r.status_code == 409, r.text
    doc = c["approver"].get(f"/v1/approvals/{reply['approval_id']}").json()
    assert doc["state"] == "denied" and "session ended" in doc["reason"]


def test_decisions_are_in_the_audit_log(desk, acme_session):
    gw, c = desk
    reply = held(c["agent"], acme_session, SHELL)
    c["approver"].post(f"/v1/approvals/{reply['approval_id']}/deny", json={"reason": "no"})
    wanted = {"approval.pending", "approval.denied", "approval.decide"}

    def recorded() -> dict:
        events = gw.client.get("/v1/audit", params={"session_id": acme_session}).json()["events"]
        actions = {e["action"]: e for e in events}
        return actions if wanted <= set(actions) else {}

    actions = wait_for(recorded)
    assert actions, "the approval's request and decision are not in the audit log"
    denial = actions["approval.denied"]
    assert (
        denial["detail"]["reason"] == "no"
        and denial["detail"]["approval_id"] == reply["approval_id"]
    )


def test_a_session_tightens_its_policy_but_cannot_loosen_it(desk):
    _, c = desk
    loose = {"mode": "report", "rules": {"shell": "allow", "install": "deny"}}
    r = c["agent"].post("/v1/sessions", json={"policy": loose})
    sid = r.json()["id"]
    try:
        held(c["agent"], sid, SHELL)  # still held: the tenant's rule stands
        r = c["agent"].post(f"/v1/sessions/{sid}/execute", json={"code": "%pip install x"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "denied"
    finally:
        c["agent"].delete(f"/v1/sessions/{sid}")
    bad = c["agent"].post("/v1/sessions", json={"policy": {"rules": {"shell": "later"}}})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "policy_invalid"


def test_policies_are_read_and_replaced_by_admins_only(desk):
    gw, c = desk
    r = gw.client.get("/v1/policies/acme")
    assert r.status_code == 200 and r.json()["policy"]["rules"]["shell"] == "hold"
    assert r.json()["source"] == ACME_POLICY
    assert c["approver"].get("/v1/policies/acme").status_code == 403
    toml = {"Content-Type": "application/toml"}
    bad = gw.client.put("/v1/policies/beta", content='mode = "enforce"\n[rules]\nshell = 1\n',
                        headers=toml)  # fmt: skip
    assert bad.status_code == 400 and "line 3" in bad.json()["error"]["message"], bad.text
    good = gw.client.put("/v1/policies/beta", content='mode = "enforce"\n', headers=toml)
    assert good.status_code == 200 and good.json()["policy"]["mode"] == "enforce"
    assert (gw.data_dir / "policies" / "beta.toml").read_text() == 'mode = "enforce"\n'
    (gw.data_dir / "policies" / "gamma.yaml").write_text("mode: enforce\n")
    assert gw.client.post("/v1/policies/reload").json()["tenants"] == ["acme", "beta", "gamma"]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "crash"])
def test_a_pending_approval_ends_denied_when_the_gateway_restarts(start_gateway, how):
    """Documented choice: the execute waiting for it dies with the process, so it is denied."""
    data_dir = short_tmpdir()
    (data_dir / "policies").mkdir()
    (data_dir / "policies" / "default.toml").write_text(
        'mode = "enforce"\n[rules]\nshell = "hold"\n'
    )
    first = start_gateway(data_dir=data_dir, keep_sessions=True)
    sid = first.client.post("/v1/sessions", json={}).json()["id"]
    approval_id = held(first.client, sid, SHELL)["approval_id"]
    first.stop(how)
    second = start_gateway(data_dir=data_dir)
    doc = second.client.get(f"/v1/approvals/{approval_id}").json()
    assert doc["state"] == "denied" and doc["decided_by"] == "gateway", doc
    assert ("restarted" if how == signal.SIGKILL else "stopped") in doc["reason"]
    assert second.client.get("/v1/approvals", params={"state": "pending"}).json()["approvals"] == []


def test_the_approvals_page_shows_held_code_live_and_approves_it(desk, acme_session, tmp_path):
    """In real headless Chromium: highlighted code, findings by line, live updates, a button."""
    gw, c = desk
    other = c["agent"].post("/v1/sessions", json={}).json()["id"]
    try:
        first = held(c["agent"], acme_session, "x = 1\n" + SHELL)
        shot = screenshot_path("approvals.png", tmp_path)
        browser = subprocess.Popen(
            ["node", "approvals.mjs", f"{gw.url}/approvals#token=approver-token", str(shot)],
            cwd=ROOT / "tests" / "browser",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert browser.stderr is not None
        for line in browser.stderr:  # the page is up and showing the first request
            if "READY" in line:
                break
        held(c["agent"], other, "import socket")
        out, err = browser.communicate(timeout=120)
        assert browser.returncode == 0, err[-3000:]
        shown = json.loads(out.strip().splitlines()[-1])
    finally:
        c["agent"].delete(f"/v1/sessions/{other}")
    assert shown["flagged"] == ["3"], f"the page marked lines {shown['flagged']}"
    assert "shell" in shown["findings"] and "line 3" in shown["findings"], shown
    assert shown["keywords"] >= 2, "the code is not highlighted"
    assert shown["left"] == 1, "the approved request stayed listed (or the other one went)"
    doc = c["approver"].get(f"/v1/approvals/{first['approval_id']}").json()
    assert doc["state"] == "approved" and doc["reason"] == "looks fine"
    assert wait_for(lambda: full_history(c["agent"], acme_session)[-1]["status"] == "ok")


def test_the_sdk_hears_of_a_pending_execute_and_an_approver_lets_it_run(desk, acme_session):
    gw, _ = desk
    heard: list = []
    with Client(gw.url, "agent-token") as agent, Client(gw.url, "approver-token") as approver:
        session = agent.session(acme_session)
        box: dict = {}
        thread = threading.Thread(
            target=lambda: box.update(run=session.run(SHELL, on_pending=heard.append))
        )
        thread.start()
        (pending,) = approver.wait_for_approvals(interval=0.1, timeout=30)
        assert pending.code == SHELL and pending.findings
        assert approver.approve(pending.id, "fine").state == "approved"
        thread.join(60)
    assert [a.id for a in heard] == [pending.id] and heard[0].reasons
    assert box["run"].ok and box["run"].stdout.strip() == "0"

    async def denied() -> str:
        async with (
            AsyncClient(gw.url, "agent-token") as agent,
            AsyncClient(gw.url, "approver-token") as approver,
        ):

            async def deny(approval) -> None:
                await approver.deny(approval.id, "not now")

            with pytest.raises(Denied) as e:
                await agent.session(acme_session).run(SHELL, on_pending=deny)
            return e.value.message

    assert "not now" in asyncio.run(denied())


def test_the_cli_lists_approves_and_denies(desk, acme_session):
    gw, c = desk
    first = held(c["agent"], acme_session, SHELL)
    approver = SimpleNamespace(url=gw.url, token="approver-token")
    listed = sbx("approvals", "--json", gateway=approver)
    assert listed.returncode == 0, listed.stderr
    assert [a["id"] for a in json.loads(listed.stdout)] == [first["approval_id"]]
    denied = sbx("deny", first["approval_id"], "--reason", "no shell", gateway=approver)
    assert denied.returncode == 0 and "denied" in denied.stderr
    agent = SimpleNamespace(url=gw.url, token="agent-token")
    own = sbx("approve", first["approval_id"], gateway=agent)
    assert own.returncode == 2, "a refused decision did not exit 2"

    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    waiting = subprocess.Popen(
        [SBX, "exec", acme_session, SHELL],
        env={**env, "SBX_URL": gw.url, "SBX_TOKEN": "agent-token"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pending = wait_for(lambda: c["approver"].get("/v1/approvals?state=pending").json()["approvals"])
    assert pending, "sbx exec's execute was not held"
    approved = sbx("approve", pending[0]["id"], gateway=approver)
    assert approved.returncode == 0, approved.stderr
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0 and out.strip() == "0", err
    assert f"held for approval {pending[0]['id']}" in err


def test_the_mcp_run_code_tool_reports_the_pending_state(desk, acme_session):
    gw, c = desk
    params = StdioServerParameters(  # this checkout's code: the whole environment
        command=SBX, args=["mcp", "--url", gw.url, "--token", "agent-token"], env=dict(os.environ)
    )
    progress: list[str] = []

    async def approve_when_pending() -> None:
        while True:
            pending = await asyncio.to_thread(
                lambda: c["approver"].get("/v1/approvals?state=pending").json()["approvals"]
            )
            if pending:
                c["approver"].post(f"/v1/approvals/{pending[0]['id']}/approve", json={})
                return
            await asyncio.sleep(0.1)

    async def on_progress(value, total, message) -> None:
        progress.append(message)

    async def scenario():
        async with MCPClient(params) as client:
            approver = asyncio.create_task(approve_when_pending())
            result = await client.call_tool(
                "run_code", {"session_id": acme_session, "code": SHELL},
                progress_callback=on_progress,
            )  # fmt: skip
            await approver
            return result

    result = asyncio.run(scenario())
    assert result.structured_content["status"] == "ok", result
    assert result.structured_content["approval"]["reasons"]
    assert progress and progress[0].startswith("pending_approval "), progress


def test_the_mcp_server_asks_the_person_by_elicitation_with_their_approver_token(
    desk, acme_session
):
    gw, _ = desk
    params = StdioServerParameters(  # this checkout's code: the whole environment
        command=SBX,
        args=[
            "mcp", "--url", gw.url, "--token", "agent-token", "--approver-token", "approver-token"
        ],
        env=dict(os.environ),
    )  # fmt: skip
    asked: list[str] = []

    async def person(context, params):
        asked.append(params.message)
        return ElicitResult(action="accept", content={"approve": True, "reason": "looks fine"})

    async def scenario():
        # The handshake-era protocol: the one whose servers may ask back mid-call.
        async with MCPClient(params, elicitation_callback=person, mode="legacy") as client:
            return await client.call_tool(
                "run_code", {"session_id": acme_session, "code": SHELL}
            )  # fmt: skip

    result = asyncio.run(scenario())
    assert asked and SHELL in asked[0] and "Held because" in asked[0], asked
    assert result.structured_content["status"] == "ok", result
    decided = gw.client.get(f"/v1/approvals/{result.structured_content['approval']['id']}").json()
    assert (decided["state"], decided["reason"]) == ("approved", "looks fine"), decided
    assert decided["decided_by"] != decided["requested_by"], "the agent's token approved itself"


def test_a_first_connection_to_a_host_is_held_at_the_proxy(start_gateway, local_index):  # noqa: F811
    data_dir = short_tmpdir()
    (data_dir / "policies").mkdir()
    (data_dir / "policies" / "default.toml").write_text(
        'mode = "enforce"\n[rules]\negress = "hold"\n'
    )
    gw = start_gateway("--egress-allow-ranges", "127.0.0.0/8", data_dir=data_dir)
    url = f"http://{local_index}/hello.txt"
    code = FETCH + f"print(fetch('{url}'))\nprint(fetch('{url}'))"
    for approve, expected in ((True, "hello from the host"), (False, "HTTP 403")):
        sid = gw.client.post("/v1/sessions", json={"network": {"allow": ["127.0.0.1"]}}).json()
        thread, box = execute_in_background(gw.client, sid["id"], code)
        pending = wait_for(
            lambda: gw.client.get("/v1/approvals", params={"state": "pending"}).json()["approvals"]
        )
        assert pending and pending[0]["code"] == f"CONNECT {local_index}", pending
        assert pending[0]["language"] == "egress" and pending[0]["session_id"] == sid["id"]
        verb = "approve" if approve else "deny"
        decided = gw.client.post(f"/v1/approvals/{pending[0]['id']}/{verb}", json={})
        assert decided.status_code == 200, decided.text
        thread.join(60)
        lines = box["reply"]["outputs"][0]["text"].splitlines()
        assert all(line.startswith(expected) for line in lines) and len(lines) == 2, lines
        held = gw.client.get("/v1/approvals", params={"state": "approved" if approve else "denied"})
        assert len(held.json()["approvals"]) == 1, "the second connection was held again"
        gw.client.delete(f"/v1/sessions/{sid['id']}")


def test_file_rules_hold_on_a_volumes_files_as_on_a_sessions(desk):
    """A volume is no way round the tenant's file rules: not to upload, download or delete."""
    _, c = desk
    agent = c["agent"]
    assert agent.post("/v1/volumes", json={"name": "ruled", "size": "16m"}).status_code == 201
    big = agent.put("/v1/volumes/ruled/files/big.txt", content=b"x" * 2000)
    assert big.status_code == 403 and "uploads over 1 KiB" in big.text
    assert agent.put("/v1/volumes/ruled/files/small.txt", content=b"x" * 100).status_code == 201
    deleted = agent.delete("/v1/volumes/ruled/files/small.txt")
    assert deleted.status_code == 403 and deleted.json()["error"]["code"] == "denied"
    sid = agent.post("/v1/sessions", json={"volumes": [{"name": "ruled", "path": "v"}]}).json()
    run(agent, sid["id"], "open('v/made.bin', 'wb').write(b'z' * 3000)")
    agent.delete(f"/v1/sessions/{sid['id']}")
    download = agent.get("/v1/volumes/ruled/files/made.bin")
    assert download.status_code == 403 and "downloads over 2 KiB" in download.text
    assert agent.delete("/v1/volumes/ruled").status_code == 204
