"""Ten thousand sessions on one host: what a gateway holding them costs.

One gateway on SQLite, no warm pool, small sessions (128 MiB, a quarter of a
core, a 64 MiB workspace). ``--live`` sessions are created for real and kept
running (each a kernel in its container); ``--paused`` more are created and
paused for real through the API (their state saved, their containers removed,
their loop-mounted workspaces kept). The rest, up to ``--total``, are copies
of one really paused session: its record, lease and quota claim under a new
id (not its execution history), and its session directory (saved state and all) copied, except that
the copy's workspace is a plain directory (as a gateway without root makes)
rather than a loop-mounted image: ten thousand loop devices are not for a
shared machine. The gateway is then stopped without ending its sessions, and
started again on the same data dir: recovery is timed until it answers and
until every session is listed again. With that population: its RSS, the
store's size, a page of the list (100, first and deep), a lookup, and its CPU
over a minute of idling (culling, lease upkeep) beside a gateway holding a few
sessions started alongside. Writes the tables into docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import stat
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import (
    Gateway,
    cpu_seconds,
    drop_worktree,
    median,
    pct,
    rss_mib,
    timed,
    worktree,
    write_section,
)

FLAGS = (
    "--pool", "", "--max-sessions", "20000", "--tenant-max-sessions", "20000",
    "--tenant-max-memory", "4t", "--tenant-max-disk", "4t", "--tenant-max-cpus", "100000",
    "--default-memory", "128m", "--default-cpus", "0.25", "--default-disk", "64m",
    "--default-ttl", "86400", "--default-idle-timeout", "86400",
)  # fmt: skip
FEW = 5  # sessions the floor gateway holds
LOOKUPS = 200


TREE: Path | None = None  # the checkout whose gateway runs (--rev), by default this one


def gateway(data: Path, end_sessions: bool = True) -> Gateway:
    return Gateway(str(data), *FLAGS, end_sessions=end_sessions, tree=TREE)


def create(gw: Gateway) -> str:
    r = gw.client.post("/v1/sessions", json={})
    r.raise_for_status()
    return r.json()["id"]


def populate(gw: Gateway, live: int, paused: int) -> tuple[list[str], list[str], float]:
    """Create ``live + paused`` sessions (two at a time), pause ``paused`` of them; seconds."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as workers:
        ids = list(workers.map(lambda _: create(gw), range(live + paused)))
    for sid in ids[live:]:
        gw.client.post(f"/v1/sessions/{sid}/execute", json={"code": "x = 42"}).raise_for_status()
        saved = {"strategy": "namespace"}  # paused to disk, as the copies are: no memory held
        gw.client.post(f"/v1/sessions/{sid}/pause", json=saved).raise_for_status()
    return ids[:live], ids[live:], time.monotonic() - t0


def store_file(data: Path) -> Path:
    return data / "gateway.sqlite3"


def clone_paused(data: Path, template: str, n: int) -> list[str]:
    """Copy a paused session ``n`` times: its directory, and its rows in the tables a
    restart reads (its record, lease and quota claim; not its history), under new ids."""
    db = sqlite3.connect(store_file(data))
    tables = [("sessions", "id"), ("leases", "session_id"), ("claims", "session_id")]
    rows = {t: db.execute(f"SELECT * FROM {t} WHERE {col} = ?", (template,)).fetchall()
            for t, col in tables}  # fmt: skip
    source = data / "sessions" / template
    ids = []
    with db:
        for _ in range(n):
            sid = str(uuid.uuid4())
            ids.append(sid)
            for t, found in rows.items():
                for row in found:
                    row = [v.replace(template, sid) if isinstance(v, str) else v for v in row]
                    marks = ", ".join("?" * len(row))
                    db.execute(f"INSERT INTO {t} VALUES ({marks})", row)
            shutil.copytree(source, data / "sessions" / sid, ignore=_not_copied)
            (data / "sessions" / sid / "workspace").mkdir(mode=0o1777)
    db.close()
    return ids


def _not_copied(directory: str, names: list[str]) -> set[str]:
    """The workspace (a copy gets a plain directory) and the dead kernel's sockets."""
    here = Path(directory)
    sockets = {n for n in names if stat.S_ISSOCK((here / n).lstat().st_mode)}
    return {"workspace.img", "workspace", *sockets}


def listed(gw: Gateway) -> int:
    """Sessions the gateway lists, page after page."""
    count, after = 0, None
    while True:
        params = {"limit": 100, **({"after": after} if after else {})}
        page = gw.client.get("/v1/sessions", params=params).json()
        count += len(page["sessions"])
        after = page.get("next")
        if not after:
            return count


def recover(data: Path, total: int) -> tuple[Gateway, float, float, str]:
    """Start a gateway on ``data``: seconds until it answers (it takes its sessions back
    first), and the seconds one listing of them all, page by page, then takes."""
    t0 = time.monotonic()
    gw = gateway(data, end_sessions=False)
    answering = time.monotonic() - t0
    t0 = time.monotonic()
    if (count := listed(gw)) != total:
        raise SystemExit(f"{count} of {total} sessions listed after the restart")
    line = next(x for x in gw.log.read_text().splitlines() if "took over" in x)
    return gw, answering, time.monotonic() - t0, line.split("took over ", 1)[1]


def deep_cursor(gw: Gateway, pages: int) -> str:
    after = None
    for _ in range(pages):
        params = {"limit": 100, **({"after": after} if after else {})}
        after = gw.client.get("/v1/sessions", params=params).json()["next"]
    return after


