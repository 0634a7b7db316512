"""Tools called from code, end to end: a real kernel calls a real local MCP server's tools.

One warehouse MCP server (examples/tools/warehouse_mcp.py) serves the module;
the shared gateway connects to it as an MCP client, and code in the sandbox
(``--network none``) calls its tools through the session's tool socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker.errors
import pytest
from helpers import Canary, run

from gateway.config import Settings
from gateway.sandbox.docker.placement import DockerPlacement
from gateway.sandbox.docker.provisioner import LABEL_GATEWAY
from gateway.sandbox.docker.tool_servers import LABEL_TOOL_SERVER
from gateway.sandbox.images import ImageBuilder

ROOT = Path(__file__).resolve().parent.parent
LOOP = """
from sbx_tools import query_warehouse
totals = {}
for day in range(1, 101):
    rows = query_warehouse("SELECT region, SUM(quantity * price) AS revenue FROM orders"
                           f" WHERE day = {day} GROUP BY region")
    for row in rows:
        totals[row["region"]] = totals.get(row["region"], 0) + row["revenue"]
{region: round(total, 2) for region, total in sorted(totals.items())}
"""


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = tmp_path_factory.mktemp("warehouse") / "warehouse.db"
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "examples/tools/warehouse_mcp.py"),
         "--port", str(port), "--db", str(db)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    server.kill()
    server.wait()


def test_code_calls_an_mcp_tool_a_hundred_times_in_one_execute_recorded_in_the_notebook(
    api, new_session, warehouse
):
    session = new_session(tools={"mcp": [{"url": warehouse, "name": "warehouse"}]})
    sid = session["id"]
    listed = {t["name"]: t["action"] for t in session["tools"]["tools"]}
    assert listed == {"query_warehouse": "allow", "list_tables": "allow", "drop_orders": "hold"}

    reply = run(api, sid, LOOP)
    assert reply["status"] == "ok", reply
    summary = reply["outputs"][0]["data"]["text/plain"]
    assert "'north'" in summary and "'west'" in summary

    reply = run(api, sid, "import inspect, sbx_tools\nprint(inspect.signature("
                "sbx_tools.query_warehouse), sbx_tools.list_tables())")  # fmt: skip
    assert reply["outputs"][0]["text"] == "(sql, *, limit=100) ['orders']\n"

    history = api.get(f"/v1/sessions/{sid}/history").json()["executions"]
    calls = history[0]["review"]["tools"]
    assert len(calls) == 100 and {c["status"] for c in calls} == {"ok"}
    assert calls[0]["tool"] == "query_warehouse" and calls[0]["decision"] == "allow"
    notebook = api.get(f"/v1/sessions/{sid}/notebook").json()
    assert len(notebook["cells"][0]["metadata"]["sbx"]["tools"]) == 100


def test_refusals_reach_the_kernel_as_exceptions_and_a_thread_left_running_is_refused(
    api, new_session, warehouse
):
    tools = {"mcp": [{"url": warehouse, "name": "warehouse"}], "rules": {"drop_orders": "deny"}}
    sid = new_session(tools=tools)["id"]
    reply = run(api, sid, "import sbx_tools\ntry:\n    sbx_tools.drop_orders('north')\n"
                "except sbx_tools.ToolRefused as e:\n    print(type(e).__name__, e)")  # fmt: skip
    assert reply["outputs"][0]["text"].startswith("ToolRefused the policy refuses drop_orders")
    reply = run(api, sid, "try:\n    sbx_tools.query_warehouse('SELECT nope')\n"
                "except sbx_tools.ToolError as e:\n    print(type(e).__name__, e)")  # fmt: skip
    assert reply["outputs"][0]["text"].startswith("ToolError query_warehouse failed")
    run(api, sid, "import threading, time\nlate = []\ndef later():\n    time.sleep(0.5)\n"
        "    try:\n        sbx_tools.list_tables()\n    except Exception as e:\n"
        "        late.append(repr(e))\nthreading.Thread(target=later).start()")  # fmt: skip
    time.sleep(1.5)
    reply = run(api, sid, "print(late)")
    assert "ToolRefused" in reply["outputs"][0]["text"] and "outside" in reply["outputs"][0]["text"]


def test_tools_are_given_to_a_live_session_and_other_kernels_reach_the_socket(
    api, new_session, warehouse
):
    sid = new_session()["id"]
    r = api.put(f"/v1/sessions/{sid}/tools", json={"mcp": [{"url": warehouse, "name": "wh"}]})
    assert r.status_code == 200, r.text
    assert api.get(f"/v1/sessions/{sid}").json()["tools"]["mcp"][0]["name"] == "wh"
    code = ("import http.client, socket, json\nc = http.client.HTTPConnection('t')\n"
            "c.sock = socket.socket(socket.AF_UNIX); c.sock.connect('/run/sbx/tools.sock')\n"
            "c.request('GET', '/tools'); print(sorted(t['name'] for t in "
            "json.loads(c.getresponse().read())['tools']))")  # fmt: skip
    assert run(api, sid, code)["outputs"][0]["text"].startswith("['drop_orders', 'list_tables'")
    r = api.put(f"/v1/sessions/{sid}/tools", json={"mcp": [{"url": "http://127.0.0.1:9/mcp"}]})
    assert r.status_code == 502 and "did not answer" in r.json()["error"]["message"]
    assert api.get(f"/v1/sessions/{sid}/tools").json()["mcp"][0]["name"] == "wh"  # kept
    r = api.put(f"/v1/sessions/{sid}/tools", json={"mcp": [{"url": "http://169.254.169.254/"}]})
    assert r.status_code == 502 and "link-local" in r.json()["error"]["message"]


def test_a_function_registered_with_the_sdk_is_called_from_the_kernel_both_halves(gateway):
    import asyncio

    from gateway.client import AsyncClient, Client

    seen = []

    def convert(amount: float, currency: str = "EUR") -> dict:
        """Convert an amount to US dollars."""
        seen.append(currency)
        return {"usd": round(amount * 1.1, 2), "from": currency}

    code = (
        "from sbx_tools import convert\nimport inspect\n"
        "print(inspect.signature(convert), [convert(a)['usd'] for a in (10, 20, 30)])"
    )
    with Client(gateway.url, gateway.token) as client:
        with client.create_session(tools=[convert]) as session:
            execution = session.run(code)
            assert execution.stdout == "(amount, *, currency='EUR') [11.0, 22.0, 33.0]\n"
            execution = session.run("try:\n    convert('x')\nexcept Exception as e:\n"
                                    "    print(type(e).__name__, e)")  # fmt: skip
            assert execution.stdout.startswith("ToolError convert failed: TypeError")
            history = gateway.client.get(f"/v1/sessions/{session.id}/history").json()
            calls = history["executions"][0]["review"]["tools"]
            assert [c["server"] for c in calls] == ["client"] * 3

    async def main():
        async def later(x: int) -> int:
            await asyncio.sleep(0)
            return x + 1

        async with AsyncClient(gateway.url, gateway.token) as client:
            async with client.create_session(tools=[later]) as session:
                return (await session.run("import sbx_tools\nsbx_tools.later(41)")).text

    assert asyncio.run(main()) == "42"
    assert seen == ["EUR"] * 4


@pytest.fixture(scope="module")
def gw(gateway):
    return gateway


def test_a_kernel_flooding_its_tool_socket_gets_clear_errors_and_a_canary_keeps_answering(
    gw, canary, new_session, warehouse
):
    sid = new_session(tools={"mcp": [{"url": warehouse, "name": "warehouse"}]})["id"]
    flood = """
