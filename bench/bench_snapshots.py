"""Pause, resume, snapshot and fork of a session holding 100 MB of objects, through a real gateway.

Usage: .venv/bin/python bench/bench_snapshots.py [--rounds 5] [--mib 100]

A python3 session (memory 1g) builds ``--mib`` MiB of objects: a numpy array,
a pandas frame and a dict of strings. Then, ``--rounds`` times each:
- the first tier: POST .../pause (frozen) and POST .../resume, an execute on a
  frozen session until its result, and beside them the floors: the same
  execute on a running session, and the engine's own pause + unpause;
- POST .../pause and POST .../resume (the namespace strategy), over HTTP,
  each resume with a pooled container waiting (the resume takes it);
- the same for a session the pool cannot serve (another workspace size), so
  its resume starts a container cold;
- the floor in the same run: loading the saved namespace in a fresh Python
  inside the sandbox (dill.load, which imports numpy and pandas), what a
  resume into a running kernel cannot avoid;
- the kernel's memory as the engine reports it before the pause, and while
  paused (the containers the engine lists for the session: none means 0 MiB);
- the paused session's disk: the saved namespace and the workspace's
  allocated blocks;
- POST .../snapshots, and a fork: POST /v1/sessions {"from_snapshot"} until
  the first execute's result (the warm pool may supply the container);
- the replay strategy beside it: a bash session of 20 cells paused and resumed;
- a session that survives crashes, holding the same objects: an execute on it
  (its checkpoint is taken while idle, so none is in the way), and its
  kernel killed (``os._exit``) until the next execute's result, the
  checkpoint loaded.
Prints a table and replaces the "Pause, resume, snapshots and forks" section
of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import docker
import httpx
from harness import Gateway, median, pct, write_section

from gateway.sessions.crashes import COMEBACKS

BUILD = """
import numpy as np, pandas as pd
mib = {mib}
array = np.random.rand(mib * 2**20 // 2 // 8)
frame = pd.DataFrame({{"x": np.arange(mib * 2**20 // 4 // 16), "y": 1.5}})
words = {{i: f"word-{{i:08d}}" for i in range(mib * 2**20 // 4 // 130)}}
"""


def ms(fn) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = fn()
    r.raise_for_status()
    return (time.perf_counter() - t0) * 1000, r


def container_mib(engine: docker.DockerClient, sid: str) -> float:
    """The session's kernel memory on the engine: the sum over its containers (none: 0).

    Its containers: labelled with its id, or named after it (one a resume took
    from the pool keeps the pooled id in its label).
    """
    total = 0
    found = {
        c.id: c
        for filters in ({"label": f"sbx.session={sid}"}, {"name": f"^sbx-{sid}$"})
        for c in engine.containers.list(all=True, filters=filters)
    }
    for c in found.values():
        stats = c.stats(stream=False)
        total += stats.get("memory_stats", {}).get("usage", 0)
    return total / 2**20


def disk_mib(session_dir: Path) -> float:
    """Blocks a session's directory holds on the host (a sparse workspace counts as used)."""
    total = 0
    for root, _, files in os.walk(session_dir):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total / 2**20


FLOOR = """
import dill, os, subprocess, sys
names = {{k: globals()[k] for k in ("np", "pd", "array", "frame", "words", "mib")}}
with open("/workspace/.floor.pkl", "wb") as f:
    dill.dump(names, f, protocol=5)
del names
load = "import time, dill; t = time.perf_counter(); "
load += "dill.load(open('/workspace/.floor.pkl', 'rb')); print((time.perf_counter() - t) * 1000)"
for _ in range({rounds}):
    print(subprocess.run([sys.executable, "-c", load], capture_output=True, text=True).stdout)
del f, load
os.unlink("/workspace/.floor.pkl")
"""


def pool_ready(client: httpx.Client) -> None:
    deadline = time.monotonic() + 120
    while client.get("/healthz").json()["pool_ready"]["python3"] < 1:
        if time.monotonic() > deadline:
            raise SystemExit("the warm pool did not refill in 2 minutes")
        time.sleep(0.1)


POOL = ("--pool", "python3=1")


def fork_rounds(
    client: httpx.Client,
    sid: str,
    rounds: int,
    snapshots: list[float],
    sizes: list[float],
    forks: list[float],
) -> None:
    """Snapshot the session, then fork it until the fork's first result, ``rounds`` times."""
    for _ in range(rounds):
        took, r = ms(lambda: client.post(f"/v1/sessions/{sid}/snapshots", json={}))
        snapshots.append(took)
        snap = r.json()
        sizes.append(snap["size_bytes"] / 2**20)
        pool_ready(client)  # a fork takes a pooled container when one waits
        t0 = time.perf_counter()
        child = client.post("/v1/sessions", json={"from_snapshot": snap["id"]})
        child.raise_for_status()
        first = client.post(
            f"/v1/sessions/{child.json()['id']}/execute", json={"code": "array.size"}
        )
        forks.append((time.perf_counter() - t0) * 1000)
        assert first.json()["status"] == "ok", first.json()
        client.delete(f"/v1/sessions/{child.json()['id']}")
        client.delete(f"/v1/snapshots/{snap['id']}")


def row(name: str, values: list[float], unit: str = "ms", target: str = "") -> str:
    return (
        f"| {name} | {median(values):.0f} {unit} | {pct(values, 0.95):.0f} {unit} "
        f"| {max(values):.0f} {unit} | {target} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=100)
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="sbx-bench-")
    engine = docker.from_env()
    gw = Gateway(data_dir, *POOL)
    client = gw.client
    pauses, resumes, running, paused_mem, disks, states = [], [], [], [], [], []
    cold_pauses, cold_resumes, floor = [], [], []
    snapshots, sizes, forks, bash_pauses, bash_resumes = [], [], [], [], []
    freezes, thaws, thawed_runs, plain_runs, engine_floor, frozen_mem = [], [], [], [], [], []
    deep = {"strategy": "namespace"}
    survivor_runs, comebacks = [], []
    try:
        sid = client.post("/v1/sessions", json={"limits": {"memory": "1g"}}).json()["id"]
        seen = {client.get(f"/v1/sessions/{sid}").json()["container_id"]}
        built = client.post(
            f"/v1/sessions/{sid}/execute", json={"code": BUILD.format(mib=args.mib)}
        ).json()
        assert built["status"] == "ok", built
        execute = lambda: client.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})  # noqa: E731
        for _ in range(args.rounds):
            took, r = ms(lambda: client.post(f"/v1/sessions/{sid}/pause"))
            assert r.json()["strategy"] == "freeze", r.json()
            freezes.append(took)
            frozen_mem.append(container_mib(engine, sid))
            took, r = ms(lambda: client.post(f"/v1/sessions/{sid}/resume"))
            assert r.json()["strategy"] == "freeze" and r.json()["lost"] == [], r.json()
            thaws.append(took)
            client.post(f"/v1/sessions/{sid}/pause").raise_for_status()
            took, r = ms(execute)
            assert r.json()["resumed"]["strategy"] == "freeze", r.json()
            thawed_runs.append(took)
            plain_runs.append(ms(execute)[0])
            container = (
                r.json().get("container_id")
                or client.get(f"/v1/sessions/{sid}").json()["container_id"]
            )
            t0 = time.perf_counter()
            engine.api.pause(container)
            engine.api.unpause(container)
            engine_floor.append((time.perf_counter() - t0) * 1000)
        for _ in range(args.rounds):
            running.append(container_mib(engine, sid))
            pool_ready(client)
            took, r = ms(lambda: client.post(f"/v1/sessions/{sid}/pause", json=deep))
            assert r.json()["strategy"] == "namespace" and not r.json()["lost"], r.json()
            pauses.append(took)
            paused_mem.append(container_mib(engine, sid))
            session_dir = Path(data_dir) / "sessions" / sid
            disks.append(disk_mib(session_dir))
            states.append(disk_mib(session_dir / "state"))
            pool_ready(client)
            took, r = ms(lambda: client.post(f"/v1/sessions/{sid}/resume"))
            assert r.json()["container_id"] not in seen, "the resume did not take a pooled one"
            seen.add(r.json()["container_id"])
            resumes.append(took)
        check = client.post(
            f"/v1/sessions/{sid}/execute", json={"code": "print(len(words), array.size)"}
        ).json()
        assert check["status"] == "ok", check
        loads = client.post(
            f"/v1/sessions/{sid}/execute", json={"code": FLOOR.format(rounds=args.rounds)}
        ).json()
        assert loads["status"] == "ok", str(loads)[:2000]
        floor = [float(v) for v in "".join(o["text"] for o in loads["outputs"]).split()]
        # Another workspace size: no pooled container fits, every resume starts one cold.
        body = {"limits": {"memory": "1g", "disk": "2g"}}
        cold = client.post("/v1/sessions", json=body).json()["id"]
        built = client.post(
            f"/v1/sessions/{cold}/execute", json={"code": BUILD.format(mib=args.mib)}
        ).json()
        assert built["status"] == "ok", built
        for _ in range(args.rounds):
            pool_ready(client)
            took, r = ms(lambda: client.post(f"/v1/sessions/{cold}/pause", json=deep))
            cold_pauses.append(took)
            took, r = ms(lambda: client.post(f"/v1/sessions/{cold}/resume"))
            assert client.get("/healthz").json()["pool_ready"]["python3"] == 1, "took the pool's"
            cold_resumes.append(took)
        client.delete(f"/v1/sessions/{cold}")
        fork_rounds(client, sid, args.rounds, snapshots, sizes, forks)
        body = {"limits": {"memory": "1g"}, "survive_crashes": True}
        survivor = client.post("/v1/sessions", json=body).json()["id"]
        run_on = lambda code: client.post(  # noqa: E731
            f"/v1/sessions/{survivor}/execute", json={"code": code}
        )
        assert run_on(BUILD.format(mib=args.mib)).json()["status"] == "ok"
        deadline = time.monotonic() + 120
        while not (client.get(f"/v1/sessions/{survivor}").json()["checkpoint"] or {}).get(
            "strategy"
        ):
            if time.monotonic() > deadline:
                raise SystemExit("no checkpoint in 2 minutes")
            time.sleep(0.2)
        for _ in range(args.rounds):
            survivor_runs.append(ms(lambda: run_on("1"))[0])
        for _ in range(min(args.rounds, COMEBACKS)):  # then it stays dead, as it should
            t0 = time.perf_counter()
            died = run_on("import os; os._exit(1)").json()
            assert died["error"]["recovery"]["from_execution"] == 1, died
            assert run_on("array.size").json()["status"] == "ok"
            comebacks.append((time.perf_counter() - t0) * 1000)
        client.delete(f"/v1/sessions/{survivor}")
        bash = client.post("/v1/sessions", json={"kernel": "bash"}).json()["id"]
        for i in range(20):
            client.post(f"/v1/sessions/{bash}/execute", json={"code": f"v{i}={i}; echo $v{i}"})
        for _ in range(args.rounds):
            took, _ = ms(
                lambda: client.post(f"/v1/sessions/{bash}/pause", json={"strategy": "replay"})
            )
            bash_pauses.append(took)
            took, r = ms(lambda: client.post(f"/v1/sessions/{bash}/resume"))
            assert r.json()["strategy"] == "replay" and r.json()["differed"] == [], r.json()
            bash_resumes.append(took)
    finally:
        gw.stop()
    # The same forks from a frozen source, pooled kernels having imported numpy and pandas.
    preloaded_snapshots, preloaded_forks = [], []
    gw = Gateway(tempfile.mkdtemp(prefix="sbx-bench-"), *POOL, "--pool-imports", "numpy,pandas")
    try:
        client = gw.client
        pool_ready(client)
        sid = client.post("/v1/sessions", json={"limits": {"memory": "1g"}}).json()["id"]
        code = BUILD.format(mib=args.mib)
        assert client.post(f"/v1/sessions/{sid}/execute", json={"code": code}).is_success
        assert client.post(f"/v1/sessions/{sid}/pause").json()["strategy"] == "freeze"
        fork_rounds(client, sid, args.rounds, preloaded_snapshots, [], preloaded_forks)
    finally:
        gw.stop()

    rows = ["| measured | p50 | p95 | max | target |", "| --- | ---: | ---: | ---: | --- |"]
    rows += [
        row(f"pause, freeze ({args.mib} MB of objects)", freezes),
        row(f"resume, freeze ({args.mib} MB of objects)", thaws, target="≤ 50 ms"),
        row("execute `1` on a frozen session → result (its resume included)", thawed_runs),
        row("floor: execute `1` on a running session → result", plain_runs),
        row("floor: the engine's own pause + unpause of the container", engine_floor),
        row("execute `1` on a session that survives crashes → result", survivor_runs),
        row(
            f"its kernel killed → the next result, its checkpoint ({args.mib} MB) loaded "
            f"({len(comebacks)} rounds: a kernel comes back {COMEBACKS} times in 10 minutes)",
            comebacks,
        ),
        row("kernel memory on the engine, frozen", frozen_mem, "MiB"),
        row(f"pause, namespace ({args.mib} MB of objects)", pauses, target="≤ 1 s"),
        row(
            f"resume, namespace ({args.mib} MB of objects), into a pooled container",
            resumes,
            target="≤ 1 s",
        ),
        row(
            f"floor: loading that namespace in a fresh Python in the sandbox ({len(floor)} runs)",
            floor,
        ),
        row(f"pause, namespace ({args.mib} MB), no pooled container fits", cold_pauses),
        row(f"resume, namespace ({args.mib} MB), cold container start", cold_resumes),
        row("kernel memory on the engine, running", running, "MiB"),
        row("kernel memory on the engine, paused deep", paused_mem, "MiB", "0 MiB"),
        row("saved namespace on disk, paused", states, "MiB"),
        row("whole session directory on disk, paused", disks, "MiB"),
        row("snapshot (namespace + workspace archive)", snapshots),
        row("snapshot size", sizes, "MiB"),
        row("fork → first result", forks, target="≤ 1.5 s"),
        row(
            "snapshot of a frozen source (the first saves it to disk, the rest copy that)",
            preloaded_snapshots,
        ),
        row(
            "fork → first result, pooled kernels with numpy and pandas imported (pool_imports)",
            preloaded_forks,
            target="≤ 250 ms",
        ),
        row("pause, replay (bash, 20 cells)", bash_pauses),
        row("resume, replay (bash, 20 cells)", bash_resumes),
        "| pause / resume, checkpoint (gVisor) | not available | | | see docs/snapshots.md |",
    ]
    for line in rows:
        print(line)
    write_section(
        "bench_snapshots",
        "Pause, resume, snapshots and forks",
        f"a python3 session (memory 1g, runc) holding {args.mib} MB of objects (a numpy "
        "array, a pandas frame, a dict of strings), "
        f"{args.rounds} rounds of each, over HTTP on loopback, warm pool python3=1. Pause "
        "and resume are the whole POST; memory is the engine's count for the session's "
        "containers (frozen: all of it held; paused deep: none); disk is allocated blocks. "
        "A pause freezes the sandbox first (the engine's pause: the cgroup freezer) and a "
        "resume thaws it, nothing saved and nothing lost; the deep rows name the namespace "
        "strategy, as a frozen pause does when its time is up. A deep resume takes a pooled "
        "container when one fits (the bench waits for the pool to refill before each): the "
        "namespace loads into its kernel while the workspace is copied in, then the "
        "session's directory and kernel move over, so it costs about the floor (a fresh "
        "Python loading the same namespace, numpy and pandas imports included) plus "
        "the move. A session no pooled container fits (here another workspace size) "
        "resumes cold: a kernel start plus the load. A fork takes a pooled kernel too. "
        "Bash replays its 20 cells after its own 3 s start. The last two rows come from a "
        "second gateway whose pooled kernels imported numpy and pandas ahead "
        "(`pool_imports`): the fork's namespace then loads without their import time, the "
        "bulk of the floor above. Published anchors: E2B about "
        "4 s per GiB to pause and about 1 s to resume; Tencent's CubeSandbox (bare metal, "
        "microVMs) 558 ms pause, 42 ms resume, 220 ms clone.",
        rows,
    )


if __name__ == "__main__":
    main()
