"""Preview URLs: what a server in a sandbox serves, reached through the gateway.

Two forms reach port P of a session: ``/v1/sessions/{id}/ports/{P}/...``
(the path form) and a Host ``P-{id}.<domain>`` (E2B's ``get_host``: the
host form; 49983 and 49999 stay envd's and the code interpreter's). Any
method, streamed answers, and WebSocket upgrades pass; the bytes go through
the session's relay (``sessions/previews.py``), never a network into the
sandbox.

Who may: the session's tenant by its API token (``Authorization``), the
E2B sandbox's access token (``X-Access-Token``), or a signed link
(``access/preview_links.py``): its ``?sbx_preview=`` turns into a cookie
for that session and port only, and the browser is sent on without it.
The cookie is honoured only on the preview's own requests (``Sec-Fetch-Site``
same-origin or a typed address, or a top-level GET navigation), so a page
of another preview cannot spend a viewer's cookie. The gateway's credentials
and its preview cookies never reach the sandbox. A path-form answer is
served with ``Content-Security-Policy: sandbox`` (no ``allow-same-origin``):
its scripts run in an opaque origin, so they can read nothing the gateway's
own pages keep (the approvals page's token in ``sessionStorage``) and call
the API with no credential of the viewer's. The host form is an origin of
its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

import tornado.iostream
import tornado.web
from tornado import httputil
from tornado.http1connection import HTTP1Connection, HTTP1ConnectionParameters
from tornado.httputil import RequestStartLine
from tornado.routing import HostMatches

from ..access.auth import Principal
from ..access.preview_links import ARGUMENT, PreviewLinks, cookie_name
from ..access.sandbox_tokens import SandboxTokens
from ..errors import BadRequest, GatewayError, PayloadTooLarge, Unauthorized
from ..limits import format_size
from ..sandbox.preview import CHUNK, Budget, pipe
from ..sessions.model import Session
from ..sessions.previews import Previews
from .base import GatewayHandlerMixin, JSONHandler

# A Host naming a port and a session (ids are UUIDs: a gateway reached by a name such as
# 2024-gateway.example keeps its API), but not envd's (49983), the interpreter's (49999)
# nor the MCP URL's (50005).
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
HOST_FORM = rf"(?!(?:49983|49999|50005)-)(?P<port>\d{{1,5}})-(?P<session_id>{_UUID})\..+"
SANDBOX_POLICY = (
    "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads "
    "allow-pointer-lock allow-presentation"
)
_HOP = frozenset(
    ("connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection",
     "proxy-authorization", "trailer", "content-length")
)  # fmt: skip
# The gateway's credentials: never passed to a sandbox.
_CREDENTIALS = frozenset(
    ("authorization", "x-access-token", "e2b-traffic-access-token", "x-api-key")
)
# Answer headers a sandbox may not send on the gateway's origin (the path form).
_REFUSED_ANSWER = frozenset(("clear-site-data", "service-worker-allowed"))
_PARAMS = HTTP1ConnectionParameters(
    no_keep_alive=True, decompress=False, max_header_size=64 * 1024, max_body_size=2**62,
    chunk_size=CHUNK,
)  # fmt: skip
_HEAD_MAX = 64 * 1024
_UPGRADE_TIMEOUT = 10.0  # seconds a server in the sandbox has to answer an upgrade


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise BadRequest(f"port {port} is not a TCP port (1-65535)")
    return port


class PreviewHandler(GatewayHandlerMixin, tornado.web.RequestHandler):
    """One request to a port in a sandbox: authorised, then relayed as it is."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "DELETE", "PATCH", "PUT", "OPTIONS")
    path_form = True
    upstream: tornado.iostream.IOStream | None = None

    def on_connection_close(self) -> None:
        """The viewer left: so does its connection into the sandbox (it counts against the cap)."""
        if self.upstream is not None:
            self.upstream.close()

    @property
    def previews(self) -> Previews:
        return self.settings["sbx_previews"]

    @property
    def links(self) -> PreviewLinks:
        return self.settings["sbx_preview_links"]

    @property
    def tokens(self) -> SandboxTokens:
        return self.settings["sbx_e2b_tokens"]

    async def get(self, session_id: str = "", port: str = "", path: str = "") -> None:
        # The path as it came (Tornado hands ``path`` decoded: a %0D%0A would be a new line).
        rest = self.request.path
        if self.path_form:
            rest = "/" + rest.split("/", 6)[6]
        await self._serve(session_id, port, rest)

    head = post = delete = patch = put = options = get

    async def _serve(self, session_id: str, port: str, rest: str) -> None:
        if not self.path_form:
            match = re.fullmatch(HOST_FORM, self.request.host_name)
            assert match is not None  # the route matched it
            session_id, port = match["session_id"], match["port"]
        number = _port(port)
        prefix = f"/v1/sessions/{session_id}/ports/{number}" if self.path_form else ""
        query = _without_link(self.request.query)
        session = self._session(session_id, number, prefix)
        if session is None:  # a link's first visit: the cookie set, the link taken off the URL
            here = prefix + "/" + rest.lstrip("/")  # never //host: another site
            self.redirect(here + (f"?{query}" if query else ""), status=303)
            return
        target = rest + (f"?{query}" if query else "")
        if _upgrade(self.request.headers):
            await self._relay_upgrade(session, number, target, prefix)
        else:
            await self._relay(session, number, target, prefix)

    # -- who may ------------------------------------------------------------------------

    def _session(self, session_id: str, port: int, prefix: str) -> Session | None:
        """The session the caller may preview; None once a link's cookie is set (redirect)."""
        signature = self.get_query_argument(ARGUMENT, None)
        if signature is not None and self.request.method in ("GET", "HEAD"):
            if not self.links.valid(signature, session_id, port):
                raise Unauthorized(
                    "this preview link is not valid (expired, or made for another session or "
                    "port); ask for a new one (POST /v1/sessions/{id}/previews)"
                )
            self._owned(session_id)
            expires = int(signature.partition(".")[0])
            self.set_cookie(
                cookie_name(session_id, port), signature, path=f"{prefix}/",
                expires=expires, httponly=True, samesite="Lax",
                secure=self.request.protocol == "https",
            )  # fmt: skip
            return None
        cookie = self.get_cookie(cookie_name(session_id, port))
        if (
            cookie is not None
            and self._own_request()
            and self.links.valid(cookie, session_id, port)
        ):
            return self._owned(session_id)
        token = self.request.headers.get("X-Access-Token") or self.request.headers.get(
            "E2B-Traffic-Access-Token"
        )
        if token is not None and self.tokens.holder(session_id, token) is not None:
            return self._owned(session_id)
        authorization = self.request.headers.get("Authorization", "")
        try:
            principal = self.authenticate_token(authorization.removeprefix("Bearer ").strip())
        except Unauthorized:
            raise Unauthorized(
                "a preview needs the session's token (Authorization: Bearer, or the E2B "
                "sandbox's X-Access-Token) or a signed link (POST /v1/sessions/{id}/previews)"
            ) from None
        return self.manager.get(session_id, principal)

    def _owned(self, session_id: str) -> Session:
        owner: Principal | None = self.manager.owner_of(session_id)
        if owner is None:
            raise Unauthorized("the session of this preview has ended")
        return self.manager.get(session_id, owner)

    def _own_request(self) -> bool:
        """Whether a request is the preview's own (or the viewer's), not another site's page's."""
        headers = self.request.headers
        site = headers.get("Sec-Fetch-Site")
        if site is None:  # a browser without fetch metadata: an Origin must be the preview's
            origin = headers.get("Origin")
            return origin is None or origin == f"{self.request.protocol}://{self.request.host}"
        if site in ("same-origin", "none"):
            return True
        navigate = headers.get("Sec-Fetch-Mode") == "navigate"
        document = headers.get("Sec-Fetch-Dest", "document") == "document"  # not in a frame
        return navigate and document and self.request.method in ("GET", "HEAD")

    # -- relaying -------------------------------------------------------------------------

    def _upstream_headers(self, prefix: str) -> httputil.HTTPHeaders:
        """The caller's headers but its hop's and the gateway's credentials and cookies."""
        headers = httputil.HTTPHeaders()
        for name, value in self.request.headers.get_all():
            lower = name.lower()
            if lower in _HOP or lower in _CREDENTIALS:
                continue
            if lower == "cookie":
                value = _without_preview_cookies(value)
                if not value:
                    continue
            headers.add(name, value)
        headers["X-Forwarded-Host"] = self.request.host
        headers["X-Forwarded-Proto"] = self.request.protocol
        if prefix:
            headers["X-Forwarded-Prefix"] = prefix
        return headers

    async def _relay(self, session: Session, port: int, target: str, prefix: str) -> None:
        headers = self._upstream_headers(prefix)
        body = self.request.body
        if len(body) > self.api_options.max_request_body:  # buffered, not streamed
            limit = format_size(self.api_options.max_request_body)
            raise PayloadTooLarge(f"a preview's request body may be {limit} at most")
        if body or self.request.method in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        headers["Connection"] = "close"
        async with self.previews.connection(session, port) as stream:
            self.upstream = stream
            relay = self.previews.relay_of(session.id)
            assert relay is not None
            conn = HTTP1Connection(stream, True, _PARAMS)
            start = httputil.RequestStartLine(self.request.method, target, "HTTP/1.1")
            await relay.budget.take(len(body))
            await conn.write_headers(start, headers, body or None)
            conn.finish()
            answer = _Answer(self, relay.budget, prefix)
            try:
                await conn.read_response(answer)
            except (tornado.iostream.StreamClosedError, httputil.HTTPInputError):
                pass
            answer.end()

    async def _relay_upgrade(self, session: Session, port: int, target: str, prefix: str) -> None:
        """A WebSocket (or other upgrade): the heads pass, then the bytes both ways as they are."""
        headers = self._upstream_headers(prefix)
        headers["Connection"] = "Upgrade"
        headers["Upgrade"] = self.request.headers["Upgrade"]
        lines = [f"{self.request.method} {target} HTTP/1.1"]
        lines += [f"{name}: {value}" for name, value in headers.get_all()]
        async with self.previews.connection(session, port) as upstream:
            self.upstream = upstream  # a viewer that leaves frees its slot
            relay = self.previews.relay_of(session.id)
            assert relay is not None
            await upstream.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            try:
                async with asyncio.timeout(_UPGRADE_TIMEOUT):
                    head = await upstream.read_until(b"\r\n\r\n", max_bytes=_HEAD_MAX)
            except (
                tornado.iostream.StreamClosedError,
                tornado.iostream.UnsatisfiableReadError,
                TimeoutError,
            ):
                raise BadRequest(f"the server on port {port} did not answer the upgrade") from None
            status, answer_headers = _parse_head(head)
            client = self.request.connection.detach()
            self._finished = True  # the connection is the relay's now
            await client.write(_head_bytes(status, _answer_headers(answer_headers, prefix)))
            await asyncio.gather(pipe(client, upstream, relay.budget),
                                 pipe(upstream, client, relay.budget))  # fmt: skip

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        if self._headers_written:  # cut off mid-answer: end the connection, not a JSON error
            self.request.connection.close()
            return
        super().write_error(status_code, **kwargs)

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, GatewayError | tornado.iostream.StreamClosedError):
            return
        super().log_exception(typ, value, tb)


