"""The gateway as an MCP client of a stdio server that runs in a sandbox of its own.

The placement starts the server (``Placement.start_tool_server``); the gateway
speaks MCP over its stdin and stdout, one JSON-RPC message per line as
``mcp.client.stdio`` frames them (``line_streams``). What the server writes is
hostile: a line longer than ``max_line`` ends the connection with an error
saying so, its stderr and the lines that are not JSON-RPC are dropped,
nothing is read ahead of what the client takes (streams of no buffer), so a
flood waits on the server's own pipe, and a line past ``OFF_LOOP`` bytes is
parsed on a thread, so a flood of big ones does not hold the event loop every
session shares. A server that exits ends the connection (a call made later
starts it again, at most every ``RECONNECT_EVERY`` seconds); its sandbox goes
whenever the connection ends. Its session's pause freezes the sandbox by its
``sandbox_id``, or ends the connection (``rest``) till the next call.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import anyio
from mcp import types
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage

from .mcp_servers import CONNECT_TIMEOUT, McpConnection, ToolFailed
from .specs import StdioServer


class ServerProcess(Protocol):
    """The server running in its sandbox: its output, its stdin, its end."""

    sandbox_id: str

    async def read(self) -> tuple[str, bytes] | None: ...

    async def write(self, data: bytes) -> None: ...

    async def end(self) -> None: ...


_ADAPTER = types.jsonrpc_message_adapter
OFF_LOOP = 64 << 10  # a line longer is parsed on a thread: a flood of big ones stalls no one


class ServerGone(Exception):
    """The server's output ended, or it wrote a line past the bound on one message."""


@contextlib.asynccontextmanager
async def line_streams(
    process: ServerProcess, max_line: int, broken: Callable[[str], None]
) -> AsyncIterator[TransportStreams]:
    """The MCP SDK's read and write streams over ``process``'s stdout and stdin; ``broken``
    hears why the server went away before the calls in flight fail."""
    to_client, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_client = anyio.create_memory_object_stream[SessionMessage](0)

    async def from_server() -> None:
        """Lines as messages until the server's output ends or a line is too long: then the
        task group fails, so the connection ends saying why (and is made again later)."""
        try:
            async for line in _lines(process, max_line):
                try:
                    message = await _parse(line)
                except ValueError:  # a banner or a stray print: the SDK would only spawn a
                    continue  # task per line to hand it to a handler that drops it
                await to_client.send(SessionMessage(message))
        except ServerGone as e:
            broken(str(e))
            raise
        broken("its process ended")
        raise ServerGone("its process ended")

    async def to_server() -> None:
        async with from_client:
            async for sent in from_client:
                data = sent.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.write(data.encode() + b"\n")

    async with anyio.create_task_group() as group:
        group.start_soon(from_server)
        group.start_soon(to_server)
        try:
            yield read_stream, write_stream
        finally:
            group.cancel_scope.cancel()
            for stream in (to_client, read_stream, write_stream, from_client):
                stream.close()


async def _parse(line: bytes) -> types.JSONRPCMessage:
    if len(line) > OFF_LOOP:
        return await anyio.to_thread.run_sync(functools.partial(_ADAPTER.validate_json, line,
                                                                by_name=False))  # fmt: skip
    return _ADAPTER.validate_json(line, by_name=False)


async def _lines(process: ServerProcess, max_line: int) -> AsyncIterator[bytes]:
    """Each non-blank stdout line; ServerGone once one passes ``max_line`` bytes."""
    parts: list[bytes] = []
    size = 0
    while (chunk := await process.read()) is not None:
        stream, data = chunk
        if stream != "stdout":
            continue
        while (end := data.find(b"\n")) >= 0:
            if size + end > max_line:
                raise ServerGone(f"the server wrote a line of more than {max_line} bytes")
            line = b"".join((*parts, data[:end]))
            parts, size, data = [], 0, data[end + 1 :]
            if line.strip():
                yield line
        size += len(data)
        if size > max_line:
            raise ServerGone(f"the server wrote a line of more than {max_line} bytes")
        parts.append(data)


class StdioConnection(McpConnection):
    """One session's connection to one stdio server, started anew with each connection."""

    def __init__(
        self,
        server: StdioServer,
        start: Callable[[], Awaitable[ServerProcess]],
        max_bytes: int,
    ) -> None:
        """``start``: the server in its sandbox; ``max_bytes``: the most one message may hold."""
        super().__init__(server, {}, max_bytes)  # type: ignore[arg-type]
        self.start = start
        self._broken: str | None = None  # why the server went away, if it did
        self._process: ServerProcess | None = None  # while connected
        # Whether its session is paused: no server starts, one that started meanwhile is ended.
        self.held: Callable[[], bool] = lambda: False

    @property
    def sandbox_id(self) -> str | None:
        """The sandbox the server runs in while it is connected (a pause freezes it)."""
        return self._process.sandbox_id if self._process is not None else None

    async def call(self, name: str, arguments: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        try:
            return await super().call(name, arguments, timeout)
        except ToolFailed:
            if self._broken is None:
                raise
            raise ToolFailed(f"MCP server {self.server.name} went away: {self._broken}") from None

    def _went(self, why: str) -> None:
        self._broken = why

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[TransportStreams]:
        paused = f"its session is paused; {self.server.name} starts again with it"
        if self.held():
            raise ToolFailed(paused)
        with anyio.fail_after(CONNECT_TIMEOUT, shield=True):  # a sandbox made is never lost
            process = await self.start()
        if self.held():  # the pause came while it started, finding no sandbox of it
            with anyio.CancelScope(shield=True):
                await process.end()
            raise ToolFailed(paused)
        self._process = process
        self._broken = None
        try:
            async with line_streams(process, self.max_bytes, self._went) as streams:
                yield streams
        finally:
            self._process = None
            with anyio.CancelScope(shield=True):
                await process.end()
