"""Session start and execute latency through a real gateway.

Usage: .venv/bin/python bench/bench_sessions.py [--sessions 10] [--executes 200]

Starts ``sbx serve`` on a free port, then measures:
- cold start: POST /v1/sessions until the first execute's result is back;
- round trip of a trivial execute (``1 + 1``) on a warm session;
- the gateway's RSS before/after 200 MB of printed output (output cap 1 MiB).
Prints a table and rewrites docs/PERFORMANCE.md with the machine it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from tornado.websocket import websocket_connect

ROOT = Path(__file__).resolve().parent.parent


def start_gateway(data_dir: str, *flags: str) -> tuple[subprocess.Popen, str]:
    # Without authentication: a benchmark on loopback measures the gateway, not tokens.
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--data-dir", data_dir]
    proc = subprocess.Popen(
        [*cmd, "--auth", "none", *flags],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "listening on http://" in line:
            return proc, line.split("listening on ")[1].split()[0]
    raise SystemExit("gateway did not start")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def stream_lags(url: str, sid: str) -> list[float]:
    """How long after each print its stream event reaches a WebSocket client."""
    ws = await websocket_connect(url.replace("http", "ws") + f"/v1/sessions/{sid}/stream")
    code = "import time\nfor _ in range(10):\n    print(time.time(), flush=True)\n    time.sleep(1)"
    ws.write_message(json.dumps({"type": "execute", "id": "lag", "code": code}))
    lags = []
    while True:
        event = json.loads(await ws.read_message())
        if event["type"] == "stream":
            received = time.time()
            lags += [(received - float(t)) * 1000 for t in event["text"].split()]
        if event["type"] == "done":
            ws.close()
            return lags


def session_starts(client: httpx.Client, n: int, body: dict) -> tuple[list[float], list[float]]:
    """For ``n`` fresh sessions: ms until 201, and until the first execute's result."""
    creates, starts = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.post("/v1/sessions", json=body)
        r.raise_for_status()
        creates.append((time.perf_counter() - t0) * 1000)
        sid = r.json()["id"]
        client.post(f"/v1/sessions/{sid}/execute", json={"code": "1 + 1"}).raise_for_status()
        starts.append((time.perf_counter() - t0) * 1000)
        client.delete(f"/v1/sessions/{sid}")
    return creates, starts


def round_trips(client: httpx.Client, sid: str, n: int) -> list[float]:
    """Ms of ``n`` trivial executes on ``sid``, after a warm-up."""
    for _ in range(10):
        client.post(f"/v1/sessions/{sid}/execute", json={"code": "1 + 1"})
    trips = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.post(f"/v1/sessions/{sid}/execute", json={"code": "1 + 1"}).raise_for_status()
        trips.append((time.perf_counter() - t0) * 1000)
    return trips


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def write_section(bench: str, title: str, about: str, table: list[str]) -> None:
    """Put a benchmark's results in docs/PERFORMANCE.md between markers of its own.

    They replace that benchmark's previous section, or are appended: each
    benchmark keeps its own part of the shared page.
    """
    load = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    machine = (
        f"{platform.node()}: {os.cpu_count()} cores (load average {load:.1f} at the end), "
        f"{platform.platform()}"
    )
    begin, end = f"<!-- {bench}: begin -->", f"<!-- {bench}: end -->"
    section = (
        f"{begin}\n## {title}\n\nMeasured by `bench/{bench}.py` on "
        f"{datetime.now(UTC):%Y-%m-%d}, on {machine}; {about}\n\n" + "\n".join(table) + f"\n{end}\n"
    )
    doc = ROOT / "docs" / "PERFORMANCE.md"
    text = doc.read_text()
    found = re.search(re.escape(begin) + ".*?" + re.escape(end) + "\n?", text, re.DOTALL)
    doc.write_text(
        text.replace(found.group(0), section) if found else f"{text.rstrip()}\n\n{section}"
    )
    print(f"\nwritten to {doc.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--executes", type=int, default=200)
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="sbx-bench-")
    proc, url = start_gateway(data_dir)
    client = httpx.Client(base_url=url, timeout=120)
    try:
        creates, starts = session_starts(client, args.sessions, {})
        sid = client.post("/v1/sessions", json={"limits": {"memory": "1g"}}).json()["id"]
        trips = round_trips(client, sid, args.executes)

        lags = asyncio.run(stream_lags(url, sid))

        before = rss_mib(proc.pid)
        code = "for _ in range(2_000_000):\n    print('x' * 99)"
        client.post(f"/v1/sessions/{sid}/execute", json={"code": code, "timeout": 300})
        after = rss_mib(proc.pid)
        client.delete(f"/v1/sessions/{sid}")
    finally:
        client.close()
        proc.terminate()
        proc.wait(30)

    rows = [
        ("POST /v1/sessions -> 201 (kernel ready)", creates, "ms"),
        ("POST /v1/sessions -> first execute result", starts, "ms"),
        ("execute `1 + 1` round trip (warm)", trips, "ms"),
        ("stream: print -> event at the client (10 prints, 1/s)", lags, "ms"),
    ]
    table = ["| measure | n | p50 | p95 | max |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, values, unit in rows:
        table.append(
            f"| {name} | {len(values)} | {statistics.median(values):.1f} {unit} "
            f"| {pct(values, 0.95):.1f} {unit} | {max(values):.1f} {unit} |"
        )
    table.append(
        f"| gateway RSS around 200 MB of output (cap 1 MiB) | 1 | {before:.0f} -> "
        f"{after:.0f} MiB | | |"
    )
    print("\n".join(table))

    machine = (
        f"{platform.node()}: {os.cpu_count()} cores, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
        f"{platform.platform()}, Python {platform.python_version()}"
    )
    doc = ROOT / "docs" / "PERFORMANCE.md"
    doc.write_text(
        "# Performance\n\n"
        f"Measured by `bench/bench_sessions.py` on {datetime.now(UTC):%Y-%m-%d}, "
        f"on {machine}; runc runtime, kernel image `python`, default limits. "
        "A real gateway process over HTTP on loopback.\n\n" + "\n".join(table) + "\n"
    )
    print(f"\nwritten to {doc.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
