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

Without tokens (``--auth none``) every caller is an admin, and a browser is
a caller: a page of any site may POST a form or open a WebSocket here, and a
page whose DNS name is rebound to this machine reads the answers as its
own. So an open gateway answers only a ``Host`` that is an IP address,
``localhost`` or its own listen host (``LocalOnly``), and refuses a
state-changing request or WebSocket whose ``Origin`` is another site's; both
403 from the headers. JSON bodies need a JSON content type (``api/base.py``).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
import sys
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable

import tornado.web
from tornado import httputil

from ..access.audit import AuditLog
from ..access.auth import Authenticator, presented_token
from ..config import Settings
from ..errors import Unauthorized
from ..limits import format_size
from .base import error_json, same_site

log = logging.getLogger(__name__)

_SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))


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
        # Other credentials a handler checks in full (the E2B edge's API key, sandbox and
        # volume tokens).
        self.also_accepts = also_accepts
        self.auth = auth
        self.audit = audit
        self.max_body = max_body  # what an authenticated caller may send (a handler may take less)
        self.max_anonymous_body = settings.max_anonymous_body
        self.body_timeout = settings.body_timeout
        self.local_only = None if auth.enabled else LocalOnly(settings.host, settings.cors_origins)
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

    @property
    def remote(self) -> str | None:
        return getattr(getattr(self.conn, "context", None), "remote_ip", None)

    def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> Awaitable[None] | None:
        assert isinstance(start_line, httputil.RequestStartLine)
        path, _, query = start_line.path.partition("?")
        refusal = self.edge.local_only and self.edge.local_only.refusal(start_line.method, headers)
        if refusal:
            log.warning("refused %s %s from %s: %s", start_line.method, path, self.remote, refusal)
            self._answer(403, "Forbidden", error_json("forbidden", refusal))
            return None
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
        self.edge.audit.auth_failure(self.remote, method, path, token)
        limit = format_size(self.edge.max_anonymous_body)
        body = error_json(
            error.code,
            f"{error.message}; without a valid token a request may carry at most {limit} of body",
        )
        self._answer(
            401, "Unauthorized", body, {"WWW-Authenticate": 'Bearer realm="sandbox-gateway"'}
        )

    def _answer(
        self, status: int, reason: str, body: str, headers: dict[str, str] | None = None
    ) -> None:
        """Answer from the headers and close the connection, the body unread."""
        self.refused = True
        data = body.encode()
        self.conn.write_headers(
            httputil.ResponseStartLine("HTTP/1.1", status, reason),
            httputil.HTTPHeaders(
                {
                    "Content-Type": "application/json; charset=UTF-8",
                    "Content-Length": str(len(data)),
                    **(headers or {}),
                    "Connection": "close",
                }
            ),
            data,
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


class LocalOnly:
    """What an open gateway (``--auth none``) answers: this machine's programs, not web pages.

    A DNS name rebound to this machine arrives with its own name as ``Host``: only
    IP addresses, ``localhost`` (and its subdomains, which browsers resolve to
    loopback themselves) and the listen host are this machine's names. A page
    of another site sends its ``Origin``: on a request that changes state, or a
    WebSocket (which no browser keeps to its own origin), it is refused unless
    it is the gateway's own (same host and port) or in ``cors_origins``.
    Programs send no ``Origin``.
    """

    def __init__(self, host: str, cors_origins: Iterable[str]) -> None:
        self.host = host.lower().strip("[]")
        self.cors_origins = tuple(cors_origins)

    def refusal(self, method: str, headers: httputil.HTTPHeaders) -> str | None:
        """Why the request is refused (403), or None."""
        host = headers.get("Host", "")
        if host and not _local_host(host, self.host):
            return (
                f"Host {host!r} is not a name of this machine: with --auth none the gateway "
                f"answers only localhost, an IP address or {self.host!r}, so that a web page "
                "whose DNS name is pointed here cannot use it; use http://127.0.0.1 or API tokens"
            )
        origin = headers.get("Origin")
        websocket = headers.get("Upgrade", "").lower() == "websocket"
        if origin is None or (method in _SAFE_METHODS and not websocket):
            return None
        if same_site(origin, host, self.cors_origins):
            return None
        return (
            f"Origin {origin!r} is a web page of another site: with --auth none the gateway "
            "takes no state-changing request or WebSocket from one (list a trusted page's "
            "origin in cors_origins, or use API tokens)"
        )


@functools.lru_cache(maxsize=256)  # every request asks; a few Host values repeat
def _local_host(host: str, own: str) -> bool:
    """Whether a ``Host`` header names this machine: an IP address, localhost or ``own``."""
    try:
        name = (urllib.parse.urlsplit(f"//{host}").hostname or "").rstrip(".")
    except ValueError:
        return False
    if name in ("localhost", own) or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


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
