"""Authentication, tenant isolation, quotas, the audit log, request limits and CORS."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from helpers import closed, execute_request, run, short_tmpdir, text_of
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.docker

TOKENS = {"alpha": "alpha-token-4f1c9e", "beta": "beta-token-77a0b2", "ops": "ops-token-c3d9"}


@pytest.fixture(scope="module")
def tenants(start_gateway):
    """A gateway with two tenants (beta on tight quotas) and an admin."""
    data_dir = short_tmpdir()
    tokens_file = data_dir / "tokens.toml"
    tokens_file.write_text(
        f"""
[[tokens]]
tenant = "alpha"
token = "{TOKENS["alpha"]}"

[[tokens]]
tenant = "beta"
sha256 = "{__import__("hashlib").sha256(TOKENS["beta"].encode()).hexdigest()}"

[[tokens]]
tenant = "ops"
token = "{TOKENS["ops"]}"
admin = true

[tenants.beta]
max_sessions = 2
max_memory = "768m"
"""
    )
    gw = start_gateway(
        "--tokens-file", str(tokens_file), "--max-code-size", "64k", "--max-request-body", "1m",
        data_dir=data_dir,
        env={"AWS_SECRET_ACCESS_KEY": "gateway-secret-do-not-leak"},
    )  # fmt: skip
    clients = {
        name: httpx.Client(
            base_url=gw.url, timeout=120, headers={"Authorization": f"Bearer {token}"}
        )
        for name, token in TOKENS.items()
    }
    yield gw, clients
    for client in clients.values():
        client.close()


def test_requests_without_a_valid_token_get_401(tenants):
    gw, _ = tenants
    with httpx.Client(base_url=gw.url) as anonymous:
        for path in ("/v1/sessions", "/api/kernels", "/api/kernelspecs", "/v1/audit"):
            r = anonymous.get(path)
            assert r.status_code == 401, f"{path} answered {r.status_code} without a token"
            assert r.json()["error"]["code"] == "unauthorized"
        r = anonymous.get("/v1/sessions", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and "not valid" in r.json()["error"]["message"]
        # Jupyter clients' scheme, and a WebSocket-style query token, both work.
        jupyter_style = {"Authorization": f"token {TOKENS['alpha']}"}
        assert anonymous.get("/api/kernels", headers=jupyter_style).status_code == 200
        assert anonymous.get("/v1/sessions", params={"token": TOKENS["alpha"]}).status_code == 200
        assert anonymous.get("/healthz").status_code == 200, "health checks need no token"


def test_tenants_cannot_see_or_touch_each_others_sessions(tenants):
    gw, c = tenants
    alpha, beta, ops = c["alpha"], c["beta"], c["ops"]
    sid = alpha.post("/v1/sessions", json={}).json()["id"]
    run(alpha, sid, "secret = 42")
    alpha.put(f"/v1/sessions/{sid}/files/a.txt", content=b"alpha's")
    missing = str(uuid.uuid4())

    def calls(target: str) -> list[tuple[str, str, dict]]:
        base = f"/v1/sessions/{target}"
        return [
            ("GET", base, {}),
            ("PATCH", base, {"json": {"ttl": 60}}),
            ("POST", f"{base}/execute", {"json": {"code": "secret"}}),
            ("POST", f"{base}/interrupt", {}),
            ("POST", f"{base}/restart", {}),
            ("GET", f"{base}/history", {}),
            ("GET", f"{base}/notebook", {}),
            ("GET", f"{base}/files", {}),
            ("GET", f"{base}/files/a.txt", {}),
            ("PUT", f"{base}/files/b.txt", {"content": b"x"}),
            ("DELETE", f"{base}/files/a.txt", {}),
            ("GET", f"/api/kernels/{target}", {}),
            ("POST", f"/api/kernels/{target}/interrupt", {}),
            ("POST", f"/api/kernels/{target}/restart", {}),
            ("DELETE", f"/api/kernels/{target}", {}),
            ("DELETE", base, {}),
        ]

    for (method, path, kw), (_, missing_path, _) in zip(calls(sid), calls(missing), strict=True):
        theirs = beta.request(method, path, **kw)
        nobodys = beta.request(method, missing_path, **kw)
        assert theirs.status_code == 404, f"beta {method} {path} -> {theirs.status_code}"
        assert theirs.json() == json.loads(nobodys.text.replace(missing, sid)), (
            f"{method} {path}: another tenant's session must look exactly like a missing one"
        )
    assert sid not in [s["id"] for s in beta.get("/v1/sessions").json()["sessions"]]
    assert sid not in [k["id"] for k in beta.get("/api/kernels").json()]

    async def sockets():
        refused = []
        for path in (f"/v1/sessions/{sid}/stream", f"/api/kernels/{sid}/channels"):
            url = gw.url.replace("http", "ws") + path
            request = HTTPRequest(url, headers={"Authorization": f"Bearer {TOKENS['beta']}"})
            with pytest.raises(HTTPClientError) as caught:
                await websocket_connect(request)
            refused.append(caught.value.code)
        return refused

    assert asyncio.run(sockets()) == [404, 404]
    # Still alive and untouched; the admin sees every tenant's sessions.
    assert text_of(run(alpha, sid, "print(secret)")) == "42\n"
    assert alpha.get(f"/v1/sessions/{sid}/files/a.txt").content == b"alpha's"
    listed = ops.get("/v1/sessions", params={"tenant": "alpha"}).json()["sessions"]
    assert sid in [s["id"] for s in listed] and listed[0]["tenant"] == "alpha"
    assert alpha.delete(f"/v1/sessions/{sid}").status_code == 204
    assert beta.get(f"/v1/sessions/{sid}/history").status_code == 404, "ended, still private"


def test_quotas_trip_at_the_right_count(tenants):
    _, c = tenants
    beta = c["beta"]
    first = beta.post("/v1/sessions", json={"limits": {"memory": "256m"}})
    second = beta.post("/v1/sessions", json={"limits": {"memory": "256m"}})
    assert first.status_code == second.status_code == 201
    third = beta.post("/v1/sessions", json={"limits": {"memory": "128m"}})
    assert third.status_code == 429 and third.json()["error"]["code"] == "quota_exceeded"
    assert "quota of 2" in third.json()["error"]["message"]
    beta.delete(f"/v1/sessions/{second.json()['id']}")
    big = beta.post("/v1/sessions", json={"limits": {"memory": "600m"}})
    assert big.status_code == 429 and "memory" in big.json()["error"]["message"]
    assert "768 MiB" in big.json()["error"]["message"]
    assert c["alpha"].post("/v1/sessions", json={}).status_code == 201, "alpha is not beta"
    for client in (beta, c["alpha"]):
        for s in client.get("/v1/sessions").json()["sessions"]:
            client.delete(f"/v1/sessions/{s['id']}")


def test_every_action_is_audited_and_only_admins_read_it(tenants):
    gw, c = tenants
    alpha, ops = c["alpha"], c["ops"]
    sid = alpha.post("/v1/sessions", json={}).json()["id"]
    run(alpha, sid, "print('audited')")
    alpha.post(f"/v1/sessions/{sid}/interrupt")
    alpha.post(f"/v1/sessions/{sid}/restart")
    alpha.put(f"/v1/sessions/{sid}/files/f.txt", content=b"12345")
    alpha.delete(f"/v1/sessions/{sid}/files/f.txt")
    alpha.delete(f"/v1/sessions/{sid}")
    httpx.get(gw.url + "/v1/sessions", headers={"Authorization": "Bearer nope"})
    assert alpha.get("/v1/audit").status_code == 403
    events = ops.get("/v1/audit", params={"session_id": sid}).json()["events"]
    by_action = {e["action"]: e for e in reversed(events)}
    for action in (
        "session.create", "session.execute", "session.interrupt", "session.restart",
        "files.upload", "files.delete", "session.delete",
    ):  # fmt: skip
        assert action in by_action, f"no audit event for {action}: {events}"
        assert by_action[action]["tenant"] == "alpha" and by_action[action]["outcome"] == "ok"
    import hashlib

    executed = by_action["session.execute"]["detail"]
    assert executed["code_bytes"] == len("print('audited')")
    assert executed["code_sha256"] == hashlib.sha256(b"print('audited')").hexdigest()
    assert by_action["files.upload"]["detail"]["size"] == 5
    failures = ops.get("/v1/audit", params={"action": "auth.failure"}).json()["events"]
    assert failures and failures[0]["outcome"] == "denied" and failures[0]["status"] == 401
    assert '"action": "session.create"' in "".join(gw.log), "audit events go to the log too"


def test_no_token_appears_in_logs_or_the_audit(tenants):
    gw, c = tenants
    c["alpha"].get("/v1/sessions")
    httpx.get(gw.url + "/v1/sessions", params={"token": "leaky-wrong-token"})
    log = "".join(gw.log)
    audit = c["ops"].get("/v1/audit", params={"limit": 1000}).text
    for token in [*TOKENS.values(), gw.token, "leaky-wrong-token"]:
        assert token not in log, "a token was written to the gateway's log"
        assert token not in audit, "a token was written to the audit log"


def test_secrets_never_reach_a_kernel(tenants):
    gw, c = tenants
    alpha = c["alpha"]
    sid = alpha.post("/v1/sessions", json={"env": {"MINE": "ok"}}).json()["id"]
    gateway_files = [str(p) for p in gw.data_dir.iterdir() if p.is_file()]  # tokens, keys
    code = (
        "import os\n"
        "print(repr(dict(os.environ)))\n"
        "print(repr(open('/proc/1/environ', 'rb').read()))\n"
        f"print([os.path.exists(p) for p in {gateway_files!r}])"
    )
    seen = text_of(run(alpha, sid, code))
    alpha.delete(f"/v1/sessions/{sid}")
    assert "MINE" in seen, "the session's own env must reach the kernel"
    assert "True" not in seen.splitlines()[-1], "the gateway's files (tokens, keys) are visible"
    for secret in [*TOKENS.values(), gw.token, "gateway-secret-do-not-leak", "SBX_"]:
        assert secret not in seen, f"{secret!r} is visible inside the sandbox"


def test_request_size_limits_answer_413(tenants):
    gw, c = tenants
    alpha = c["alpha"]
    sid = alpha.post("/v1/sessions", json={}).json()["id"]
    r = alpha.post(f"/v1/sessions/{sid}/execute", json={"code": "x = '" + "a" * 70_000 + "'"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert "file" in r.json()["error"]["message"], "the message should say what to do"
    r = alpha.post(f"/v1/sessions/{sid}/execute", json={"code": "#" * (2 * 2**20)})
    assert r.status_code == 413 and "request body" in r.json()["error"]["message"]

    async def over_the_stream():
        url = gw.ws_url(f"/v1/sessions/{sid}/stream")
        ws = await websocket_connect(
            HTTPRequest(url, headers={"Authorization": f"Bearer {TOKENS['alpha']}"})
        )
        ws.write_message(json.dumps({"type": "execute", "id": "big", "code": "1" * 70_000}))
        event = json.loads(await asyncio.wait_for(ws.read_message(), 30))
        await closed(ws)
        return event

    event = asyncio.run(over_the_stream())
    assert event["type"] == "rejected" and event["error"]["code"] == "payload_too_large"
    assert run(alpha, sid, "1 + 1")["status"] == "ok", "the session must keep working"
    alpha.delete(f"/v1/sessions/{sid}")


def test_jupyter_channels_executes_are_audited(tenants):
    gw, c = tenants
    sid = c["alpha"].post("/v1/sessions", json={}).json()["id"]

    async def execute():
        url = gw.url.replace("http", "ws") + f"/api/kernels/{sid}/channels"
        ws = await websocket_connect(
            HTTPRequest(url, headers={"Authorization": f"token {TOKENS['alpha']}"})
        )
        request = execute_request("1 + 1")
        ws.write_message(json.dumps(request))
        while True:
            msg = json.loads(await asyncio.wait_for(ws.read_message(), 30))
            if msg["msg_type"] == "execute_reply":
                break
        await closed(ws)

    asyncio.run(execute())
    events = c["ops"].get("/v1/audit", params={"session_id": sid}).json()["events"]
    assert any(e["action"] == "kernel.execute" and e["detail"]["code_bytes"] == 5 for e in events)
    c["alpha"].delete(f"/v1/sessions/{sid}")


def test_stream_executes_are_audited_and_a_refused_one_as_failed(tenants):
    gw, c = tenants
    sid = c["alpha"].post("/v1/sessions", json={}).json()["id"]
    code = "import time; time.sleep(1)"

    async def execute_twice():
        ws = await websocket_connect(
            HTTPRequest(
                gw.ws_url(f"/v1/sessions/{sid}/stream"),
                headers={"Authorization": f"Bearer {TOKENS['alpha']}"},
            )
        )
        request = {"type": "execute", "id": "twice", "code": code}
        ws.write_message(json.dumps(request))
        ws.write_message(json.dumps(request))  # the same id while the first runs: refused
        events = []
        while not any(e["type"] == "done" for e in events):
            events.append(json.loads(await asyncio.wait_for(ws.read_message(), 30)))
        await closed(ws)
        return events

    events = asyncio.run(execute_twice())
    assert [e["type"] for e in events].count("rejected") == 1, events
    audited = c["ops"].get("/v1/audit", params={"session_id": sid}).json()["events"]
    executes = [e for e in audited if e["action"] == "session.execute"]
    assert sorted(e["outcome"] for e in executes) == ["failed", "ok"], (
        f"the refused execute should be audited as failed, the other as ok: {executes}"
    )
    assert all(e["detail"]["transport"] == "stream" for e in executes)
    assert all(e["detail"]["code_bytes"] == len(code) for e in executes)
    c["alpha"].delete(f"/v1/sessions/{sid}")


def test_cors_is_off_by_default_and_configurable(gateway, start_gateway):
    evil = {"Origin": "https://evil.example"}
    r = gateway.client.get("/v1/sessions", headers=evil)
    assert "Access-Control-Allow-Origin" not in r.headers

    async def cross_site_socket(gw):
        request = HTTPRequest(gw.ws_url("/v1/sessions/x/stream"), headers=evil)
        with pytest.raises(HTTPClientError) as caught:
            await websocket_connect(request)
        return caught.value.code

    assert asyncio.run(cross_site_socket(gateway)) == 403, "a page on another site got a socket"
    open_to = start_gateway("--cors-origins", "https://app.example")
    preflight = httpx.options(
        open_to.url + "/v1/sessions",
        headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "Authorization" in preflight.headers["Access-Control-Allow-Headers"]
    other = open_to.client.get("/v1/sessions", headers=evil)
    assert "Access-Control-Allow-Origin" not in other.headers


def test_without_tokens_one_is_generated_not_auth_switched_off(start_gateway):
    gw = start_gateway(env={"SBX_TOKEN": ""})
    token_file = gw.data_dir / "token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    token = token_file.read_text().strip()
    with httpx.Client(base_url=gw.url) as client:
        assert client.get("/v1/sessions").status_code == 401
        ok = client.get("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200
    assert token not in "".join(gw.log) and str(token_file) in "".join(gw.log)


def test_auth_is_switched_off_only_explicitly_and_loudly(start_gateway):
    gw = start_gateway("--auth", "none", "--host", "0.0.0.0")
    with httpx.Client(base_url=gw.url) as anonymous:
        assert anonymous.get("/v1/sessions").status_code == 200
    log = "".join(gw.log)
    assert "AUTHENTICATION IS OFF" in log and "ANYONE WHO CAN REACH 0.0.0.0" in log
