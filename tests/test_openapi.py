"""The OpenAPI document is the API's contract: every real response must match it.

Each test drives a real gateway through an endpoint's happy path and main
errors with a client that validates every response against
gateway/openapi.json (status code declared for the operation, content type,
headers, body schema); WebSocket messages are checked against the document's
message schemas. The last test fails if a documented operation was never seen
answering successfully, so the document cannot grow endpoints nobody checks.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import tarfile
import textwrap
import uuid
import zipfile

import httpx
import pytest
from contract import DOC, Contract, operations, schema_errors
from helpers import closed, execute_request, run_over_channels, short_tmpdir, wait_for
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.docker

USER_TOKEN = "acme-user-token-5d1e"
AGENT_TOKEN, APPROVER_TOKEN = "review-agent-token-81c2", "review-approver-token-0b9e"
HOOK = "http://127.0.0.1:9/hook"  # nothing answers: deliveries wait for retries


@pytest.fixture(scope="module")
def gw(start_gateway):
    """A gateway with an admin (its own token) and a user of tenant acme on a 1-session quota."""
    data_dir = short_tmpdir()
    tokens_file = data_dir / "tokens.toml"
    digest = hashlib.sha256(USER_TOKEN.encode()).hexdigest()
    tokens_file.write_text(
        f'[[tokens]]\ntenant = "acme"\nsha256 = "{digest}"\n\n'
        f'[[tokens]]\ntenant = "review"\ntoken = "{AGENT_TOKEN}"\n\n'
        f'[[tokens]]\ntenant = "review"\ntoken = "{APPROVER_TOKEN}"\napprover = true\n\n'
        "[tenants.acme]\nmax_sessions = 1\n"
        f'[[tenants.acme.webhooks]]\nurl = "{HOOK}"\nsecret = "a-secret-of-16-chars"\n'
    )
    (data_dir / "policies").mkdir()
    (data_dir / "policies" / "review.toml").write_text(
        'mode = "enforce"\n[rules]\nshell = "hold"\nsecrets = "deny"\n'
    )
    return start_gateway(
        "--tokens-file", str(tokens_file), "--runtimes", "runc",
        "--max-code-size", "1k", "--max-request-body", "64k", "--interrupt-grace", "1",
        "--webhook-allow-ranges", "127.0.0.0/8", data_dir=data_dir,
    )  # fmt: skip


@pytest.fixture(scope="module")
def contract(gw):
    contract = Contract(gw.url)
    yield contract
    contract.close()


@pytest.fixture(scope="module")
def admin(gw, contract) -> httpx.Client:
    return contract.client(gw.token)


@pytest.fixture(scope="module")
def user(contract) -> httpx.Client:
    return contract.client(USER_TOKEN)


@pytest.fixture(scope="module")
def anonymous(contract) -> httpx.Client:
    return contract.client()


@pytest.fixture
def sid(admin):
    """A live session of the admin's, deleted afterwards."""
    r = admin.post("/v1/sessions", json={"limits": {"disk": "16m"}})
    assert r.status_code == 201, r.text
    yield r.json()["id"]
    admin.delete(f"/v1/sessions/{r.json()['id']}")