import collections, socket, threading, sbx_tools
outcomes = collections.Counter()
def hammer():
    for _ in range(20):
        try:
            sbx_tools.list_tables(); outcomes["ok"] += 1
        except sbx_tools.ToolError as e:
            outcomes[type(e).__name__ + ": " + str(e)[:40]] += 1
def garbage():
    for _ in range(20):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect("/run/sbx/tools.sock"); s.sendall(b"\\x00" * 9000)
threads = [threading.Thread(target=f) for f in [hammer] * 48 + [garbage] * 8]
[t.start() for t in threads]; [t.join() for t in threads]
try:
    sbx_tools.query_warehouse("x" * 300_000)
except sbx_tools.ToolRefused as e:
    outcomes["big: " + str(e)[:30]] += 1
print(dict(outcomes))
"""
    with Canary(gw, canary):
        reply = run(gw.client, sid, flood, timeout=120)
    assert reply["status"] == "ok", reply
    text = reply["outputs"][0]["text"]
    assert "'ok'" in text and "big: arguments over 262144 bytes" in text
    assert run(gw.client, sid, "sbx_tools.list_tables()")["outputs"][0]["data"]["text/plain"] == (
        "['orders']"
    )


def test_a_tool_that_answers_slowly_hugely_or_crashes_its_server_is_a_clear_error_in_the_kernel(
    gw, canary, new_session
):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, str(ROOT / "tests/hostile_mcp.py"), str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        tools = {
            "mcp": [{"url": f"http://127.0.0.1:{port}/mcp", "name": "hostile"}],
            "rules": {"slow": "allow", "huge": "allow", "crash": "allow"},
            "limits": {"call_timeout": 1, "result_bytes": 100_000},
        }
        sid = new_session(tools=tools)["id"]
        code = """
