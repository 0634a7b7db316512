"""Several gateways on one PostgreSQL store: what the shared store and forwarding cost.

Starts a PostgreSQL server of its own (``scripts/postgres``), one gateway on
SQLite and two on the shared server. Times trivial executes (``1 + 1``) over
HTTP on a session of each: on SQLite, on PostgreSQL through the gateway that
owns the session, and through the other gateway, which passes each request on
to the owner; and the gateway CPU each execute costs (the owner's, and the
forwarder's too for a forwarded one). The last two alternate in blocks on one
session, so that a shared machine's load falls on both alike. Then failover:
a gateway owning a session is killed (SIGKILL) and the time until the session
answers again, with its state, through the surviving gateway (which adopts
it) is taken, at the default lease. Writes the tables into docs/PERFORMANCE.md.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time

from harness import ROOT, Gateway, cpu_seconds, median, pct, round_trips, write_section

N = 400
BLOCK = 50  # executes at the owner and forwarded alternate in blocks this long
FAILOVERS = 3


def failover(url: str, survivor: Gateway) -> float:
    """Seconds from killing a session's gateway until the survivor answers for it, state kept."""
    with Gateway(tempfile.mkdtemp(prefix="sbx-bench-"), "--pool", "", "--database-url", url) as gw:
        sid = gw.client.post("/v1/sessions", json={}).json()["id"]
        gw.client.post(f"/v1/sessions/{sid}/execute", json={"code": "x = 42"})
        gw.proc.send_signal(signal.SIGKILL)
        gw.proc.wait()
        killed = time.monotonic()
        while True:
            r = survivor.client.post(f"/v1/sessions/{sid}/execute", json={"code": "print(x)"})
            text = "".join(o.get("text", "") for o in r.json().get("outputs", []))
            if r.status_code == 200 and text == "42\n":
                took = time.monotonic() - killed
                survivor.client.delete(f"/v1/sessions/{sid}")
                return took
            if time.monotonic() - killed > 60:
                raise RuntimeError(f"the session was never adopted: {r.status_code} {r.text}")
            time.sleep(0.05)


def measure(
    via: Gateway, sid: str, gateways: list[Gateway], n: int = N
) -> tuple[list[float], list[float]]:
    """Round trips of ``n`` executes through ``via``, and the CPU ms per execute of each gateway."""
    before = [cpu_seconds(g.pid) for g in gateways]
    trips = round_trips(via.client, sid, n)
    used = [cpu_seconds(g.pid) - b for g, b in zip(gateways, before, strict=True)]
    return trips, [u * 1000 / (n + 10) for u in used]  # round_trips warms up with 10 more


def alternating(owner: Gateway, other: Gateway, sid: str) -> dict[str, tuple[list[float], list]]:
    """At the owner and forwarded by ``other``, N executes each, in alternating blocks.

    The CPU lists are per gateway: the owner's, and (forwarded) the forwarder's.
    """
    found: dict[str, tuple[list[float], list]] = {
        "owner": ([], [0.0]),
        "forwarded": ([], [0.0, 0.0]),
    }
    for _ in range(N // BLOCK):
        for name, via, counted in (("owner", owner, [owner]), ("forwarded", other, [owner, other])):
            trips, cpu = measure(via, sid, counted, BLOCK)
            found[name][0].extend(trips)
            for i, ms in enumerate(cpu):
                found[name][1][i] += ms * BLOCK / N
    return found


def main() -> None:
    server = tempfile.mkdtemp(prefix="sbx-pg-")
    url = subprocess.run(
        [str(ROOT / "scripts" / "postgres"), "start", server],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    dirs = [tempfile.mkdtemp(prefix="sbx-bench-") for _ in range(3)]
    try:
        with (
            Gateway(dirs[0], "--pool", "") as alone,
            Gateway(dirs[1], "--pool", "", "--database-url", url) as owner,
            Gateway(dirs[2], "--pool", "", "--database-url", url) as other,
        ):
            sid = alone.client.post("/v1/sessions", json={}).json()["id"]
            trips, cpu = measure(alone, sid, [alone])
            alone.client.delete(f"/v1/sessions/{sid}")
            rows = [row("one gateway, SQLite", trips, cpu)]
            sid = owner.client.post("/v1/sessions", json={}).json()["id"]
            found = alternating(owner, other, sid)
            owner.client.delete(f"/v1/sessions/{sid}")
            rows.append(row("shared PostgreSQL, at the owner", *found["owner"]))
            rows.append(row("shared PostgreSQL, forwarded by another gateway", *found["forwarded"]))
            overhead = median(found["forwarded"][0]) - median(found["owner"][0])
            forwarder = found["forwarded"][1][1]
            adopted = [failover(url, other) for _ in range(FAILOVERS)]
    finally:
        subprocess.run([str(ROOT / "scripts" / "postgres"), "stop", server], check=False)
        for path in (server, *dirs):
            shutil.rmtree(path, ignore_errors=True)
    body = [
        "| store and route | execute p50 ms | p90 ms | gateway CPU ms per execute |",
        "| --- | ---: | ---: | ---: |",
        *rows,
        "",
        f"Forwarding: p50 {overhead:+.2f} ms over the owner's; the forwarding gateway's own CPU "
        f"{forwarder:.2f} ms per execute (the owner's and the forwarded rows alternate in blocks "
        f"of {BLOCK} on one session).",
        "",
        "| failover (default lease, 3 s) | runs | each, s | worst, s |",
        "| --- | ---: | --- | ---: |",
        f"| a killed gateway's session answers through another, state kept | {FAILOVERS} | "
        f"{', '.join(f'{s:.1f}' for s in adopted)} | {max(adopted):.1f} |",
    ]
    print("\n".join(body))
    write_section(
        "bench_gateways",
        "Several gateways: the shared store and forwarding",
        f"{N} trivial executes (`1 + 1`) over HTTP one after another on one session each; "
        "CPU counts every gateway process the request went through (docs/SCALING.md).",
        body,
    )


def row(name: str, trips: list[float], cpu: list[float]) -> str:
    return f"| {name} | {median(trips):.2f} | {pct(trips, 0.9):.2f} | {sum(cpu):.2f} |"


if __name__ == "__main__":
    main()