def code_of(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


def test_document_and_health_are_public(anonymous):
    served = anonymous.get("/v1/openapi.json")
    assert served.status_code == 200 and served.json() == DOC
    health = anonymous.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_every_kind_of_token_and_its_absence(gw, contract, anonymous):
    assert anonymous.get("/v1/sessions").status_code == 401
    assert anonymous.post("/v1/sessions", json={}).status_code == 401
    r = contract.client("not-a-token").get("/v1/sessions/x")
    assert r.status_code == 401 and code_of(r) == "unauthorized"
    jupyter = contract.client(Authorization=f"token {gw.token}")
    assert jupyter.get("/v1/sessions").status_code == 200
    assert anonymous.get("/v1/sessions", params={"token": gw.token}).status_code == 200


def test_session_lifecycle_and_its_errors(admin):
    catalog = admin.get("/v1/kernels").json()
    assert catalog["default"] == "python3" and "python3" in {k["name"] for k in catalog["kernels"]}
    chosen = str(uuid.uuid4())
    body = {
        "id": chosen, "kernel": "python3", "image": None, "ttl": 600, "idle_timeout": 300,
        "limits": {"memory": "256m", "cpus": 0.5, "pids": 128, "disk": "16m", "timeout": 30,
                   "output_bytes": 65536},
        "runtime": "runc", "network": "none", "env": {"MODE": "fast"},
        "metadata": {"agent": "a1", "step": 3, "draft": True},
    }  # fmt: skip
    created = admin.post("/v1/sessions", json=body)
    assert created.status_code == 201 and created.json()["id"] == chosen
    listed = admin.get("/v1/sessions", params={"metadata.agent": "a1", "state": "idle"})
    assert [s["id"] for s in listed.json()["sessions"]] == [chosen]
    assert admin.get(f"/v1/sessions/{chosen}").json()["env"] == ["MODE"], "names, not values"
    patched = admin.patch(f"/v1/sessions/{chosen}", json={"ttl": 900, "idle_timeout": None})
    assert patched.status_code == 200 and patched.json()["ttl"] == 900
    assert code_of(admin.patch(f"/v1/sessions/{chosen}", json={"kernel": "x"})) == "bad_request"
    assert admin.patch(f"/v1/sessions/{chosen}", json={"ttl": -1}).status_code == 422
    assert admin.delete(f"/v1/sessions/{chosen}").status_code == 204
    ended = admin.get(f"/v1/sessions/{chosen}")
    assert ended.status_code == 200 and ended.json()["state"] == "deleted"
    assert admin.delete(f"/v1/sessions/{chosen}").status_code == 404
    assert admin.patch(f"/v1/sessions/{chosen}", json={"ttl": 60}).status_code == 404
    reused = admin.post("/v1/sessions", json={"id": chosen})
    assert reused.status_code == 409 and code_of(reused) == "conflict"
    refusals = [
        ({"limits": {"gpus": 1}}, 400, "bad_request"),
        ({"kernel": 7}, 400, "bad_request"),
        ({"kernel": "cobol"}, 404, "kernel_not_found"),
        ({"runtime": "gvisor"}, 403, "not_allowed"),
        ({"limits": {"memory": "512g"}}, 422, "limit_exceeded"),
        ({"ttl": 0}, 422, "limit_exceeded"),
        ({"metadata": {"k": [1]}}, 400, "bad_request"),
        ({"env": {"1BAD": "x"}}, 400, "bad_request"),
        ({"secrets": ["NO_SUCH_SECRET"]}, 400, "bad_request"),
    ]
    for request, status, code in refusals:
        r = admin.post("/v1/sessions", json=request)
        assert (r.status_code, code_of(r)) == (status, code), f"{request} -> {r.text}"
    bad_json = admin.post("/v1/sessions", content=b"{nope", headers={"content-type": "x"})
    assert bad_json.status_code == 400
    huge = admin.post("/v1/sessions", json={"metadata": {"blob": "x" * 70_000}})
    assert huge.status_code == 413 and code_of(huge) == "payload_too_large"
    assert admin.get("/v1/sessions/no-such-session").status_code == 404


def test_quota_is_a_429(user):
    first = user.post("/v1/sessions", json={"limits": {"disk": "16m"}})
    assert first.status_code == 201, first.text
    try:
        second = user.post("/v1/sessions", json={})
        assert second.status_code == 429 and code_of(second) == "quota_exceeded"
    finally:
        assert user.delete(f"/v1/sessions/{first.json()['id']}").status_code == 204


def test_execute_outcomes_history_and_notebook(admin, sid):
    code = (
        "import sys\n"
        "from IPython.display import HTML, display\n"
        "print('out')\n"
        "print('err', file=sys.stderr)\n"
        "display(HTML('<b>bold</b>'))\n"
        "open('made.txt', 'w').write('x')\n"
        "41 + 1"
    )
    ok = admin.post(
        f"/v1/sessions/{sid}/execute", json={"code": code, "description": "# All outputs"}
    ).json()
    kinds = [(o["output_type"], o.get("name")) for o in ok["outputs"]]
    assert kinds == [
        ("stream", "stdout"), ("stream", "stderr"), ("display_data", None),
        ("execute_result", None),
    ], ok  # fmt: skip
    assert ok["artifacts"][0]["path"] == "made.txt"
    failed = admin.post(f"/v1/sessions/{sid}/execute", json={"code": "1/0"}).json()
    assert failed["status"] == "error" and failed["outputs"][-1]["output_type"] == "error"
    slow = {"code": "import time; time.sleep(3)", "timeout": 0.5}
    assert admin.post(f"/v1/sessions/{sid}/execute", json=slow).json()["status"] == "timeout"
    for request, status in [
        ({"code": 42}, 400),
        ({}, 400),
        ({"code": "1", "timeout": "soon"}, 400),
        ({"code": "1", "timeout": -1}, 422),
        ({"code": "x" * 2000}, 413),
    ]:
        assert admin.post(f"/v1/sessions/{sid}/execute", json=request).status_code == status
    assert admin.post(f"/v1/sessions/{sid}/interrupt").status_code == 200
    assert admin.post(f"/v1/sessions/{sid}/restart").json()["state"] == "idle"
    history = admin.get(f"/v1/sessions/{sid}/history").json()["executions"]
    assert [e["status"] for e in history] == ["ok", "error", "timeout"]
    page = admin.get(f"/v1/sessions/{sid}/history", params={"limit": 2}).json()
    assert len(page["executions"]) == 2 and page["next"] == page["executions"][-1]["id"]
    assert admin.get(f"/v1/sessions/{sid}/history", params={"limit": 0}).status_code == 400
    network = admin.get(f"/v1/sessions/{sid}/network")
    assert network.json() == {"connections": [], "next": None}, "no network: no connections"
    assert admin.get(f"/v1/sessions/{sid}/network", params={"limit": 0}).status_code == 400
    usage = admin.get(f"/v1/sessions/{sid}/metrics")
    assert usage.status_code == 200 and usage.json()["session_id"] == sid, usage.text
    assert admin.get("/v1/sessions/nope/metrics").status_code == 404
    notebook = admin.get(f"/v1/sessions/{sid}/notebook")
    assert notebook.status_code == 200 and notebook.json()["cells"][0]["cell_type"] == "markdown"
    bare = admin.get(f"/v1/sessions/{sid}/notebook", params={"descriptions": "false"}).json()
    assert bare["cells"][0]["cell_type"] == "code"
    for path in ("execute", "interrupt", "restart"):
        assert admin.post(f"/v1/sessions/nope/{path}", json={"code": "1"}).status_code == 404


def test_commands_and_their_errors(admin, sid):
    ran = admin.post(f"/v1/sessions/{sid}/commands", json={"command": "echo hi; exit 3"})
    assert ran.status_code == 200 and (ran.json()["exit_code"], ran.json()["stdout"]) == (3, "hi\n")
    for request, status in [
        ({}, 400),
        ({"command": "ls", "cwd": {}}, 400),
        ({"command": "ls", "cwd": "../up"}, 400),
        ({"command": "ls", "timeout": -1}, 422),
    ]:
        assert admin.post(f"/v1/sessions/{sid}/commands", json=request).status_code == status
    assert admin.post("/v1/sessions/nope/commands", json={"command": "ls"}).status_code == 404
    for path in ("history", "notebook"):
        assert admin.get(f"/v1/sessions/nope/{path}").status_code == 404


def test_a_dead_kernel_is_a_409_until_restarted(admin, sid, engine):
    engine.containers.get(f"sbx-{sid}").kill()
    assert wait_for(lambda: admin.get(f"/v1/sessions/{sid}").json()["state"] == "dead", 30)
    dead = admin.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})
    assert dead.status_code == 409 and code_of(dead) == "kernel_died"
    assert admin.post(f"/v1/sessions/{sid}/interrupt").status_code == 409
    assert admin.post(f"/v1/sessions/{sid}/restart").status_code == 200
    assert admin.post(f"/v1/sessions/{sid}/execute", json={"code": "1"}).json()["status"] == "ok"