class HostPreviewHandler(PreviewHandler):
    path_form = False


class _Answer(httputil.HTTPMessageDelegate):
    """The sandbox server's answer, passed to the viewer as it comes."""

    def __init__(self, handler: PreviewHandler, budget: Budget, prefix: str) -> None:
        self.handler = handler
        self.budget = budget
        self.prefix = prefix
        self.started = False

    def headers_received(self, start_line: Any, headers: httputil.HTTPHeaders) -> None:
        """The answer's status line (a client connection reads only those) and headers."""
        handler = self.handler
        self.started = True
        handler.set_status(start_line.code, start_line.reason or "Unknown")
        handler.clear_header("Content-Type")
        for name, value in _answer_headers(headers, self.prefix).get_all():
            handler.add_header(name, value)
        if "Content-Length" in headers and handler.request.method == "HEAD":
            handler.set_header("Content-Length", headers["Content-Length"])

    async def data_received(self, chunk: bytes) -> None:
        await self.budget.take(len(chunk))
        self.handler.write(chunk)
        await self.handler.flush()

    def end(self) -> None:
        if not self.started:
            raise BadRequest("the server in the sandbox answered nothing or a malformed head")
        if not self.handler._finished:
            self.handler.finish()


def _answer_headers(headers: httputil.HTTPHeaders, prefix: str) -> httputil.HTTPHeaders:
    """What of an answer's headers a viewer gets; a path-form answer (``prefix``: its path
    on the gateway's origin) is sandboxed (CSP)."""
    kept = httputil.HTTPHeaders()
    for name, value in headers.get_all():
        lower = name.lower()
        if lower in _HOP or (prefix and lower in _REFUSED_ANSWER):
            continue
        if lower == "set-cookie":
            if value.strip().lower().startswith("sbx_preview_"):
                continue
            value = _own_cookie(value, prefix)
        kept.add(name, value)
    if prefix:
        kept.add("Content-Security-Policy", SANDBOX_POLICY)
    return kept


