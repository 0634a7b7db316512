"""envd's Filesystem service over the session's workspace (watching is not offered)."""

from __future__ import annotations

from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_connect as fs_rpc
from e2b.envd.filesystem import filesystem_pb as fs
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from ...errors import BadRequest
from ...sandbox.files import AsyncWorkspace
from ...sandbox.workspace import parse_iso
from .connect import as_connect_errors
from .envd import sdk_path, workspace_path

HOME_NAME = "user"  # the workspace's own name, as envd names /home/user
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


class FilesystemService(fs_rpc.Filesystem):
    """Stat, list (with depth), make_dir, move and remove, on workspace paths."""

    def __init__(self, workspace: AsyncWorkspace) -> None:
        self.workspace = workspace

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
            await self.workspace.remove(workspace_path(request.path))
        return fs.RemoveResponse()