import sbx_tools
for name, arguments in [("slow", {"seconds": 600}), ("huge", {"size": 5_000_000}),
                        ("crash", {}), ("echo", {"text": "x"})]:
    try:
        sbx_tools.call(name, **arguments)
    except sbx_tools.ToolError as e:
        print(name, "->", e)
"""
        with Canary(gw, canary):
            reply = run(gw.client, sid, code, timeout=60)
        lines = reply["outputs"][0]["text"].splitlines()
        assert lines[0] == "slow -> slow did not answer within 1 s (call_timeout)"
        assert lines[1].startswith("huge -> MCP server hostile failed")
        assert "more than" in lines[1] or "over the 100000" in lines[1]
        assert lines[2].startswith("crash -> ") and lines[3].startswith("echo -> MCP server")
    finally:
        server.kill()
        server.wait()


JS_CALL = """
$$.async();
const body = JSON.stringify({arguments: {}});
const req = require("http").request(
  {socketPath: "/run/sbx/tools.sock", path: "/call/list_tables", method: "POST",
   headers: {"Content-Type": "application/json", "Content-Length": Buffer.byteLength(body)}},
  (res) => { let text = ""; res.on("data", (c) => text += c);
             res.on("end", () => $$.done(JSON.parse(text).result.join(","))); });
