"""What the gateway is measured against: the floors, and Jupyter Kernel Gateway.

- floor: an async jupyter_client talking straight to a local ipykernel over
  ipc sockets (the same transport the gateway uses), no gateway in between,
  measured in blocks alternating with the measure it is the floor of;
- cold-start floor: ``docker run`` of the kernel image until ipykernel answers,
  with none of the gateway's work (workspace, hardening, bookkeeping);
- Jupyter Kernel Gateway, installed in a venv of its own under ``.bench/``,
  on the same machine: kernel start, and execute round trip over its
  WebSocket.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import docker
import httpx
from harness import ROOT, wait_for_line
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import write_connection_file
from jupyter_client.manager import AsyncKernelManager
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

KG_VENV = ROOT / ".bench" / "kg-venv"


async def kernel_round_trip(client: AsyncKernelClient, code: str = "1 + 1") -> None:
    """One execute, until its reply and the kernel's idle status are both in."""
    msg_id = client.execute(code)
    idle = replied = False
    while not idle:
        msg = await client.get_iopub_msg(timeout=30)
        idle = msg["parent_header"].get("msg_id") == msg_id and (
            msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
        )
    while not replied:
        replied = (await client.get_shell_msg(timeout=30))["parent_header"].get("msg_id") == msg_id


class Floor:
    """A local ipykernel driven by jupyter_client, kept running on a loop of its own.

    Measured in blocks between the gateway's own blocks (see ``paired``), so a
    shared machine whose speed drifts over minutes moves both alike.
    """

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="sbx-floor-")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._manager = AsyncKernelManager(
            kernel_name="python3", transport="ipc", ip=f"{self._tmp.name}/k"
        )
        self._client = self._run(self._start())

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _start(self) -> AsyncKernelClient:
        await self._manager.start_kernel()
        client = self._manager.client()
        client.start_channels()
        await client.wait_for_ready(timeout=60)
        return client

    def round_trips(self, n: int) -> list[float]:
        """Ms of ``n`` trivial executes, after a warm-up."""
        return self._run(async_timed(lambda: kernel_round_trip(self._client), n))

    def close(self) -> None:
        self._client.stop_channels()
        self._run(self._manager.shutdown_kernel(now=True))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._tmp.cleanup()

    def __enter__(self) -> Floor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def paired(
    floor: Floor, measure: Callable[[int], list[float]], n: int, blocks: int = 5
) -> tuple[list[float], list[float]]:
    """``n`` round trips of ``measure`` and as many of the floor, in alternating blocks."""
    ours: list[float] = []
    floors: list[float] = []
    for _ in range(blocks):
        floors += floor.round_trips(n // blocks)
        ours += measure(n // blocks)
    return ours, floors


async def async_timed(fn, n: int, warmup: int = 10) -> list[float]:
    """Milliseconds of ``n`` awaited calls of ``fn``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        await fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def docker_run_floor(image: str, n: int) -> list[float]:
    """Ms from ``docker run`` of the kernel image until its ipykernel answers."""
    engine = docker.from_env()

    async def once() -> float:
        run_dir = Path(tempfile.mkdtemp(prefix="sbx-f-", dir="/tmp"))
        os.chmod(run_dir, 0o777)
        fname, _ = write_connection_file(
            str(run_dir / "c.json"), transport="ipc", ip=str(run_dir / "k"),
            key=secrets.token_hex(16).encode(),
        )  # fmt: skip
        os.chmod(fname, 0o644)
        t0 = time.perf_counter()
        container = engine.containers.run(
            image,
            ["python", "-m", "ipykernel_launcher", "-f", fname],
            user="1000:1000", network_mode="none", detach=True, read_only=True,
            tmpfs={"/tmp": ""}, volumes={str(run_dir): {"bind": str(run_dir), "mode": "rw"}},
        )  # fmt: skip
        client = AsyncKernelClient()
        client.load_connection_file(fname)
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=60)
            return (time.perf_counter() - t0) * 1000
        finally:
            client.stop_channels()
            container.remove(force=True)
            shutil.rmtree(run_dir, ignore_errors=True)

    async def measure() -> list[float]:
        return [await once() for _ in range(n)]

    return asyncio.run(measure())


def execute_request(code: str) -> dict:
    return {
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": "",
                   "session": uuid.uuid4().hex, "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": True,
                    "user_expressions": {}, "allow_stdin": False},
    }  # fmt: skip


async def channels_round_trip(ws: WebSocketClientConnection, code: str = "1 + 1") -> None:
    """One execute over a Jupyter channels WebSocket, until its reply and idle status."""
    request = execute_request(code)
    ws.write_message(json.dumps(request))
    idle = replied = False
    while not (idle and replied):
        msg = json.loads(await ws.read_message())
        if msg.get("parent_header", {}).get("msg_id") != request["header"]["msg_id"]:
            continue
        replied |= msg["msg_type"] == "execute_reply"
        idle |= msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"


def channels_round_trips(ws_url: str, n: int, warmup: int = 10) -> list[float]:
    """Ms of trivial executes over a Jupyter channels WebSocket."""

    async def measure() -> list[float]:
        ws = await websocket_connect(HTTPRequest(ws_url))
        try:
            return await async_timed(lambda: channels_round_trip(ws), n, warmup)
        finally:
            ws.close()

    return asyncio.run(measure())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KernelGateway:
    """Jupyter Kernel Gateway in its own venv, on a free port."""

    def __init__(self) -> None:
        if not (KG_VENV / "bin" / "jupyter-kernelgateway").exists():
            print("installing Jupyter Kernel Gateway into", KG_VENV.relative_to(ROOT), flush=True)
            subprocess.run([sys.executable, "-m", "venv", str(KG_VENV)], check=True)
            subprocess.run(
                [KG_VENV / "bin" / "pip", "install", "-q", "jupyter_kernel_gateway", "ipykernel"],
                check=True,
            )
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sbx-kg-"))
        log = self.dir / "kg.log"
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [KG_VENV / "bin" / "jupyter-kernelgateway", "--KernelGatewayApp.ip=127.0.0.1",
                 f"--KernelGatewayApp.port={self.port}"],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.dir,
                env={**os.environ, "JUPYTER_PATH": str(KG_VENV / "share" / "jupyter")},
            )  # fmt: skip
        wait_for_line(log, "at http://", 60)
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=120)

    def start_kernel(self) -> tuple[str, float]:
        t0 = time.perf_counter()
        r = self.client.post("/api/kernels", json={"name": "python3"})
        r.raise_for_status()
        return r.json()["id"], (time.perf_counter() - t0) * 1000

    def starts(self, n: int) -> tuple[list[float], list[float]]:
        """Ms until the kernel is started, and until its first result over the WebSocket."""
        creates, firsts = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            kernel_id, created = self.start_kernel()
            creates.append(created)
            channels_round_trips(self.ws_url(kernel_id), 1, warmup=0)
            firsts.append((time.perf_counter() - t0) * 1000)
            self.client.delete(f"/api/kernels/{kernel_id}")
        return creates, firsts

    def ws_url(self, kernel_id: str) -> str:
        return f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels"

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)
