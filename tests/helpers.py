"""Helpers for tests that drive a real gateway process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx


class GatewayProcess:
    """``sbx serve`` in a subprocess, with its log kept for failure messages."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        self.data_dir = data_dir
        cmd = [
            sys.executable, "-m", "gateway.cli", "serve",
            "--port", "0", "--data-dir", str(data_dir), "--log-level", "debug", *args,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        self.log: list[str] = []
        self.client = httpx.Client(timeout=120)
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
        with httpx.Client(base_url=api.base_url, timeout=api.timeout) as own:
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
