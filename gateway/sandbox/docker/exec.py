"""A command run in a kernel's container with ``docker exec``: same user, same limits.

The process shares the container's cgroup (memory, CPU, pids), user,
filesystem and network with the kernel. Its output arrives on the exec's
socket: with no TTY as Docker's multiplexed frames (an 8-byte header naming
stdout or stderr, then the bytes), with one as the terminal's raw bytes.
The command is started through ``sh -c 'echo $$; exec "$@"'`` so the first
line of its output is its pid inside the container, which signals need.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from pathlib import PurePosixPath

import docker

from ...errors import Conflict
from ..base import AS_BATCH

WORKDIR = PurePosixPath("/workspace")  # where the workspace is mounted (SandboxSpec.workdir)
_STREAMS = {1: "stdout", 2: "stderr"}
_PID_LINE_MAX = 32


class DockerProcess:
    """One exec'd command: its output as it comes, its stdin, signals, its exit code."""

    def __init__(
        self,
        api: docker.APIClient,
        container_id: str,
        exec_id: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        tty: bool,
    ) -> None:
        self.api, self.container_id, self.exec_id = api, container_id, exec_id
        self.reader, self.writer, self.tty = reader, writer, tty
        self.pid = 0
        self._pending: list[tuple[str, bytes]] = []  # what came with or before the pid line
        self.stdin_closed = False

    @classmethod
    async def start(
        cls,
        client: docker.DockerClient,
        container_id: str,
        argv: list[str],
        env: Mapping[str, str],
        cwd: str,
        tty: tuple[int, int] | None,
    ) -> DockerProcess:
        """Start ``argv`` in the container, in ``cwd`` (relative to the workspace)."""
        api = client.api
        command = ["/bin/sh", "-c", f'{AS_BATCH}; echo "$$"; exec "$@"', "sh", *argv]
        created = await asyncio.to_thread(
            api.exec_create,
            container_id,
            command,
            stdin=True,
            stdout=True,
            stderr=True,
            tty=tty is not None,
            environment=[f"{k}={v}" for k, v in env.items()],
            workdir=str(WORKDIR / cwd),
        )
        exec_id = created["Id"]
        sock = await asyncio.to_thread(api.exec_start, exec_id, socket=True, tty=tty is not None)
        raw: socket.socket = sock._sock  # the connection itself, for asyncio to own
        raw.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=raw)
        process = cls(api, container_id, exec_id, reader, writer, tty is not None)
        if tty is not None:
            await process.resize(*tty)
        await process._read_pid()
        return process

    async def _read_pid(self) -> None:
        """Take the pid line off stdout; stderr said meanwhile (pipes race) is kept for later."""
        line = b""
        while b"\n" not in line and len(line) < _PID_LINE_MAX:
            chunk = await self._read_raw()
            if chunk is None:
                break
            if chunk[0] == "stderr":
                self._pending.append(chunk)
            else:
                line += chunk[1]
        text, _, rest = line.partition(b"\n")
        if not text.strip().isdigit():
            said = b"".join(data for _, data in self._pending)[:200]
            raise Conflict(f"the command could not be started in the sandbox: {said!r}")
        self.pid = int(text.strip())
        if rest:
            self._pending.insert(0, ("pty" if self.tty else "stdout", rest))

    async def read(self) -> tuple[str, bytes] | None:
        """The next piece of output as (stdout | stderr | pty, bytes); None once it has ended."""
        if self._pending:
            return self._pending.pop(0)
        return await self._read_raw()

    async def _read_raw(self) -> tuple[str, bytes] | None:
        try:
            if self.tty:
                data = await self.reader.read(64 * 1024)
                return ("pty", data) if data else None
            header = await self.reader.readexactly(8)
            data = await self.reader.readexactly(int.from_bytes(header[4:], "big"))
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return _STREAMS.get(header[0], "stdout"), data

    async def write(self, data: bytes) -> None:
        if self.stdin_closed or self.writer.is_closing():
            raise Conflict("the command's stdin is closed")
        self.writer.write(data)
        await self.writer.drain()

    async def close_stdin(self) -> None:
        if not self.stdin_closed and not self.writer.is_closing():
            self.stdin_closed = True
            self.writer.write_eof()

    async def signal(self, signum: int) -> None:
        """Signal the command and what it started (its process group), as the container's user.

        The command leads its own process group in the container: a shell
        running a pipeline goes down with its children.
        """
        group, pid = f"-{signum} -{self.pid}", f"-{signum} {self.pid}"
        argv = ["/bin/sh", "-c", f"kill {group} 2>/dev/null || kill {pid}"]

        def kill() -> None:
            self.api.exec_start(self.api.exec_create(self.container_id, argv)["Id"])

        await asyncio.to_thread(kill)

    async def resize(self, rows: int, cols: int) -> None:
        await asyncio.to_thread(self.api.exec_resize, self.exec_id, height=rows, width=cols)

    async def wait(self) -> int:
        """The exit code, once the output has ended (the exec may lag it a moment)."""
        for _ in range(100):
            info = await asyncio.to_thread(self.api.exec_inspect, self.exec_id)
            if not info["Running"]:
                return int(info["ExitCode"] if info["ExitCode"] is not None else -1)
            await asyncio.sleep(0.02)
        return -1

    def close(self) -> None:
        self.writer.close()