def test_pause_resume_and_their_errors(admin, sid):
    assert admin.post(f"/v1/sessions/{sid}/execute", json={"code": "a = 1"}).status_code == 200
    assert code_of(admin.post(f"/v1/sessions/{sid}/resume")) == "not_paused"
    assert admin.post(f"/v1/sessions/{sid}/pause", json={"strategy": 3}).status_code == 400
    refused = admin.post(f"/v1/sessions/{sid}/pause", json={"strategy": "checkpoint"})
    assert code_of(refused) == "strategy_unavailable"
    paused = admin.post(f"/v1/sessions/{sid}/pause")
    assert paused.status_code == 200 and paused.json()["state"] == "paused", paused.text
    assert admin.get(f"/v1/sessions/{sid}").json()["paused"]["strategy"] == "freeze"
    assert admin.post(f"/v1/sessions/{sid}/execute", json={"code": "a"}).json()["resumed"]
    assert admin.post(f"/v1/sessions/{sid}/pause", json={"strategy": "replay"}).status_code == 200
    assert admin.post(f"/v1/sessions/{sid}/resume").json()["differed"] == []
    for path in ("pause", "resume"):
        assert admin.post(f"/v1/sessions/nope/{path}").status_code == 404


def test_snapshots_forks_and_their_errors(admin, sid):
    assert admin.post(f"/v1/sessions/{sid}/execute", json={"code": "b = 2"}).status_code == 200
    assert admin.post(f"/v1/sessions/{sid}/snapshots", json={"name": 5}).status_code == 400
    taken = admin.post(f"/v1/sessions/{sid}/snapshots", json={"name": "s"})
    assert taken.status_code == 201, taken.text
    snap = taken.json()["id"]
    assert admin.get(f"/v1/sessions/{sid}/snapshots").json()["snapshots"][0]["id"] == snap
    assert admin.get(f"/v1/snapshots/{snap}").json()["name"] == "s"
    fork = admin.post("/v1/sessions", json={"from_snapshot": snap, "limits": {"disk": "16m"}})
    assert fork.status_code == 201 and fork.json()["forked_from"]["snapshot_id"] == snap, fork.text
    assert admin.delete(f"/v1/sessions/{fork.json()['id']}").status_code == 204
    wrong = admin.post("/v1/sessions", json={"from_snapshot": snap, "kernel": "bash"})
    assert wrong.status_code == 409, wrong.text
    assert admin.delete(f"/v1/snapshots/{snap}").status_code == 204
    for method in ("get", "delete"):
        assert code_of(getattr(admin, method)(f"/v1/snapshots/{snap}")) == "snapshot_not_found"
    assert code_of(admin.post("/v1/sessions", json={"from_snapshot": snap})) == "snapshot_not_found"
    assert admin.get("/v1/sessions/nope/snapshots").status_code == 404
    assert admin.post("/v1/sessions/nope/snapshots").status_code == 404


