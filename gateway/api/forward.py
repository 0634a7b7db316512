"""Requests for a session another gateway owns, passed on to that gateway.

Gateways sharing a store record where each answers (``Store.announce``); a
request for a session this gateway does not hold goes to the gateway whose
lease holds it, and the owner's answer comes back unchanged: status,
headers, body (a streamed one piece by piece), or every WebSocket message
both ways. The owner checks the caller's token again (the gateways of a
deployment share their tokens) and audits the request; the forwarder does
not, so each request is one audit event. A passed-on request carries
``FORWARDED``, so it is never passed on again: if the owner changed
meanwhile, the client gets the owner's 404 and asks again, and any gateway
then finds the new owner. An owner that does not answer is a 503
``owner_unavailable``.

Uploads stream their body and are not passed on: send them to the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
import urllib.parse
from typing import Any

import tornado.httpclient
import tornado.iostream
import tornado.tcpclient
import tornado.web
import tornado.websocket
from tornado import httputil
from tornado.http1connection import HTTP1Connection, HTTP1ConnectionParameters

from ..errors import OwnerUnavailable

log = logging.getLogger(__name__)

FORWARDED = "X-Sbx-Forwarded"
# Seconds a connect to the owner may take. Gateways share a network: one that has
# not accepted by then is gone (a killed Swarm task's address answers nothing at
# all, so the default 20 s would hold every request until then).
CONNECT_TIMEOUT = 2.0
_BODIES = ("POST", "PUT", "PATCH")
# Headers of one hop only, and those Tornado sets itself.
_HOP = frozenset(
    ("connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host", "content-length",
     "date", "server", "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
     "sec-websocket-accept", "expect", "proxy-connection")
)  # fmt: skip
_IDLE_KEPT = 16  # idle connections kept per owner: more are closed
_FLUSH_AT = 64 * 1024  # a reply of known length is passed on in pieces this big
_PARAMS = HTTP1ConnectionParameters(no_keep_alive=False, decompress=False)


def passed_on(request: Any) -> bool:
    """Whether another gateway passed this request on (so it is answered here, or 404)."""
    return FORWARDED in request.headers


def _headers(request: Any) -> httputil.HTTPHeaders:
    """The caller's headers but those of its hop, marked as passed on."""
    headers = httputil.HTTPHeaders()
    for name, value in request.headers.get_all():
        if name.lower() not in _HOP:
            headers.add(name, value)
    headers[FORWARDED] = "1"
    return headers