req.end(body);
"""


def test_a_javascript_kernel_calls_a_tool_over_the_socket(api, new_session, warehouse):
    sid = new_session(kernel="javascript", tools={"mcp": [{"url": warehouse, "name": "wh"}]})["id"]
    reply = run(api, sid, JS_CALL, timeout=60)
    assert reply["status"] == "ok", reply
    assert "orders" in reply["outputs"][0]["data"]["text/plain"]


def test_e2bs_mcp_url_lists_and_calls_the_sessions_tools_through_the_gate_with_its_own_token(
    gw, warehouse
):
    """The stock SDK: create(mcp=...) gives the sandbox an MCP server by URL; an MCP client at
    get_mcp_url() with get_mcp_token() lists and calls its tools, each call recorded."""
    import asyncio
    from urllib.parse import urlsplit

    import httpx2
    from e2b import Sandbox
    from helpers import e2b_env
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    gateway_url = urlsplit(gw.url)

    class ToGateway(httpx2.AsyncHTTPTransport):
        """Sends to the gateway what the SDK's URL (https://50005-ID.DOMAIN/mcp) names by Host."""

        async def handle_async_request(self, request):
            request.url = request.url.copy_with(
                scheme="http", host=gateway_url.hostname, port=gateway_url.port
            )
            return await super().handle_async_request(request)

    async def mcp_call(url: str, token: str | None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx2.AsyncClient(headers=headers, transport=ToGateway(), timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                names = sorted(t.name for t in (await client.list_tools()).tools)
                answer = await client.call_tool("list_tables", {})
                return names, answer

    async def refused(url: str, token: str | None, body: dict | None = None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        body = body or {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        async with httpx2.AsyncClient(headers=headers, transport=ToGateway()) as http:
            return (await http.post(url, json=body)).status_code

    async def denied(url: str, token: str):
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, transport=ToGateway(), timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                return await client.call_tool("drop_orders", {"region": "north"})

    with pytest.MonkeyPatch.context() as mp:
        for name, value in e2b_env(gw, gw.token).items():
            mp.setenv(name, value)
        tools = {"mcp": [{"url": warehouse, "name": "warehouse"}], "rules": {"drop_orders": "deny"}}
        servers = {"sbxTools": tools}
        sandbox = Sandbox.create(mcp=servers)
        other = Sandbox.create(template="base", mcp={})
        try:
            url, token = sandbox.get_mcp_url(), sandbox.get_mcp_token()
            assert url.startswith("https://50005-") and url.endswith("/mcp") and token
            names, answer = asyncio.run(mcp_call(url, token))
            assert names == ["drop_orders", "list_tables", "query_warehouse"]
            assert not answer.is_error and "orders" in answer.content[0].text
            history = gw.client.get(f"/v1/sessions/{sandbox.sandbox_id}/history").json()
            calls = [c for e in history["executions"] for c in e["review"]["tools"]]
            assert [(c["tool"], c["status"]) for c in calls] == [("list_tables", "ok")]
            assert asyncio.run(refused(url, other.get_mcp_token())) == 401
            assert asyncio.run(refused(url, None)) == 401
            assert asyncio.run(refused(url, sandbox._envd_access_token)) == 401
            assert asyncio.run(refused(other.get_mcp_url(), token)) == 401
            answer = asyncio.run(denied(url, token))  # the gate: the session's rule holds
            assert answer.is_error and "denied" in answer.content[0].text
            arguments = {"name": "query_warehouse", "arguments": {"sql": "x" * 400_000}}
            huge = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": arguments}
            assert asyncio.run(refused(url, token, huge)) == 413  # the tool socket's 256 KiB
            history = gw.client.get(f"/v1/sessions/{sandbox.sandbox_id}/history").json()
            calls = [c for e in history["executions"] for c in e["review"]["tools"]]
            assert [(c["tool"], c["status"]) for c in calls][-1] == ("drop_orders", "denied")
            assert not [line for line in gw.log if token in line]  # never logged, at debug level
            read = Sandbox.connect(sandbox.sandbox_id).get_mcp_token()  # the gateway's file
            assert read and read != token and asyncio.run(mcp_call(url, read))[0] == names
            assert asyncio.run(refused(other.get_mcp_url(), read)) == 401
            assert not [line for line in gw.log if read in line]
        finally:
            sandbox.kill()
            other.kill()
        assert asyncio.run(refused(url, token)) == asyncio.run(refused(url, read)) == 401  # ended


def test_a_cell_sent_over_the_jupyter_channels_calls_a_tool_recorded_and_its_window_closes(
    gateway, api, new_session, warehouse
):
    import asyncio

    from helpers import run_over_channels

    sid = new_session(tools={"mcp": [{"url": warehouse, "name": "warehouse"}]})["id"]
    url = gateway.ws_url(f"/api/kernels/{sid}/channels")
    code = ("import sbx_tools, threading, time\nprint(sbx_tools.list_tables())\nlate = []\n"
            "def later():\n    time.sleep(0.5)\n    try:\n        sbx_tools.list_tables()\n"
            "    except Exception as e:\n        late.append(repr(e))\n"
            "threading.Thread(target=later).start()")  # fmt: skip
    seen = asyncio.run(run_over_channels(url, code))
    text = "".join(m["content"].get("text", "") for m in seen if m["msg_type"] == "stream")
    assert text == "['orders']\n", [m["content"] for m in seen if m["msg_type"] == "error"]
    time.sleep(1.5)
    late = run(api, sid, "print(late)")["outputs"][0]["text"]
    assert "ToolRefused" in late and "outside" in late, late
    history = api.get(f"/v1/sessions/{sid}/history").json()["executions"]
    cell = next(e for e in history if "threading" in e["code"])
    assert [(c["tool"], c["status"]) for c in cell["review"]["tools"]] == [("list_tables", "ok")]
    notebook = api.get(f"/v1/sessions/{sid}/notebook").json()
    assert notebook["cells"][0]["metadata"]["sbx"]["tools"][0]["tool"] == "list_tables"


# A stdio MCP server in the stdlib (the kernel image has no mcp package): one JSON-RPC
# message per line; it answers who runs it and which network interfaces it sees.
STDIO_SERVER = """
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    method, answer = m["method"], None
    if method == "initialize":
        answer = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "whoami", "version": "1"}}
    elif method == "tools/list":
        answer = {"tools": [{"name": "whoami", "description": "Who runs this server.",
                             "inputSchema": {"type": "object", "properties": {}},
                             "annotations": {"readOnlyHint": True}}]}
    elif method == "tools/call":
        facts = {"uid": os.getuid(), "nets": sorted(os.listdir("/sys/class/net")),
                 "greeting": os.environ.get("GREETING")}
        answer = {"content": [{"type": "text", "text": json.dumps(facts)}],
                  "structuredContent": facts, "isError": False}
    said = {"result": answer} if answer is not None else {"error": {"code": -32601,
                                                                     "message": method}}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], **said}), flush=True)
"""


def test_a_stdio_mcp_server_runs_in_a_hardened_container_of_its_own_gone_with_the_session(
    api, new_session, engine
):
    server = {"name": "who", "command": ["/opt/venv/bin/python", "-c", STDIO_SERVER],
              "env": {"GREETING": "hi; $(reboot)"}}  # fmt: skip
    session = new_session(tools={"stdio": [server]})
    sid = session["id"]
    assert [t["name"] for t in session["tools"]["tools"]] == ["whoami"]
    reply = run(api, sid, "from sbx_tools import whoami\nprint(whoami())")
    assert (
        reply["outputs"][0]["text"]
        == "{'uid': 1000, 'nets': ['lo'], 'greeting': 'hi; $(reboot)'}\n"
    )
    found = engine.containers.list(filters={"label": f"sbx.tool-server={sid}"})
    assert len(found) == 1
    host = found[0].attrs["HostConfig"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"]
    assert found[0].attrs["Config"]["User"] == "1000:1000" and not found[0].attrs["Mounts"]
    assert api.delete(f"/v1/sessions/{sid}").status_code in (200, 204)
    deadline = time.monotonic() + 10
    while engine.containers.list(all=True, filters={"label": f"sbx.tool-server={sid}"}):
        assert time.monotonic() < deadline, "the stdio server's container outlived its session"
        time.sleep(0.2)


def test_a_paused_sessions_stdio_server_is_frozen_with_it_and_gone_while_it_is_saved(
    api, new_session, engine
):
    """Frozen with the session and thawed on resume; removed by a deep pause, started again
    by the first call after the resume (the execute resumes the session first)."""
    server = {"name": "who", "command": ["/opt/venv/bin/python", "-c", STDIO_SERVER]}
    sid = new_session(tools={"stdio": [server]})["id"]
    label = {"label": f"sbx.tool-server={sid}"}

    def container() -> str:
        found = engine.api.containers(all=True, filters=label)
        view = api.get(f"/v1/sessions/{sid}").json()["tools"]["stdio"][0]["container"]
        return f"{view}: " + ",".join(c["State"] for c in found)

    assert api.post(f"/v1/sessions/{sid}/pause").status_code == 200
    assert container() == "frozen: paused"
    assert api.post(f"/v1/sessions/{sid}/resume").status_code == 200
    assert container() == "running: running"
    r = api.post(f"/v1/sessions/{sid}/pause", json={"strategy": "namespace"})
    assert r.status_code == 200 and container() == "stopped: "
    reply = run(api, sid, "from sbx_tools import whoami\nprint(whoami()['uid'])")
    assert reply["resumed"]["strategy"] == "namespace", reply
    assert reply["outputs"][0].get("text") == "1000\n", reply["outputs"]
    assert container() == "running: running"
    assert api.post(f"/v1/sessions/{sid}/pause").status_code == 200  # frozen, then ended
    assert api.delete(f"/v1/sessions/{sid}").status_code in (200, 204)
    deadline = time.monotonic() + 10
    while engine.api.containers(all=True, filters=label):
        assert time.monotonic() < deadline, "a frozen stdio server outlived its session"
        time.sleep(0.2)


def test_a_takeover_removes_the_other_gateways_stdio_server_containers_of_its_sessions_only(
    engine, tmp_path
):
    """``DockerPlacement.remove_tool_servers`` as recovery calls it for the sessions it takes
    over (tests/unit/sessions/test_adopted_tool_servers.py is the recovery side): of three
    servers' containers, only the dead gateway's of the adopted session goes."""
    settings = Settings()
    image = ImageBuilder(engine, Path(settings.images_dir), base=settings.base_image).tag_for(
        "python"
    )
    here, dead, sid = (f"takeover-{uuid.uuid4().hex[:8]}" for _ in range(3))
    made = []
    try:
        for session, gateway in ((sid, dead), (sid, here), (f"{sid}-other", dead)):
            labels = {LABEL_GATEWAY: gateway, LABEL_TOOL_SERVER: session}
            options = dict(entrypoint=["sleep"], labels=labels, network_mode="none", detach=True)
            made.append(engine.containers.run(image, ["60"], **options))
        placement = DockerPlacement(engine, None, tmp_path, 0, 0)  # type: ignore[arg-type]
        asyncio.run(placement.remove_tool_servers(here, {sid}))
        left = {
            c.id for c in engine.containers.list(all=True, filters={"id": [c.id for c in made]})
        }
        assert left == {made[1].id, made[2].id}
    finally:
        for container in made:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def test_a_v1_execute_queued_behind_a_jupyter_cell_does_not_take_that_cells_tool_calls(
    gateway, api, new_session, warehouse
):
    """The kernel runs one cell at a time: a /v1 execute sent while a Jupyter client's cell
    runs opens its window when it begins, so the cell's calls stay on its own record (and
    its caller's, for who may approve them)."""
    import asyncio
    import threading

    from helpers import run_over_channels

    sid = new_session(tools={"mcp": [{"url": warehouse, "name": "warehouse"}]})["id"]
    run(api, sid, "import sbx_tools")
    url = gateway.ws_url(f"/api/kernels/{sid}/channels")
    later = threading.Timer(0.5, lambda: run(api, sid, "'queued behind'"))
    later.start()
    code = "import time\ntime.sleep(1.5)\nprint(sbx_tools.list_tables())"
    seen = asyncio.run(run_over_channels(url, code))
    later.join()
    text = "".join(m["content"].get("text", "") for m in seen if m["msg_type"] == "stream")
    assert text == "['orders']\n", [m["content"] for m in seen if m["msg_type"] == "error"]
    history = api.get(f"/v1/sessions/{sid}/history").json()["executions"]
    calls = {e["code"]: [c["tool"] for c in (e["review"] or {}).get("tools", [])] for e in history}
    assert calls[code] == ["list_tables"] and calls["'queued behind'"] == [], calls


def test_e2bs_mcp_token_outlives_a_gateway_restart(start_gateway):
    """The token the SDK made at create opens the sandbox's MCP URL on the gateway that took
    the session over after a restart (its record holds the token's HMAC); no other does."""
    from e2b import Sandbox
    from helpers import e2b_env

    first = start_gateway(keep_sessions=True)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in e2b_env(first, first.token).items():
            mp.setenv(name, value)
        sandbox = Sandbox.create(template="base", mcp={})
    token = sandbox.get_mcp_token()
    first.stop()
    second = start_gateway(data_dir=first.data_dir, env={"SBX_TOKEN": first.token})  # its holder

    def listed(bearer: str) -> int:
        headers = {
            "E2b-Sandbox-Id": sandbox.sandbox_id,
            "E2b-Sandbox-Port": "50005",
            "Authorization": f"Bearer {bearer}",
            "Accept": "application/json, text/event-stream",
        }
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        return second.client.post("/mcp", headers=headers, json=body).status_code

    assert listed(token) == 200
    assert listed(str(uuid.uuid4())) == 401