def test_files_both_ways_and_their_errors(admin, sid):
    files = f"/v1/sessions/{sid}/files"
    put = admin.put(f"{files}/data/in.csv", content=b"a,b\n1,2\n")
    digest = hashlib.sha256(b"a,b\n1,2\n").hexdigest()
    assert put.json() == {"path": "data/in.csv", "size": 8, "sha256": digest}, put.text
    assert admin.get(f"{files}/data/in.csv").content == b"a,b\n1,2\n"
    batch = admin.post(
        files, params={"path": "data"}, files={"one": ("x.txt", b"x"), "two": ("y.txt", b"yy")}
    )
    assert batch.status_code == 201 and len(batch.json()["files"]) == 2
    listing = admin.get(files, params={"path": "data"}).json()
    assert [e["name"] for e in listing["entries"]] == ["in.csv", "x.txt", "y.txt"]
    assert admin.get(files).json()["entries"][0]["type"] == "directory"
    tar = admin.get(files, params={"format": "tar"})
    assert "data/in.csv" in tarfile.open(fileobj=io.BytesIO(tar.content)).getnames()
    archive = admin.get(f"{files}/data", params={"format": "zip"})
    assert "in.csv" in zipfile.ZipFile(io.BytesIO(archive.content)).namelist()
    made = admin.post(f"/v1/sessions/{sid}/directories", json={"path": "made/deep"})
    assert made.status_code == 201 and made.json()["type"] == "directory", made.text
    assert admin.post(f"/v1/sessions/{sid}/directories", json={"path": "made"}).status_code == 200
    moved = admin.post(f"/v1/sessions/{sid}/rename", json={"from": "data/x.txt", "to": "made/x"})
    assert moved.status_code == 200 and moved.json()["path"] == "made/x", moved.text
    admin.post(f"/v1/sessions/{sid}/execute", json={"code": "import os; os.symlink('/etc', 'l')"})
    rename, directories = f"/v1/sessions/{sid}/rename", f"/v1/sessions/{sid}/directories"
    refusals = [
        ("POST", rename, {"json": {"from": "nothing", "to": "b"}}, 404, "file_not_found"),
        ("POST", rename, {"json": {"from": "made/x"}}, 400, "bad_request"),
        ("POST", rename, {"json": {"from": "made/x", "to": "l/x"}}, 403, "path_forbidden"),
        ("POST", directories, {"json": {"path": "data/in.csv"}}, 409, "conflict"),
        ("POST", directories, {"json": {}}, 400, "bad_request"),
        ("GET", f"{files}/data", {}, 409, "not_a_file"),
        ("GET", f"{files}/missing.txt", {}, 404, "file_not_found"),
        ("GET", f"{files}/l/passwd", {}, 403, "path_forbidden"),
        ("GET", files, {"params": {"path": "data/in.csv"}}, 409, "not_a_file"),
        ("GET", files, {"params": {"path": "nowhere"}}, 404, "file_not_found"),
        ("GET", files, {"params": {"path": "../"}}, 400, "bad_request"),
        ("GET", files, {"params": {"format": "rar"}}, 400, "bad_request"),
        ("PUT", f"{files}/%2Fetc%2Fpasswd", {"content": b"x"}, 400, "bad_request"),
        ("PUT", f"{files}/big.bin", {"content": b"0" * 20 * 2**20}, 413, "file_too_large"),
        ("POST", files, {"content": b"{}"}, 400, "bad_request"),
        ("DELETE", f"{files}/missing.txt", {}, 404, "file_not_found"),
        ("GET", "/v1/sessions/nope/files", {}, 404, "session_not_found"),
        ("PUT", "/v1/sessions/nope/files/a", {"content": b"x"}, 404, "session_not_found"),
    ]
    for method, url, kw, status, code in refusals:
        r = admin.request(method, url, **kw)
        assert (r.status_code, code_of(r)) == (status, code), f"{method} {url} -> {r.text}"
    assert admin.delete(f"{files}/data").status_code == 204


