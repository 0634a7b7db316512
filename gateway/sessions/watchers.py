"""Watching a directory of a session's workspace for changes (E2B's ``files.watch_dir``).

A watcher polls: every ``INTERVAL`` it walks its directory with the
workspace's own bounded walk and compares each entry's inode, kind, size,
mtime and mode with the walk before. Polling rather than inotify on the host
or ``inotifywait`` in the sandbox, because it works alike on every placement
and runtime (a Swarm workspace is on another node, reached by one agent call
a walk; gVisor's writes need not reach a host inotify promptly; the images
hold no inotify tools) and its cost is bounded by construction: one walk of
at most ``MAX_ENTRIES`` entries (and ``WALK_SECONDS``) per watcher per
interval, the interval growing with the walk's cost so that a watcher takes
at most a tenth of a worker thread (10,000 entries: about 0.15 s a walk);
at most ``MAX_WATCHERS`` watchers per session and ``MAX_TENANT_WATCHERS``
per tenant (429 past either); at most ``MAX_EVENTS`` events held for a
watcher's client. Past the walk's or the events' bound the watcher stops and
says it overflowed, so a sandbox making files faster than a client reads
them, or more files than a walk sees, grows nothing.

Walks are background work, so they never run on the default executor, whose
threads every tenant's file calls and engine calls wait on: every watcher's
walks (its first one too) run on ``WATCH_THREADS`` threads of their own, and
one tenant's watchers take turns, ``TENANT_WALKS`` walks at a time, so a
tenant with many watchers over large trees slows only its own watchers
(their pause grows with the wait) and leaves the other tenants' a thread.

Events are envd's: ``create`` (a new path), ``write`` (a file's size or
mtime changed), ``chmod``, ``remove``, and ``rename`` (a path gone whose
inode shows under a new one: ``rename`` for the old name, ``create`` for the
new, as inotify reports it). Changes within one interval merge (a file made
and written in it is one ``create``), and a directory's own mtime is not an
event (its entries' are).
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from ..errors import (
    BadRequest,
    Conflict,
    FileNotFound,
    GatewayError,
    SessionNotFound,
    TooManyWatchers,
)
from ..tasks import TaskSet
from ..workspace.files import AsyncWorkspace
from ..workspace.rules import Bounds, Walk, clean_path

INTERVAL = 0.5  # seconds between two walks of a watched directory, at least
SHARE = 10  # ... and at least this many times as long as the last walk took
MAX_WATCHERS = 4  # at once, per session
MAX_TENANT_WATCHERS = 16  # at once, per tenant (each holds up to MAX_ENTRIES entries' stats)
WATCH_THREADS = 2  # every watcher's walks, all tenants': none on the default executor
TENANT_WALKS = 1  # one tenant's walks at once: another tenant always finds a thread
MAX_ENTRIES = 10_000  # a watched directory (recursive: its whole tree) seen per walk
WALK_SECONDS = 1.0
MAX_EVENTS = 1_000  # events waiting for a watcher's client

_walks = ThreadPoolExecutor(WATCH_THREADS, thread_name_prefix="sbx-watch")


class WatchOverflow(Conflict):
    """More changes than a watcher keeps, or a directory larger than its walk (Connect:
    ``FAILED_PRECONDITION``; the SDK's ``SandboxException``)."""


class Event(NamedTuple):
    name: str  # relative to the watched directory
    kind: str  # create, write, chmod, remove, rename


class _Seen(NamedTuple):
    inode: int
    directory: bool
    size: int
    mtime_ns: int
    mode: int


def _seen(info: os.stat_result) -> _Seen:
    directory = stat.S_ISDIR(info.st_mode)
    return _Seen(info.st_ino, directory, info.st_size, info.st_mtime_ns, stat.S_IMODE(info.st_mode))


class Watcher:
    """One watched directory: a polling task and the events its client has not taken yet.

    ``turn`` is its tenant's: held for each walk, so the tenant's watchers walk in turn.
    """

    def __init__(
        self,
        workspace: AsyncWorkspace,
        path: str,
        recursive: bool,
        tenant: str,
        turn: asyncio.Semaphore,
    ) -> None:
        self.id = str(uuid.uuid4())
        self.workspace = workspace
        self.tenant = tenant
        self.turn = turn
        self.parts = clean_path(path, allow_root=True)
        self.recursive = recursive
        self.events: deque[Event] = deque()
        self.failure: GatewayError | None = None
        self.changed = asyncio.Event()  # set when events (or a failure) are waiting
        self.seen: dict[str, _Seen] = {}
        self.task: asyncio.Task | None = None

    async def baseline(self) -> None:
        """The first walk: what is there before watching begins (a 404 / 400 refuses it)."""
        info = await self.workspace.stat("/".join(self.parts))
        if info["type"] != "directory":
            raise BadRequest(f"{info['path'] or 'the workspace'} is not a directory; watch one")
        self.seen = await self._walk()

    async def _walk(self) -> dict[str, _Seen]:
        bounds = Bounds(depth=64 if self.recursive else 1, entries=MAX_ENTRIES,
                        seconds=WALK_SECONDS)  # fmt: skip
        async with self.turn:
            walking = asyncio.ensure_future(
                self.workspace.walk(self.parts, bounds, self.recursive, _walks)
            )
            try:
                walk: Walk = await asyncio.shield(walking)
            except asyncio.CancelledError:
                # Stopped: its thread walks on, so the turn stays taken until it is done.
                await asyncio.wait([walking])
                if not walking.cancelled():
                    walking.exception()  # retrieved, so not logged: nobody awaits it now
                raise
        if walk.truncated and not walk.truncated.startswith("deeper"):
            raise WatchOverflow(
                f"the watch overflowed: the watched directory holds {walk.truncated}; "
                "watch a smaller directory"
            )
        skip = len(self.parts)
        return {"/".join(rel.split("/")[skip:]): _seen(info) for rel, info in walk.entries}

    async def poll(self) -> None:
        """Walk every ``INTERVAL`` until stopped, or until a bound is passed or the path goes."""
        pause = INTERVAL
        try:
            while True:
                await asyncio.sleep(pause)
                started = time.monotonic()
                now = await self._walk()
                # A large tree is walked less often: a watcher spends at most 1/SHARE of a thread.
                pause = max(INTERVAL, (time.monotonic() - started) * SHARE)
                self._push(_diff(self.seen, now))
                self.seen = now
        except FileNotFound:
            self._fail(FileNotFound("the watched directory was removed"))
        except GatewayError as e:
            self._fail(e)

    def _push(self, events: list[Event]) -> None:
        if len(self.events) + len(events) > MAX_EVENTS:
            raise WatchOverflow(
                f"the watch overflowed: more than {MAX_EVENTS} events waited to be read; "
                "read them more often, or watch a smaller directory"
            )
        self.events.extend(events)
        if events:
            self.changed.set()

    def _fail(self, error: GatewayError) -> None:
        self.failure = error
        self.seen = {}
        self.changed.set()

    def take(self) -> list[Event]:
        """The events waiting, oldest first; once all are read, the failure that ended it."""
        if not self.events and self.failure is not None:
            raise self.failure
        taken = list(self.events)
        self.events.clear()
        self.changed.clear()
        return taken

    async def stream(self) -> AsyncIterator[Event]:
        """Every event as it comes, until the watch fails (raised) or is stopped."""
        while True:
            await self.changed.wait()
            for event in self.take():
                yield event

    def stop(self, reason: GatewayError | None = None) -> None:
        """Stop polling; whoever waits on the watch gets ``reason`` (by default: stopped)."""
        if self.task is not None:
            self.task.cancel()
        self.events.clear()
        self._fail(reason or FileNotFound(f"the watcher {self.id} was stopped"))


def _diff(before: dict[str, _Seen], after: dict[str, _Seen]) -> list[Event]:
    """What changed between two walks, as envd names it."""
    arrived = {seen.inode for path, seen in after.items() if path not in before}
    events = [
        Event(path, "rename" if seen.inode in arrived else "remove")
        for path, seen in before.items()
        if path not in after
    ]
    for path, seen in after.items():
        old = before.get(path)
        if old is None or old.inode != seen.inode:  # new, renamed here, or replaced
            events.append(Event(path, "create"))
        elif not seen.directory and (old.size, old.mtime_ns) != (seen.size, seen.mtime_ns):
            events.append(Event(path, "write"))
        elif old.mode != seen.mode:
            events.append(Event(path, "chmod"))
    return events


class Watchers:
    """Every session's watchers, by session and watcher id; at most ``MAX_WATCHERS`` a
    session and ``MAX_TENANT_WATCHERS`` a tenant; each tenant's walks take turns."""

    def __init__(self, tasks: TaskSet) -> None:
        self.tasks = tasks
        self._by_session: dict[str, dict[str, Watcher]] = {}
        self._turns: dict[str, asyncio.Semaphore] = {}  # per tenant (tenants are configured)

    async def start(
        self, session_id: str, tenant: str, workspace: AsyncWorkspace, path: str, recursive: bool
    ) -> Watcher:
        live = self._by_session.setdefault(session_id, {})
        if len(live) >= MAX_WATCHERS:
            raise TooManyWatchers(
                f"{MAX_WATCHERS} watchers already watch this sandbox's files; stop one first"
            )
        held = sum(w.tenant == tenant for each in self._by_session.values() for w in each.values())
        if held >= MAX_TENANT_WATCHERS:
            raise TooManyWatchers(
                f"your sandboxes hold {MAX_TENANT_WATCHERS} watchers, as many as a tenant may; "
                "stop one first"
            )
        turn = self._turns.setdefault(tenant, asyncio.Semaphore(TENANT_WALKS))
        watcher = Watcher(workspace, path, recursive, tenant, turn)
        live[watcher.id] = watcher  # held while its first walk runs, so the bound holds
        try:
            await watcher.baseline()
        except BaseException:
            live.pop(watcher.id, None)
            raise
        watcher.task = self.tasks.spawn(watcher.poll())
        return watcher

    def get(self, session_id: str, watcher_id: str) -> Watcher:
        watcher = self._by_session.get(session_id, {}).get(watcher_id)
        if watcher is None:
            raise FileNotFound(f"no watcher {watcher_id} in this sandbox (stopped, or never made)")
        return watcher

    def stop(self, session_id: str, watcher_id: str) -> None:
        watcher = self.get(session_id, watcher_id)
        self._by_session[session_id].pop(watcher_id, None)
        watcher.stop()

    def discard(self, session_id: str, watcher_id: str) -> None:
        """Stop a watcher if it is still there (its stream ended)."""
        watcher = self._by_session.get(session_id, {}).pop(watcher_id, None)
        if watcher is not None:
            watcher.stop()

    def end(self, session_id: str) -> None:
        """Stop a session's watchers (it ended, or is another gateway's now)."""
        for watcher in self._by_session.pop(session_id, {}).values():
            watcher.stop(SessionNotFound(session_id))
