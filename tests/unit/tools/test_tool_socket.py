"""The tool socket reads a sandbox's requests strictly, and ``sbx_tools`` makes plain functions.

Each test serves a real ``ToolEndpoint`` on a Unix socket (in a run directory
as a sandbox's) in front of a stand-in caller, and talks to it as a kernel
would: raw bytes for hostile requests, the ``sbx_tools`` module for the rest.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from gateway.tools import endpoint as endpoint_module
from gateway.tools import sbx_tools
from gateway.tools.endpoint import CallRefused, ToolEndpoint

TOOLS = [
    {
        "name": "query_warehouse",
        "description": "Run one read-only SELECT.",
        "input_schema": {
            "type": "object",
            "properties": {
                "sql": {"type": "string", "description": "the query"},
                "limit": {"type": "integer", "default": 100},
            },
            "required": ["sql"],
        },
    },
    {"name": "post-result", "description": "Post.", "input_schema": {"type": "object"}},
]


class Served:
    """An endpoint on a loop of its own thread, so blocking ``sbx_tools`` calls can reach it."""

    def __init__(self, max_connections: int = 32) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="t38", dir="/tmp"))
        (self.dir / "run").mkdir()
        self.calls: list[tuple[str, dict]] = []
        self.release = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.endpoint = ToolEndpoint(self._listing, self._call, max_connections)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.run(self.endpoint.open("s1", self.dir / "run"))
        sbx_tools.SOCKET = str(self.dir / "run" / "tools.sock")

    async def _listing(self, session_id: str) -> bytes:
        return json.dumps({"tools": TOOLS}).encode()

    async def _call(self, session_id: str, tool: str, arguments: dict) -> dict:
        self.calls.append((tool, arguments))
        if tool == "refused":
            raise CallRefused(403, "denied", "the policy refuses refused")
        if tool == "broken":
            raise CallRefused(502, "tool_error", "broken failed: no such table")
        if tool == "slow":
            await asyncio.to_thread(self.release.wait, 10)
        return {"result": {"tool": tool, "arguments": arguments}}

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def raw(self, data: bytes, close: bool = True) -> bytes:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(sbx_tools.SOCKET)
            s.sendall(data)
            if close:
                s.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
            return answer

    def close(self) -> None:
        async def stop() -> None:
            self.endpoint.stop()
            await asyncio.sleep(0.05)

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def served():
    s = Served()
    yield s
    s.release.set()
    s.close()


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_tools_are_plain_functions_with_signatures_and_docstrings_from_their_schemas(served):
    from_module = sbx_tools.__getattr__("query_warehouse")
    assert str(inspect.signature(from_module)) == "(sql, *, limit=100)"
    assert "Run one read-only SELECT." in from_module.__doc__
    assert "sql (str): the query" in from_module.__doc__
    assert from_module("SELECT 1") == {"tool": "query_warehouse", "arguments": {"sql": "SELECT 1"}}
    assert from_module("x", limit=5)["arguments"] == {"sql": "x", "limit": 5}
    with pytest.raises(TypeError):
        from_module(limit=5)  # sql is required: refused in the kernel, never sent
    assert sbx_tools.python_name("post-result") == "post_result"
    assert sbx_tools.post_result() == {"tool": "post-result", "arguments": {}}
    assert sbx_tools.call("post-result", x=1)["arguments"] == {"x": 1}
    assert "query_warehouse" in dir(sbx_tools)
    with pytest.raises(AttributeError, match="no tool named 'nope'"):
        sbx_tools.__getattr__("nope")


def test_a_refusal_and_a_tools_error_raise_clear_exceptions(served):
    with pytest.raises(sbx_tools.ToolRefused, match="the policy refuses refused"):
        sbx_tools.call("refused")
    with pytest.raises(sbx_tools.ToolError, match="no such table") as raised:
        sbx_tools.call("broken")
    assert not isinstance(raised.value, sbx_tools.ToolRefused)


def test_calls_run_from_threads_and_asyncio_at_once(served):
    results = []
    threads = [
        threading.Thread(target=lambda n=n: results.append(sbx_tools.call("t", n=n)))
        for n in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(r["arguments"]["n"] for r in results) == list(range(8))

    async def gathered():
        return await asyncio.gather(*(sbx_tools.acall("t", n=n) for n in range(8)))

    assert [r["arguments"]["n"] for r in asyncio.run(gathered())] == list(range(8))


@pytest.mark.parametrize(
    "request_bytes, code",
    [
        (b"DELETE /tools HTTP/1.1\r\n\r\n", 400),
        (b"GET http://evil/tools HTTP/1.1\r\n\r\n", 400),
        (b"POST /call/../../etc HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 400),
        (b"POST /call/t HTTP/1.1\r\n\r\n", 400),  # no length
        (b"POST /call/t HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST /call/t HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400),
        (b"POST /call/t HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /call/t HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413),
        (b"POST /call/t HTTP/1.1\r\nContent-Length: 3\r\n\r\n{x}", 400),
        (b"POST /call/t HTTP/1.1\r\nContent-Length: 2\r\n\r\n[]", 400),
        (b'POST /call/t HTTP/1.1\r\nContent-Length: 17\r\n\r\n{"arguments": []}', 400),
        (b"GET /tools HTTP/1.1\r\nX: " + b"a" * 10000 + b"\r\n\r\n", 431),
        (b"GET /tools HTTP/1.1\r\nX: \xff\r\n\r\n", 400),
    ],
)
def test_malformed_or_oversized_requests_get_a_clear_error_and_reach_no_tool(
    served, request_bytes, code
):
    answer = served.raw(request_bytes)
    assert status(answer) == code, answer
    assert b'"error"' in answer
    assert served.calls == []


def test_deeply_nested_arguments_are_refused_not_a_crash(served):
    body = b'{"arguments": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    head = f"POST /call/t HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    assert status(served.raw(head + body)) == 400
    assert sbx_tools.call("t", ok=1)["arguments"] == {"ok": 1}  # it still answers


def test_a_request_that_never_ends_is_cut_after_the_head_timeout(served, monkeypatch):
    monkeypatch.setattr(endpoint_module, "HEAD_TIMEOUT", 0.3)
    started = time.monotonic()
    answer = served.raw(b"POST /call/t HTTP/1.1\r\nContent-Length: 10\r\n\r\n{", close=False)
    assert status(answer) == 408 and time.monotonic() - started < 5


def test_a_flood_of_connections_is_refused_past_the_bound_and_others_still_answer():
    served = Served(max_connections=4)
    try:
        held = []
        for _ in range(4):  # hold four slow calls open
            t = threading.Thread(target=lambda: held.append(sbx_tools.call("slow")))
            t.start()
        deadline = time.monotonic() + 5
        while len(served.calls) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(sbx_tools.ToolRefused, match="more than 4 connections"):
            sbx_tools.call("t")
        served.release.set()
        deadline = time.monotonic() + 5
        while len(held) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sbx_tools.call("t")["tool"] == "t"
    finally:
        served.release.set()
        served.close()


def test_the_socket_is_served_in_the_run_directory_for_the_sandbox_user(served):
    path = Path(sbx_tools.SOCKET)
    assert path.is_socket() and path.stat().st_mode & 0o777 == 0o777
    served.loop.call_soon_threadsafe(served.endpoint.close, "s1")
    time.sleep(0.1)
    with pytest.raises(sbx_tools.ToolError, match="did not answer"):
        sbx_tools.call("t")


def test_a_kernel_that_reads_nothing_does_not_hold_the_gateway(served, monkeypatch):
    monkeypatch.setattr(endpoint_module, "WRITE_TIMEOUT", 0.2)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(sbx_tools.SOCKET)
        s.sendall(b"GET /tools HTTP/1.1\r\n\r\n")
        time.sleep(0.5)  # never reads
    assert sbx_tools.tools()[0]["name"] == "query_warehouse"


def test_arguments_nested_past_the_bound_are_refused_before_any_tool_sees_them(served):
    deep: object = 1
    for _ in range(500):  # parses, but would recurse through every walk the gateway makes
        deep = [deep]
    with pytest.raises(sbx_tools.ToolRefused, match="nested deeper than 64"):
        sbx_tools.call("t", deep=deep)
    assert served.calls == []


@pytest.mark.parametrize(
    "schema",
    [[], {"properties": ["a", "b"]}, {"properties": {"a": 1}, "required": "a"}, "x"],
)
def test_a_crafted_input_schema_still_makes_a_callable_function(schema):
    fn = sbx_tools.function({"name": "odd", "description": None, "input_schema": schema})
    assert fn.__name__ == "odd" and callable(fn)


def test_a_tool_whose_argument_is_called_name_can_be_called(served):
    """``call(name, **arguments)`` took a tool's own ``name`` argument for the tool's name."""
    fn = sbx_tools.function({"name": "greet", "input_schema": {
        "properties": {"name": {"type": "string"}}, "required": ["name"]}})  # fmt: skip
    assert fn("Ada") == {"tool": "greet", "arguments": {"name": "Ada"}}
    assert sbx_tools.call("greet", name="Ada")["arguments"] == {"name": "Ada"}


def test_the_kernel_waits_for_the_gateways_answer_however_long_an_approver_takes(
    served, monkeypatch
):
    """The gateway bounds a call (an approver's time, then call_timeout) and always answers;
    a timeout of the kernel's own (600 s, as long as approval_timeout) gave up on a call
    approved late, which then ran while the code was told the socket did not answer."""
    monkeypatch.setattr(sbx_tools, "TIMEOUT", 0.3, raising=False)  # as if 600 s had passed
    threading.Timer(0.8, served.release.set).start()
    assert sbx_tools.call("slow")["tool"] == "slow"
