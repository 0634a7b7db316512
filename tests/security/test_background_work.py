"""A tenant's background work cannot hold up another tenant's calls (issue 35, item 10).

A watcher walks its directory on a thread, first when it starts (its
baseline) and then every poll. One tenant starting watchers over large
directories, as many as it may and over and over, must not take the threads
another tenant's file calls (list, upload, download) and engine calls wait on:
those answer within ``CANARY_SECONDS``, as does a canary execute.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from e2b import SandboxException
from e2b_code_interpreter import Sandbox
from helpers import (
    CANARY_SECONDS,
    Canary,
    GatewayProcess,
    canary_session,
    e2b_env,
    tenant_gateway,
)

pytestmark = pytest.mark.docker

SANDBOXES = 6  # the attacker's
ENTRIES = 9_990  # a watched tree just within a walk's bound (sessions/watchers.py)
ATTACK_SECONDS = 12  # the old code held another tenant's calls for seconds within the first few


class FileCalls:
    """Another tenant's list, upload and download in a loop, keeping the slowest answer."""

    def __init__(self, gw: GatewayProcess, sid: str) -> None:
        headers = {"Authorization": f"Bearer {gw.token}"}
        self.api = httpx.Client(base_url=gw.url, headers=headers, timeout=60)
        self.sid = sid
        self.slowest = 0.0
        self.calls = 0
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        base = f"/v1/sessions/{self.sid}/files"
        calls = [
            lambda: self.api.put(f"{base}/note.txt", content=b"x" * 4096),
            lambda: self.api.get(f"{base}/note.txt"),
            lambda: self.api.get(base),
        ]
        while not self._stop.is_set():
            for call in calls:
                started = time.monotonic()
                try:
                    r = call()
                except httpx.HTTPError as e:
                    self.failure = f"no answer: {e!r}"
                    return
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.calls += 1
                if r.status_code >= 300:
                    self.failure = f"{r.request.method} {r.request.url.path}: {r.text}"
                    return

    def __enter__(self) -> FileCalls:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self.api.close()
        print(f"file calls: {self.calls}, slowest {self.slowest * 1000:.0f} ms")
        assert self.failure is None, self.failure
        assert self.slowest < CANARY_SECONDS, (
            f"another tenant's file call took {self.slowest:.2f} s during the attack"
        )


def churn(sandbox: Sandbox, until: float, refused: list[str]) -> None:
    """Start a watcher over the large tree and stop it, again and again (each start walks it)."""
    while time.monotonic() < until:
        try:
            sandbox.files.watch_dir("big", recursive=True).stop()
        except SandboxException as e:
            refused.append(str(e))
            time.sleep(0.05)


def test_a_tenants_watchers_do_not_hold_up_another_tenants_calls(
    start_gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    with tenant_gateway(start_gateway, {"mallory": "mallory-token"}) as (gw, _clients):
        for name, value in e2b_env(gw, "mallory-token").items():
            monkeypatch.setenv(name, value)
        sandboxes = [Sandbox.create() for _ in range(SANDBOXES)]
        try:
            for sandbox in sandboxes:
                half = f"seq 1 {ENTRIES // 2 - 1} | xargs touch"
                made = sandbox.commands.run(
                    f"mkdir -p big/a big/b && (cd big/a && {half}) && (cd big/b && {half})"
                )
                assert made.exit_code == 0, made.stderr
            with (
                canary_session(gw) as sid,
                Canary(gw, sid, list_files=True, max_rss_growth=128 * 2**20) as canary,
                FileCalls(gw, sid),
            ):
                refused: list[str] = []
                until = time.monotonic() + ATTACK_SECONDS
                attackers = [
                    threading.Thread(target=churn, args=(sandbox, until, refused), daemon=True)
                    for sandbox in sandboxes
                    for _ in range(4)  # as many as a sandbox may watch at once
                ]
                for attacker in attackers:
                    attacker.start()
                for attacker in attackers:
                    attacker.join(ATTACK_SECONDS + 60)
            print(canary, f"; attacker refused {len(refused)} times: {set(refused)}")
        finally:
            for sandbox in sandboxes:
                sandbox.kill()