def test_replay_and_its_errors(admin, sid):
    admin.post(f"/v1/sessions/{sid}/execute", json={"code": "print(6 * 7)"})
    notebook = admin.get(f"/v1/sessions/{sid}/notebook").content
    report = admin.post("/v1/notebooks/replay", content=notebook, params={"image_tolerance": 0})
    assert report.status_code == 200 and report.json()["reproduced"], report.text
    assert admin.post("/v1/notebooks/replay", content=b'{"cells": 1}').status_code == 400
    checked = admin.post("/v1/notebooks/verify", content=notebook)
    assert checked.status_code == 200 and checked.json()["matches"], checked.text
    headless = json.loads(notebook)
    del headless["metadata"]["sbx"]["chain"]
    assert admin.post("/v1/notebooks/verify", json=headless).status_code == 400
    headless["metadata"]["sbx"]["session_id"] = "nope"
    assert admin.post("/v1/notebooks/verify", json=headless).status_code == 404
    out_of_range = admin.post(
        "/v1/notebooks/replay", content=notebook, params={"image_tolerance": 5}
    )
    assert out_of_range.status_code == 400


def test_secrets_are_write_only(admin):
    created = admin.post("/v1/secrets", json={"name": "DOC_KEY", "value": "doc-value-1"})
    assert created.status_code == 201, created.text
    assert code_of(admin.post("/v1/secrets", json={"name": "DOC_KEY", "value": "x"})) == "conflict"
    assert admin.post("/v1/secrets", json={"name": "no spaces", "value": "x"}).status_code == 400
    assert admin.post("/v1/secrets", json={"name": "BIG", "value": "x" * 70_000}).status_code == 413
    assert admin.put("/v1/secrets/DOC_KEY", json={"value": "doc-value-2"}).status_code == 200
    assert admin.put("/v1/secrets/DOC_NEW", json={"value": "doc-value-3"}).status_code == 201
    assert admin.put("/v1/secrets/DOC_NEW", json={}).status_code == 400
    assert [s["name"] for s in admin.get("/v1/secrets").json()["secrets"]] == ["DOC_KEY", "DOC_NEW"]
    for name in ("DOC_KEY", "DOC_NEW"):
        assert admin.delete(f"/v1/secrets/{name}").status_code == 204
    assert code_of(admin.delete("/v1/secrets/DOC_KEY")) == "not_found"


def test_audit_is_for_admins(admin, user):
    events = admin.get("/v1/audit", params={"action": "session.create", "limit": 5})
    assert events.status_code == 200 and events.json()["events"]
    assert admin.get("/v1/audit", params={"since": "2000-01-01T00:00:00Z"}).status_code == 200
    assert admin.get("/v1/audit", params={"limit": 0}).status_code == 400
    assert admin.get("/v1/audit", params={"limit": "many"}).status_code == 400
    assert code_of(user.get("/v1/audit")) == "forbidden"
    verified = admin.get("/v1/admin/audit/verify", params={"tenant": "acme"})
    assert verified.status_code == 200 and verified.json()["ok"], verified.text
    both = {"tenant": "acme", "session": "s"}
    assert admin.get("/v1/admin/audit/verify", params=both).status_code == 400
    assert code_of(user.get("/v1/admin/audit/verify")) == "forbidden"


def test_approvals_and_policies(gw, contract, admin):
    agent, approver = contract.client(AGENT_TOKEN), contract.client(APPROVER_TOKEN)
    sid = agent.post("/v1/sessions", json={"policy": {"rules": {"network": "hold"}}}).json()["id"]
    try:
        shell = {"code": "import os\nos.system('true')"}
        held = agent.post(f"/v1/sessions/{sid}/execute", json=shell)
        assert held.status_code == 202, held.text
        approval_id = held.json()["approval_id"]
        pending = approver.get("/v1/approvals", params={"state": "pending"})
        assert [a["id"] for a in pending.json()["approvals"]] == [approval_id]
        assert approver.get(f"/v1/approvals/{approval_id}").status_code == 200
        assert code_of(agent.post(f"/v1/approvals/{approval_id}/approve", json={})) == "forbidden"
        r = approver.post(f"/v1/approvals/{approval_id}/approve", json={"reason": "fine"})
        assert r.status_code == 200 and r.json()["state"] == "approved"
        again = approver.post(f"/v1/approvals/{approval_id}/deny", json={})
        assert code_of(again) == "already_decided"
        second = agent.post(f"/v1/sessions/{sid}/execute", json=shell).json()["approval_id"]
        assert approver.post(f"/v1/approvals/{second}/deny", json={}).status_code == 200
        refused = agent.post(f"/v1/sessions/{sid}/execute", json={"code": "open('/etc/shadow')"})
        assert code_of(refused) == "denied"
        history = agent.get(f"/v1/sessions/{sid}/history").json()["executions"]
        assert [e["status"] for e in history] == ["ok", "denied", "denied"]
        assert approver.get("/v1/approvals", params={"state": "denied"}).json()["approvals"]
        assert code_of(approver.get("/v1/approvals", params={"state": "maybe"})) == "bad_request"
        missing = approver.post(f"/v1/approvals/{'0' * 32}/approve", json={})
        assert code_of(missing) == "approval_not_found"
    finally:
        agent.delete(f"/v1/sessions/{sid}")
    page = contract.client().get("/approvals")
    assert page.status_code == 200 and "Pending approvals" in page.text
    assert admin.get("/v1/policies/review").json()["policy"]["mode"] == "enforce"
    assert code_of(agent.get("/v1/policies/review")) == "forbidden"
    yaml = {"Content-Type": "application/yaml"}
    malformed = "mode: enforce\nrules: {shell: x}\n"
    bad = admin.put("/v1/policies/other", content=malformed, headers=yaml)
    assert code_of(bad) == "policy_invalid" and "line 2" in bad.json()["error"]["message"]
    good = admin.put("/v1/policies/other", content="mode: report\n", headers=yaml)
    assert good.status_code == 200
    assert admin.post("/v1/policies/reload").json()["tenants"] == ["other", "review"]


