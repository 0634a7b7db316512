"""The gateway as an MCP client of a session's streamable-HTTP servers.

Each server gets one long-lived connection (``McpConnection``): the MCP
SDK's client runs in a task of its own (its task group must be entered and
left in one task), and calls from any task go through it. What a server
sends is hostile as much as a sandbox's bytes: every HTTP response is cut
off past ``max_bytes`` (``_Bounded``) before the SDK parses it, each request
goes only to an address the operator allows (``_GuardedTransport``: no
loopback, private or link-local address, nor the gateway's own port, unless
``tool_allow_ranges`` says so), a call is
bounded in time, and a server that crashes fails the calls in flight and
the next ones with a clear error instead of hanging them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx2
from mcp import Client
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client

from .specs import McpServer

log = logging.getLogger(__name__)

Refusal = Callable[[ipaddress.IPv4Address | ipaddress.IPv6Address, int], str | None]
MAX_TOOLS = 256  # listed by one server
CONNECT_TIMEOUT = 15.0
RECONNECT_EVERY = 5.0  # seconds between attempts to reach a server that went away


class ToolFailed(Exception):
    """A call did not get an answer: the server failed, timed out, or answered too much."""


class _Bounded(httpx2.AsyncByteStream):
    """A response body that fails once it passes ``limit`` bytes."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self.inner, self.limit = inner, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.inner:
            seen += len(chunk)
            if seen > self.limit:
                raise httpx2.StreamError(f"the MCP server answered more than {self.limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class _GuardedTransport(httpx2.AsyncBaseTransport):
    """Each request sent to an address ``refusal`` allows (the name resolved once, here, and
    the request pinned to that address; TLS still checks the name), its body bounded."""

    def __init__(self, limit: int, refusal: Refusal | None) -> None:
        self.inner, self.limit, self.refusal = httpx2.AsyncHTTPTransport(), limit, refusal

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self.refusal is not None:
            request = await self._pinned(request)
        response = await self.inner.handle_async_request(request)
        response.stream = _Bounded(response.stream, self.limit)  # type: ignore[arg-type]
        return response

    async def _pinned(self, request: httpx2.Request) -> httpx2.Request:
        assert self.refusal is not None
        url = request.url
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except socket.gaierror as e:
            raise httpx2.ConnectError(f"{host} does not resolve ({e})") from None
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
        for address in addresses:
            why = self.refusal(address, port)
            if why is not None:
                raise httpx2.ConnectError(
                    f"{host} is refused: {why.split(', which')[0]}; the operator's "
                    "tool_allow_ranges may allow it"
                )
        if url.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": host}
        request.url = url.copy_with(host=str(addresses[0]))
        return request

    async def aclose(self) -> None:
        await self.inner.aclose()


class McpConnection:
    """One session's connection to one MCP server: its tools, and calls to them."""

    def __init__(
        self,
        server: McpServer,
        headers: Mapping[str, str],
        max_bytes: int,
        refusal: Refusal | None = None,
    ) -> None:
        """``headers``: resolved (secrets in); ``max_bytes``: the most one response may hold;
        ``refusal(address, port)``: why an address may not be reached (None: any may)."""
        self.server = server
        self.refusal = refusal
        self.headers = dict(headers)
        self.max_bytes = max_bytes
        self.tools: list[dict[str, Any]] = []
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._stop = asyncio.Event()
        self._gone: str | None = None  # why the connection ended, once it has
        self._reconnecting = asyncio.Lock()
        self._tried = time.monotonic()  # the last attempt to connect

    async def open(self) -> list[dict[str, Any]]:
        """Connect, list the server's tools; ToolFailed saying why if it cannot."""
        self._ready = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._run())
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await asyncio.shield(self._ready)
        except TimeoutError:
            await self._halt()
            raise ToolFailed(f"no answer within {CONNECT_TIMEOUT:g} s") from None
        except BaseException:
            await self._halt()
            raise
        return self.tools

    async def _halt(self) -> None:
        """End a connection that never became ready."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    async def _reconnect(self) -> Client:
        """The connection made again after its server went away: tried at most every
        RECONNECT_EVERY seconds, so a server that is down is not hammered; ToolFailed
        saying why while there is none."""
        async with self._reconnecting:
            if self._client is not None:
                return self._client
            gone = f"MCP server {self.server.name} is gone ({self._gone})"
            if self._stop.is_set() or time.monotonic() - self._tried < RECONNECT_EVERY:
                raise ToolFailed(gone)
            self._tried = time.monotonic()
            try:
                await self.open()
            except ToolFailed as e:
                self._gone = str(e)
                raise ToolFailed(f"{gone}; reaching it again failed: {e}") from None
            assert self._client is not None
            return self._client

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[TransportStreams]:
        """The MCP SDK's streams to the server: streamable HTTP, guarded and bounded."""
        http = httpx2.AsyncClient(
            headers=self.headers,
            timeout=httpx2.Timeout(CONNECT_TIMEOUT, read=None),  # calls: bounded each on its own
            transport=_GuardedTransport(self.max_bytes, self.refusal),
        )
        async with http, streamable_http_client(self.server.url, http_client=http) as streams:
            yield streams

    async def _run(self) -> None:
        assert self._ready is not None
        try:
            async with Client(self._transport()) as c:
                c.session.validate_tool_result = _unchecked  # type: ignore[method-assign]
                listed = await c.list_tools()
                self.tools = [_tool(t) for t in listed.tools[:MAX_TOOLS]]
                self._client = c
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as e:  # an anyio task group's ExceptionGroup too
            self._gone = _reason(e)
            if not self._ready.done():
                self._ready.set_exception(ToolFailed(self._gone))
            if not isinstance(e, Exception | asyncio.CancelledError):
                raise
        finally:
            self._client = None
            self._gone = self._gone or "the connection was closed"

    async def call(self, name: str, arguments: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """A tool's answer as ``{"content", "structured", "is_error"}``; ToolFailed if none."""
        client = self._client or await self._reconnect()
        assert self._task is not None
        call = asyncio.ensure_future(client.call_tool(name, dict(arguments)))
        try:
            done, _ = await asyncio.wait(
                (call, self._task), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:
            call.cancel()
            raise
        if call not in done:
            call.cancel()
            if self._task in done:
                raise ToolFailed(f"MCP server {self.server.name} went away ({self._gone})")
            raise ToolFailed(f"{name} did not answer within {timeout:g} s (call_timeout)")
        try:
            result = call.result()
        except Exception as e:
            raise ToolFailed(f"MCP server {self.server.name} failed: {_reason(e)}") from None
        return {
            "content": [c.model_dump(mode="json", exclude_none=True) for c in result.content],
            "structured": result.structured_content,
            "is_error": bool(result.is_error),
        }

    async def rest(self) -> None:
        """End the connection (a stdio server's sandbox with it) till the next call makes it
        again, at once: its session is paused deep."""
        await self.close()
        self._stop = asyncio.Event()
        self._gone, self._tried = "its session was paused", -math.inf

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None and not self._task.done():
            try:
                async with asyncio.timeout(5):
                    await asyncio.shield(self._task)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task


async def _unchecked(name: str, result: Any) -> None:
    """Answers pass unchecked against their tool's output schema: a server's schema is its
    own word, and checking it (its patterns backtracking) would hold the loop all share."""


def _tool(tool: Any) -> dict[str, Any]:
    annotations = (
        tool.annotations.model_dump(by_alias=True, exclude_none=True) if (tool.annotations) else {}
    )
    return {
        "name": tool.name,
        "description": tool.description or "",
        "input_schema": tool.input_schema or {"type": "object"},
        "annotations": annotations,
    }


def _reason(error: BaseException) -> str:
    """The innermost cause a person can read (anyio wraps failures in exception groups)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error) or error.__class__.__name__
    return text[:300]
