"""The HTTP server's first look at a request, before Tornado reads its body.

Tornado reads a whole body before a handler runs, so a handler's token check
comes too late to spare the memory. Here the token is checked from the
headers: a caller with a valid one may send up to the server's limit (each
handler checks its own once the body is in, so the caller reads its 413
rather than a reset); anyone else may send at most ``max_anonymous_body``,
within ``body_timeout``. A bigger (or chunked) body from them is answered
401 at once, unread, and the connection closed. Clients that send ``Expect:
100-continue`` read that answer before sending anything; others may see the
connection reset while they send.
"""

from __future__ import annotations

import logging
import re
import sys
import urllib.parse
from collections.abc import Awaitable, Callable

import tornado.web
from tornado import httputil

from ..access.audit import AuditLog
from ..access.auth import Authenticator, presented_token
from ..config import Settings
from ..errors import Unauthorized
from ..limits import format_size
from .base import error_json


class Edge(httputil.HTTPServerConnectionDelegate):
    """Wraps the application: lets a request's body in only as far as its caller may send."""

    def __init__(
        self,
        app: tornado.web.Application,
        auth: Authenticator,
        audit: AuditLog,
        settings: Settings,
        max_body: int,
        also_accepts: Callable[
            [httputil.RequestStartLine, httputil.HTTPHeaders], bool
        ] = lambda start_line, headers: False,
    ) -> None:
        self.app = app
        # Other credentials a handler checks in full (the E2B edge's API key and sandbox tokens).
        self.also_accepts = also_accepts
        self.auth = auth
        self.audit = audit
        self.max_body = max_body  # what an authenticated caller may send (a handler may take less)
        self.max_anonymous_body = settings.max_anonymous_body
        self.body_timeout = settings.body_timeout
        _hide_header_values()

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        return _Gate(self, request_conn, self.app.start_request(server_conn, request_conn))

    def on_close(self, server_conn: object) -> None:
        self.app.on_close(server_conn)


class _Gate(httputil.HTTPMessageDelegate):
    """One request: passed on to the application, unless its caller sends too much unknown."""

    def __init__(
        self, edge: Edge, conn: httputil.HTTPConnection, inner: httputil.HTTPMessageDelegate
    ) -> None:
        self.edge = edge
        self.conn = conn  # an HTTP1Connection: the server speaks HTTP/1 only
        self.inner = inner
        self.refused = False

    def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> Awaitable[None] | None:
        assert isinstance(start_line, httputil.RequestStartLine)
        path, _, query = start_line.path.partition("?")
        token = presented_token(headers.get("Authorization"), _query_token(query))
        try:
            self.edge.auth.authenticate(token or headers.get("X-API-Key"))
        except Unauthorized as e:
            if self.edge.also_accepts(start_line, headers):
                self.conn.set_max_body_size(self.edge.max_body)  # type: ignore[attr-defined]
                return self.inner.headers_received(start_line, headers)
            self.conn.set_body_timeout(self.edge.body_timeout)  # type: ignore[attr-defined]
            if _body_over(headers, self.edge.max_anonymous_body):
                self._refuse(start_line.method, path, token, e)
                return None
        else:
            self.conn.set_max_body_size(self.edge.max_body)  # type: ignore[attr-defined]
        return self.inner.headers_received(start_line, headers)

    def _refuse(self, method: str, path: str, token: str | None, error: Unauthorized) -> None:
        """Answer 401 from the headers and close the connection, the body unread."""
        remote = getattr(getattr(self.conn, "context", None), "remote_ip", None)
        self.edge.audit.auth_failure(remote, method, path, token)
        self.refused = True
        limit = format_size(self.edge.max_anonymous_body)
        body = error_json(
            error.code,
            f"{error.message}; without a valid token a request may carry at most {limit} of body",
        ).encode()
        self.conn.write_headers(
            httputil.ResponseStartLine("HTTP/1.1", 401, "Unauthorized"),
            httputil.HTTPHeaders(
                {
                    "Content-Type": "application/json; charset=UTF-8",
                    "Content-Length": str(len(body)),
                    "WWW-Authenticate": 'Bearer realm="sandbox-gateway"',
                    "Connection": "close",
                }
            ),
            body,
        )
        self.conn.finish()  # before the body is read: Tornado closes the connection once sent
        # Tornado then reads on from the closed stream, which ends quietly; under its size
        # limit it would log a "Malformed HTTP message" for every refusal instead.
        self.conn.set_max_body_size(sys.maxsize)  # type: ignore[attr-defined]

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        return None if self.refused else self.inner.data_received(chunk)

    def finish(self) -> None:
        if not self.refused:
            self.inner.finish()

    def on_connection_close(self) -> None:
        if not self.refused:
            self.inner.on_connection_close()


def _query_token(query: str) -> str | None:
    """``?token=`` as handlers read it (the last one wins)."""
    values = urllib.parse.parse_qs(query, keep_blank_values=True).get("token")
    return values[-1] if values else None


def _body_over(headers: httputil.HTTPHeaders, limit: int) -> bool:
    """Whether a request declares a body over ``limit``; a chunked one's size is unknown."""
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        return True
    try:
        return int(headers.get("Content-Length", "0").split(",")[0]) > limit
    except ValueError:
        return False  # Tornado answers a malformed length with 400 before reading anything


class _HideHeaderValues(logging.Filter):
    """Tornado quotes a header it cannot parse in its log line: it may be Authorization."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Malformed HTTP message from %s: %s" and len(record.args or ()) == 2:
            context, error = record.args  # type: ignore[misc]
            shown = re.sub(r"\s*b?['\"].*", " (value not shown)", str(error), flags=re.S)
            record.args = (context, shown)
        return True


def _hide_header_values() -> None:
    general = logging.getLogger("tornado.general")
    if not any(isinstance(f, _HideHeaderValues) for f in general.filters):
        general.addFilter(_HideHeaderValues())