def test_websocket_endpoints_refuse_with_json_errors(gw, contract, admin, anonymous, sid):
    evil = contract.client(gw.token, Origin="https://evil.example")
    for path in (f"/v1/sessions/{sid}/stream", f"/api/kernels/{sid}/channels"):
        assert code_of(admin.get(path)) == "bad_request"  # a plain GET, not an upgrade
        assert anonymous.get(path).status_code == 401
        assert evil.get(path).status_code == 403
    assert admin.get("/v1/sessions/nope/stream").status_code in (400, 404)
    upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}  # fmt: skip
    for path in ("/v1/sessions/nope/stream", "/api/kernels/nope/channels"):
        assert admin.get(path, headers=upgrade).status_code == 404


def test_undocumented_methods_are_405_json_errors(gw):
    plain = gw.client  # no contract check: these operations are deliberately not in the document
    for method, path, allowed in [
        ("PUT", "/v1/sessions", "GET, POST, OPTIONS"),
        ("POST", "/v1/sessions/x/stream", "GET"),
        ("DELETE", "/api/kernels/x/channels", "GET"),
        ("POST", "/healthz", "GET, OPTIONS"),
    ]:
        r = plain.request(method, path)
        assert r.status_code == 405, f"{method} {path} -> {r.status_code}"
        assert r.json()["error"]["code"] == "method_not_allowed", f"{method} {path}: {r.text}"
        assert r.headers["allow"] == allowed


def test_stream_events_match_the_document(gw, sid):
    async def scenario() -> list[dict]:
        ws = await websocket_connect(gw.ws_url(f"/v1/sessions/{sid}/stream"))
        requests = [
            {"type": "execute", "id": "c1", "code": "print('a')\ndisplay({'x': 1}, raw=True)\n7"},
            {"type": "execute", "id": "c2", "code": "from IPython.display import clear_output\n"
             "print('gone'); clear_output(); 1/0", "description": "fails"},
            {"type": "execute", "id": "c3", "code": "x" * 2000},
            {"type": "dance"},
        ]  # fmt: skip
        for request in requests:
            ws.write_message(json.dumps(request))
        ws.write_message("[not an object")
        events: list[dict] = []
        while sum(e["type"] in ("done", "rejected") for e in events) < 5:
            raw = await asyncio.wait_for(ws.read_message(), 60)
            assert raw is not None, f"the stream closed after {events}"
            events.append(json.loads(raw))
        await closed(ws)
        return events

    events = asyncio.run(scenario())
    for event in events:
        assert not schema_errors("StreamEvent", event), (event, schema_errors("StreamEvent", event))
    kinds = {e["type"] for e in events}
    assert {"status", "stream", "display_data", "execute_result", "error", "clear_output", "done",
            "rejected"} <= kinds, kinds  # fmt: skip
    for request in [{"type": "execute", "code": "1"}, {"type": "interrupt"}]:
        assert not schema_errors("StreamRequest", request)


def test_jupyter_channel_messages_match_the_document(gw, sid):
    url = gw.ws_url(f"/api/kernels/{sid}/channels")
    messages = asyncio.run(run_over_channels(url, "print('hi'); 1 + 1"))
    assert {m["msg_type"] for m in messages} >= {"status", "stream", "execute_result"}
    for message in messages:
        assert not schema_errors("JupyterMessage", message), message

    async def refused() -> dict:
        ws = await websocket_connect(HTTPRequest(url))
        ws.write_message(json.dumps({"no": "header"}))
        reply = json.loads(await asyncio.wait_for(ws.read_message(), 30))
        await closed(ws)
        return reply

    reply = asyncio.run(refused())
    assert reply["channel"] == "error" and not schema_errors("JupyterMessage", reply)
    assert not schema_errors("JupyterMessage", execute_request("1"))


