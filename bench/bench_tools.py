"""What a tool call from code costs: a trivial call from the kernel, beside its floors.

Usage: .venv/bin/python bench/bench_tools.py [--calls 500] [--blocks 4]

Starts a gateway (loopback MCP servers allowed) and a local MCP server
(``examples/tools/warehouse_mcp.py``); a session given it as a tool times,
inside one execute, ``--calls`` round trips each of:

- ``list_tables()``: a trivial MCP tool, kernel -> tool socket -> gate ->
  MCP server -> back (target 5 ms);
- ``echo()``: a trivial stdio MCP tool, its server a process in a sandbox
  of its own, kernel -> tool socket -> gate -> the server's stdin and
  stdout through the engine's exec stream -> back;
- ``sbx_tools.tools()``: the tool socket alone (the listing, answered by the
  gateway): the floor of any call from the kernel;
- the same MCP call made by the gateway's own client from the host, no
  sandbox in between (the MCP floor);
- ``ping()``: a client tool, a function of this process registered with the
  SDK, kernel -> tool socket -> gate -> agent stream -> this process -> back
  (target 2 ms).

Blocks alternate so the machine's drift hits each alike. Prints a table and
rewrites its section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import Gateway, median, pct, write_section

from gateway.client import Client
from gateway.tools.mcp_servers import McpConnection
from gateway.tools.specs import McpServer

ROOT = Path(__file__).resolve().parent.parent
TIMED = """
import json, time, sbx_tools
def timed(call, n):
    call(); times = []
    for _ in range(n):
        t = time.perf_counter(); call(); times.append((time.perf_counter() - t) * 1000)
    return times
mcp, floor = timed(sbx_tools.list_tables, {n}), timed(sbx_tools.tools, {n})
stdio = timed(sbx_tools.echo, {n})
print(json.dumps({{"mcp": mcp, "socket": floor, "stdio": stdio}}))
"""
CLIENT = """
print(json.dumps(timed(sbx_tools.ping, {n})))
"""


# A trivial stdio MCP server in the stdlib (the kernel image has no mcp package).
ECHO_SERVER = """
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    method, answer = m["method"], {}
    if method == "initialize":
        answer = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "echo", "version": "1"}}
    elif method == "tools/list":
        answer = {"tools": [{"name": "echo", "description": "Answers at once.",
                             "inputSchema": {"type": "object", "properties": {}},
                             "annotations": {"readOnlyHint": True}}]}
    elif method == "tools/call":
        answer = {"content": [{"type": "text", "text": "ok"}], "isError": False}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": answer}), flush=True)
"""
STDIO = {"name": "local", "command": ["/opt/venv/bin/python", "-c", ECHO_SERVER]}


def ping() -> str:
    """A trivial client tool."""
    return "pong"


def start_warehouse() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = Path(tempfile.mkdtemp(prefix="sbx-bench-")) / "warehouse.db"
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "examples/tools/warehouse_mcp.py"), "--port", str(port),
         "--db", str(db)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(300):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return server, f"http://127.0.0.1:{port}/mcp"
        time.sleep(0.1)
    raise SystemExit("the MCP server did not start")


async def host_floor(url: str, n: int) -> list[float]:
    connection = McpConnection(McpServer(url, "floor"), {}, 1 << 20)
    await connection.open()
    try:
        await connection.call("list_tables", {}, 10)
        times = []
        for _ in range(n):
            started = time.perf_counter()
            await connection.call("list_tables", {}, 10)
            times.append((time.perf_counter() - started) * 1000)
        return times
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--blocks", type=int, default=4)
    args = parser.parse_args()
    server, url = start_warehouse()
    figures: dict[str, list[float]] = {k: [] for k in ("mcp", "stdio", "socket", "host", "client")}
    try:
        with Gateway(tempfile.mkdtemp(prefix="sbx-bench-"), "--pool", "",
                     "--tool-allow-ranges", "127.0.0.0/8") as gw:  # fmt: skip
            body = {"tools": {"mcp": [{"url": url, "name": "warehouse"}], "stdio": [STDIO],
                              "limits": {"calls_per_execute": 100_000}}}  # fmt: skip
            created = gw.client.post("/v1/sessions", json=body)
            if created.status_code != 201:
                raise SystemExit(f"the session was not made: {created.text}")
            sid = created.json()["id"]
            per_block = max(1, args.calls // args.blocks)
            sdk = Client(gw.url, "")
            session = sdk.connect(sid)
            session.tools.register(ping)
            for _ in range(args.blocks):
                reply = gw.client.post(f"/v1/sessions/{sid}/execute",
                                       json={"code": TIMED.format(n=per_block)}).json()  # fmt: skip
                if reply["status"] != "ok":
                    raise SystemExit(f"the timing cell failed: {reply['error']}")
                timed = json.loads(reply["outputs"][0]["text"])
                figures["mcp"] += timed["mcp"]
                figures["stdio"] += timed["stdio"]
                figures["socket"] += timed["socket"]
                figures["host"] += asyncio.run(host_floor(url, per_block))
                figures["client"] += json.loads(session.run(CLIENT.format(n=per_block)).stdout)
            sdk.close()
    finally:
        server.kill()
        server.wait()
    rows = [
        ("client tool from the kernel (`ping()`)", figures["client"], "≤ 2 ms"),
        ("MCP tool from the kernel (`list_tables()`)", figures["mcp"], "≤ 5 ms"),
        ("stdio MCP tool in a sandbox of its own (`echo()`)", figures["stdio"], "≤ 5 ms"),
        ("tool socket alone (`sbx_tools.tools()`)", figures["socket"], "floor"),
        ("same MCP call from the host, no sandbox", figures["host"], "floor"),
    ]
    body = ["| round trip | p50 ms | p95 ms | target |", "| --- | ---: | ---: | --- |"]
    for name, values, target in rows:
        body.append(f"| {name} | {median(values):.2f} | {pct(values, 95):.2f} | {target} |")
        print(f"{name:48} p50 {median(values):6.2f} ms  p95 {pct(values, 95):6.2f} ms")
    body.append("")
    body.append(
        "A call from code costs the tool socket's round trip (a fresh connection on a Unix "
        "socket, one strict HTTP request, the gate) plus the MCP server's own; the difference "
        "between the first row and the sum of the two floors is the gateway's bookkeeping "
        "(record, audit, masking). A stdio server's call goes to a process in a container "
        "of its own, one line each way through the engine's exec stream; its server here "
        "answers at once, while the HTTP row's is the MCP SDK's streamable-HTTP server reading "
        "SQLite (its own cost is the host floor). A client tool's call adds the agent "
        "stream's two WebSocket frames and the SDK's dispatch to the socket's round trip."
    )
    write_section(
        "bench_tools",
        "Tools called from code",
        f"{len(figures['mcp'])} calls in {args.blocks} blocks, inside one execute each",
        body,
    )


if __name__ == "__main__":
    main()
