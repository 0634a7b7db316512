"""The per-session tool socket: a sandbox's one way to its tools, HTTP over a Unix socket.

Served in the session's run directory (``/run/sbx/tools.sock`` inside), as
the package gate's socket is, so the sandbox keeps ``--network none``. Any
kernel speaks it (``curl --unix-socket /run/sbx/tools.sock http://t/tools``)::

    GET  /tools              -> 200 {"tools": [{"name", "description", "input_schema", ...}]}
    POST /call/<tool>        {"arguments": {...}}
                             -> 200 {"result": ..., "content": [...]}
                             -> 4xx/5xx {"error": {"code", "message"}}

Nothing from the sandbox is trusted: one request per connection, its head
bounded in size and time, its body by ``Content-Length`` alone (no chunks)
and ``max_body``, JSON parsed once with its nesting bounded, and a session's
open connections capped (429 past that), so a flood costs it its own calls
and no one else's. The gateway answers, whatever the handler does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..nofollow import SessionSockets
from .specs import TOOL_NAME

log = logging.getLogger(__name__)

SOCKET_NAME = "tools.sock"  # in the session's run directory (/run/sbx inside)
MAX_HEAD = 8 * 1024
MAX_BODY = 256 * 1024
MAX_DEPTH = 64  # levels of nesting in a call's arguments
HEAD_TIMEOUT = 10.0
WRITE_TIMEOUT = 10.0
_LINE = re.compile(rf"(GET|POST) (/tools|/call/({TOOL_NAME})) HTTP/1\.[01]")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Header Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class CallRefused(Exception):
    """Answers a call with ``status`` and an error the kernel raises (``code``, ``message``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


Listing = Callable[[str], Awaitable[bytes]]  # the answer to GET /tools, encoded
Caller = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]


class ToolEndpoint:
    """Every session's tool socket; calls are handed to ``call(session_id, tool, arguments)``."""

    def __init__(self, listing: Listing, call: Caller, max_connections: int = 32) -> None:
        self.listing = listing
        self.call = call
        self.max_connections = max_connections
        # Each made out of the sandbox's reach and put in whole (``nofollow.bind_socket``).
        self.sockets = SessionSockets(SOCKET_NAME, self._serve, MAX_HEAD)
        self._open: dict[str, int] = {}

    def serves(self, session_id: str) -> bool:
        return self.sockets.serves(session_id)

    async def open(self, session_id: str, run_dir: Path) -> None:
        await self.sockets.open(session_id, run_dir)

    def close(self, session_id: str) -> None:
        self.sockets.close(session_id)

    def stop(self) -> None:
        self.sockets.stop()

    async def _serve(
        self, session_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        opened = self._open.get(session_id, 0)
        try:
            if opened >= self.max_connections:
                why = f"more than {self.max_connections} connections to the tool socket at once"
                raise CallRefused(429, "too_many_calls", f"{why}; wait for some to end")
            self._open[session_id] = opened + 1
            try:
                status, doc = 200, await self._answer(session_id, reader)
            finally:
                self._open[session_id] -= 1
                if not self._open[session_id]:
                    del self._open[session_id]
        except CallRefused as e:
            status, doc = e.status, {"error": {"code": e.code, "message": e.message}}
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.close()
            return
        except Exception:
            log.exception("the tool socket of session %s failed", session_id)
            status, doc = 502, {"error": {"code": "internal", "message": "the gateway failed"}}
        await _send(writer, status, doc)

    async def _answer(
        self, session_id: str, reader: asyncio.StreamReader
    ) -> dict[str, Any] | bytes:
        tool, body = await _read(reader)
        if tool is None:
            return await self.listing(session_id)
        return await self.call(session_id, tool, _arguments(body))


async def _read(reader: asyncio.StreamReader) -> tuple[str | None, bytes]:
    """The tool named (None: the listing) and the body; CallRefused unless strictly well formed."""
    try:
        async with asyncio.timeout(HEAD_TIMEOUT):
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head[:-4].decode("ascii").split("\r\n")
            match = _LINE.fullmatch(lines[0])
            if match is None:
                raise CallRefused(400, "bad_request", "send GET /tools or POST /call/<tool>")
            length = _content_length(lines[1:])
            if match[1] == "GET":
                return None, b""
            if length is None:
                raise CallRefused(400, "bad_request", "a call needs Content-Length")
            if length > MAX_BODY:
                raise CallRefused(
                    413,
                    "too_large",
                    f"arguments over {MAX_BODY} bytes; pass "
                    "large data in a file of the workspace and its path",
                )
            return match[3], await reader.readexactly(length)
    except TimeoutError:
        why = f"the request did not arrive within {HEAD_TIMEOUT:g} s"
        raise CallRefused(408, "timeout", why) from None
    except asyncio.LimitOverrunError:
        raise CallRefused(431, "too_large", f"request head over {MAX_HEAD} bytes") from None
    except UnicodeDecodeError:
        raise CallRefused(400, "bad_request", "the request head is not ASCII") from None


def _content_length(lines: list[str]) -> int | None:
    length = None
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise CallRefused(400, "bad_request", "malformed header line")
        name, value = name.lower(), value.strip()
        if name == "transfer-encoding":
            raise CallRefused(400, "bad_request", "chunked bodies are not accepted")
        if name == "content-length":
            if length is not None or not value.isdigit() or len(value) > 9:
                raise CallRefused(400, "bad_request", "one Content-Length of digits")
            length = int(value)
    return length


def _arguments(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body) if body else {}
    except (ValueError, RecursionError):
        raise CallRefused(400, "bad_request", 'the body is {"arguments": {...}} as JSON') from None
    if not isinstance(doc, dict) or set(doc) - {"arguments"}:
        raise CallRefused(400, "bad_request", 'the body is {"arguments": {...}} as JSON')
    arguments = doc.get("arguments", {})
    if not isinstance(arguments, dict):
        raise CallRefused(400, "bad_request", "arguments must be a JSON object")
    if depth(arguments) > MAX_DEPTH:
        raise CallRefused(400, "bad_request", f"arguments nested deeper than {MAX_DEPTH} levels")
    return arguments


def depth(value: Any) -> int:
    """How deeply ``value`` nests, walked without recursion (each walk after this recurses)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            break
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        stack.extend((child, level + 1) for child in children)
    return deepest


async def _send(writer: asyncio.StreamWriter, status: int, doc: dict[str, Any] | bytes) -> None:
    body = doc if isinstance(doc, bytes) else json.dumps(doc, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(ConnectionError, OSError, TimeoutError):
        writer.write(head + body)
        async with asyncio.timeout(WRITE_TIMEOUT):  # a kernel that reads nothing lets go
            await writer.drain()
    writer.close()
