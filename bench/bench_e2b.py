"""The stock E2B SDK against the gateway's own SDK, on one gateway, in one run.

Usage: .venv/bin/python bench/bench_e2b.py [--creates 10] [--executes 300]

Measures, alternating blocks of each (this machine's speed drifts within minutes):
- warm create -> first result: ``Sandbox.create()`` then ``run_code("1 + 1")``
  (e2b-code-interpreter), against ``create_session()`` then ``run("1 + 1")``
  (gateway.client), each from the warm pool (refilled between creates);
- a trivial round trip: ``run_code("1 + 1")`` against ``Session.run("1 + 1")``.
Prints a table and replaces the "E2B SDK" section of docs/PERFORMANCE.md.
Targets (issue 25): round trip within +1 ms of our SDK's, warm create within 10 %.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from harness import Gateway, pct, write_section

from gateway.client import Client

BLOCKS = 5


def warm_creates(gw: Gateway, n: int) -> tuple[list[float], list[float]]:
    """Ms from create to the first result, E2B's SDK and ours in turn, the pool refilled."""
    from e2b_code_interpreter import Sandbox

    with Client(gw.url) as client:
        ways: dict[str, tuple[Callable[[], Any], Callable[[Any], object], Callable[[Any], object]]]
        ways = {
            "e2b": (Sandbox.create, lambda s: s.run_code("1 + 1"), lambda s: s.kill()),
            "ours": (client.create_session, lambda s: s.run("1 + 1"), lambda s: s.delete()),
        }
        times: dict[str, list[float]] = {"e2b": [], "ours": []}
        for _ in range(n):
            for name, (create, run, end) in ways.items():
                wait_for_pool(gw)
                t0 = time.perf_counter()
                made = create()
                run(made)
                times[name].append((time.perf_counter() - t0) * 1000)
                end(made)
    return times["e2b"], times["ours"]


def wait_for_pool(gw: Gateway) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if gw.client.get("/healthz").json()["pool_ready"].get("python3", 0) >= 1:
            return
        time.sleep(0.1)
    raise SystemExit("the warm pool did not refill within 60 s")


def round_trips(n: int) -> tuple[list[float], list[float]]:
    """Ms of trivial runs, E2B's ``run_code`` and our ``Session.run`` in alternating blocks."""
    from e2b_code_interpreter import Sandbox

    sandbox = Sandbox.create()
    with Client(os.environ["E2B_API_URL"]) as client, client.create_session() as session:
        calls: dict[str, Callable[[], object]] = {
            "e2b": lambda: sandbox.run_code("1 + 1"),
            "ours": lambda: session.run("1 + 1"),
        }
        times: dict[str, list[float]] = {"e2b": [], "ours": []}
        for call in calls.values():
            for _ in range(20):
                call()  # warm up both paths
        for _ in range(BLOCKS):
            for name, call in calls.items():
                for _ in range(n // BLOCKS):
                    t0 = time.perf_counter()
                    call()
                    times[name].append((time.perf_counter() - t0) * 1000)
    sandbox.kill()
    return times["e2b"], times["ours"]


def row(what: str, values: list[float], versus: list[float] | None = None) -> str:
    p50 = statistics.median(values)
    diff = ""
    if versus:
        base = statistics.median(versus)
        diff = f"{p50 / base:.2f}x ({p50 - base:+.1f} ms)"
    return f"| {what} | {len(values)} | {p50:.1f} ms | {pct(values, 0.99):.1f} ms | {diff} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--creates", type=int, default=10)
    parser.add_argument("--executes", type=int, default=300)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="sbx-bench-") as data,
        Gateway(data, "--pool", "python3=1") as gw,
    ):
        os.environ.update(E2B_API_KEY="none", E2B_API_URL=gw.url, E2B_SANDBOX_URL=gw.url)
        e2b_creates, our_creates = warm_creates(gw, args.creates)
        e2b_runs, our_runs = round_trips(args.executes)
    body = [
        "| measure | n | p50 | p99 | vs our SDK |",
        "| --- | ---: | ---: | ---: | ---: |",
        row("our SDK: warm create -> first result", our_creates),
        row("E2B SDK: warm create -> first result", e2b_creates, our_creates),
        row("our SDK: `Session.run` round trip (agent stream)", our_runs),
        row("E2B SDK: `run_code` round trip (/execute, NDJSON)", e2b_runs, our_runs),
    ]
    print("\n".join(body))
    write_section(
        "bench_e2b",
        "E2B SDK",
        "e2b-code-interpreter against gateway.client on one gateway (no authentication, "
        "loopback, warm pool of one python3 kernel refilled before each create); blocks "
        "alternate. Targets: round trip within +1 ms of our SDK's, warm create within 10 %.",
        body,
    )


if __name__ == "__main__":
    main()
