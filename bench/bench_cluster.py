"""Cluster capacity: create latency local versus on a swarm worker, and sessions per node.

Starts the test swarm (``scripts/cluster up``: a manager and two workers on this
machine), deploys the gateway there without a warm pool, and a local gateway
without one; creates sessions cold one after another on each and times the
create and the first result; then measures what an idle cluster session
costs on its node (kernel + agent, from the worker's engine) and how many
default sessions each node's memory admits (each reserves its limit).
Writes the table into docs/SCALING.md. Run as root; the swarm is removed at the end.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import tempfile
import time

import docker
import httpx
from harness import ROOT, Gateway, machine, median, pct, round_trips, session_starts

N = 8
# Limits no pooled kernel has: every create is a cold start, on either placement.
COLD = {"limits": {"memory": "500m"}}
PORT = 18799


def cluster(*args: str, **env: str) -> None:
    subprocess.run(["scripts/cluster", *args], cwd=ROOT, check=True, env={**os.environ, **env})


def wait_ready(client: httpx.Client) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if client.get("/healthz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit("the cluster gateway did not answer")


def row(name: str, creates: list[float], starts: list[float], trips: list[float]) -> str:
    return (
        f"| {name} | {median(creates):.0f} | {pct(creates, 0.9):.0f} | {median(starts):.0f} "
        f"| {median(trips):.1f} |"
    )


def node_costs() -> tuple[float, int, int]:
    """Mean memory of the idle sessions on the workers (MiB), how many, and default
    sessions a node admits."""
    usage = []
    for worker in ("w1", "w2"):
        engine = docker.DockerClient(base_url=f"unix:///run/sbxc/{worker}/docker.sock")
        for container in engine.containers.list(filters={"label": "sbx.session"}):
            stats = container.stats(stream=False)["memory_stats"]
            usage.append(stats["usage"] - stats.get("stats", {}).get("cache", 0))
    manager = docker.DockerClient(base_url="unix:///run/sbxc/m1/docker.sock")
    node = next(n for n in manager.api.nodes() if n["Description"]["Hostname"] == "w1")
    memory = node["Description"]["Resources"]["MemoryBytes"]
    return sum(usage) / len(usage) / 2**20, len(usage), memory // (512 * 2**20)


def main() -> None:
    local = Gateway(tempfile.mkdtemp(prefix="sbx-"), "--pool", "")
    try:
        local_creates, local_starts = session_starts(local.client, N, COLD)
        sid = local.client.post("/v1/sessions", json={}).json()["id"]
        local_trips = round_trips(local.client, sid, 200)
    finally:
        local.stop()
    token = secrets.token_urlsafe(16)
    cluster("up", "2")
    try:
        cluster("deploy", SBX_TOKEN=token, SBX_PORT=str(PORT), SBX_POOL="")
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"http://10.213.0.10:{PORT}", headers=headers, timeout=600) as c:
            wait_ready(c)
            # The first session on each worker pulls the image there: not a create's cost.
            warm = [c.post("/v1/sessions", json={}).json()["id"] for _ in range(2)]
            creates, starts = session_starts(c, N, COLD)
            trips = round_trips(c, warm[0], 200)
            for _ in range(8):  # idle sessions, to measure what one costs its node
                c.post("/v1/sessions", json={}).raise_for_status()
            time.sleep(3)
            per_session, counted, per_node = node_costs()
    finally:
        cluster("down")
    table = [
        "| placement | create p50 ms | create p90 ms | create + first result p50 ms "
        "| execute round trip p50 ms |",
        "| --- | ---: | ---: | ---: | ---: |",
        row("local docker (this host)", local_creates, local_starts, local_trips),
        row("swarm worker (remote)", creates, starts, trips),
        "",
        f"An idle cluster session (kernel + agent) uses {per_session:.0f} MiB on its node "
        f"(mean of {counted}); "
        f"a node of this machine's memory admits {per_node} sessions of the default 512 MiB "
        "limit (each reserves its limit).",
        "",
        f"Measured by `bench/bench_cluster.py` ({N} cold creates each, one at a time, no warm "
        f"pool) on {machine()}.",
    ]
    print("\n".join(table))
    doc = ROOT / "docs" / "SCALING.md"
    begin, end = "<!-- bench_cluster: begin -->", "<!-- bench_cluster: end -->"
    text = doc.read_text()
    section = begin + "\n" + "\n".join(table) + "\n" + end
    doc.write_text(re.sub(re.escape(begin) + ".*?" + re.escape(end), section, text, flags=re.S))


if __name__ == "__main__":
    main()
