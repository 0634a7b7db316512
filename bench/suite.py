"""The gateway against its floors and against Jupyter Kernel Gateway, in one run.

Usage: .venv/bin/python bench/suite.py [--quick] [--idle 200] [--no-kernel-gateway]

Measures side by side, on this machine, in this run:
- floors: trivial execute on a local ipykernel driven by jupyter_client;
  ``docker run`` of the kernel image until ipykernel answers;
- Jupyter Kernel Gateway (own venv under .bench/): kernel start, first
  result, execute round trip over its WebSocket;
- this gateway: cold and warm create -> first result, execute round trip
  over HTTP, the agent stream and the Jupyter channels WebSocket, gateway
  CPU per execute, throughput of 20 sessions executing at once, memory per
  idle session and gateway RSS with ``--idle`` idle sessions (and a round
  trip on one of them), and the stdout relay rate.
Prints a table (medians and p99, ratios to the floor and to Kernel Gateway)
and rewrites its section of docs/PERFORMANCE.md. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import docker
import httpx
from harness import (
    Gateway,
    cpu_seconds,
    median,
    pct,
    round_trips,
    rss_mib,
    session_starts,
    write_section,
)
from peers import (
    Floor,
    KernelGateway,
    async_timed,
    channels_round_trips,
    docker_run_floor,
    paired,
)
from tornado.websocket import websocket_connect

FLOOD_MB = 50


def stream_round_trips(url: str, sid: str, n: int) -> list[float]:
    """Ms of trivial executes over the agent stream, from request to ``done``."""

    async def measure() -> list[float]:
        ws = await websocket_connect(url.replace("http", "ws") + f"/v1/sessions/{sid}/stream")
        counter = iter(range(10**9))

        async def once() -> None:
            request_id = f"r{next(counter)}"
            ws.write_message(json.dumps({"type": "execute", "id": request_id, "code": "1 + 1"}))
            while True:
                event = json.loads(await ws.read_message())
                if event["type"] == "done" and event["id"] == request_id:
                    return

        try:
            return await async_timed(once, n)
        finally:
            ws.close()

    return asyncio.run(measure())


def relay_rate(gw: Gateway, sid: str) -> tuple[float, float]:
    """MB/s of stdout relayed to a stream client, and gateway CPU seconds per MB."""
    code = (
        "import sys\nchunk = 'x' * 65535 + '\\n'\n"
        f"for _ in range({FLOOD_MB * 16}):\n    sys.stdout.write(chunk)"
    )

    async def measure() -> tuple[float, int]:
        ws = await websocket_connect(
            gw.url.replace("http", "ws") + f"/v1/sessions/{sid}/stream",
            max_message_size=512 * 2**20,  # ``done`` repeats up to output_bytes of outputs
        )
        received = 0
        t0 = time.perf_counter()
        ws.write_message(json.dumps({"type": "execute", "id": "flood", "code": code}))
        while True:
            event = json.loads(await ws.read_message())
            if event["type"] == "stream":
                received += len(event["text"])
            if event["type"] == "done":
                ws.close()
                return time.perf_counter() - t0, received

    cpu = cpu_seconds(gw.pid)
    seconds, received = asyncio.run(measure())
    mb = received / 2**20
    return mb / seconds, (cpu_seconds(gw.pid) - cpu) / mb


def throughput(gw: Gateway, sessions: int, seconds: float) -> tuple[float, list[float]]:
    """Executes per second with ``sessions`` sessions each executing back to back."""
    ids = [gw.client.post("/v1/sessions", json={}).json()["id"] for _ in range(sessions)]
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def work(sid: str) -> None:
        with httpx.Client(base_url=gw.url, timeout=120) as client:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                client.post(f"/v1/sessions/{sid}/execute", json={"code": "1 + 1"})
                with lock:
                    latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(sessions) as pool:
        list(pool.map(work, ids))
    rate = len(latencies) / (time.perf_counter() - t0)
    for sid in ids:
        gw.client.delete(f"/v1/sessions/{sid}")
    return rate, latencies


def mem_available_mib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def idle_sessions(gw: Gateway, n: int, floor: Floor, trips: int) -> dict[str, float | list[float]]:
    """Memory of ``n`` idle sessions, the gateway's RSS, and a round trip among them."""
    engine = docker.from_env()
    available = mem_available_mib()
    rss = rss_mib(gw.pid)
    ids = []
    for i in range(n):
        r = gw.client.post("/v1/sessions", json={"limits": {"memory": "256m"}})
        r.raise_for_status()
        ids.append(r.json()["id"])
        if (i + 1) % 50 == 0:
            print(f"  {i + 1} idle sessions", flush=True)
    time.sleep(5)  # let the kernels settle

    def used(sid: str) -> float:
        stats = engine.api.stats(f"sbx-{sid}", stream=False, one_shot=True)["memory_stats"]
        return (stats["usage"] - stats.get("stats", {}).get("inactive_file", 0)) / 2**20

    with ThreadPoolExecutor(8) as pool:
        per_container = list(pool.map(used, ids))
    trip, trip_floor = paired(floor, lambda k: round_trips(gw.client, ids[n // 2], k), trips)
    result: dict[str, float | list[float]] = {
        "container": per_container,
        "host_per_session": (available - mem_available_mib()) / n,
        "gateway_rss": rss_mib(gw.pid),
        "gateway_rss_before": rss,
        "trip": trip,
        "trip_floor": trip_floor,
    }
    for sid in ids:
        gw.client.delete(f"/v1/sessions/{sid}")
    return result


def wait_for_pool(gw: Gateway, ready: int, timeout: float = 120) -> None:
    """Wait until the warm pool holds ``ready`` kernels (it refills after each claim)."""
    deadline = time.monotonic() + timeout
    while gw.client.get("/healthz").json()["pool_ready"]["python3"] < ready:
        if time.monotonic() > deadline:
            raise SystemExit(f"the warm pool did not refill in {timeout} s; see {gw.log}")
        time.sleep(0.2)


def row(name: str, values: list[float], floor: float | None, peer: float | None) -> str:
    p50 = median(values)
    vs_floor = f"{p50 / floor:.2f}x ({p50 - floor:+.1f} ms)" if floor else ""
    vs_peer = f"{p50 / peer:.2f}x" if peer else ""
    return (
        f"| {name} | {len(values)} | {p50:.1f} ms | {pct(values, 0.99):.1f} ms "
        f"| {vs_floor} | {vs_peer} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, 20 idle sessions")
    parser.add_argument("--idle", type=int, default=200, help="idle sessions to hold at once")
    parser.add_argument("--no-kernel-gateway", action="store_true")
    args = parser.parse_args()
    n = 60 if args.quick else 300
    starts = 4 if args.quick else 10
    idle = 20 if args.quick else args.idle

    with Floor() as floor:
        results = measure(floor, args, n, starts, idle)
    report(results, idle)


@dataclass
class Results:
    """Milliseconds per measure (``floors``: the floor's blocks paired with each), and figures."""

    floors: dict[str, list[float]] = field(default_factory=dict)
    kg: dict[str, list[float]] = field(default_factory=dict)
    ours: dict[str, list[float]] = field(default_factory=dict)
    numbers: dict[str, float] = field(default_factory=dict)
    held: dict[str, float | list[float]] = field(default_factory=dict)
    run_floor: list[float] = field(default_factory=list)


def measure(floor: Floor, args: argparse.Namespace, n: int, starts: int, idle: int) -> Results:
    """Every measurement, the round trips each in blocks alternating with the floor's."""
    print("cold-start floor...", flush=True)
    results = Results()
    floors, kg, ours, numbers = results.floors, results.kg, results.ours, results.numbers
    with tempfile.TemporaryDirectory(prefix="sbx-b-", dir="/tmp") as data_dir:
        with Gateway(data_dir, "--pool", "") as gw:
            probe = gw.client.post("/v1/sessions", json={}).json()
            image = probe["image"]
            gw.client.delete(f"/v1/sessions/{probe['id']}")
    results.run_floor = docker_run_floor(image, starts)

    if not args.no_kernel_gateway:
        print("Jupyter Kernel Gateway...", flush=True)
        peer = KernelGateway()
        try:
            kg["create"], kg["first"] = peer.starts(starts)
            kernel_id, _ = peer.start_kernel()
            kg["ws"], floors["kg_ws"] = paired(
                floor, lambda k: channels_round_trips(peer.ws_url(kernel_id), k), n
            )
        finally:
            peer.stop()

    print("this gateway, cold...", flush=True)
    with tempfile.TemporaryDirectory(prefix="sbx-b-", dir="/tmp") as data_dir:
        flags = ("--pool", "", "--max-sessions", str(idle + 30))
        flags += ("--tenant-max-sessions", str(idle + 30), "--tenant-max-memory", "1t")
        with Gateway(data_dir, *flags) as gw:
            ours["cold_create"], ours["cold_first"] = session_starts(gw.client, starts, {})
            body = {"limits": {"memory": "1g", "output_bytes": "64m"}}
            sid = gw.client.post("/v1/sessions", json=body).json()["id"]
            ours["http"], floors["http"] = paired(
                floor, lambda k: round_trips(gw.client, sid, k), n
            )
            cpu = cpu_seconds(gw.pid)
            round_trips(gw.client, sid, n)
            numbers["cpu_ms"] = (cpu_seconds(gw.pid) - cpu) * 1000 / (n + 10)
            ours["stream"], floors["stream"] = paired(
                floor, lambda k: stream_round_trips(gw.url, sid, k), n
            )
            channels = gw.url.replace("http", "ws") + f"/api/kernels/{sid}/channels"
            ours["channels"], floors["channels"] = paired(
                floor, lambda k: channels_round_trips(channels, k), n
            )
            numbers["relay"], numbers["relay_cpu"] = relay_rate(gw, sid)
            gw.client.delete(f"/v1/sessions/{sid}")
            print("throughput...", flush=True)
            numbers["throughput"], ours["concurrent"] = throughput(gw, 20, 5 if args.quick else 15)
            print(f"{idle} idle sessions...", flush=True)
            results.held = idle_sessions(gw, idle, floor, n)

    print("this gateway, warm...", flush=True)
    with tempfile.TemporaryDirectory(prefix="sbx-b-", dir="/tmp") as data_dir:
        with Gateway(data_dir, "--pool", "python3=2") as gw:
            warm_create, warm_first = [], []
            for _ in range(starts):
                wait_for_pool(gw, 2)
                create, first = session_starts(gw.client, 1, {})
                warm_create += create
                warm_first += first
            ours["warm_create"], ours["warm_first"] = warm_create, warm_first
    return results


def report(results: Results, idle: int) -> None:
    """Print the tables and write them to docs/PERFORMANCE.md."""
    floors, kg, ours, numbers = results.floors, results.kg, results.ours, results.numbers
    held, run_floor = results.held, results.run_floor
    every_floor = [trip for trips in floors.values() for trip in trips]
    f50 = median(every_floor)
    kg50 = {k: median(v) for k, v in kg.items()}
    table = [
        "| measure | n | p50 | p99 | vs floor | vs Kernel Gateway |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        row("floor: execute on a local ipykernel (jupyter_client, ipc)", every_floor, None, None),
        row("floor: `docker run` + ipykernel ready", run_floor, None, None),
    ]
    if kg:
        table += [
            row("Kernel Gateway: start kernel (POST /api/kernels)", kg["create"], None, None),
            row("Kernel Gateway: start -> first result", kg["first"], None, None),
            row(
                "Kernel Gateway: execute over its WebSocket",
                kg["ws"],
                median(floors["kg_ws"]),
                None,
            ),
        ]
    table += [
        row("gateway: cold create (POST /v1/sessions -> 201)", ours["cold_create"], None,
            kg50.get("create")),
        row("gateway: cold create -> first result", ours["cold_first"], median(run_floor),
            kg50.get("first")),
        row("gateway: warm create (pool) -> 201", ours["warm_create"], None, kg50.get("create")),
        row("gateway: warm create (pool) -> first result", ours["warm_first"], None,
            kg50.get("first")),
        row("gateway: execute over HTTP", ours["http"], median(floors["http"]), kg50.get("ws")),
        row("gateway: execute over the agent stream", ours["stream"], median(floors["stream"]),
            kg50.get("ws")),
        row("gateway: execute over the Jupyter channels", ours["channels"],
            median(floors["channels"]), kg50.get("ws")),
        row(f"gateway: execute among {idle} idle sessions", held["trip"],
            median(held["trip_floor"]), kg50.get("ws")),
        row("gateway: execute, 20 sessions at once", ours["concurrent"], f50, None),
    ]  # fmt: skip
    container = held["container"]
    assert isinstance(container, list)
    table += [
        "",
        "| measure | value |",
        "| --- | ---: |",
        "| throughput, 20 sessions executing back to back "
        f"| {numbers['throughput']:.0f} executes/s |",
        f"| gateway CPU per execute (HTTP) | {numbers['cpu_ms']:.2f} ms |",
        f"| memory per idle session: container (kernel, init), p50 / max "
        f"| {median(container):.1f} / {max(container):.1f} MiB |",
        f"| memory per idle session: host MemAvailable drop / {idle} "
        f"| {held['host_per_session']:.1f} MiB |",
        f"| gateway RSS: empty -> {idle} idle sessions "
        f"| {held['gateway_rss_before']:.0f} -> {held['gateway_rss']:.0f} MiB |",
        f"| stdout relayed to a stream client ({FLOOD_MB} MB cell) | {numbers['relay']:.0f} MB/s |",
        f"| gateway CPU per MB of stdout relayed | {numbers['relay_cpu'] * 1000:.1f} ms |",
    ]
    print("\n".join(table))
    write_section(
        "suite",
        "The gateway against its floors and Jupyter Kernel Gateway",
        "one run, runc, kernel image `python`, default limits, loopback, no authentication "
        "(tokens are a dictionary lookup). Ratios compare medians. Each round trip is "
        "measured in five blocks alternating with blocks of the floor, and compared with the "
        "floor's median over those same blocks: this machine's speed drifts by a millisecond "
        "within minutes. The floor row pools every floor block; the concurrent row is "
        "compared with it.",
        table,
    )


if __name__ == "__main__":
    main()