def _own_cookie(value: str, prefix: str) -> str:
    """A cookie kept to the preview that set it: never a ``Domain`` (the host form's
    siblings and the gateway share a parent), and in the path form never a path outside
    the preview's own (every session's previews share the gateway's origin)."""
    parts = [part.strip() for part in value.split(";")]
    kept = [parts[0]] + [
        part
        for part in parts[1:]
        if part.split("=", 1)[0].strip().lower() not in ("domain", *(["path"] if prefix else []))
    ]
    if prefix:
        kept.append(f"Path={prefix}/")
    return "; ".join(kept)


def _parse_head(head: bytes) -> tuple[httputil.ResponseStartLine, httputil.HTTPHeaders]:
    try:
        first, _, rest = head.decode("latin-1").partition("\r\n")
        return httputil.parse_response_start_line(first), httputil.HTTPHeaders.parse(rest)
    except httputil.HTTPInputError:
        raise BadRequest("the server in the sandbox answered a malformed head") from None


def _head_bytes(status: httputil.ResponseStartLine, headers: httputil.HTTPHeaders) -> bytes:
    if status.code == 101:
        headers["Connection"] = "Upgrade"
        headers["Upgrade"] = "websocket"
    else:
        headers["Connection"] = "close"
    lines = [f"HTTP/1.1 {status.code} {status.reason}"]
    lines += [f"{name}: {value}" for name, value in headers.get_all()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _upgrade(headers: httputil.HTTPHeaders) -> bool:
    connection = [part.strip().lower() for part in headers.get("Connection", "").split(",")]
    return "upgrade" in connection and bool(headers.get("Upgrade"))


def _without_link(query: str) -> str:
    """The query without a link's signature (the sandbox never sees it)."""
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if k != ARGUMENT]
    return query if len(kept) == len(pairs) else urllib.parse.urlencode(kept)