class Forwarder:
    """Passes HTTP requests on to their owners, over connections kept open between requests.

    A connection per request cost the forwarding gateway most of a forwarded
    request's overhead (a resolver thread, connect, accept, close on both
    sides; bench_gateways). Kept connections idle longer than ``idle`` are
    closed here, before the owner's ``idle_connection_timeout`` would close
    them there; one the owner closed anyway (it restarted) is seen closed
    before it is used again.
    """

    def __init__(self, idle: float = 30.0) -> None:
        self.idle = idle
        self._idle: dict[str, list[tuple[tornado.iostream.IOStream, float]]] = {}
        self._tcp = tornado.tcpclient.TCPClient()

    async def forward(
        self, handler: tornado.web.RequestHandler, owner: str, timeout: float
    ) -> bool:
        """Answer with the reply of ``owner`` (a gateway's base URL); whether it had the session.

        A 404 from the owner (it lost the session meanwhile) is not answered:
        the caller asks where the session is again.
        """
        request = handler.request
        stream = await self._connection(owner)
        conn = HTTP1Connection(stream, True, _PARAMS)
        reply = _Reply(handler, owner, stream)
        expire = asyncio.get_running_loop().call_later(timeout, reply.expire)
        try:
            headers = _headers(request)
            headers["Host"] = urllib.parse.urlsplit(owner).netloc
            body = request.body
            if body or request.method in _BODIES:
                headers["Content-Length"] = str(len(body))
            start = httputil.RequestStartLine(request.method, request.uri, "HTTP/1.1")
            conn.write_headers(start, headers, body or None)
            conn.finish()
            open_after = await conn.read_response(reply)
        except OSError as e:  # reset, cut off, timed out
            stream.close()
            return reply.failed("timed out" if reply.expired else e)
        finally:
            expire.cancel()
        if not reply.done:  # malformed (Tornado logged it), or cut off
            stream.close()
            return reply.failed("its reply was cut off or malformed")
        if open_after and reply.reusable:
            self._keep(owner, stream)
        else:
            stream.close()
        return reply.answered

    async def _connection(self, owner: str) -> tornado.iostream.IOStream:
        """A kept connection to ``owner`` still open, or a new one."""
        idle = self._idle.get(owner)
        now = time.monotonic()
        while idle:
            stream, since = idle.pop()
            if now - since < self.idle and _still_open(stream):
                return stream
            stream.close()
        url = urllib.parse.urlsplit(owner)
        secure = url.scheme == "https"
        try:
            stream = await self._tcp.connect(
                url.hostname or "",
                url.port or (443 if secure else 80),
                ssl_options=ssl.create_default_context() if secure else None,
                timeout=CONNECT_TIMEOUT,
            )
        except OSError as e:  # refused, unreachable, timed out
            raise _unreachable(owner, e) from e
        stream.set_nodelay(True)
        return stream

    def _keep(self, owner: str, stream: tornado.iostream.IOStream) -> None:
        idle = self._idle.setdefault(owner, [])
        if len(idle) >= _IDLE_KEPT:
            stream.close()
            return
        idle.append((stream, time.monotonic()))

    def close(self) -> None:
        for idle in self._idle.values():
            for stream, _ in idle:
                stream.close()
        self._idle.clear()
        self._tcp.close()


def _still_open(stream: tornado.iostream.IOStream) -> bool:
    """Whether an idle connection is still open: nothing to read, not even its end."""
    if stream.closed():
        return False
    if isinstance(stream, tornado.iostream.SSLIOStream):
        return True  # a peek would read TLS records: its use tells
    try:
        stream.socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True  # nothing there: open
    except OSError:
        return False
    return False  # its end (the owner closed it), or bytes nobody asked for


