"""A cluster session's workspace, reached through the sandbox agent on its node.

The workspace lives on whichever node runs the kernel, so the gateway cannot
open it. ``RemoteWorkspace`` offers what ``Workspace`` offers; the agent in the
sandbox runs the real ``Workspace`` on ``/workspace`` (the same code, shipped
to it), so links, devices, ``..`` and absolute paths are refused there exactly
as on one host. Paths are checked here too, before anything is sent.
Downloads and uploads move a chunk per request, so neither side ever holds a
whole file. Blocking, like ``Workspace``, and callable only from a worker
thread (``AgentClient.call_sync`` refuses the event loop): the gateway uses it
through ``AsyncWorkspace``, which runs it there.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from ...workspace.rules import CHUNK, WALK, Archive, Bounds, Walk, Workspace, clean_path
from .agent_client import AgentClient


@dataclass
class RemoteWorkspace(Workspace):
    """Workspace operations forwarded to the sandbox's agent."""

    # Never used here: the agent's own user owns what it writes (-1 means "leave as is").
    uid: int = -1
    gid: int = -1
    # The sandbox's agent client, looked up per call: a restart may bring a new sandbox.
    agent: Callable[[], AgentClient] | None = field(default=None, kw_only=True)

    def _call(self, op: str, data: bytes = b"", **args: Any) -> tuple[Any, bytes]:
        assert self.agent is not None
        return self.agent().call_sync(op, args, data)

    @property
    def small(self) -> bool:
        """Never: any walk is a round trip to another node, and blocks (keep it off the loop)."""
        return False

    def open_read(self, path: str) -> tuple[IO[bytes], os.stat_result]:
        clean_path(path)
        info, _ = self._call("fs.read_open", path=path)
        mtime = float(info["mtime"])
        stat = _stat(int(info["mode"]), int(info["size"]), int(mtime * 1e9))
        return RemoteReader(self, info["stream"]), stat

    def open_write(self, path: str) -> RemoteUpload:
        self.seen = None  # the gateway's own writes are never reported as the code's
        clean_path(path)
        info, _ = self._call("fs.write_open", path=path)
        return RemoteUpload(self, info["upload"])

    def free_bytes(self) -> int:
        return int(self._call("fs.free")[0])

    def list(self, path: str, bounds: Bounds = WALK) -> dict[str, Any]:
        clean_path(path, allow_root=True)
        return self._call("fs.list", path=path)[0]

    def remove(self, path: str) -> None:
        self.seen = None
        clean_path(path)
        self._call("fs.remove", path=path)

    def tree(self, path: str, depth: int) -> dict[str, Any]:
        clean_path(path, allow_root=True)
        return self._call("fs.tree", path=path, depth=depth)[0]

    def stat(self, path: str) -> dict[str, Any]:
        clean_path(path, allow_root=True)
        return self._call("fs.stat", path=path)[0]

    def make_dir(self, path: str) -> bool:
        self.seen = None
        clean_path(path)
        return bool(self._call("fs.make_dir", path=path)[0])

    def move(self, source: str, destination: str) -> dict[str, Any]:
        self.seen = None
        clean_path(source)
        clean_path(destination)
        return self._call("fs.move", source=source, destination=destination)[0]

    def walk(self, parts: list[str], bounds: Bounds = WALK, recurse: bool = True) -> Walk:
        """The agent's bounded walk (its own bounds: the same code, ``WALK``)."""
        found, _ = self._call("fs.walk", parts=parts)
        entries = [(rel, _stat(mode, size, ns)) for rel, size, ns, mode in found["entries"]]
        return Walk(entries[: bounds.entries], found["truncated"])

    def archive(self, path: str, fmt: str) -> Archive:
        clean_path(path, allow_root=True)
        info, _ = self._call("fs.archive_open", path=path, fmt=fmt)
        reader = RemoteReader(self, info["stream"])
        return Archive(iter(reader.read, b""), int(info["size"]), int(info["files"]), reader.close)


def _stat(mode: int, size: int, mtime_ns: int) -> os.stat_result:
    seconds = mtime_ns // 10**9
    return os.stat_result(
        (mode, 0, 0, 1, 0, 0, size, seconds, seconds, seconds),
        {"st_mtime": mtime_ns / 1e9, "st_mtime_ns": mtime_ns},
    )


class RemoteReader:
    """A file (or archive) in the sandbox, read a chunk per request."""

    def __init__(self, workspace: RemoteWorkspace, stream: str) -> None:
        self.workspace, self.stream = workspace, stream
        self.done = False

    def read(self, size: int = CHUNK) -> bytes:
        if self.done:
            return b""
        _, chunk = self.workspace._call("fs.pull", stream=self.stream)
        self.done = not chunk
        return chunk

    def close(self) -> None:
        if not self.done:
            self.done = True
            self.workspace._call("fs.close", stream=self.stream)

    def __enter__(self) -> RemoteReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteUpload:
    """An upload into the sandbox: chunks sent as they come, renamed into place at the end."""

    def __init__(self, workspace: RemoteWorkspace, upload: str) -> None:
        self.workspace, self.upload = workspace, upload
        self.size = 0
        self.finished = False

    def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        for start in range(0, len(view), CHUNK):
            self.workspace._call("fs.write", bytes(view[start : start + CHUNK]), upload=self.upload)
        self.size += len(chunk)

    def finish(self, ok: bool) -> None:
        if self.finished:
            return
        self.finished = True
        result, _ = self.workspace._call("fs.write_finish", upload=self.upload, ok=ok)
        self.size = int(result["size"])
