"""One deployment, one view: what the deployment-wide quota claim and listing cost.

Starts a PostgreSQL server of its own. The claim: warm creates (201 and the
session deleted again, the pool refilled before the next) through a gateway
on PostgreSQL, at this checkout and at the floor, the revision before creates
claimed their quota in the store (a count of this gateway's own sessions in
memory), alternating in blocks; and the claim alone, the store call from one
gateway one at a time, and 30 at once from three. The listing: 1,000 open
sessions on record, held by three gateways (records as a real session's, with
leases), listed through each of three gateways on the same store, a page of
100 and all 1,000 at once. Writes the tables into docs/PERFORMANCE.md.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from harness import ROOT, Gateway, drop_worktree, median, pct, timed, worktree, write_section

FLOOR = "6e47fd3"  # the revision before quotas were claimed in the store
CREATES = 40
BLOCK = 10
LISTED = 1000
LISTS = 60


def database(server_url: str) -> str:
    name = f"b{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as db:
        db.execute(f"CREATE DATABASE {name}")
    return server_url.replace("/sbx?", f"/{name}?")


def pool_ready(gw: Gateway) -> bool:
    metrics = gw.client.get("/metrics").text
    return any(
        line.startswith('sbx_pool_ready{kernel="python3"}') and float(line.split()[-1]) >= 2
        for line in metrics.splitlines()
    )


def warm_creates(gw: Gateway, n: int) -> list[float]:
    """Ms of ``n`` creates served by the warm pool, each deleted and the pool refilled after."""
    times = []
    for _ in range(n):
        while not pool_ready(gw):
            time.sleep(0.05)
        t0 = time.perf_counter()
        r = gw.client.post("/v1/sessions", json={})
        r.raise_for_status()
        times.append((time.perf_counter() - t0) * 1000)
        gw.client.delete(f"/v1/sessions/{r.json()['id']}")
    return times


def claims(url: str, data: Path) -> tuple[list[float], float]:
    """Ms of claims one at a time from one gateway's store; ms for 30 at once from three."""
    sys.path.insert(0, str(ROOT))
    from gateway.store.postgres import PostgresStore

    caps = {"sessions": 10**6, "memory": 2**60, "cpus": 1e9, "disk": 2**60, "per_minute": 0}

    def claim(sid: str) -> dict:
        return {"session_id": sid, "tenant": "bench", "owner": "g", "memory": 2**29,
                "cpus": 1.0, "disk": 2**30}  # fmt: skip

    async def scenario() -> tuple[list[float], float]:
        stores = [PostgresStore(url, data / f"g{n}") for n in range(3)]
        for store in stores:
            await store.open()
        one = []
        for _ in range(300):
            t0 = time.perf_counter()
            await stores[0].claim_quota(claim(uuid.uuid4().hex), caps, 60)
            one.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        await asyncio.gather(
            *(s.claim_quota(claim(uuid.uuid4().hex), caps, 60) for s in stores for _ in range(10))
        )
        burst = (time.perf_counter() - t0) * 1000
        for store in stores:
            await store.close()
        return one[20:], burst

    return asyncio.run(scenario())


def fill(url: str, template: dict) -> None:
    """1,000 open sessions' records, held by three gateways' leases, as a real one's."""
    now = time.time()
    with psycopg.connect(url, autocommit=True) as db, db.transaction():
        for n in range(LISTED):
            sid = str(uuid.uuid4())
            made = f"2026-11-28T00:{n // 60:02d}:{n % 60:02d}.000Z"
            doc = {**template, "id": sid, "created_at": made}
            db.execute(
                "INSERT INTO sessions (id, tenant, state, created_at, ended_at, doc)"
                " VALUES (%s, %s, 'idle', %s, NULL, %s)",
                (sid, doc["tenant"], doc["created_at"], json.dumps(doc)),
            )
            db.execute(
                "INSERT INTO leases (session_id, owner, expires_at, renewed_at)"
                " VALUES (%s, %s, %s, %s)",
                (sid, f"bench-gateway-{n % 3}", now + 3600, now),
            )