class _Reply(httputil.HTTPMessageDelegate):
    """The owner's reply, passed on to the caller as it comes; a 404 is kept, to be looked at."""

    def __init__(self, handler: tornado.web.RequestHandler, owner: str, upstream: Any) -> None:
        self.handler = handler
        self.owner = owner
        self.upstream = upstream
        self.streamed = False  # chunked by the owner: each piece is passed on as it comes
        self.held: list[bytes] | None = None  # a 404's body
        self.pending = 0  # bytes written to the handler, not flushed yet
        self.reusable = False
        self.done = False
        self.answered = True
        self.gone = False  # the caller left mid-reply
        self.sent = False  # part of the reply has gone to the caller
        self.expired = False

    def failed(self, error: Any) -> bool:
        """The owner's reply did not come whole: 503 if nothing of it was sent yet.

        Otherwise the caller's connection is closed, so that a cut-off reply
        does not look whole.
        """
        if not (self.gone or self.sent):
            raise _unreachable(self.owner, error)
        self._drop()
        return True

    def _drop(self) -> None:
        """End the caller's side unanswered: its connection closed, the handler finished."""
        self.handler.request.connection.close()
        with contextlib.suppress(Exception):
            self.handler.finish()  # so that the handler does not answer here as well

    def expire(self) -> None:
        self.expired = True
        self.upstream.close()

    def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> None:
        assert isinstance(start_line, httputil.ResponseStartLine)
        self.reusable = start_line.version == "HTTP/1.1" and (
            headers.get("Connection", "").lower() != "close"
        )
        if start_line.code == 404:
            self.held = []
            self.head = (start_line, headers)
            return
        self._answer(start_line, headers)

    def _answer(
        self, start_line: httputil.ResponseStartLine, headers: httputil.HTTPHeaders
    ) -> None:
        handler = self.handler  # its default headers are the owner's too: no clear() needed
        handler.set_status(start_line.code, start_line.reason)
        self.streamed = "Content-Length" not in headers
        head = handler.request.method == "HEAD"
        seen = set()
        for name, value in headers.get_all():
            lower = name.lower()
            if lower not in _HOP or (lower == "content-length" and not head):
                if lower in seen:
                    handler.add_header(name, value)
                else:
                    handler.set_header(name, value)  # in place of this gateway's default
                    seen.add(lower)

    def data_received(self, chunk: bytes) -> Any:
        if self.held is not None:
            self.held.append(chunk)
            return None
        if self.gone:
            return None
        self.handler.write(chunk)
        self.pending += len(chunk)
        if self.streamed or self.pending >= _FLUSH_AT:
            self.pending = 0
            return self._flush()
        return None

    async def _flush(self) -> None:
        self.sent = True
        try:
            await self.handler.flush()
        except tornado.iostream.StreamClosedError:
            self.gone = True  # the caller left: stop the owner's work on its behalf too
            self.upstream.close()

    def finish(self) -> None:
        self.done = True
        if self.held is not None:
            body = b"".join(self.held)
            if b"session_not_found" in body:
                self.answered = False
                return
            self.held = None
            self._answer(*self.head)
            self.handler.write(body)
        if self.gone:
            self._drop()
        else:
            self.handler.finish()


def _unreachable(owner: str, error: Any) -> OwnerUnavailable:
    return OwnerUnavailable(
        f"the gateway that owns this session ({owner}) does not answer ({error}); "
        "if it is gone, another gateway takes the session over within seconds: try again"
    )


async def connect_upstream(
    handler: tornado.websocket.WebSocketHandler, owner: str
) -> tornado.websocket.WebSocketClientConnection | None:
    """Open the same WebSocket on the owner, before the client's upgrade is accepted.

    None if the owner refused it (the session moved or ended meanwhile): the
    request is then answered here.
    """
    url = "ws" + owner.removeprefix("http") + handler.request.uri
    request = tornado.httpclient.HTTPRequest(
        url, headers=_headers(handler.request), connect_timeout=CONNECT_TIMEOUT
    )
    try:
        return await tornado.websocket.websocket_connect(request)
    except tornado.httpclient.HTTPClientError as e:
        if e.code == 599:  # no answer at all: timed out
            raise _unreachable(owner, e) from e
        return None
    except OSError as e:
        raise _unreachable(owner, e) from e


def relay_socket(
    handler: tornado.websocket.WebSocketHandler,
    upstream: tornado.websocket.WebSocketClientConnection,
) -> None:
    """Make the handler a pipe to ``upstream``: its own open/message/close are bypassed."""

    async def pump() -> None:
        while (message := await upstream.read_message()) is not None:
            if handler.ws_connection is None or handler.ws_connection.is_closing():
                break
            handler.write_message(message, binary=isinstance(message, bytes))
        handler.close(upstream.close_code, upstream.close_reason)

    def open(*args: Any, **kwargs: Any) -> None:
        handler.set_nodelay(True)
        handler.pump = asyncio.get_running_loop().create_task(pump())  # type: ignore[attr-defined]

    def on_message(message: str | bytes) -> Any:
        return upstream.write_message(message, binary=isinstance(message, bytes))

    def on_close() -> None:
        upstream.close(handler.close_code, handler.close_reason)

    # Instance attributes shadow the handler's methods: Tornado calls these instead.
    handler.open = open  # type: ignore[method-assign]
    handler.on_message = on_message  # type: ignore[method-assign]
    handler.on_close = on_close  # type: ignore[method-assign]
