"""A burst of creates at once, each followed by a trivial execute, with nothing lost.

Usage: .venv/bin/python bench/bench_burst.py [--burst 100]

One gateway as an operator would set it for bursts: a warm pool of 4 that
grows to 16 while creates find it empty, cold starts one per core, and a
start queue that holds the whole burst (``--start-queue``), each create
waiting up to two minutes. The burst is fired twice, once through the stock
E2B SDK (``Sandbox.create`` then ``run_code("1 + 1")``) and once through the
gateway's SDK (``create_session`` then ``run("1 + 1")``), every request on
its own thread, released together. For each: time to the first result
(median, p95, slowest), how every request ended (a working session, or a
refusal with its status, code and Retry-After), and what was left behind:
containers of the gateway that no live session or pooled sandbox holds.
Writes the table into docs/PERFORMANCE.md beside the published burst figures.
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import docker
from harness import Gateway, median, pct, write_section

from gateway.client import Client

POOL, POOL_MAX = 4, 16
SHRINK = 3  # seconds: the pool shrinks back between bursts quickly
# The ComputeSDK burst runs of May 2026: 100 sandboxes at once, time to the first command,
# median, over the internet against each provider's fleet.
PUBLISHED = {"Daytona": 367, "E2B": 822, "Vercel": 832}


def burst(n: int, create: Callable[[], Any], run: Callable[[Any], object]) -> list[dict]:
    """``n`` creates released together, each then running code; how each ended, and when."""
    go = threading.Barrier(n)
    ends: list[dict] = [{} for _ in range(n)]

    def one(i: int) -> None:
        go.wait()
        t0 = time.perf_counter()
        try:
            made = create()
            run(made)
            ends[i] = {"ok": True, "ms": (time.perf_counter() - t0) * 1000, "made": made}
        except Exception as e:  # a refusal: what the client was told
            ends[i] = {"ok": False, "ms": (time.perf_counter() - t0) * 1000, "why": refusal(e)}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return ends


def refusal(error: Exception) -> str:
    """A refused create as ``status code (Retry-After)``, from either SDK's exception."""
    status = getattr(error, "status", None) or getattr(error, "status_code", None)
    code = getattr(error, "code", None) or type(error).__name__
    retry = getattr(error, "retry_after", None)
    text = str(error)
    if status is None:
        for guess in (429, 503, 500):
            if str(guess) in text:
                status = guess
    return f"{status} {code}" + (" (Retry-After)" if retry or "retry" in text.lower() else "")


def leftovers(gw: Gateway, engine: docker.DockerClient, gateway_id: str, data: str) -> str:
    """Containers and workspace mounts of this gateway no live session or the pool accounts for."""
    live = {s["id"] for s in gw.client.get("/v1/sessions").json()["sessions"]}
    health = gw.client.get("/healthz").json()
    pooled = sum(health["pool_ready"].values()) + POOL_MAX  # ready, or a refill starting
    mine = engine.containers.list(all=True, filters={"label": f"sbx.gateway={gateway_id}"})
    containers = [c for c in mine if c.labels.get("sbx.session") not in live]
    sessions = os.path.join(os.path.realpath(data), "sessions") + "/"
    with open("/proc/self/mounts") as f:
        mounted = {line.split()[1][len(sessions) :].split("/")[0] for line in f
                   if line.split()[1].startswith(sessions)}  # fmt: skip
    mounts = mounted - live
    return f"{max(0, len(containers) - pooled)} containers, {max(0, len(mounts) - pooled)} mounts"


def settle(gw: Gateway) -> None:
    """Delete every session; wait for the pool to shrink back to its base size, and fill it.

    So each burst meets the same pool: the first's demand grew it.
    """
    for s in gw.client.get("/v1/sessions").json()["sessions"]:
        gw.client.delete(f"/v1/sessions/{s['id']}")
    deadline = time.monotonic() + 300
    while (
        gw.client.get("/healthz").json()["pool_ready"].get("python3", 0) != POOL
        or _pool_target(gw.client.get("/metrics").text) != POOL
    ):
        if time.monotonic() > deadline:
            raise SystemExit("the warm pool did not settle at its base size within 5 minutes")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=100)
    args = parser.parse_args()
    n = args.burst
    data = tempfile.mkdtemp(prefix="sbx-bench-")
    flags = (
        "--pool", f"python3={POOL}", "--pool-max", f"python3={POOL_MAX}",
        "--start-queue", str(n), "--start-queue-per-tenant", str(n), "--start-wait", "120",
        "--max-sessions", str(n + POOL_MAX + 8), "--pool-shrink-after", str(SHRINK),
        # One tenant asks for the whole burst: its quotas must hold it (default 32 sessions).
        "--tenant-max-sessions", str(n), "--tenant-max-memory", f"{n}g",
        "--tenant-max-disk", f"{n}g", "--tenant-max-cpus", str(n),
    )  # fmt: skip
    engine = docker.from_env()
    rows, lost = [], {}
    with Gateway(data, *flags) as gw:
        os.environ.update(E2B_API_KEY="none", E2B_API_URL=gw.url, E2B_SANDBOX_URL=gw.url)
        from e2b_code_interpreter import Sandbox

        gateway_id = _sqlite_gateway_id(data)
        with Client(gw.url, timeout=600) as client:
            ways = {
                "stock E2B SDK": (
                    lambda: Sandbox.create(timeout=600, request_timeout=300),
                    lambda s: s.run_code("1 + 1"),
                ),
                "gateway SDK": (client.create_session, lambda s: s.run("1 + 1")),
            }
            for name, (create, run) in ways.items():
                settle(gw)
                ends = burst(n, create, run)
                took = [e["ms"] for e in ends if e["ok"]]
                refused = collections.Counter(e["why"] for e in ends if not e["ok"])
                lost[name] = leftovers(gw, engine, gateway_id, data)
                grew = _pool_target(gw.client.get("/metrics").text)
                rows.append((name, took, refused, grew))
        settle(gw)
    body = [
        f"| burst of {n} creates, each then `1 + 1` | sessions | refused | first result p50 ms "
        "| p95 ms | slowest ms | left behind | pool grew to |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, took, refused, grew in rows:
        why = ", ".join(f"{count} refused {k}" for k, count in refused.items()) or "none"
        body.append(
            f"| {name} | {len(took)} | {why} | {median(took):.0f} | {pct(took, 0.95):.0f} "
            f"| {max(took):.0f} | {lost[name]} | {grew:.0f} |"
        )
    published = ", ".join(f"{k} {v} ms" for k, v in PUBLISHED.items())
    body += [
        "",
        f"Published medians to the first command for a burst of 100 (ComputeSDK, May 2026, over "
        f"the internet against each provider's fleet): {published}. Ours: one gateway on this "
        f"2-core host, where every sandbox beyond the warm pool ({POOL}, grown by demand up to "
        f"{POOL_MAX}) is a container started here, {os.cpu_count()} at a time; the rest wait "
        f"their turn in the start queue.",
    ]
    print("\n".join(body))
    write_section(
        "bench_burst",
        "A burst of creates",
        "every request on its own thread, released together; docs/SCALING.md#a-burst-of-creates.",
        body,
    )


def _pool_target(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('sbx_pool_target{kernel="python3"}'):
            return float(line.split()[-1])
    return 0.0


def _sqlite_gateway_id(data: str) -> str:
    import sqlite3

    with sqlite3.connect(os.path.join(data, "gateway.sqlite3")) as db:
        return db.execute("SELECT value FROM meta WHERE key = 'gateway_id'").fetchone()[0]


if __name__ == "__main__":
    main()
