"""``sbx mcp --http`` shared by many users: each brings a gateway token, and sees only its
tenant's sessions; listing, interrupting, restarting, progress, and files as resources."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from test_mcp import SBX, MCPHTTPProcess

pytestmark = pytest.mark.docker

TOKENS = {"acme": "acme-mcp-token-0123456789", "beta": "beta-mcp-token-0123456789"}


@pytest.fixture(scope="module")
def shared(tenants):
    gw, clients = tenants
    server = MCPHTTPProcess(gw.url)
    try:
        yield server, clients
    finally:
        server.stop()


def _texts(result) -> list[str]:
    return [block.text for block in result.content if block.type == "text"]


def test_a_call_without_a_valid_token_is_refused(shared):
    server, _ = shared
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    bare = httpx.post(server.url, json=hello, headers=headers, timeout=30)
    assert bare.status_code == 401, bare.text
    wrong = httpx.post(
        server.url, json=hello, headers={**headers, "Authorization": "Bearer nope"}, timeout=30
    )
    assert wrong.status_code == 401, wrong.text


def test_two_tokens_never_see_each_others_sessions(shared):
    server, clients = shared

    async def scenario() -> dict:
        seen: dict = {}
        async with server.client(TOKENS["acme"]) as acme, server.client(TOKENS["beta"]) as beta:
            created = await acme.call_tool("create_session", {"metadata": {"who": "acme"}})
            assert not created.is_error, _texts(created)
            sid = created.structured_content["session_id"]
            seen["sid"] = sid
            await acme.call_tool("run_code", {"session_id": sid, "code": "secret = 'acme-only'"})
            seen["acme_list"] = await acme.call_tool("list_sessions", {})
            seen["beta_list"] = await beta.call_tool("list_sessions", {})
            seen["beta_run"] = await beta.call_tool(
                "run_code", {"session_id": sid, "code": "print(secret)"}
            )
            seen["beta_files"] = await beta.call_tool("list_files", {"session_id": sid})
            seen["beta_resources"] = await beta.list_resources()
            seen["beta_delete"] = await beta.call_tool("delete_session", {"session_id": sid})
            seen["acme_still"] = await acme.call_tool(
                "run_code", {"session_id": sid, "code": "secret"}
            )
            await acme.call_tool("delete_session", {"session_id": sid})
        return seen

    seen = asyncio.run(scenario())
    sid = seen["sid"]
    assert [s["session_id"] for s in seen["acme_list"].structured_content["sessions"]] == [sid]
    assert seen["beta_list"].structured_content["sessions"] == [], "beta saw acme's session"
    for name in ("beta_run", "beta_files", "beta_delete"):
        assert seen[name].is_error and "session_not_found" in _texts(seen[name])[0], name
    assert not [r for r in seen["beta_resources"].resources if sid in str(r.uri)]
    assert _texts(seen["acme_still"]) == ["'acme-only'"]
    # The gateway recorded each session under the caller's own tenant.
    owned = clients["acme"].get(f"/v1/sessions/{sid}").json()
    assert owned["tenant"] == "acme", owned


def test_a_tokens_code_contexts_are_its_own_and_another_tenant_reaches_none(shared):
    server, _ = shared

    async def scenario() -> dict:
        seen: dict = {}
        async with server.client(TOKENS["acme"]) as acme, server.client(TOKENS["beta"]) as beta:
            sid = (await acme.call_tool("create_session", {})).structured_content["session_id"]
            made = await acme.call_tool("create_context", {"session_id": sid, "cwd": "work"})
            assert not made.is_error, _texts(made)
            ctx = seen["ctx"] = made.structured_content["context_id"]
            seen["in_context"] = await acme.call_tool(
                "run_code", {"session_id": sid, "code": "import os; os.getcwd()", "context": ctx}
            )
            on = {"session_id": sid, "context_id": ctx}
            for tool, arguments in [
                ("list_contexts", {"session_id": sid}),
                ("create_context", {"session_id": sid}),
                ("restart_context", on),
                ("remove_context", on),
                ("run_code", {"session_id": sid, "code": "os", "context": ctx}),
            ]:
                seen[f"beta_{tool}"] = await beta.call_tool(tool, arguments)
            seen["acme_list"] = await acme.call_tool("list_contexts", {"session_id": sid})
            seen["acme_remove"] = await acme.call_tool("remove_context", on)
            await acme.call_tool("delete_session", {"session_id": sid})
        return seen

    seen = asyncio.run(scenario())
    assert _texts(seen["in_context"]) == ["'/workspace/work'"]
    assert seen["in_context"].structured_content["context"]["restarted"] is None
    for name in [name for name in seen if name.startswith("beta_")]:
        assert seen[name].is_error and "session_not_found" in _texts(seen[name])[0], name
    listed = seen["acme_list"].structured_content["contexts"]
    assert [(c["context_id"], c["state"]) for c in listed][1:] == [(seen["ctx"], "running")]
    assert not seen["acme_remove"].is_error, _texts(seen["acme_remove"])


def test_list_interrupt_restart_progress_and_resources(shared):
    server, _ = shared
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def scenario() -> dict:
        seen: dict = {}
        async with server.client(TOKENS["acme"]) as client:
            sid = (await client.call_tool("create_session", {})).structured_content["session_id"]
            code = "import time\nfor i in range(3):\n    print('step', i)\n    time.sleep(1)"
            seen["slow"] = await client.call_tool(
                "run_code", {"session_id": sid, "code": code}, progress_callback=on_progress
            )
            await client.call_tool("upload_file", {"session_id": sid, "path": "d/in.txt",
                                                   "content": "hello resource"})  # fmt: skip
            listed = await client.list_resources()
            seen["uris"] = [str(r.uri) for r in listed.resources]
            uri = f"sbx://sessions/{sid}/files/d/in.txt"
            seen["read"] = await client.read_resource(uri)

            async def interrupt_soon() -> None:
                await asyncio.sleep(2)
                seen["interrupt"] = await client.call_tool("interrupt", {"session_id": sid})

            started = time.monotonic()
            _, seen["stopped"] = await asyncio.gather(
                interrupt_soon(),
                client.call_tool("run_code", {"session_id": sid, "code": "time.sleep(60)"}),
            )
            seen["stopped_after"] = time.monotonic() - started
            await client.call_tool("run_code", {"session_id": sid, "code": "kept = 1"})
            seen["restart"] = await client.call_tool("restart", {"session_id": sid})
            seen["after_restart"] = await client.call_tool(
                "run_code", {"session_id": sid, "code": "kept"}
            )
            await client.call_tool("delete_session", {"session_id": sid})
        return seen

    seen = asyncio.run(scenario())
    assert seen["slow"].structured_content["status"] == "ok"
    messages = [m for _, m in progress if m]
    assert any("step 0" in m for m in messages) and any("step 2" in m for m in messages), progress
    values = [v for v, _ in progress]
    assert values == sorted(values) and len(set(values)) == len(values), "progress went back"

    assert any(u.endswith("/files/d/in.txt") for u in seen["uris"]), seen["uris"]
    (content,) = seen["read"].contents
    assert content.text == "hello resource"

    assert not seen["interrupt"].is_error, _texts(seen["interrupt"])
    assert seen["stopped"].structured_content["status"] in ("interrupted", "error")
    assert seen["stopped_after"] < 30
    assert not seen["restart"].is_error and seen["restart"].structured_content["state"] == "idle"
    assert seen["after_restart"].structured_content["status"] == "error"  # NameError: fresh kernel


def test_mcp_config_prints_ready_client_configurations(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    env.update(SBX_URL="http://127.0.0.1:8765", SBX_TOKEN="tok-123")
    done = subprocess.run(
        [SBX, "mcp", "config"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    stdio = config["mcpServers"]["sandbox-gateway"]
    assert Path(stdio["command"]).name == "sbx" and stdio["args"] == ["mcp"]
    assert stdio["env"] == {"SBX_URL": "http://127.0.0.1:8765", "SBX_TOKEN": "tok-123"}
    http = subprocess.run(
        [SBX, "mcp", "config", "--http", "http://mcp.example:8766/mcp", "--client", "vscode"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert http.returncode == 0, http.stderr
    server = json.loads(http.stdout)["servers"]["sandbox-gateway"]
    assert server == {
        "type": "http",
        "url": "http://mcp.example:8766/mcp",
        "headers": {"Authorization": "Bearer tok-123"},
    }
    claude = subprocess.run(
        [SBX, "mcp", "config", "--client", "claude-code"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert claude.stdout.startswith("claude mcp add sandbox-gateway"), claude.stdout