def listings(gateways: list[Gateway]) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"a page of 100": [], f"all {LISTED} at once": []}
    for gw in gateways:
        for name, limit in (("a page of 100", 100), (f"all {LISTED} at once", LISTED)):

            def listed(limit: int = limit, gw: Gateway = gw) -> None:
                r = gw.client.get("/v1/sessions", params={"limit": limit})
                r.raise_for_status()
                assert len(r.json()["sessions"]) == limit, len(r.json()["sessions"])

            found[name] += timed(listed, LISTS // len(gateways), warmup=3)
    return found


def main() -> None:
    server = tempfile.mkdtemp(prefix="sbx-pg-")
    server_url = subprocess.run(
        [str(ROOT / "scripts" / "postgres"), "start", server],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    floor = worktree(FLOOR)
    dirs: list[str] = []

    def gateway(url: str, *flags: str, tree: Path | None = None) -> Gateway:
        dirs.append(tempfile.mkdtemp(prefix="sbx-bench-"))
        return Gateway(dirs[-1], "--database-url", url, *flags, tree=tree)

    try:
        pooled = ("--pool", "python3=2")
        ours, before = (
            gateway(database(server_url), *pooled),
            gateway(database(server_url), *pooled, tree=floor),
        )
        creates: dict[str, list[float]] = {"this checkout": [], f"floor ({FLOOR})": []}
        with ours, before:
            warm_creates(ours, 3), warm_creates(before, 3)  # warm-up
            for _ in range(CREATES // BLOCK):
                creates["this checkout"] += warm_creates(ours, BLOCK)
                creates[f"floor ({FLOOR})"] += warm_creates(before, BLOCK)
        one, burst = claims(database(server_url), Path(tempfile.mkdtemp(prefix="sbx-bench-")))

        url = database(server_url)
        with gateway(url, "--pool", "") as first:
            sid = first.client.post("/v1/sessions", json={}).json()["id"]
            template = first.client.get(f"/v1/sessions/{sid}").json()
            first.client.delete(f"/v1/sessions/{sid}")
        fill(url, template)
        three = [gateway(url, "--pool", "") for _ in range(3)]
        try:
            listed = listings(three)
        finally:
            for gw in three:
                gw.stop()
    finally:
        subprocess.run([str(ROOT / "scripts" / "postgres"), "stop", server], check=False)
        drop_worktree(floor)
        for path in (server, *dirs):
            shutil.rmtree(path, ignore_errors=True)

    ms = {name: median(t) for name, t in creates.items()}
    body = [
        "| warm create through a gateway on PostgreSQL | creates | p50 ms | p90 ms |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {name} | {len(t)} | {median(t):.2f} | {pct(t, 0.9):.2f} |"
            for name, t in creates.items()
        ),
        "",
        f"The deployment-wide claim adds {ms['this checkout'] - ms[f'floor ({FLOOR})']:+.2f} ms "
        f"to a create's p50 (the floor counts only its own gateway's sessions, in memory). The "
        f"claim alone, the store call from one gateway: p50 {median(one):.2f} ms, p90 "
        f"{pct(one, 0.9):.2f} ms; 30 claims at once from three gateways' stores, all granted "
        f"or refused in {burst:.0f} ms (they take one lock in turn).",
        "",
        f"| listing {LISTED} open sessions held by three gateways, through each of three "
        "| lists | p50 ms | p95 ms |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {name} | {len(t)} | {median(t):.2f} | {pct(t, 0.95):.2f} |"
            for name, t in listed.items()
        ),
    ]
    print("\n".join(body))
    write_section(
        "bench_deployment",
        "One deployment, one view: the quota claim and the listing",
        "PostgreSQL on this machine (scripts/postgres); docs/SCALING.md#one-deployment-one-view.",
        body,
    )


if __name__ == "__main__":
    main()
