"""envd's Filesystem service over the session's workspace, and its watchers.

Watching (``WatchDir``, the async SDK's stream; ``CreateWatcher`` /
``GetWatcherEvents`` / ``RemoveWatcher``, the sync SDK's) is the session
manager's bounded, polling watchers (``sessions/watchers.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_connect as fs_rpc
from e2b.envd.filesystem import filesystem_pb as fs
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from ...access.auth import Principal
from ...errors import BadRequest
from ...sessions.watchers import Event
from ...sessions.workspaces import Workspaces
from ...timestamps import parse_iso
from ...workspace.files import AsyncWorkspace
from .connect import as_connect_errors
from .envd import sdk_path, workspace_path

KEEPALIVE = 50.0  # seconds of silence before a keep-alive on a watch, unless the client asks

HOME_NAME = "user"  # the workspace's own name, as envd names /home/user
_EVENTS = {"create": fs.EventType.CREATE, "write": fs.EventType.WRITE,
           "remove": fs.EventType.REMOVE, "rename": fs.EventType.RENAME,
           "chmod": fs.EventType.CHMOD}  # fmt: skip
_KINDS = {"file": fs.FileType.FILE, "directory": fs.FileType.DIRECTORY,
          "symlink": fs.FileType.SYMLINK}  # fmt: skip


def entry_info(entry: dict[str, Any]) -> fs.EntryInfo:
    """A workspace entry as envd's ``EntryInfo``."""
    kind = entry["type"]
    modified = Timestamp(seconds=int(parse_iso(entry["modified"]))) if entry["modified"] else None
    return fs.EntryInfo(
        name=entry["name"] or HOME_NAME,
        type=_KINDS.get(kind, fs.FileType.UNSPECIFIED),
        path=sdk_path(entry["path"]),
        size=entry["size"] or 0,
        mode=0o755 if kind == "directory" else 0o644,
        permissions="drwxr-xr-x" if kind == "directory" else "-rw-r--r--",
        owner="user",
        group="user",
        modified_time=modified,
        is_symlink=kind == "symlink",
    )


def fs_event(event: Event) -> fs.FilesystemEvent:
    return fs.FilesystemEvent(name=event.name, type=_EVENTS[event.kind])


def keepalive_of(ctx: Any) -> float:
    """The keep-alive interval the client asked for (``Keepalive-Ping-Interval``), in seconds."""
    asked = ctx.request_headers.get("keepalive-ping-interval", "")
    return float(asked) if asked.isdigit() and int(asked) > 0 else KEEPALIVE


class FilesystemService(fs_rpc.Filesystem):
    """Stat, list (with depth), make_dir, move, remove and watch, on workspace paths."""

    def __init__(self, workspaces: Workspaces, sandbox_id: str, who: Principal) -> None:
        self.workspaces, self.sandbox_id, self.who = workspaces, sandbox_id, who
        self.workspace: AsyncWorkspace = workspaces.files(sandbox_id, who)

    async def stat(self, request: fs.StatRequest, ctx: Any, /) -> fs.StatResponse:
        with as_connect_errors():
            entry = await self.workspace.stat(workspace_path(request.path))
        return fs.StatResponse(entry=entry_info(entry))

    async def make_dir(self, request: fs.MakeDirRequest, ctx: Any, /) -> fs.MakeDirResponse:
        with as_connect_errors():
            path = workspace_path(request.path)
            if not await self.workspace.make_dir(path):
                raise ConnectError(Code.ALREADY_EXISTS, f"{request.path} already exists")
            entry = await self.workspace.stat(path)
        return fs.MakeDirResponse(entry=entry_info(entry))

    async def move(self, request: fs.MoveRequest, ctx: Any, /) -> fs.MoveResponse:
        with as_connect_errors():
            self.workspaces.check_file(self.sandbox_id, self.who, "delete")  # the old name goes
            source = workspace_path(request.source)
            entry = await self.workspace.move(source, workspace_path(request.destination))
        return fs.MoveResponse(entry=entry_info(entry))

    async def list_dir(self, request: fs.ListDirRequest, ctx: Any, /) -> fs.ListDirResponse:
        with as_connect_errors():
            path = workspace_path(request.path)
            if (await self.workspace.stat(path))["type"] != "directory":
                raise BadRequest(f"{request.path} is not a directory")
            tree = await self.workspace.tree(path, max(1, request.depth))
        return fs.ListDirResponse(entries=[entry_info(e) for e in tree["entries"]])

    async def remove(self, request: fs.RemoveRequest, ctx: Any, /) -> fs.RemoveResponse:
        with as_connect_errors():
            self.workspaces.check_file(self.sandbox_id, self.who, "delete")
            await self.workspace.remove(workspace_path(request.path))
        return fs.RemoveResponse()

    async def create_watcher(
        self, request: fs.CreateWatcherRequest, ctx: Any, /
    ) -> fs.CreateWatcherResponse:
        with as_connect_errors():
            path = workspace_path(request.path)
            watcher = await self.workspaces.watch(
                self.sandbox_id, self.who, path, request.recursive
            )
        return fs.CreateWatcherResponse(watcher_id=watcher.id)

    async def get_watcher_events(
        self, request: fs.GetWatcherEventsRequest, ctx: Any, /
    ) -> fs.GetWatcherEventsResponse:
        with as_connect_errors():
            events = self.workspaces.watcher(self.sandbox_id, self.who, request.watcher_id).take()
        return fs.GetWatcherEventsResponse(events=[fs_event(e) for e in events])

    async def remove_watcher(
        self, request: fs.RemoveWatcherRequest, ctx: Any, /
    ) -> fs.RemoveWatcherResponse:
        with as_connect_errors():
            self.workspaces.unwatch(self.sandbox_id, self.who, request.watcher_id)
        return fs.RemoveWatcherResponse()

    async def watch_dir(
        self, request: fs.WatchDirRequest, ctx: Any, /
    ) -> AsyncIterator[fs.WatchDirResponse]:
        """Start, then each event as the watcher sees it (keep-alives while quiet).

        The watch ends with its stream: its watcher is stopped however the stream ends.
        """
        with as_connect_errors():
            path = workspace_path(request.path)
            watcher = await self.workspaces.watch(
                self.sandbox_id, self.who, path, request.recursive
            )
        response = fs.WatchDirResponse
        try:
            yield response(event=Oneof("start", response.StartEvent()))
            interval = keepalive_of(ctx)
            while True:
                try:
                    async with asyncio.timeout(interval):
                        await watcher.changed.wait()
                except TimeoutError:
                    yield response(event=Oneof("keepalive", response.KeepAlive()))
                    continue
                with as_connect_errors():
                    events = watcher.take()
                for event in events:
                    yield response(event=Oneof("filesystem", fs_event(event)))
        finally:
            self.workspaces.forget(self.sandbox_id, watcher.id)