def idle_cpu(gateways: list[Gateway], seconds: float) -> list[float]:
    """CPU seconds each gateway used over ``seconds`` of nobody asking, per minute."""
    before = [cpu_seconds(g.pid) for g in gateways]
    time.sleep(seconds)
    return [(cpu_seconds(g.pid) - b) * 60 / seconds for g, b in zip(gateways, before, strict=True)]


def size_mib(data: Path) -> float:
    db = store_file(data)
    files = [db, *(db.parent / (db.name + s) for s in ("-wal", "-shm"))]
    return sum(f.stat().st_size for f in files if f.exists()) / 2**20


def cleanup(gw: Gateway, data: Path, real: list[str]) -> None:
    """End the real sessions through the gateway, then remove whatever of this run is left."""
    if gw.proc.poll() is not None:  # stopped, keeping its sessions: take them back to end them
        gw = gateway(data)
    with ThreadPoolExecutor(4) as workers:
        list(workers.map(lambda sid: gw.client.delete(f"/v1/sessions/{sid}"), real))
    gw.stop()
    with sqlite3.connect(store_file(data)) as db:
        (gateway_id,) = db.execute("SELECT value FROM meta WHERE key = 'gateway_id'").fetchone()
    if gateway_id:
        left = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=sbx.gateway={gateway_id}"],
            capture_output=True, text=True, check=False,
        ).stdout.split()  # fmt: skip
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, check=False)
    for line in Path("/proc/mounts").read_text().splitlines():
        if str(data) in line.split()[1]:
            subprocess.run(["umount", "-l", line.split()[1]], check=False)
    shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=200)
    parser.add_argument("--paused", type=int, default=20, help="paused for real through the API")
    parser.add_argument("--idle", type=float, default=60, help="seconds of idling measured")
    parser.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    parser.add_argument("--rev", help="run this revision's gateway (a worktree), e.g. HEAD")
    args = parser.parse_args()
    global TREE
    TREE = worktree(args.rev) if args.rev else None
    data = Path(tempfile.mkdtemp(prefix="sbx-scale-"))
    floor_data = Path(tempfile.mkdtemp(prefix="sbx-scale-floor-"))
    floor = gateway(floor_data)
    few = [create(floor) for _ in range(FEW)]
    gw = gateway(data, end_sessions=False)
    try:
        live, paused, made = populate(gw, args.live, args.paused)
        print(f"{len(live)} live and {len(paused)} paused made in {made:.0f} s")
        rss_real = rss_mib(gw.pid)
        gw.stop()
        t0 = time.monotonic()
        clones = clone_paused(data, paused[0], args.total - len(live) - len(paused))
        print(f"{len(clones)} paused copies written in {time.monotonic() - t0:.0f} s")
        gw, answering, listing_all, took = recover(data, args.total)
        print(f"answering after {answering:.1f} s, all listed in {listing_all:.1f} s; {took}")
        rss = rss_mib(gw.pid)
        store = size_mib(data)
        first = timed(lambda: gw.client.get("/v1/sessions?limit=100").raise_for_status(), 50)
        cursor = deep_cursor(gw, args.total // 200)
        deep = timed(
            lambda: gw.client.get(f"/v1/sessions?limit=100&after={cursor}").raise_for_status(), 50
        )
        looked = [*live[: LOOKUPS // 4], *clones[: LOOKUPS // 4], *paused[: LOOKUPS // 4]]
        lookups = timed(lambda: [gw.client.get(f"/v1/sessions/{s}").raise_for_status()
                                 for s in looked], 3, warmup=1)  # fmt: skip
        lookup = [ms / len(looked) for ms in lookups]
        cpu_many, cpu_few = idle_cpu([gw, floor], args.idle)
    finally:
        cleanup(gw, data, [*live, *paused] if "paused" in locals() else [])
        cleanup(floor, floor_data, few)
        if TREE:
            drop_worktree(TREE)
    rows = [
        f"| sessions on record | {args.total:,} ({len(live)} live, {len(paused)} paused through "
        f"the API, {len(clones):,} paused copies) |",
        f"| gateway RSS, {len(live)} live + {len(paused)} paused | {rss_real:.0f} MiB |",
        f"| gateway RSS after recovering all | {rss:.0f} MiB (target ≤ 500) |",
        f"| store (SQLite file, WAL, shm) | {store:.1f} MiB |",
        f"| recovery: from start until it answers, every session taken back | {answering:.1f} s "
        "(target ≤ 30) |",
        f"| its log | took over {took} |",
        f"| listing all {args.total:,} after it, page by page | {listing_all:.1f} s |",
        f"| a page of 100, first | {median(first):.1f} ms median, {pct(first, 0.95):.1f} p95 "
        "(target ≤ 50) |",
        f"| a page of 100, halfway | {median(deep):.1f} ms median, {pct(deep, 0.95):.1f} p95 |",
        f"| a lookup (GET /v1/sessions/{{id}}) | {median(lookup):.2f} ms |",
        f"| CPU idling, {args.total:,} sessions | {cpu_many:.2f} s a minute |",
        f"| CPU idling, {FEW} sessions (floor) | {cpu_few:.2f} s a minute |",
    ]
    body = ["| measure | figure |", "|---|---|", *rows]
    print("\n".join(body))
    if not args.no_write:
        write_section(
            "bench_scale",
            "Ten thousand sessions on one host",
            f"{made:.0f} s to create the live and paused ones for real; the copies are a "
            "really paused session's rows and files under new ids, their workspaces plain "
            "directories (no loop mount each); see bench/bench_scale.py",
            body,
        )


if __name__ == "__main__":
    main()
