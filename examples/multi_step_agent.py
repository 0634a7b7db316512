"""A multi-step agent keeping its state across steps in one session with a TTL (asyncio).

Between steps the agent keeps nothing but the session id, as a stateless
worker fed from a job queue would: each step reconnects, builds on the
variables the earlier steps left in the kernel, and extends the session's
life while work remains. The TTL is the safety net: an agent that dies
mid-task leaves a session that ends by itself instead of running forever::

    python examples/multi_step_agent.py --url http://127.0.0.1:8765 --ttl 120
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from gateway.client import AsyncClient

STEPS = [
    (
        "collect",
        "import random\nrandom.seed(7)\n"
        "readings = [round(random.gauss(20, 4), 2) for _ in range(1000)]\nlen(readings)",
    ),
    ("clean", "clean = [r for r in readings if 10 <= r <= 30]\nlen(readings) - len(clean)"),
    (
        "summarise",
        "import statistics\nsummary = {'n': len(clean), 'mean': round(statistics.mean(clean), 2),\n"
        "           'stdev': round(statistics.stdev(clean), 2)}\nsummary",
    ),
    (
        "report",
        "import json\nwith open('report.json', 'w') as f:\n    json.dump(summary, f)\n"
        "print(f\"report: {summary['n']} readings, mean {summary['mean']}\")",
    ),
]


async def step(client: AsyncClient, session_id: str, name: str, code: str, ttl: float) -> str:
    """One unit of agent work: reconnect by id, run, and push the deadline out."""
    session = await client.connect(session_id)
    execution = await session.run(code, description=f"### Step: {name}")
    if not execution.ok:
        raise RuntimeError(f"step {name} failed: {execution.error}")
    info = await session.extend(ttl)
    print(
        f"step {name}: {(execution.text or execution.stdout).strip()} (expires {info.expires_at})"
    )
    return execution.text or execution.stdout


async def run(url: str | None, token: str | None, ttl: float, keep: bool = False) -> dict:
    async with AsyncClient(url, token) as client:
        created = await client.create_session(
            ttl=ttl, idle_timeout=ttl, metadata={"agent": "multi-step"}
        )
        print(f"session {created.id} (ttl {ttl:g} s)")
        try:
            for name, code in STEPS:
                await step(client, created.id, name, code, ttl)
            session = await client.connect(created.id)
            report = json.loads(await session.files.read("report.json"))
            history = await session.history()
            print(f"{len(history)} steps ran in one kernel; report.json: {report}")
        finally:
            if not keep:
                await created.delete()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="gateway URL (default: SBX_URL or http://127.0.0.1:8765)")
    parser.add_argument("--token", help="bearer token (default: SBX_TOKEN)")
    parser.add_argument("--ttl", type=float, default=120, help="seconds of life per step")
    parser.add_argument("--keep", action="store_true", help="leave the session for its TTL")
    args = parser.parse_args(argv)
    asyncio.run(run(args.url, args.token, args.ttl, args.keep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