def test_previews_and_their_errors(admin, anonymous, sid):
    """A server the kernel starts answers every method through the path form; links, ports."""
    run_code = textwrap.dedent("""
        import http.server, threading
        class Any(http.server.BaseHTTPRequestHandler):
            def answer(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = self.command.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = answer
        _server = http.server.ThreadingHTTPServer(("127.0.0.1", 8010), Any)
        threading.Thread(target=_server.serve_forever, daemon=True).start()
    """)
    assert admin.post(f"/v1/sessions/{sid}/execute", json={"code": run_code}).status_code == 200
    base = f"/v1/sessions/{sid}/ports/8010/x"
    for method in ("GET", "PUT", "POST", "DELETE", "PATCH"):
        r = admin.request(
            method, base, content=b"1" if method in ("PUT", "POST", "PATCH") else None
        )
        assert r.status_code == 200 and r.text == method, r.text
    assert 8010 in [p["port"] for p in admin.get(f"/v1/sessions/{sid}/ports").json()["ports"]]
    assert code_of(admin.get(f"/v1/sessions/{sid}/ports/8011/x")) == "port_not_listening"
    assert anonymous.get(base).status_code == 401
    link = admin.post(f"/v1/sessions/{sid}/previews", json={"port": 8010, "expires_in": 60})
    assert link.status_code == 200, link.text
    assert link.json()["path_url"].endswith(link.json()["url"].split("/", 3)[3])
    assert code_of(admin.post(f"/v1/sessions/{sid}/previews", json={"port": "x"})) == "bad_request"
    assert admin.post("/v1/sessions/nope/previews", json={"port": 1}).status_code == 404


def test_network_rules_change_and_their_errors(admin, sid):
    made = admin.post("/v1/sessions", json={"network": {"allow": []}})
    assert made.status_code == 201, made.text
    networked = made.json()["id"]
    try:
        changed = admin.patch(
            f"/v1/sessions/{networked}/network", json={"allow": ["public"], "deny": ["10.0.0.0/8"]}
        )
        assert changed.status_code == 200 and changed.json()["network"]["deny"] == ["10.0.0.0/8"]
        bad = admin.patch(f"/v1/sessions/{networked}/network", json={"allow": "x"})
        assert code_of(bad) == "bad_request"
    finally:
        admin.delete(f"/v1/sessions/{networked}")
    assert admin.patch(f"/v1/sessions/{sid}/network", json={"allow": []}).status_code == 409
    for page in ("network", "history"):  # a cursor past the store's 64-bit ids was a 500
        assert code_of(admin.get(f"/v1/sessions/{sid}/{page}?after={2**64}")) == "bad_request"
    assert admin.patch("/v1/sessions/nope/network", json={"allow": []}).status_code == 404


def test_webhook_endpoints_the_delivery_log_and_a_replay(user, admin):
    assert user.get("/v1/webhooks").json()["endpoints"][0]["url"] == HOOK
    created = user.post("/v1/sessions", json={"limits": {"disk": "16m"}})
    assert user.delete(f"/v1/sessions/{created.json()['id']}").status_code == 204
    page = wait_for(lambda: user.get("/v1/webhooks/deliveries", params={"limit": 1}).json())
    assert page and page["deliveries"], page
    delivery = page["deliveries"][0]
    assert user.get(f"/v1/webhooks/deliveries/{delivery['id']}").json()["id"] == delivery["id"]
    assert user.post(f"/v1/webhooks/deliveries/{delivery['id']}/replay").status_code == 202
    assert admin.get("/v1/webhooks/deliveries", params={"before": page["next"]}).status_code == 200
    assert code_of(user.get("/v1/webhooks/deliveries", params={"state": "x"})) == "bad_request"
    assert user.get(f"/v1/webhooks/deliveries/{'0' * 32}").status_code == 404


def test_code_contexts_and_their_errors(admin, sid):
    base = f"/v1/sessions/{sid}/contexts"
    made = admin.post(base, json={"kernel": "xpython", "cwd": "/workspace/ctx"})
    assert made.status_code == 201, made.text
    cid = made.json()["id"]
    assert [c["id"] for c in admin.get(base).json()["contexts"]] == ["default", cid]
    assert admin.get(f"{base}/default").json()["default"] is True
    ran = admin.post(f"/v1/sessions/{sid}/execute", json={"code": "v = 1", "context": cid})
    assert ran.json()["context"]["id"] == cid
    assert admin.post(f"{base}/{cid}/interrupt").status_code == 200
    assert admin.post(f"{base}/{cid}/restart").json()["state"] == "running"
    notebook = admin.get(f"/v1/sessions/{sid}/notebook", params={"context": cid})
    assert notebook.json()["metadata"]["kernelspec"]["name"] == "xpython"
    for body in ({"language": "cobol"}, {"cwd": "/etc"}, {"kernel": 3}):
        assert code_of(admin.post(base, json=body)) == "bad_request"
    assert admin.get(f"{base}/nope").status_code == 404
    assert admin.post(f"{base}/nope/restart").status_code == 404
    assert admin.delete(f"{base}/default").status_code == 400
    assert admin.get("/v1/sessions/nope/contexts").status_code == 404
    assert admin.delete(f"{base}/{cid}").status_code == 204


