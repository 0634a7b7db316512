"""Helpers for tests that drive a real gateway process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

import httpx
from tornado.websocket import websocket_connect

from gateway.sandbox import volume


class GatewayProcess:
    """``sbx serve`` in a subprocess, with its log kept for failure messages."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        cmd = [
            sys.executable, "-m", "gateway.cli", "serve",
            "--port", "0", "--data-dir", str(data_dir), "--log-level", "debug", *args,
        ]  # fmt: skip
        # Every gateway has its own admin token, passed as SBX_TOKEN as an operator would.
        self.token = secrets.token_hex(16)  # a leading "-" would read as a flag
        environ = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        environ.update({"SBX_TOKEN": self.token, **(env or {})})
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=environ)
        self.log: list[str] = []
        self.client = httpx.Client(timeout=120, headers={"Authorization": f"Bearer {self.token}"})
        self.url = ""
        self.stopped = False  # stopped on purpose, as opposed to crashed
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                if "listening on http://" in line and not ready.is_set():
                    self.url = line.split("listening on ")[1].split()[0]
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(60) or not self.url:
            self.stop()
            raise RuntimeError("gateway did not start:\n" + "".join(self.log[-40:]))
        self.client.base_url = self.url

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ws_url(self, path: str, **query: str) -> str:
        """A WebSocket URL on this gateway, carrying the token as browsers would."""
        query = {"token": self.token, **query}
        return self.url.replace("http://", "ws://") + path + "?" + urllib.parse.urlencode(query)

    def tail(self, n: int = 30) -> str:
        return "".join(self.log[-n:])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.stopped = True
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def gateway_id(data_dir: Path) -> str | None:
    """The id a gateway labels its containers with, read from its store."""
    path = data_dir / "gateway.sqlite3"
    if not path.exists():
        return None
    with contextlib.closing(sqlite3.connect(path)) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'gateway_id'").fetchone()
    return row[0] if row else None


def remove_leftovers(engine, data_dir: Path) -> None:
    """Remove what gateways on ``data_dir`` left (tests that kill them leave kernels)."""
    gid = gateway_id(data_dir)
    if gid:
        for container in engine.containers.list(all=True, filters={"label": f"sbx.gateway={gid}"}):
            container.remove(force=True)
    sessions = data_dir / "sessions"
    if sessions.exists():
        for session_dir in sessions.iterdir():
            volume.destroy(session_dir)
    shutil.rmtree(data_dir, ignore_errors=True)


def short_tmpdir() -> Path:
    """A short data dir: kernel socket paths must fit in 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="sbx-"))


def run(api: httpx.Client, sid: str, code: str, **kw) -> dict:
    """Execute code and return the reply body, failing loudly on HTTP errors."""
    r = api.post(f"/v1/sessions/{sid}/execute", json={"code": code, **kw})
    assert r.status_code == 200, f"execute answered {r.status_code}: {r.text}"
    return r.json()


def execute_in_background(
    api: httpx.Client, sid: str, code: str, **kw
) -> tuple[threading.Thread, dict]:
    """Start an execute on its own connection; the box gets the reply when it ends.

    A client of its own keeps this long request from sharing a connection
    pool with the test's other calls across threads.
    """
    box: dict = {}

    def go() -> None:
        with httpx.Client(base_url=api.base_url, timeout=api.timeout, headers=api.headers) as own:
            box["reply"] = run(own, sid, code, **kw)

    thread = threading.Thread(target=go)
    thread.start()
    return thread, box


def text_of(reply: dict, name: str = "stdout") -> str:
    return "".join(
        o["text"] for o in reply["outputs"] if o["output_type"] == "stream" and o["name"] == name
    )


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.1):
    """Poll until ``predicate()`` is truthy; return its value or None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


async def closed(ws) -> None:
    """Close a WebSocket client and wait until its socket is gone.

    A bare ``close()`` only starts the closing handshake; a loop that ends
    right after leaves the socket for the garbage collector, whose
    ResourceWarning then fails whichever test happens to be running.
    """
    ws.close()
    with contextlib.suppress(TimeoutError):
        while await asyncio.wait_for(ws.read_message(), 10) is not None:
            pass


def execute_request(code: str) -> dict:
    # No "date" and an empty "session", as some clients send.
    return {
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": "",
                   "session": "", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": True},
    }  # fmt: skip


async def run_over_channels(url: str, code: str, headers: dict | None = None) -> list[dict]:
    """Send one execute_request and collect messages until its reply and idle."""
    from tornado.httpclient import HTTPRequest

    ws = await websocket_connect(HTTPRequest(url, headers=headers or {}))
    request = execute_request(code)
    ws.write_message(json.dumps(request))
    seen: list[dict] = []
    replied = idle = False
    while not (replied and idle):
        msg = json.loads(await asyncio.wait_for(ws.read_message(), 60))
        if msg.get("parent_header", {}).get("msg_id") != request["header"]["msg_id"]:
            continue
        seen.append(msg)
        replied |= msg["msg_type"] == "execute_reply"
        idle |= msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
    await closed(ws)
    return seen


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak since the last reset) of a process, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}


class Canary:
    """While an attack runs: how slowly another session answers, and the gateway's peak RSS.

    A thread keeps executing a trivial cell in ``sid``; ``worst`` is its
    slowest answer (one still waiting at the end counts). The peak is the
    kernel's VmHWM, reset on entry, so a spike between samples is not missed.
    """

    def __init__(self, gateway: GatewayProcess, sid: str, interval: float = 0.2) -> None:
        self.gateway = gateway
        self.sid = sid
        self.interval = interval
        self.worst = 0.0
        self.answers = 0
        self._asked = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ask, daemon=True)

    def __enter__(self) -> Canary:
        Path(f"/proc/{self.gateway.pid}/clear_refs").write_text("5")  # resets VmHWM
        self.before = memory_kib(self.gateway.pid)["VmRSS"]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._asked:
            self.worst = max(self.worst, time.monotonic() - self._asked)
        self._thread.join(120)
        self.peak = memory_kib(self.gateway.pid)["VmHWM"]

    @property
    def grown_mib(self) -> float:
        """How far the gateway's RSS rose above where it was when the attack began."""
        return (self.peak - self.before) / 1024

    def __str__(self) -> str:
        return (
            f"canary: {self.answers} answers, slowest {self.worst:.2f} s; gateway RSS "
            f"{self.before // 1024} MiB before, peak {self.peak // 1024} MiB"
        )

    def _ask(self) -> None:
        gw = self.gateway
        with httpx.Client(base_url=gw.url, timeout=120, headers=gw.client.headers) as own:
            while not self._stop.is_set():
                self._asked = time.monotonic()
                reply = run(own, self.sid, "1 + 1")
                self.worst = max(self.worst, time.monotonic() - self._asked)
                self._asked = 0.0
                assert reply["status"] == "ok", f"the canary failed during the attack: {reply}"
                self.answers += 1
                self._stop.wait(self.interval)
