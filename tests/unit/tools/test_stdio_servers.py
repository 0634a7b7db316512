"""The line-bounded bridge between the MCP SDK and a stdio server in its sandbox (no engine).

``FakeServer`` stands for the sandboxed process: what it writes is scripted,
what the gateway writes to it is answered by ``answer``.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.tools.mcp_servers import ToolFailed
from gateway.tools.specs import StdioServer
from gateway.tools.stdio_servers import StdioConnection

TOOL = {"name": "echo", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}


def answer(message: dict) -> dict | None:
    if "id" not in message:
        return None
    method = message["method"]
    if method == "initialize":
        result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities":
                  {"tools": {}}, "serverInfo": {"name": "fake", "version": "1"}}  # fmt: skip
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call":
        said = message["params"]["arguments"].get("text", "")
        result = {"content": [{"type": "text", "text": said}], "isError": False}
    else:
        return {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "?"}}
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


class FakeServer:
    """A server answering line by line, in chunks of ``chunk`` bytes; ``hostile`` replaces
    what it writes once it is asked to call a tool."""

    def __init__(self, chunk: int = 7, hostile=None, silent: bool = False) -> None:
        self.out: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(maxsize=4)
        self.chunk, self.hostile, self.silent = chunk, hostile, silent
        self.written = 0  # bytes the gateway wrote
        self.ended = False
        self.tasks: list[asyncio.Future] = []

    async def read(self):
        return await self.out.get()

    async def write(self, data: bytes) -> None:
        self.written += len(data)
        message = json.loads(data)
        if self.silent:
            return
        if message.get("method") == "tools/call" and self.hostile is not None:
            self.tasks.append(asyncio.ensure_future(self.hostile(self, message)))
            return
        reply = answer(message)
        if reply is not None:
            await self.out.put(("stderr", b"noise on stderr\n"))
            raw = json.dumps(reply).encode() + b"\n"
            for i in range(0, len(raw), self.chunk):
                await self.out.put(("stdout", raw[i : i + self.chunk]))

    async def end(self) -> None:
        self.ended = True


def run(server: FakeServer, test, max_bytes: int = 4096):
    async def main():
        async def start():
            return server

        connection = StdioConnection(StdioServer("fake", ("fake",)), start, max_bytes)
        try:
            await test(connection)
        finally:
            await connection.close()

    asyncio.run(main())


def test_messages_split_across_chunks_and_stderr_noise_become_calls_and_the_sandbox_ends():
    server = FakeServer()

    async def test(c: StdioConnection):
        tools = await c.open()
        assert [t["name"] for t in tools] == ["echo"]
        for text in ("one", "two"):
            got = await c.call("echo", {"text": text}, timeout=5)
            assert got["content"][0]["text"] == text and not got["is_error"]

    run(server, test)
    assert server.ended


def test_an_endless_line_ends_the_connection_with_a_clear_error_and_memory_stays_bounded():
    async def endless(server: FakeServer, message: dict):
        while True:
            await server.out.put(("stdout", b"x" * 1000))

    server = FakeServer(hostile=endless)

    async def test(c: StdioConnection):
        await c.open()
        with pytest.raises(
            ToolFailed, match="went away: the server wrote a line of more than 4096 bytes"
        ):
            await c.call("echo", {"text": "a"}, timeout=5)

    run(server, test)
    assert server.ended


def test_a_flood_of_lines_is_read_only_as_the_client_takes_them():
    async def flood(server: FakeServer, message: dict):
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                           "params": {"level": "info", "data": "x"}}).encode()  # fmt: skip
        for _ in range(500):
            await server.out.put(("stdout", note + b"\n"))
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": {"content": [], "isError": False}}
        await server.out.put(("stdout", json.dumps(reply).encode() + b"\n"))

    server = FakeServer(hostile=flood)

    async def test(c: StdioConnection):
        await c.open()
        got = await c.call("echo", {}, timeout=10)
        assert got == {"content": [], "structured": None, "is_error": False}

    run(server, test)


def test_a_server_that_crashes_fails_the_call_in_flight_and_is_started_again(monkeypatch):
    monkeypatch.setattr("gateway.tools.mcp_servers.RECONNECT_EVERY", 0)

    async def crash(server: FakeServer, message: dict):
        await server.out.put(None)

    server = FakeServer(hostile=crash)

    async def test(c: StdioConnection):
        await c.open()
        with pytest.raises(ToolFailed, match="went away: its process ended"):
            await c.call("echo", {}, timeout=5)
        for _ in range(100):  # its sandbox goes as the connection ends, a moment later
            if server.ended:
                break
            await asyncio.sleep(0.01)
        assert server.ended
        server.hostile, server.ended = None, False
        got = await c.call("echo", {"text": "again"}, timeout=5)
        assert got["content"][0]["text"] == "again"

    run(server, test)


def test_a_server_that_never_answers_initialize_is_given_up_and_its_sandbox_ends(monkeypatch):
    monkeypatch.setattr("gateway.tools.mcp_servers.CONNECT_TIMEOUT", 0.5)
    server = FakeServer(silent=True)

    async def test(c: StdioConnection):
        with pytest.raises(ToolFailed, match="no answer within"):
            await c.open()

    run(server, test)
    assert server.ended


def test_a_big_line_is_parsed_off_the_event_loop_so_a_flood_of_them_stalls_no_one(monkeypatch):
    import threading

    from gateway.tools import stdio_servers

    loop_thread, seen = threading.get_ident(), []
    parse = stdio_servers.types.jsonrpc_message_adapter.validate_json

    class Adapter:
        @staticmethod
        def validate_json(line, **kwargs):
            seen.append((len(line), threading.get_ident() == loop_thread))
            return parse(line, **kwargs)

    monkeypatch.setattr(stdio_servers, "_ADAPTER", Adapter, raising=False)

    async def big(server: FakeServer, message: dict):
        text = "x" * (200 << 10)
        result = {"content": [{"type": "text", "text": text}], "isError": False}
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        await server.out.put(("stdout", json.dumps(reply).encode() + b"\n"))

    server = FakeServer(hostile=big)

    async def test(c: StdioConnection):
        await c.open()
        got = await c.call("echo", {}, timeout=5)
        assert len(got["content"][0]["text"]) == 200 << 10

    run(server, test, max_bytes=1 << 20)
    assert [on_loop for size, on_loop in seen if size > 64 << 10] == [False]
    assert all(on_loop for size, on_loop in seen if size <= 64 << 10)


def test_lines_that_are_not_json_rpc_are_dropped_not_handed_to_the_client(monkeypatch):
    from mcp.client.session import ClientSession

    handed = []

    async def on_stream_exception(self, exc):
        handed.append(exc)

    monkeypatch.setattr(ClientSession, "_on_stream_exception", on_stream_exception)

    async def noise(server: FakeServer, message: dict):
        for _ in range(300):
            await server.out.put(("stdout", b"Server started, listening on stdio " * 20 + b"\n"))
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": {"content": [], "isError": False}}
        await server.out.put(("stdout", json.dumps(reply).encode() + b"\n"))

    server = FakeServer(hostile=noise)

    async def test(c: StdioConnection):
        await c.open()
        assert (await c.call("echo", {}, timeout=5))["content"] == []

    run(server, test)
    assert handed == []