def _without_preview_cookies(header: str) -> str:
    parts = [p.strip() for p in header.split(";")]
    return "; ".join(p for p in parts if p and not p.startswith("sbx_preview_"))


class PortsHandler(JSONHandler):
    """What listens in a session's sandbox, each port with its preview URL (path form)."""

    async def get(self, session_id: str) -> None:
        session = self.manager.get(session_id, self.principal)
        previews: Previews = self.settings["sbx_previews"]
        ports = await previews.ports(session)
        base = f"{self.request.protocol}://{self.request.host}"
        self.send({"ports": [
            {"port": p, "url": f"{base}/v1/sessions/{session_id}/ports/{p}/"} for p in ports
        ]})  # fmt: skip


class PreviewLinkHandler(JSONHandler):
    """A signed link to a port of a session, for a person in a browser."""

    actions = {"POST": "session.preview_link"}

    async def post(self, session_id: str) -> None:
        session = self.manager.get(session_id, self.principal)
        body = self.json_body()
        port = body.get("port")
        unknown = sorted(set(body) - {"port", "expires_in"})
        if unknown:
            raise BadRequest(f"unknown fields {unknown}: a link takes port and expires_in")
        if not isinstance(port, int) or isinstance(port, bool):
            raise BadRequest('send {"port": <the port the server listens on>, "expires_in": s}')
        _port(str(port))
        lifetime = body.get("expires_in", 3600)
        if not isinstance(lifetime, int | float) or isinstance(lifetime, bool):
            raise BadRequest("expires_in is a number of seconds")
        links: PreviewLinks = self.settings["sbx_preview_links"]
        signature, expires = links.sign(session.id, port, lifetime)
        self.audit_detail = {"port": port, "expires_at": expires}
        request = self.request
        path = f"{request.protocol}://{request.host}/v1/sessions/{session.id}/ports/{port}/"
        path_url = f"{path}?{ARGUMENT}={signature}"
        url = path_url
        name = request.host_name
        if not _is_address(name):
            netloc = f"{port}-{session.id}.{request.host}"
            url = f"{request.protocol}://{netloc}/?{ARGUMENT}={signature}"
        self.send({"port": port, "url": url, "path_url": path_url, "expires_at": expires})


def link_holder(links: PreviewLinks) -> Callable[[RequestStartLine, httputil.HTTPHeaders], bool]:
    """Whether a request carries a valid link's cookie for the preview it names (the edge then
    lets a body in as for a token's holder: a preview page's form or upload)."""

    def accepts(start_line: RequestStartLine, headers: httputil.HTTPHeaders) -> bool:
        name = httputil.split_host_and_port(headers.get("Host", "").lower())[0]
        named = re.fullmatch(HOST_FORM, name) or _PATH_FORM.match(start_line.path)
        if named is None:
            return False
        session_id, port = named["session_id"], int(named["port"])
        cookie = httputil.parse_cookie(headers.get("Cookie", "")).get(cookie_name(session_id, port))
        return links.valid(cookie, session_id, port)

    return accepts


def _is_address(name: str) -> bool:
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(name.strip("[]"))
        return True
    return False


_ID = r"(?P<session_id>[^/]+)"
_PATH_FORM = re.compile(rf"/v1/sessions/{_ID}/ports/(?P<port>\d{{1,5}})/")
routes = [
    (rf"/v1/sessions/{_ID}/ports", PortsHandler),
    (rf"/v1/sessions/{_ID}/previews", PreviewLinkHandler),
    (rf"/v1/sessions/{_ID}/ports/(?P<port>\d{{1,5}})/(?P<path>.*)", PreviewHandler),
]
# Put first in the application: a Host of the host form is a preview, whatever its path.
host_routes = [(HostMatches(HOST_FORM), [(r"/.*", HostPreviewHandler)])]
