"""Watchers are background work bounded per tenant (issue 35, item 10): their walks run on
threads of their own, a tenant's in turn, and a session and a tenant hold a bounded number."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.errors import TooManyWatchers
from gateway.sessions import watchers as module
from gateway.sessions.watchers import MAX_TENANT_WATCHERS, MAX_WATCHERS, Watchers
from gateway.tasks import TaskSet
from gateway.workspace.files import AsyncWorkspace
from gateway.workspace.rules import Walk


class SlowTree:
    """A workspace whose every walk takes ``seconds``, noting its thread and who walks at once."""

    def __init__(self, tenant: str, log: Log, seconds: float = 0.0) -> None:
        self.tenant, self.log, self.seconds = tenant, log, seconds

    def stat(self, path: str) -> dict:
        return {"type": "directory", "path": path}

    def walk(self, parts: list[str], bounds: object, recurse: bool) -> Walk:
        self.log.enter(self.tenant)
        try:
            time.sleep(self.seconds)
        finally:
            self.log.leave(self.tenant)
        return Walk(entries=[("a.txt", os.stat(__file__))])


class Log:
    """Which threads walked, and the most walks of each tenant at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: set[str] = set()
        self.now: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.walks = 0

    def enter(self, tenant: str) -> None:
        with self.lock:
            self.threads.add(threading.current_thread().name)
            self.now[tenant] = self.now.get(tenant, 0) + 1
            self.most[tenant] = max(self.most.get(tenant, 0), self.now[tenant])
            self.walks += 1

    def leave(self, tenant: str) -> None:
        with self.lock:
            self.now[tenant] -= 1


def space(tenant: str, log: Log, seconds: float = 0.0) -> AsyncWorkspace:
    return AsyncWorkspace(SlowTree(tenant, log, seconds))  # type: ignore[arg-type]


async def held_up_default_executor(release: threading.Event) -> None:
    """Every thread of the loop's default executor busy until ``release``."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(1))
    loop.run_in_executor(None, release.wait)


def test_walks_never_wait_on_the_default_executor() -> None:
    """Polls go on while the threads file and engine calls share are all taken."""

    async def main() -> None:
        log, release = Log(), threading.Event()
        watchers = Watchers(TaskSet())
        await watchers.start("s1", "acme", space("acme", log), "", True)
        await held_up_default_executor(release)
        walked = log.walks
        await asyncio.sleep(module.INTERVAL * 3)
        release.set()
        assert log.walks >= walked + 2, "the watcher stopped polling"
        assert log.threads and all(t.startswith("sbx-watch") for t in log.threads), log.threads
        watchers.end("s1")

    asyncio.run(main())


def test_a_tenants_walks_take_turns_and_leave_others_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight slow watchers of one tenant walk one at a time; another tenant's first walk
    does not queue behind them."""
    monkeypatch.setattr(module, "INTERVAL", 0.01)

    async def main() -> None:
        log = Log()
        watchers = Watchers(TaskSet())
        sessions = [f"a{i}" for i in range(8 // MAX_WATCHERS)]
        await asyncio.gather(
            *(
                watchers.start(sid, "mallory", space("mallory", log, 0.2), "", True)
                for sid in sessions
                for _ in range(MAX_WATCHERS)
            )
        )
        started = time.monotonic()
        await watchers.start("b", "bob", space("bob", log), "", True)
        waited = time.monotonic() - started
        for sid in [*sessions, "b"]:
            watchers.end(sid)
        assert log.most["mallory"] == module.TENANT_WALKS
        assert waited < 0.5, f"bob's first walk waited {waited:.2f} s behind mallory's"

    asyncio.run(main())


def test_watchers_are_bounded_per_session_and_per_tenant() -> None:
    async def main() -> None:
        log = Log()
        watchers = Watchers(TaskSet())

        async def start(sid: str, tenant: str = "mallory"):
            return await watchers.start(sid, tenant, space(tenant, log), "", True)

        held = [await start("s0") for _ in range(MAX_WATCHERS)]
        with pytest.raises(TooManyWatchers, match="this sandbox") as refused:
            await start("s0")
        assert refused.value.status == 429
        for i in range(1, MAX_TENANT_WATCHERS // MAX_WATCHERS):
            held += [await start(f"s{i}") for _ in range(MAX_WATCHERS)]
        with pytest.raises(TooManyWatchers, match=f"{MAX_TENANT_WATCHERS} watchers") as refused:
            await start("another")
        assert refused.value.status == 429
        await start("theirs", tenant="bob")  # another tenant is not counted against it
        watchers.stop("s1", held[MAX_WATCHERS].id)
        await start("another")  # a stopped watcher frees its place
        watchers.end("s0")
        await start("again")  # so do a session's, when it ends
        for sid in ["another", "again", "theirs", *(f"s{i}" for i in range(1, 4))]:
            watchers.end(sid)

    asyncio.run(main())


def test_a_watcher_stopped_mid_walk_keeps_its_tenants_turn_until_the_walk_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stopping a watcher cannot end its walk's thread: the next of its tenant's walks waits
    for that thread, so stopping and starting again never puts two walks on the threads."""
    monkeypatch.setattr(module, "INTERVAL", 0.01)

    async def main() -> None:
        log = Log()
        watchers = Watchers(TaskSet())
        for _ in range(3):
            watcher = await watchers.start("s", "mallory", space("mallory", log, 0.3), "", True)
            await asyncio.sleep(0.1)  # its first poll is walking
            watchers.stop("s", watcher.id)
        await asyncio.sleep(0.4)
        assert log.most["mallory"] == module.TENANT_WALKS

    asyncio.run(main())
