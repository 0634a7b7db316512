"""Code contexts: a context's create -> first result, against a session's warm create.

Usage: .venv/bin/python bench/bench_contexts.py [--rounds 10]

Each round, in one session: ``create_context()`` (a kernel started with docker
exec beside the session's) then ``run("1 + 1", context=...)``, then the context
removed; the same for the other kernel of the python image (xeus-python), and,
beside them, a warm session's create -> first result (the pool refilled first).
Prints a table and replaces the "Code contexts" section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from bench_e2b import wait_for_pool
from harness import Gateway, pct, write_section

from gateway.client import Client


def context_starts(client: Client, kernel: str, n: int) -> list[float]:
    """Ms from a context's create to its first result, in one session."""
    times = []
    with client.create_session() as session:
        for _ in range(n):
            t0 = time.perf_counter()
            context = session.create_context(kernel=kernel)
            session.run("1 + 1", context=context)
            times.append((time.perf_counter() - t0) * 1000)
            session.remove_context(context)
    return times


def warm_creates(gw: Gateway, client: Client, n: int) -> list[float]:
    times = []
    for _ in range(n):
        wait_for_pool(gw)
        t0 = time.perf_counter()
        with client.create_session() as session:
            session.run("1 + 1")
            times.append((time.perf_counter() - t0) * 1000)
    return times


def row(what: str, values: list[float]) -> str:
    p50, p99 = statistics.median(values), pct(values, 0.99)
    return f"| {what} | {len(values)} | {p50:.0f} ms | {p99:.0f} ms |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="sbx-bench-") as data,
        Gateway(data, "--pool", "python3=1") as gw,
        Client(gw.url) as client,
    ):
        ipykernel = context_starts(client, "python3", args.rounds)
        xeus = context_starts(client, "xpython", args.rounds)
        warm = warm_creates(gw, client, args.rounds)
    body = [
        "| measure | n | p50 | p99 |",
        "| --- | ---: | ---: | ---: |",
        row("context create -> first result (ipykernel, docker exec)", ipykernel),
        row("context create -> first result (xeus-python, docker exec)", xeus),
        row("warm session create -> first result (for scale)", warm),
    ]
    print("\n".join(body))
    write_section(
        "bench_contexts",
        "Code contexts",
        "the SDK against one gateway (no authentication, loopback); a context's kernel "
        "starts cold beside the session's (no pool of contexts), a session comes warm "
        "from a pool of one python3 kernel refilled before each create.",
        body,
    )


if __name__ == "__main__":
    main()
