"""The gateway's calls, as root, on paths in a directory a sandbox can write.

A sandbox controls every name in its run directory and its workspace: between
two calls on one path it can swap what is there for a symbolic link to any
host file. So nothing here acts on such a name twice, nor follows a link: a
socket is bound and given its mode where the sandbox cannot reach and renamed
in whole; a file is made new, without following a link, and given its owner
and mode through its descriptor; a socket is connected through the very file
opened without following a link. docs/SECURITY.md lists every such call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import stat
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Python 3.13's asyncio stats a listener's name to unlink it on close; ours, bound as
# /proc/self/fd/N/..., names whatever N is by then (a file: NotADirectoryError).
_NO_CLEANUP: dict[str, Any] = {"cleanup_socket": False} if sys.version_info >= (3, 13) else {}


class NotASocket(OSError):
    """Something other than a socket (a symbolic link, say) is where a kernel's should be."""


def bind_socket(directory: Path, name: str, mode: int, backlog: int = 100) -> socket.socket:
    """A Unix socket listening at ``directory/name`` with ``mode``, for a sandbox to connect to.

    ``directory`` is the sandbox's, its parent the gateway's alone: the socket
    is bound and given its mode in the parent, under a name of its own, then
    renamed over whatever the sandbox left at ``name`` (a link is replaced,
    never followed). OSError if that cannot be done (a directory in the way).
    """
    parent = os.open(directory.parent, DIR_FLAGS)
    try:
        inside = os.open(directory.name, DIR_FLAGS, dir_fd=parent)
        try:
            temp = f".{name}-{secrets.token_hex(6)}"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(f"/proc/self/fd/{parent}/{temp}")  # short, and anchored on parent
                try:
                    os.chmod(temp, mode, dir_fd=parent)
                    os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=inside)
                except OSError:
                    os.unlink(temp, dir_fd=parent)
                    raise
                sock.listen(backlog)
            except BaseException:
                sock.close()
                raise
            return sock
        finally:
            os.close(inside)
    finally:
        os.close(parent)


Handler = Callable[[str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class SessionSockets:
    """A Unix socket per session in its run directory (``bind_socket``), served on the loop:
    each connection handed to ``handle(session_id, reader, writer)``, its reads bounded by
    ``limit``."""

    def __init__(self, name: str, handle: Handler, limit: int) -> None:
        self.name, self.handle, self.limit = name, handle, limit
        self._servers: dict[str, asyncio.Server] = {}

    def serves(self, session_id: str) -> bool:
        return session_id in self._servers

    async def open(self, session_id: str, run_dir: Path) -> None:
        """Serve the session's socket in ``run_dir`` (again, after a gateway restart)."""
        self.close(session_id)
        sock = await asyncio.to_thread(bind_socket, run_dir, self.name, 0o777)
        self._servers[session_id] = await asyncio.start_unix_server(
            lambda r, w: self.handle(session_id, r, w), sock=sock, limit=self.limit, **_NO_CLEANUP
        )

    def close(self, session_id: str) -> None:
        server = self._servers.pop(session_id, None)
        if server is not None:
            server.close()

    def stop(self) -> None:
        for session_id in list(self._servers):
            self.close(session_id)


def write_file(
    dir_fd: int, name: str, data: bytes, mode: int, owner: tuple[int, int] | None
) -> None:
    """Replace ``name`` in ``dir_fd`` with a new file of ``data``: ``mode`` and ``owner``
    (uid, gid; None: the gateway's) are set on its descriptor, a link in its place removed."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


async def connect_socket_file(path: str, factory: Callable[[], asyncio.Protocol]) -> Any:
    """Connect to the Unix socket at ``path`` itself, never through a symbolic link; the protocol.

    A kernel's socket directory is its sandbox's: a link planted in a socket's
    place would take the gateway's connection (and what it sends) to any socket
    the gateway can reach. The path is opened without following a link and the
    connection made through that very file. OSError if nothing is there.
    """
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise NotASocket(f"{path} is not a socket")
        _, protocol = await asyncio.get_running_loop().create_unix_connection(
            factory, f"/proc/self/fd/{fd}"
        )
        return protocol
    finally:
        os.close(fd)
