"""A data-analysis agent's task done two ways: tools called from code, and call by call.

The task: revenue per region over 100 days of a warehouse, one query per day.
The warehouse is a small MCP server over SQLite (``warehouse_mcp.py``, started
here as a local HTTP server); the session is given it as a tool::

    python examples/tools/warehouse_agent.py --url http://127.0.0.1:8765 --out results

(the gateway must be allowed to reach the server: ``sbx serve --tool-allow-ranges
127.0.0.0/8``). **From code**: one execute loops over the days, calling
``query_warehouse`` 100 times in the sandbox, and only the summary comes back
to the model. **Call by call**: each query is a model turn of its own (here
an execute that calls the tool once and hands the model its rows), as an
agent without code-called tools works. It prints the model turns and the
tokens the model reads each way (tokens estimated as characters / 4), and
writes the first session's notebook, whose cell metadata lists the 100 calls.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).parent
DAYS = 100
QUERY = (
    "SELECT region, SUM(quantity * price) AS revenue FROM orders WHERE day = {day} GROUP BY region"
)
LOOP = f"""
from sbx_tools import query_warehouse
totals = {{}}
for day in range(1, {DAYS + 1}):
    for row in query_warehouse({QUERY!r}.format(day=day)):
        totals[row["region"]] = totals.get(row["region"], 0) + row["revenue"]
{{region: round(total, 2) for region, total in sorted(totals.items())}}
"""
ONE_CALL = "from sbx_tools import query_warehouse\nquery_warehouse({sql!r})"


def tokens(text: str) -> int:
    return max(1, len(text) // 4)


def start_warehouse() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = Path(tempfile.mkdtemp()) / "warehouse.db"
    server = subprocess.Popen(
        [sys.executable, str(HERE / "warehouse_mcp.py"), "--port", str(port), "--db", str(db)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return server, f"http://127.0.0.1:{port}/mcp"
        time.sleep(0.1)
    server.kill()
    raise SystemExit("the warehouse MCP server did not start")


def execute(api: httpx.Client, sid: str, code: str) -> dict:
    reply = api.post(f"/v1/sessions/{sid}/execute", json={"code": code, "timeout": 120})
    reply.raise_for_status()
    body = reply.json()
    if body["status"] != "ok":
        raise SystemExit(f"the cell failed: {body['error']}")
    return body


def result_text(body: dict) -> str:
    return next(o["data"]["text/plain"] for o in body["outputs"] if "data" in o)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("SBX_URL", "http://127.0.0.1:8765"))
    parser.add_argument("--token", default=os.environ.get("SBX_TOKEN", ""))
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    server, mcp_url = start_warehouse()
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    tools = {"mcp": [{"url": mcp_url, "name": "warehouse"}]}
    try:
        with httpx.Client(base_url=args.url, headers=headers, timeout=300) as api:
            created = api.post("/v1/sessions", json={"tools": tools})
            created.raise_for_status()
            sid = created.json()["id"]
            try:
                started = time.perf_counter()
                summary = result_text(execute(api, sid, LOOP))
                from_code = time.perf_counter() - started
                started = time.perf_counter()
                read = 0
                for day in range(1, DAYS + 1):  # each a model turn reading the rows
                    body = execute(api, sid, ONE_CALL.format(sql=QUERY.format(day=day)))
                    read += tokens(result_text(body))
                by_call = time.perf_counter() - started
                args.out.mkdir(parents=True, exist_ok=True)
                notebook = api.get(f"/v1/sessions/{sid}/notebook").json()
                (args.out / "warehouse.ipynb").write_text(json.dumps(notebook, indent=1))
                calls = notebook["cells"][0]["metadata"]["sbx"]["tools"]
            finally:
                api.delete(f"/v1/sessions/{sid}")
    finally:
        server.kill()
        server.wait()
    print(f"summary: {summary}")
    print(f"{'':24}{'model turns':>12}{'tokens read':>13}{'seconds':>10}")
    print(f"{'tools called from code':24}{1:>12}{tokens(summary):>13}{from_code:>10.2f}")
    print(f"{'call by call':24}{DAYS:>12}{read:>13}{by_call:>10.2f}")
    print(f"the notebook's first cell records {len(calls)} tool calls: {args.out}/warehouse.ipynb")


if __name__ == "__main__":
    main()
