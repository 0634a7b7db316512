"""A canary session and the gateway's memory while another session attacks through its outputs.

Usage: .venv/bin/python bench/bench_hostile.py

Runs each attack of tests/security/test_hostile_outputs.py (the tests assert
the bounds; this records the figures) in a fresh session with a 1 MiB output
cap, while a canary session on the same gateway answers a trivial cell back
to back. The first row is the floor: the same canary with the attacker idle.
For each: how long the attack's execute took, how many answers the canary
gave and its slowest, the gateway's peak RSS and how far it rose (VmHWM, so
a spike between samples counts), and the size of the attack's reply.
Replaces the "Hostile outputs" section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import json
import sys
import time

from harness import ROOT, write_section

sys.path.insert(0, str(ROOT / "tests"))
from helpers import Canary, GatewayProcess, canary_session, run, short_tmpdir
from security.test_hostile_outputs import ATTACKS

QUIET = "floor: no attack (the attacker sleeps 3 s)"
ATTACKER = {"limits": {"memory": "3g", "output_bytes": "1m", "timeout": 120}}


def attack(gw: GatewayProcess, bystander: str, code: str) -> str:
    """One table row: the attack's execute under a canary."""
    sid = gw.client.post("/v1/sessions", json=ATTACKER).json()["id"]
    try:
        run(gw.client, sid, "print('warm')")
        failure = ""
        started = time.monotonic()
        try:
            with Canary(gw, bystander) as canary:
                reply = run(gw.client, sid, code, timeout=120)
        except AssertionError as e:  # past the tests' bound: a figure worth seeing
            failure = f" (**{str(e).splitlines()[0]}**)"
        took = time.monotonic() - started
        size = len(json.dumps(reply)) / 2**10
        return (
            f"{took:.1f} s | {canary.answers} | {canary.worst * 1000:.0f} ms{failure} | "
            f"{canary.peak_rss_mib} MiB | +{canary.grown_mib:.0f} MiB | {size:.0f} KiB | "
            f"{'yes' if reply['truncated'] else 'no'}"
        )
    finally:
        gw.client.delete(f"/v1/sessions/{sid}")


def main() -> None:
    gw = GatewayProcess(short_tmpdir(), "--end-sessions-on-stop", "--pool", "")
    rows = [
        "| attack | execute | canary answers | canary slowest | gateway RSS peak "
        "| RSS rise | reply | cut |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    try:
        with canary_session(gw) as bystander:
            for name, code in {QUIET: "import time; time.sleep(3)", **ATTACKS}.items():
                row = f"| {name} | {attack(gw, bystander, code)} |"
                print(row, flush=True)
                rows.append(row)
    finally:
        gw.stop()
    write_section(
        "bench_hostile",
        "Hostile outputs: a canary and the gateway's memory during each attack",
        "one gateway, runc, default settings (`max_kernel_message` 32 MiB), the attacker "
        "with `output_bytes` 1 MiB and 3 GiB of memory; the canary answers `print(alive)` "
        "over HTTP back to back throughout. RSS rise is from the attack's start to the "
        "peak (VmHWM).",
        rows,
    )


if __name__ == "__main__":
    main()
