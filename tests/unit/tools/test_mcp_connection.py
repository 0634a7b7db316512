"""The gateway as an MCP client of a real local streamable-HTTP server (no engine needed).

The server runs in a process of its own (``SERVER``): a tool that answers, one
that answers slowly, one that answers hugely, and one that crashes the server.
Each hostile answer ends as a ``ToolFailed`` that says what happened.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.tools.mcp_servers import McpConnection, ToolFailed
from gateway.tools.specs import McpServer

SERVER = Path(__file__).resolve().parents[2] / "hostile_mcp.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    port = _free_port()
    process = subprocess.Popen([sys.executable, str(SERVER), str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return process, f"http://127.0.0.1:{port}/mcp"
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the MCP server did not start")


@pytest.fixture(scope="module")
def server():
    process, url = start_server()
    yield url
    process.kill()
    process.wait()


def run(url: str, test, max_bytes: int = 1 << 20):
    async def main():
        connection = McpConnection(McpServer(url, "hostile"), {"X-Key": "k"}, max_bytes)
        try:
            await connection.open()
            await test(connection)
        finally:
            await connection.close()

    asyncio.run(main())


def test_the_servers_tools_are_listed_with_schemas_and_annotations(server):
    async def test(c: McpConnection):
        tools = {t["name"]: t for t in c.tools}
        assert set(tools) == {"echo", "slow", "huge", "crash", "backtrack"}
        assert tools["echo"]["annotations"] == {"readOnlyHint": True}
        assert tools["echo"]["input_schema"]["required"] == ["text"]
        answer = await c.call("echo", {"text": "hi"}, 5)
        assert answer["structured"] == {"result": "hi"} and not answer["is_error"]

    run(server, test)


def test_a_tool_that_answers_slowly_fails_at_the_call_timeout_and_the_next_call_works(server):
    async def test(c: McpConnection):
        started = time.monotonic()
        with pytest.raises(ToolFailed, match=r"did not answer within 0\.5 s"):
            await c.call("slow", {"seconds": 3}, 0.5)
        assert time.monotonic() - started < 2
        assert (await c.call("echo", {"text": "still"}, 5))["structured"] == {"result": "still"}

    run(server, test)


def test_a_huge_answer_is_cut_off_before_it_is_read_whole(server):
    async def test(c: McpConnection):
        with pytest.raises(ToolFailed, match="more than 100000 bytes"):
            await c.call("huge", {"size": 5_000_000}, 10)

    run(server, test, max_bytes=100_000)


def test_a_servers_output_schema_is_not_checked_on_the_gateways_loop(server):
    """A server's output schema is its own word: checking its answer against a pattern that
    backtracks exponentially held the loop every session shares (2**25 steps here)."""

    async def test(c: McpConnection):
        gaps, last = [0.0], time.monotonic()

        async def beat():
            nonlocal last
            while True:
                await asyncio.sleep(0.02)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()

        beating = asyncio.ensure_future(beat())
        try:
            answer = await c.call("backtrack", {"size": 25}, 30)
        finally:
            beating.cancel()
        assert answer["structured"] == {"x": "a" * 25 + "!"}
        assert max(gaps) < 0.5

    run(server, test)


def test_a_server_that_is_not_there_fails_the_open_with_why():
    async def main():
        connection = McpConnection(McpServer(f"http://127.0.0.1:{_free_port()}/mcp", "x"), {}, 1000)
        with pytest.raises(ToolFailed):
            await connection.open()

    asyncio.run(main())


def test_a_server_that_crashes_fails_the_call_in_flight_and_the_next_with_a_clear_error():
    process, url = start_server()
    try:

        async def test(c: McpConnection):
            with pytest.raises(ToolFailed):
                await c.call("crash", {}, 10)
            with pytest.raises(ToolFailed):
                await c.call("echo", {"text": "x"}, 3)

        run(url, test)
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("allowed, refused", [([], True), (["127.0.0.0/8"], False)])
def test_a_server_at_a_loopback_or_private_address_is_refused_unless_the_operator_allows_it(
    server, allowed, refused
):
    from gateway.egress.policy import AddressGuard

    guard = AddressGuard([ipaddress.ip_network(r) for r in allowed], set())

    async def main():
        connection = McpConnection(McpServer(server, "x"), {}, 1 << 20, guard.refusal)
        try:
            if refused:
                with pytest.raises(ToolFailed, match=r"loopback.*tool_allow_ranges"):
                    await connection.open()
            else:
                assert len(await connection.open()) == 5
        finally:
            await connection.close()

    asyncio.run(main())


def test_the_gateways_own_port_is_refused_even_on_an_allowed_range(server):
    from gateway.egress.policy import AddressGuard

    port = int(server.rsplit(":", 1)[1].split("/")[0])
    guard = AddressGuard([ipaddress.ip_network("127.0.0.0/8")], {port})

    async def main():
        connection = McpConnection(McpServer(server, "x"), {}, 1 << 20, guard.refusal)
        with pytest.raises(ToolFailed, match="the gateway itself"):
            await connection.open()

    asyncio.run(main())


def test_a_crashed_server_that_comes_back_is_reached_again_without_a_new_put(monkeypatch):
    from gateway.tools import mcp_servers

    monkeypatch.setattr(mcp_servers, "RECONNECT_EVERY", 0.2)
    process, url = start_server()
    port = int(url.rsplit(":", 1)[1].split("/")[0])

    async def test(c: McpConnection):
        with pytest.raises(ToolFailed):
            await c.call("crash", {}, 10)
        process.wait()
        with pytest.raises(ToolFailed, match=r"gone|failed"):
            await c.call("echo", {"text": "x"}, 3)  # down: said at once
        argv = [sys.executable, str(SERVER), str(port)]
        again = await asyncio.to_thread(subprocess.Popen, argv, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                await asyncio.sleep(0.3)
                try:
                    answer = await c.call("echo", {"text": "back"}, 3)
                    break
                except ToolFailed:
                    continue
            assert answer["structured"] == {"result": "back"}
        finally:
            again.kill()
            again.wait()

    try:
        run(url, test)
    finally:
        process.kill()
        process.wait()
