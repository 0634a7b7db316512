"""Session start and execute round trip under runc versus gVisor, and the egress proxy's cost.

Usage: .venv/bin/python bench/bench_runtimes.py [--sessions 8] [--executes 200]

Starts ``sbx serve`` on a free port (egress to loopback permitted, so the
proxy can be measured against a local HTTP server), then for each runtime:
- POST /v1/sessions until 201 (kernel ready), and until the first result;
- round trip of a trivial execute (``1 + 1``) on a warm session;
- an HTTP GET from inside the sandbox through the egress proxy to a local
  server (allowlist session), the proxy's added latency included.
Prints a table and rewrites only its own section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import http.server
import statistics
import tempfile
import threading

import httpx
from harness import Gateway, pct, round_trips, session_starts, write_section

FETCH = """
import os, time, urllib.request
os.environ.pop('NO_PROXY', None); os.environ.pop('no_proxy', None)
times = []
for _ in range({n}):
    t0 = time.perf_counter()
    urllib.request.urlopen('http://{target}/', timeout=10).read()
    times.append((time.perf_counter() - t0) * 1000)
print(' '.join(f'{{t:.3f}}' for t in times))
"""


def local_server() -> tuple[http.server.ThreadingHTTPServer, str]:
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"


def measure(client: httpx.Client, runtime: str, args, target: str) -> dict[str, list[float]]:
    creates, starts = session_starts(client, args.sessions, {"runtime": runtime})
    sid = client.post("/v1/sessions", json={"runtime": runtime}).json()["id"]
    trips = round_trips(client, sid, args.executes)
    client.delete(f"/v1/sessions/{sid}")

    body = {"runtime": runtime, "network": {"allow": ["127.0.0.1"]}}
    sid = client.post("/v1/sessions", json=body).json()["id"]
    code = FETCH.format(n=args.fetches + 5, target=target)
    reply = client.post(f"/v1/sessions/{sid}/execute", json={"code": code}).json()
    client.delete(f"/v1/sessions/{sid}")
    text = "".join(o.get("text", "") for o in reply["outputs"])
    fetches = [float(t) for t in text.split()][5:]  # the first few warm up
    return {"create": creates, "start": starts, "trip": trips, "fetch": fetches}


def row(name: str, values: list[float]) -> str:
    return (
        f"| {name} | {len(values)} | {statistics.median(values):.1f} ms "
        f"| {pct(values, 0.95):.1f} ms | {max(values):.1f} ms |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--executes", type=int, default=200)
    parser.add_argument("--fetches", type=int, default=50)
    args = parser.parse_args()

    server, target = local_server()
    data_dir = tempfile.mkdtemp(prefix="sbx-bench-")
    try:
        with Gateway(data_dir, "--pool", "", "--egress-allow-ranges", "127.0.0.0/8") as gw:
            results = {rt: measure(gw.client, rt, args, target) for rt in ("runc", "gvisor")}
    finally:
        server.shutdown()

    labels = [
        ("create", "POST /v1/sessions -> 201 (kernel ready)"),
        ("start", "POST /v1/sessions -> first execute result"),
        ("trip", "execute `1 + 1` round trip (warm)"),
        ("fetch", "HTTP GET from the sandbox via the egress proxy (local server)"),
    ]
    table = ["| measure | n | p50 | p95 | max |", "| --- | ---: | ---: | ---: | ---: |"]
    for key, label in labels:
        for runtime in ("runc", "gvisor"):
            table.append(row(f"{label}, {runtime}", results[runtime][key]))
    print("\n".join(table))

    write_section(
        "bench_runtimes",
        "runc versus gVisor",
        "Docker runtimes runc and runsc (gVisor, ptrace platform), "
        "kernel image `python`, default limits, a real gateway over HTTP on loopback. The "
        "proxy row is a sandbox fetching a tiny page from a server on the host's loopback "
        "through the egress proxy (allowlist session, operator range 127.0.0.0/8).",
        table,
    )


if __name__ == "__main__":
    main()
