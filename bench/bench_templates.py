"""A template's build, and a session's start from it, beside a start from the kernel's image.

Usage: .venv/bin/python bench/bench_templates.py [--rounds 3] [--starts 5]

One gateway (no kernelspec pool, so those starts are cold). Each round
builds a new version of a small template FROM sbx/python (a file written,
an env var set), first with nothing cached by the engine (a fresh RUN each
round) and timed from ``POST /v1/templates`` to ready; then ``--starts``
sessions from the template and as many from the kernel's own image, create
-> first result; then as many from the template's warm pool (size 1, each
create once it is ready again: the new version's sandbox replaced the old).
Prints a table and rewrites its section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from harness import Gateway, median, pct, session_starts, write_section


def build(gw: Gateway, round_no: int) -> float:
    """Seconds from the build's request to its version being ready."""
    dockerfile = (
        f"FROM sbx/python\nUSER root\nRUN echo {round_no} {time.time()} > /opt/round\n"
        "ENV BENCH=yes\n"
    )
    t0 = time.perf_counter()
    r = gw.client.post("/v1/templates", json={"name": "bench", "dockerfile": dockerfile})
    r.raise_for_status()
    version = r.json()["version"]
    while True:
        builds = gw.client.get("/v1/templates/bench").json()["versions"]
        doc = next(b for b in builds if b["version"] == version)
        if doc["status"] != "building":
            break
        time.sleep(0.05)
    if doc["status"] != "ready":
        raise SystemExit(f"the build failed: {doc['error']}")
    return time.perf_counter() - t0


def pooled_starts(gw: Gateway, n: int, version: int) -> list[float]:
    """Ms create -> first result of ``n`` sessions each served by the template's pool."""
    gw.client.put("/v1/templates/bench/pool", json={"size": 1}).raise_for_status()
    pool = lambda: gw.client.get("/v1/templates/bench").json()["pool"]  # noqa: E731
    starts = []
    for _ in range(n):
        deadline = time.monotonic() + 60
        while not (pool()["ready"] and pool()["version"] == version):
            if time.monotonic() > deadline:
                raise SystemExit(f"the template's pool never filled: {pool()}")
            time.sleep(0.05)
        starts += session_starts(gw.client, 1, {"template": "bench"})[1]
    if pool()["served"] < n:
        raise SystemExit(f"only {pool()['served']} of {n} pooled creates came from the pool")
    return starts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    builds, template, kernel, pooled = [], [], [], []
    with tempfile.TemporaryDirectory() as data, Gateway(data, "--pool", "") as gw:
        try:
            for n in range(args.rounds):
                builds.append(build(gw, n))
                template += session_starts(gw.client, args.starts, {"template": "bench"})[1]
                kernel += session_starts(gw.client, args.starts, {})[1]
                pooled += pooled_starts(gw, args.starts, n + 1)
        finally:
            gw.client.delete("/v1/templates/bench")
    body = [
        "| measure | n | p50 | max |",
        "| --- | ---: | ---: | ---: |",
        f"| template build FROM sbx/python (a RUN, an ENV), request -> ready | {len(builds)} "
        f"| {median(builds):.1f} s | {max(builds):.1f} s |",
        f"| session from the template: create -> first result | {len(template)} "
        f"| {median(template):.0f} ms | {pct(template, 1.0):.0f} ms |",
        f"| session from the kernel's image: create -> first result | {len(kernel)} "
        f"| {median(kernel):.0f} ms | {pct(kernel, 1.0):.0f} ms |",
        f"| session from the template's warm pool: create -> first result | {len(pooled)} "
        f"| {median(pooled):.0f} ms | {pct(pooled, 1.0):.0f} ms |",
    ]
    print("\n".join(body))
    write_section(
        "bench_templates",
        "Templates: a build, and a session's start from it",
        "cold starts (no kernelspec pool) beside starts from the template's own warm pool "
        "(PUT /v1/templates/bench/pool, size 1, each create once it is ready), each round a "
        "fresh build (its pool moves to it). A build is the tenant's "
        "Dockerfile, the gateway's layer on top, and the export that checks it (about 4 s of "
        "the build for the Python image's 700 MB); a session from a template starts as one from "
        "the kernel's image does, its layers shared with it.",
        body,
    )


if __name__ == "__main__":
    main()