def test_tools_and_their_errors(admin, sid):
    base = f"/v1/sessions/{sid}/tools"
    assert admin.get(base).json()["tools"] == []
    assert admin.put(base, json={}).json() == admin.get(base).json()
    assert code_of(admin.put(base, json={"mcp": "x"})) == "bad_request"
    assert code_of(admin.put(base, json={"stdio": [{"command": "x"}]})) == "bad_request"
    unreachable = admin.put(base, json={"mcp": [{"url": "http://169.254.169.254/mcp"}]})
    assert code_of(unreachable) == "tool_server_failed"
    assert admin.get("/v1/sessions/nope/tools").status_code == 404
    assert code_of(admin.post("/v1/sessions", json={"tools": {"rules": {"x": "maybe"}}})) == (
        "bad_request"
    )


def test_volumes_their_files_and_their_errors(admin, user):
    assert admin.post("/v1/volumes", json={"name": "contract", "size": "16m"}).status_code == 201
    assert admin.post("/v1/volumes", json={"name": "../x"}).status_code == 400
    assert admin.post("/v1/volumes", json={"name": "contract"}).status_code == 409
    assert "contract" in {v["name"] for v in admin.get("/v1/volumes").json()["volumes"]}
    assert admin.get("/v1/volumes/contract").json()["name"] == "contract"
    assert user.get("/v1/volumes/contract").status_code == 404  # another tenant's
    files = "/v1/volumes/contract/files"
    assert admin.put(f"{files}/a.csv", content=b"x,y\n1,2\n").status_code == 201
    assert admin.get(files, params={"path": ""}).status_code == 200
    assert admin.get(f"{files}/a.csv").content == b"x,y\n1,2\n"
    assert admin.get(f"{files}/nope.csv").status_code == 404
    assert admin.delete(f"{files}/a.csv").status_code == 204
    assert admin.delete("/v1/volumes/contract").status_code == 204
    assert admin.get("/v1/volumes/contract").status_code == 404


def test_templates_and_their_errors(admin, user):
    built = admin.post(
        "/v1/templates", json={"name": "contract", "dockerfile": "FROM sbx/python\n"}
    )
    assert built.status_code == 202, built.text
    assert wait_for(
        lambda: admin.get("/v1/templates/contract").json()["versions"][0]["status"] != "building",
        timeout=120,
    )
    assert admin.get("/v1/templates/contract").json()["versions"][0]["status"] == "ready"
    assert "contract" in json.dumps(admin.get("/v1/templates").json())
    assert user.get("/v1/templates/contract").status_code == 404  # another tenant's
    tagged = admin.post("/v1/templates/contract/tags", json={"version": 1, "tags": ["prod"]})
    assert tagged.json()["tags"] == ["prod"]
    assert (
        admin.post("/v1/templates/contract/tags", json={"version": 9, "tags": ["x"]}).status_code
        == 404
    )
    assert (
        user.post("/v1/templates/contract/tags", json={"version": 1, "tags": ["x"]}).status_code
        == 404
    )
    assert [t["tag"] for t in admin.get("/v1/templates/contract/tags").json()["tags"]] == [
        "default", "prod"
    ]  # fmt: skip
    untag = admin.request("DELETE", "/v1/templates/contract/tags", json={"tags": ["prod"]})
    assert untag.status_code == 204
    pooled = admin.put("/v1/templates/contract/pool", json={"size": 1})
    assert pooled.status_code == 200 and pooled.json()["size"] == 1, pooled.text
    assert admin.get("/v1/templates/contract").json()["pool"]["size"] == 1
    assert user.put("/v1/templates/contract/pool", json={"size": 1}).status_code == 404
    assert admin.put("/v1/templates/contract/pool", json={"size": -1}).status_code == 422
    assert admin.put("/v1/templates/contract/pool", json={}).status_code == 400
    assert admin.put("/v1/templates/contract/pool", json={"size": 0}).json()["size"] == 0
    bad = {"name": "x", "dockerfile": "FROM elsewhere/base\n"}
    assert admin.post("/v1/templates", json=bad).status_code == 400
    assert (
        admin.post(
            "/v1/templates", json={"name": "..", "dockerfile": "FROM sbx/python\n"}
        ).status_code
        == 400
    )
    assert admin.delete("/v1/templates/contract").status_code == 204
    assert admin.get("/v1/templates/contract").status_code == 404


def test_every_documented_operation_was_seen_succeeding(contract):
    """Runs last: the tests above must have seen each operation answer with a 2xx."""
    websockets = {"/v1/sessions/{session_id}/stream", "/api/kernels/{kernel_id}/channels"}
    succeeded = {(m, t) for m, t, status in contract.seen if 200 <= status < 300}
    missing = {(m, t) for m, t in operations() if t not in websockets} - succeeded
    assert not missing, f"no test saw these documented operations succeed: {sorted(missing)}"
