"""Sealed secrets: write-only storage, delivery to a session's sandbox, masking everywhere.

The value must never come back: not from the secrets API, a session view,
the history, a notebook export, the Jupyter channels, the audit log, the
gateway's log, the database file, or another tenant's session.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import urllib.parse
from pathlib import Path

import pytest
from helpers import closed, full_history, run, run_over_channels, text_of
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.docker

TOKENS = {"alpha": "alpha-secret-token-81d2", "beta": "beta-secret-token-5c0e"}
TENANT_FLAGS = ("--max-secret-size", "1k")
VALUE = "wh-7Qx9/z+Lk2=pass&word"  # characters every encoding treats differently
MASK = "***WAREHOUSE_KEY***"


def forms(value: str) -> list[str]:
    """The value and the encodings a careless cell would print."""
    raw = value.encode()
    return [
        value,
        base64.b64encode(raw).decode()[:-4],  # the padded tail holds neighbour bits
        urllib.parse.quote(value, safe=""),
        raw.hex(),
    ]


def assert_hidden(where: str, text: str) -> None:
    for form in forms(VALUE):
        assert form not in text, f"{where} shows the secret (as {form!r}): {text[:2000]}"


def test_the_secrets_api_is_write_only(tenants):
    _, c = tenants
    alpha = c["alpha"]
    r = alpha.post("/v1/secrets", json={"name": "API_TOKEN", "value": "first-value-123"})
    assert r.status_code == 201, r.text
    assert r.headers["Location"] == "/v1/secrets/API_TOKEN"
    assert set(r.json()) == {"name", "created_at", "updated_at"}, "a create echoes only dates"
    again = alpha.post("/v1/secrets", json={"name": "API_TOKEN", "value": "x"})
    assert again.status_code == 409 and "PUT /v1/secrets/API_TOKEN" in again.text
    rotated = alpha.put("/v1/secrets/API_TOKEN", json={"value": "second-value-456"})
    assert rotated.status_code == 200 and rotated.json()["created_at"] == r.json()["created_at"]
    assert alpha.put("/v1/secrets/OTHER", json={"value": "v"}).status_code == 201
    listed = alpha.get("/v1/secrets")
    assert [s["name"] for s in listed.json()["secrets"]] == ["API_TOKEN", "OTHER"]
    assert "value" not in listed.text and "second-value" not in listed.text
    assert c["beta"].get("/v1/secrets").json()["secrets"] == [], "tenants see only their own"
    assert c["beta"].delete("/v1/secrets/OTHER").status_code == 404
    assert alpha.delete("/v1/secrets/OTHER").status_code == 204
    missing = alpha.delete("/v1/secrets/OTHER")
    assert missing.status_code == 404 and "GET /v1/secrets" in missing.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"name": "9BAD", "value": "v"}, 400, "environment variable name"),
        ({"name": "OK_NAME"}, 400, "non-empty string"),
        ({"name": "OK_NAME", "value": ""}, 400, "non-empty string"),
        ({"name": "OK_NAME", "value": "x" * 1025}, 413, "1025 bytes, over the limit of 1 KiB"),
    ],
)
def test_bad_secrets_are_refused_clearly(tenants, body, status, says):
    _, c = tenants
    r = c["alpha"].post("/v1/secrets", json=body)
    assert r.status_code == status and says in r.json()["error"]["message"], r.text
    assert "OK_NAME" not in c["alpha"].get("/v1/secrets").text


def test_unknown_or_another_tenants_secret_is_a_400_naming_it(tenants):
    _, c = tenants
    c["alpha"].put("/v1/secrets/ALPHA_ONLY", json={"value": "alpha-private-value"})
    for client in (c["alpha"], c["beta"]):
        r = client.post("/v1/sessions", json={"secrets": ["NOPE_KEY", "ALPHA_ONLY"]})
        assert r.status_code == 400 and "NOPE_KEY" in r.json()["error"]["message"], r.text
    r = c["beta"].post("/v1/sessions", json={"secrets": ["ALPHA_ONLY"]})
    assert r.status_code == 400 and "ALPHA_ONLY" in r.json()["error"]["message"]
    assert c["beta"].get("/v1/sessions").json()["sessions"] == [], "no session was started"
    both = c["alpha"].post(
        "/v1/sessions", json={"env": {"ALPHA_ONLY": "x"}, "secrets": ["ALPHA_ONLY"]}
    )
    assert both.status_code == 400 and "both env and secrets" in both.text


def test_a_session_gets_its_secret_and_nothing_it_produces_shows_it(tenants):
    gw, c = tenants
    alpha = c["alpha"]
    alpha.put("/v1/secrets/WAREHOUSE_KEY", json={"value": VALUE})
    created = alpha.post(
        "/v1/sessions", json={"secrets": ["WAREHOUSE_KEY"], "env": {"MODE": "fast"}}
    )
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    assert created.json()["env"] == ["MODE"] and created.json()["secrets"] == ["WAREHOUSE_KEY"]
    try:
        digest = hashlib.sha256(VALUE.encode()).hexdigest()
        check = run(
            alpha, sid,
            "import os, hashlib\n"
            "print(hashlib.sha256(os.environ['WAREHOUSE_KEY'].encode()).hexdigest())",
        )  # fmt: skip
        assert text_of(check).strip() == digest, "the kernel did not get the secret's value"
        leaky = (
            "import os, base64, urllib.parse, sys\n"
            "from IPython.display import HTML, display\n"
            "v = os.environ['WAREHOUSE_KEY']\n"
            "print(v); print(base64.b64encode(v.encode()).decode())\n"
            "print(base64.b64encode(b'xy' + v.encode()).decode())\n"
            "print(urllib.parse.quote(v, safe='')); print(v.encode().hex())\n"
            "sys.stdout.write(v[:5]); sys.stdout.flush(); sys.stdout.write(v[5:] + '\\n')\n"
            "display(HTML(f'<b>{v}</b>'))\n"
            "raise ValueError(v)"
        )
        reply = run(alpha, sid, leaky, description=f"uses {MASK}")
        assert reply["status"] == "error"
        assert MASK in text_of(reply) and MASK in reply["error"]["evalue"]
        assert_hidden("the execute reply", str(reply))
        channel = asyncio.run(
            run_over_channels(
                gw.ws_url(f"/api/kernels/{sid}/channels").replace(gw.token, TOKENS["alpha"]),
                "import os; print(os.environ['WAREHOUSE_KEY'])",
            )
        )
        assert MASK in str(channel)
        assert_hidden("the Jupyter channels", str(channel))
        views = {
            "the session view": alpha.get(f"/v1/sessions/{sid}").text,
            "the session list": alpha.get("/v1/sessions").text,
            "the history": str(full_history(alpha, sid)),
            "the notebook export": alpha.get(f"/v1/sessions/{sid}/notebook").text,
            "the audit log": gw.client.get("/v1/audit", params={"limit": 1000}).text,
            "the secrets list": alpha.get("/v1/secrets").text,
        }
        for where, text in views.items():
            assert_hidden(where, text)
        assert MASK in views["the history"] and MASK in views["the notebook export"]
        beta_try = c["beta"].get(f"/v1/sessions/{sid}/history")
        assert beta_try.status_code == 404
    finally:
        alpha.delete(f"/v1/sessions/{sid}")
    assert_hidden("the gateway's log", gw.tail(100000))
    stored = b"".join(
        path.read_bytes() for path in gw.data_dir.glob("gateway.sqlite3*") if path.is_file()
    )
    assert VALUE.encode() not in stored, "the database holds the value unsealed"
    key_file = gw.data_dir / "secrets.key"
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_a_restarted_kernel_still_has_its_secret(tenants):
    _, c = tenants
    alpha = c["alpha"]
    alpha.put("/v1/secrets/WAREHOUSE_KEY", json={"value": VALUE})
    sid = alpha.post("/v1/sessions", json={"secrets": ["WAREHOUSE_KEY"]}).json()["id"]
    try:
        assert alpha.post(f"/v1/sessions/{sid}/restart").status_code == 200
        reply = run(alpha, sid, "import os; print(os.environ['WAREHOUSE_KEY'])")
        assert text_of(reply).strip() == MASK
    finally:
        alpha.delete(f"/v1/sessions/{sid}")


def test_secrets_as_files_live_on_a_tmpfs_and_stay_out_of_env(tenants):
    _, c = tenants
    alpha = c["alpha"]
    alpha.put("/v1/secrets/WAREHOUSE_KEY", json={"value": VALUE})
    created = alpha.post("/v1/sessions", json={"secrets": ["WAREHOUSE_KEY"], "secrets_as": "files"})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    try:
        reply = run(
            alpha, sid,
            "import os, hashlib\n"
            "p = '/run/secrets/WAREHOUSE_KEY'\n"
            "print(hashlib.sha256(open(p, 'rb').read()).hexdigest())\n"
            "print('WAREHOUSE_KEY' in os.environ, oct(os.stat(p).st_mode & 0o777))\n"
            "print([l.split()[2] for l in open('/proc/mounts') if '/run/secrets' in l])\n"
            "try:\n    open(p, 'a')\nexcept OSError as e:\n    print('read-only:', e.errno)",
        )  # fmt: skip
        lines = text_of(reply).splitlines()
        assert lines[0] == hashlib.sha256(VALUE.encode()).hexdigest(), reply
        assert lines[1] == "False 0o400", "a file secret must not be in env, and be owner-read"
        assert lines[2] == "['tmpfs']", "the secret files must live on a tmpfs, never on disk"
        assert lines[3].startswith("read-only:")
    finally:
        alpha.delete(f"/v1/sessions/{sid}")
    assert not (Path("/dev/shm/sbx-secrets") / sid).exists(), "the files outlived the session"
    bad = alpha.post("/v1/sessions", json={"secrets": ["WAREHOUSE_KEY"], "secrets_as": "disk"})
    assert bad.status_code == 400 and "'env' or 'files'" in bad.text


def test_a_restarted_gateway_keeps_masking_the_secrets_of_sessions_it_takes_over(start_gateway):
    first = start_gateway(keep_sessions=True)
    first.client.post("/v1/secrets", json={"name": "WAREHOUSE_KEY", "value": VALUE})
    created = first.client.post("/v1/sessions", json={"secrets": ["WAREHOUSE_KEY"]})
    sid = created.json()["id"]
    first.stop()
    second = start_gateway(data_dir=first.data_dir)
    reply = run(second.client, sid, "import os; print(os.environ['WAREHOUSE_KEY'])")
    assert text_of(reply) == MASK + "\n", "the secret was lost, or shown, after the restart"
    assert second.client.get(f"/v1/sessions/{sid}").json()["secrets"] == ["WAREHOUSE_KEY"]


def test_the_agent_stream_shows_only_the_mask(tenants):
    gw, c = tenants
    alpha = c["alpha"]
    alpha.put("/v1/secrets/WAREHOUSE_KEY", json={"value": VALUE})
    sid = alpha.post("/v1/sessions", json={"secrets": ["WAREHOUSE_KEY"]}).json()["id"]

    async def stream() -> list[str]:
        url = gw.ws_url(f"/v1/sessions/{sid}/stream").replace(gw.token, TOKENS["alpha"])
        ws = await websocket_connect(url)
        code = "import os, base64; v = os.environ['WAREHOUSE_KEY']; print(v); v.encode().hex()"
        ws.write_message(json.dumps({"type": "execute", "id": "c1", "code": code}))
        frames = []
        while not frames or json.loads(frames[-1])["type"] != "done":
            frames.append(await asyncio.wait_for(ws.read_message(), 60))
        await closed(ws)
        return frames

    try:
        frames = asyncio.run(stream())
    finally:
        alpha.delete(f"/v1/sessions/{sid}")
    assert_hidden("the agent stream", "".join(frames))
    assert sum(MASK in frame for frame in frames) >= 3, frames  # stdout, result, done


def test_a_command_beside_the_kernel_shows_only_the_mask(tenants):
    """A shell command inherits the sandbox's environment: its output is masked like a cell's."""
    _, c = tenants
    alpha = c["alpha"]
    alpha.put("/v1/secrets/WAREHOUSE_KEY", json={"value": VALUE})
    sid = alpha.post("/v1/sessions", json={"secrets": ["WAREHOUSE_KEY"]}).json()["id"]
    try:
        r = alpha.post(
            f"/v1/sessions/{sid}/commands",
            json={"command": 'echo "$WAREHOUSE_KEY"; echo "$WAREHOUSE_KEY" >&2'},
        )
        assert r.status_code == 200, r.text
        assert r.json()["stdout"].strip() == r.json()["stderr"].strip() == MASK, r.json()
        assert_hidden("a command's output", r.text)
    finally:
        alpha.delete(f"/v1/sessions/{sid}")


PEM = (
    "-----BEGIN PRIVATE KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
    "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu\n"
    "-----END PRIVATE KEY-----\n"
)


def test_printed_forms_and_output_cut_between_reads_show_only_the_mask(tenants):
    """A PEM key through repr and JSON, a value a command writes in two pieces."""
    _, c = tenants
    alpha = c["alpha"]
    alpha.put("/v1/secrets/WAREHOUSE_KEY", json={"value": VALUE})
    alpha.put("/v1/secrets/PEM_KEY", json={"value": PEM})
    created = alpha.post("/v1/sessions", json={"secrets": ["WAREHOUSE_KEY", "PEM_KEY"]})
    sid = created.json()["id"]
    body_lines = PEM.splitlines()[1:3]
    try:
        reply = run(
            alpha, sid,
            "import os, json\nk = os.environ['PEM_KEY']\n"
            "print(repr(k)); print(json.dumps({'k': k})); print(k.splitlines()[1]); k",
        )  # fmt: skip
        for line in body_lines:
            assert line not in str(reply), f"a line of the PEM key shows: {reply}"
        assert text_of(reply).count("***PEM_KEY***") == 3, reply
        command = (
            "printf '%.5s' \"$WAREHOUSE_KEY\"; sleep 0.01; "
            "printf '%s\\n' \"${WAREHOUSE_KEY#?????}\""
        )
        r = alpha.post(f"/v1/sessions/{sid}/commands", json={"command": command})
        assert r.status_code == 200, r.text
        assert r.json()["stdout"] == MASK + "\n", r.json()
    finally:
        alpha.delete(f"/v1/sessions/{sid}")
