"""Start time and execute round trip of each kernel, through a real gateway.

Usage: .venv/bin/python bench/bench_kernels.py [--sessions 5] [--executes 200] [KERNEL ...]

For each kernel (default: every one GET /v1/kernels lists as built) measures:
- POST /v1/sessions until 201 (the kernel in its container answered);
- the round trip of a trivial execute on a warm session, over HTTP, and the
  part of it between the gateway sending the request and the kernel going idle
  (the reply's duration_ms), which leaves out HTTP and the gateway's bookkeeping.
Prints a table and replaces the "Kernels" section of docs/PERFORMANCE.md,
leaving the rest of the page alone.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import httpx
from harness import Gateway, pct, write_section

# A cell that does next to nothing, per language_info name.
TRIVIAL = {"python": "1 + 1", "R": "1 + 1", "javascript": "1 + 1", "bash": "true"}


def measure(
    client: httpx.Client, kernel: str, language: str, sessions: int, executes: int
) -> tuple[list[float], list[float], list[float], str]:
    """Start times of fresh sessions; round trips and kernel times of a trivial cell."""
    starts = []
    for _ in range(sessions):
        t0 = time.perf_counter()
        r = client.post("/v1/sessions", json={"kernel": kernel})
        r.raise_for_status()
        starts.append((time.perf_counter() - t0) * 1000)
        client.delete(f"/v1/sessions/{r.json()['id']}")
    sid = client.post("/v1/sessions", json={"kernel": kernel}).json()["id"]
    code = TRIVIAL[language]
    try:
        for _ in range(10):  # warm up
            client.post(f"/v1/sessions/{sid}/execute", json={"code": code})
        trips, kernel_times = [], []
        for _ in range(executes):
            t0 = time.perf_counter()
            reply = client.post(f"/v1/sessions/{sid}/execute", json={"code": code}).json()
            trips.append((time.perf_counter() - t0) * 1000)
            assert reply["status"] == "ok", reply
            kernel_times.append(reply["duration_ms"])
    finally:
        client.delete(f"/v1/sessions/{sid}")
    return starts, trips, kernel_times, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", nargs="*", help="kernel names (default: all built ones)")
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--executes", type=int, default=200)
    args = parser.parse_args()

    # No warm pool: every start below is a cold one, comparable across kernels.
    gw = Gateway(tempfile.mkdtemp(prefix="sbx-bench-"), "--pool", "")
    client = gw.client
    rows = ["| kernel | start p50 | start max | cell | round trip p50 | p95 | in the kernel p50 |"]
    rows.append("| --- | ---: | ---: | --- | ---: | ---: | ---: |")
    try:
        catalog = [k for k in client.get("/v1/kernels").json()["kernels"] if k["built"]]
        for entry in catalog:
            if args.kernels and entry["name"] not in args.kernels:
                continue
            starts, trips, kernel_times, code = measure(
                client, entry["name"], entry["language"], args.sessions, args.executes
            )
            rows.append(
                f"| {entry['name']} ({entry['display_name']}) "
                f"| {statistics.median(starts):.0f} ms | {max(starts):.0f} ms | `{code}` "
                f"| {statistics.median(trips):.1f} ms | {pct(trips, 0.95):.1f} ms "
                f"| {statistics.median(kernel_times):.1f} ms |"
            )
            print(rows[-1], flush=True)
    finally:
        gw.stop()

    write_section(
        "bench_kernels",
        "Kernels",
        f"runc runtime, default limits, no warm pool, {args.sessions} starts and "
        f"{args.executes} warm executes per kernel, over HTTP on loopback. Start is "
        "POST /v1/sessions until 201 "
        "(the kernel answered in its container); 'in the kernel' is the reply's duration_ms: "
        "from the execute request leaving the gateway to the kernel going idle.",
        rows,
    )


if __name__ == "__main__":
    main()
