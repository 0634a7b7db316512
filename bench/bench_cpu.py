"""Gateway CPU per trivial execute: this checkout against another revision, side by side.

Usage: .venv/bin/python bench/bench_cpu.py BASE [BASE ...] [--blocks 10] [--executes 500]
       [--kernel xpython]

Each revision (a git worktree of it, made under /tmp and removed after) runs
its own gateway with one session; blocks of ``--executes`` ``1 + 1`` executes
over HTTP alternate between the gateways, so the machine's drift within
minutes falls on all of them alike. Reports, per gateway, the median over
blocks of its process's CPU (user + system, every thread) per execute, and
the p50 round trip, and how this checkout's CPU differs from each revision's
block by block (the median of those differences: the machine's drift
between blocks cancels out). The kernel counts CPU in ticks of 10 ms: a
block of 500 executes reads to +-0.02 ms. Issue 23's target is at most 1.5 ms.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from bench_throughput import tree_cpu
from harness import ROOT, Gateway, drop_worktree, median, worktree, write_section

BODY = {"code": "1 + 1"}


def block(gw: Gateway, sid: str, n: int) -> tuple[float, list[float]]:
    """CPU ms per execute of ``gw`` over ``n`` executes, and their round trips."""
    trips = []
    before = tree_cpu(gw.pid)
    for _ in range(n):
        t0 = time.perf_counter()
        gw.client.post(f"/v1/sessions/{sid}/execute", json=BODY).raise_for_status()
        trips.append((time.perf_counter() - t0) * 1000)
    return (tree_cpu(gw.pid) - before) * 1000 / n, trips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bases", nargs="+", metavar="BASE", help="revisions to compare with")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--executes", type=int, default=500)
    parser.add_argument("--kernel", default="xpython")
    args = parser.parse_args()

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    trees: dict[str, Path | None] = {f"this checkout ({commit})": None}
    trees |= {rev: worktree(rev) for rev in args.bases}
    gateways: dict[str, tuple[Gateway, str]] = {}
    try:
        for name, tree in trees.items():
            gw = Gateway(tempfile.mkdtemp(prefix="sbx-bench-"), "--pool", "", tree=tree)
            r = gw.client.post("/v1/sessions", json={"kernel": args.kernel})
            r.raise_for_status()
            gateways[name] = (gw, r.json()["id"])
            block(gw, gateways[name][1], 50)  # warm-up
        cpu: dict[str, list[float]] = {name: [] for name in trees}
        trips: dict[str, list[float]] = {name: [] for name in trees}
        for b in range(args.blocks):
            for name, (gw, sid) in gateways.items():
                ms, t = block(gw, sid, args.executes)
                cpu[name].append(ms)
                trips[name] += t
            print(f"block {b + 1}: " + ", ".join(f"{n}: {c[-1]:.2f} ms" for n, c in cpu.items()))
    finally:
        for gw, _ in gateways.values():
            gw.stop()
        for tree in trees.values():
            if tree is not None:
                drop_worktree(tree)

    rows = [
        "| gateway | CPU ms per execute (median of blocks) | blocks' range | p50 round trip ms "
        "| this checkout's CPU against it, ms (median of the blocks' differences) |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    ours = cpu[next(iter(trees))]
    for name in trees:
        change = median([a - b for a, b in zip(ours, cpu[name], strict=True)])
        rows.append(
            f"| {name} | {median(cpu[name]):.2f} | {min(cpu[name]):.2f}-{max(cpu[name]):.2f} "
            f"| {median(trips[name]):.2f} | {change:+.2f} |"
        )
    print("\n".join(rows))
    write_section(
        "bench_cpu",
        "Gateway CPU per trivial execute, against earlier revisions",
        f"kernel `{args.kernel}`, runc, default limits, loopback, no authentication; one "
        f"session per gateway, {args.blocks} blocks of {args.executes} `1 + 1` executes over "
        "HTTP (httpx, one request at a time) alternating between the gateways; CPU is the "
        "gateway process's, every thread (issue 23's target: at most 1.5 ms).",
        rows,
    )


if __name__ == "__main__":
    main()
