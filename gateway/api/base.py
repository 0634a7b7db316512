"""What every handler shares: who is calling, JSON in and out, errors, audit.

Callers are authenticated before anything else happens (``public`` handlers
excepted). A body past ``max_request_body`` is refused with 413 (Tornado
holds at most the server's buffer size; uploads stream instead). Errors
become ``{"error": {"code", "message"}}`` in one place. Every
state-changing request is audited when it finishes, under the action its
handler names.

Handlers read the whole body before ``prepare``: an answer given before
the body is read makes Tornado close the connection, and a client reusing
it meanwhile sees a reset instead of the answer. That holds for callers
with a valid token only: the edge (``api/edge.py``) refuses a bigger body
than ``max_anonymous_body`` from anyone else before it is read.

Nothing here logs a query string unmasked: ``?token=`` may carry a token.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import urllib.parse
from collections.abc import Iterable
from typing import Any

import tornado.iostream
import tornado.web
import tornado.websocket

from ..access.audit import AuditLog, code_facts
from ..access.auth import Authenticator, Principal, presented_token
from ..access.secrets import SecretVault
from ..errors import (
    BadRequest,
    Forbidden,
    GatewayError,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)
from ..limits import format_size
from ..policy.approvals import ApprovalDesk
from ..policy.book import PolicyBook
from ..relays.agent_stream import RelayOptions
from ..sandbox.images import ImageBuilder
from ..sandbox.kernelspecs import KernelSpecs
from ..sessions.executions import Executions
from ..sessions.listing import Listing
from ..sessions.locations import Locations
from ..sessions.manager import SessionManager
from ..sessions.networks import NetworkRules
from ..sessions.reports import Reports
from ..sessions.snapshots import Snapshots
from ..sessions.template_pools import TemplatePools
from ..sessions.templates import Templates
from ..sessions.tools import SessionTools
from ..sessions.volumes import Volumes
from ..sessions.webhooks import Webhooks
from ..sessions.workspaces import Workspaces
from .forward import Forwarder, connect_upstream, passed_on, relay_socket

log = logging.getLogger(__name__)
access_log = logging.getLogger("tornado.access")


def log_request(handler: tornado.web.RequestHandler) -> None:
    """Tornado's access log line, with any credential in the query masked.

    A refused token's line is left to the audit log, which folds them per
    address (``AuditLog.auth_failure``).
    """
    if getattr(handler, "quiet", False):
        return
    request = handler.request
    status = handler.get_status()
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    access_log.log(
        level,
        "%d %s %s (%s) %.2fms",
        status,
        request.method,
        masked_uri(request.path, request.query),
        request.remote_ip,
        1000.0 * request.request_time(),
    )


# Query arguments that carry a credential: an API token (WebSockets), a signed file URL's
# signature (as good as the file it opens), a preview link's, an OAuth-style access token or key.
CREDENTIAL_ARGUMENTS = {"token", "signature", "access_token", "api_key", "sbx_preview"}


def masked_uri(path: str, query: str) -> str:
    """``path?query`` with the value of every credential argument masked, however encoded."""
    if not query:
        return path
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    masked = [(k, "***" if k.lower() in CREDENTIAL_ARGUMENTS else v) for k, v in pairs]
    return path + "?" + urllib.parse.urlencode(masked)


@dataclasses.dataclass(frozen=True)
class ApiOptions:
    """The settings the handlers read (``app`` builds them; handlers never see ``Settings``)."""

    cors_origins: tuple[str, ...]
    max_timeout: float
    max_request_body: int
    client_write_buffer: int
    max_archive_size: int
    jupyter_ttl_from: str
    max_ttl: float


class GatewayHandlerMixin:
    """Authentication, CORS and auditing, for plain and WebSocket handlers alike."""

    public = False  # True: answers without a token (health, the API document)
    principal: Principal | None = None
    quiet = False  # True: a refused token already logged this minute, so no access line

    request: Any
    settings: Any

    @property
    def manager(self) -> SessionManager:
        return self.settings["sbx_manager"]

    @property
    def executions(self) -> Executions:
        return self.settings["sbx_executions"]

    @property
    def networks(self) -> NetworkRules:
        return self.settings["sbx_networks"]

    @property
    def relay_options(self) -> RelayOptions:
        return self.settings["sbx_relay_options"]

    @property
    def api_options(self) -> ApiOptions:
        return self.settings["sbx_options"]

    @property
    def desk(self) -> ApprovalDesk:
        return self.settings["sbx_desk"]

    @property
    def book(self) -> PolicyBook:
        return self.settings["sbx_book"]

    @property
    def snapshots(self) -> Snapshots:
        return self.settings["sbx_snapshots"]

    @property
    def templates(self) -> Templates:
        return self.settings["sbx_templates"]

    @property
    def template_pools(self) -> TemplatePools | None:
        return self.settings["sbx_template_pools"]

    @property
    def reports(self) -> Reports:
        return self.settings["sbx_reports"]

    @property
    def workspaces(self) -> Workspaces:
        return self.settings["sbx_workspaces"]

    @property
    def volumes(self) -> Volumes:
        return self.settings["sbx_volumes"]

    @property
    def tools(self) -> SessionTools:
        return self.settings["sbx_tools"]

    @property
    def locations(self) -> Locations:
        return self.settings["sbx_locations"]

    @property
    def listing(self) -> Listing:
        return self.settings["sbx_listing"]

    @property
    def webhooks(self) -> Webhooks:
        return self.settings["sbx_webhooks"]

    @property
    def kernelspecs(self) -> KernelSpecs:
        return self.settings["sbx_kernelspecs"]

    @property
    def images(self) -> ImageBuilder:
        return self.settings["sbx_images"]

    @property
    def forwarder(self) -> Forwarder:
        return self.settings["sbx_forwarder"]

    @property
    def auth(self) -> Authenticator:
        return self.settings["sbx_auth"]

    @property
    def audit(self) -> AuditLog:
        return self.settings["sbx_audit"]

    @property
    def secrets(self) -> SecretVault:
        return self.settings["sbx_secrets"]

    def authenticate(self) -> Principal:
        """Who is calling; a missing or bad token is audited and refused with 401."""
        token = presented_token(
            self.request.headers.get("Authorization"), self.get_query_argument("token", None)
        )
        return self.authenticate_token(token)

    def authenticate_token(self, token: str | None) -> Principal:
        """The principal of ``token``; a refusal is audited (folded per address) and raised."""
        try:
            self.principal = self.auth.authenticate(token)
        except Unauthorized:
            self.audit_refusal(token)
            raise
        return self.principal

    def audit_refusal(self, token: str | None) -> None:
        request = self.request
        self.quiet = not self.audit.auth_failure(
            request.remote_ip, request.method, request.path, token
        )

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        """Log a failure by its path, never its query (a ``?token=`` may be there).

        User-caused errors are answers, not server faults: no traceback. A
        refused token is the audit log's to report. Tornado's own log line
        would quote the whole URI, and an argument it cannot decode.
        """
        method, path = self.request.method, self.request.path
        if isinstance(value, Unauthorized):
            return
        if isinstance(value, GatewayError):
            log.info("%s %s -> %s", method, path, value)
        elif isinstance(value, tornado.web.HTTPError):
            log.info("%s %s -> HTTP %d", method, path, value.status_code)
        else:
            log.error("uncaught exception in %s %s", method, path, exc_info=(typ, value, tb))

    def session_elsewhere(self, kwargs: dict[str, Any]) -> str | None:
        """The session this request names, if another gateway may own it (``locate`` says)."""
        session_id = kwargs.get("session_id") or kwargs.get("kernel_id")
        if (
            session_id
            and not passed_on(self.request)
            and self.locations.may_be_elsewhere(session_id)
        ):
            return session_id
        return None

    def allowed_origin(self, origin: str | None) -> bool:
        """Whether a browser page from ``origin`` may call; same-host pages always may."""
        if not origin:
            return True
        host = self.request.headers.get("Host", "")
        return same_site(origin, host, self.api_options.cors_origins)

    def allowed_methods(self) -> list[str]:
        """The methods this handler implements, for a 405's ``Allow`` header."""
        base = tornado.web.RequestHandler
        return [
            method
            for method in base.SUPPORTED_METHODS
            if getattr(type(self), method.lower()) is not getattr(base, method.lower())
        ]

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error as the API's JSON body, WebSocket endpoints' included."""
        error = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(error, GatewayError):
            status, code, message = error.status, error.code, error.message
            if error.retry_after is not None:
                self.set_header("Retry-After", str(error.retry_after))
        elif isinstance(error, tornado.web.HTTPError):
            status = error.status_code
            code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
            message = error.log_message or self._reason
        else:
            status, code = 500, "internal_error"
            message = "the gateway hit an unexpected error; it has been logged"
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        if status == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="sandbox-gateway"')
        elif status == 405:
            self.set_header("Allow", ", ".join(self.allowed_methods()))
        self.finish(error_json(code, message))


class JSONHandler(GatewayHandlerMixin, tornado.web.RequestHandler):
    """Base handler: authenticated, JSON bodies in (bounded), JSON out, audited."""

    actions: dict[str, str] = {}  # HTTP method -> the action its requests are audited as
    forwards = True  # False: the body streams in after prepare (uploads), answered here only
    audit_detail: dict[str, Any]
    audit_session: str | None = None

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        origin = self.request.headers.get("Origin")
        if origin and origin.rstrip("/") in self.api_options.cors_origins:
            self.set_header("Access-Control-Allow-Origin", origin)
            self.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type")
            self.set_header(
                "Access-Control-Allow-Methods", "GET, POST, PUT, PATCH, DELETE, OPTIONS"
            )
            self.set_header("Access-Control-Max-Age", "600")
            self.set_header("Vary", "Origin")

    def prepare(self) -> Any:
        self.audit_detail = {}
        if self.request.method == "OPTIONS" or self.public:
            return None
        self.authenticate()
        self.manager.check_available()
        if len(self.request.body) > self.body_limit():
            raise PayloadTooLarge(
                f"the request body is larger than this endpoint's limit of "
                f"{format_size(self.body_limit())}; send less (upload files with PUT)"
            )
        session_id = self.session_elsewhere(self.path_kwargs) if self.forwards else None
        return None if session_id is None else self._pass_on(session_id)

    async def _pass_on(self, session_id: str) -> None:
        """Answer with the reply of the gateway that owns the session, if another one does."""
        timeout = self.api_options.max_timeout + 60
        for _ in range(2):  # the owner it was found at may have lost it since: ask once more
            owner = await self.locations.locate(session_id)
            if owner is None:
                return
            # Audited by the owner, where it happens; here only if the owner never answers.
            principal, self.principal = self.principal, None
            try:
                if await self.forwarder.forward(self, owner, timeout):
                    return
            finally:
                if not self._finished:
                    self.principal = principal
                    self.locations.forget(session_id)

    def body_limit(self) -> int:
        return self.api_options.max_request_body

    def require_admin(self, what: str) -> None:
        """Refuse a caller whose token is not an admin's (403); ``what`` names what it asked for.

        Handler methods call it once ``prepare`` has authenticated the caller,
        so a bad token is still a 401 and an oversized body a 413 first.
        """
        if not self.principal.admin:  # type: ignore[union-attr]
            raise Forbidden(f"{what} is for admin tokens only")

    def json_body(self) -> dict[str, Any]:
        """The request body as a JSON object; an empty body is an empty object."""
        raw = self.request.body
        if not raw:
            return {}
        if not self.auth.enabled and not _is_json(self.request.headers.get("Content-Type", "")):
            raise UnsupportedMediaType(
                "with --auth none a JSON body must be sent as Content-Type: application/json "
                "(a web page's form cannot send that to another site); with curl: --json, or "
                "-H 'Content-Type: application/json'"
            )
        try:
            body = json.loads(raw, parse_constant=_not_json)
        except ValueError as e:  # undecodable, malformed, or NaN / Infinity
            raise BadRequest(f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body

    def int_argument(self, name: str, default: int) -> int:
        """A whole-number query argument; anything else is a 400 naming it."""
        value = self.get_argument(name, None)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise BadRequest(f"{name} must be a whole number, not {value!r}") from None

    def send(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(payload))

    def options(self, *args: Any, **kwargs: Any) -> None:
        """CORS preflight: the headers were set (or not) by ``set_default_headers``."""
        self.set_status(204)
        self.finish()

    def on_finish(self) -> None:
        """Record this request's action, if its method changes state."""
        action = self.actions.get(self.request.method)
        if action is None or self.principal is None:
            return  # not a state change, or refused before the caller was known
        status = self.get_status()
        if status < 400:
            outcome = "ok"
        elif status in (401, 403, 404):
            outcome = "denied"
        else:
            outcome = "failed" if status < 500 else "error"
        kwargs = self.path_kwargs
        self.audit.record(
            action,
            self.principal,
            outcome,
            session_id=self.audit_session or kwargs.get("session_id") or kwargs.get("kernel_id"),
            status=status,
            remote=self.request.remote_ip,
            detail=self.audit_detail,
        )


class JSONWebSocketHandler(GatewayHandlerMixin, tornado.websocket.WebSocketHandler):
    """A WebSocket whose refusals before the upgrade are the API's JSON errors.

    The token may come as ``?token=``: browsers cannot set headers on one.
    Subclasses call ``set_nodelay(True)`` in ``open``: an execute answers with
    several small messages, and with Nagle's algorithm on (Tornado's default)
    each waits for the client's delayed ACK, some 40 ms a round trip.
    """

    transport = ""  # what this socket's audit events name as their transport
    too_slow = False  # closed for letting more than client_write_buffer wait

    def check_origin(self, origin: str) -> bool:
        # A page may not drive a sandbox from another site, even on an open gateway.
        return self.allowed_origin(origin)

    async def get(self, *args: Any, **kwargs: Any) -> None:
        try:
            if not self.allowed_origin(self.request.headers.get("Origin")):
                raise Forbidden("WebSockets from pages of other sites are refused (cors_origins)")
            self.authenticate()
            self.manager.check_available()
            if not _is_upgrade(self.request.headers):
                raise BadRequest(
                    "this is a WebSocket endpoint: connect with a WebSocket client "
                    "(Upgrade: websocket)"
                )
            session_id = self.session_elsewhere(kwargs)
            owner = await self.locations.locate(session_id) if session_id else None
            try:
                upstream = await connect_upstream(self, owner) if owner else None
            except GatewayError:
                self.locations.forget(session_id or "")
                raise
            if upstream is not None:
                relay_socket(self, upstream)
            else:
                self.prepare_socket(**kwargs)
        except GatewayError as e:
            self.send_error(e.status, exc_info=(type(e), e, e.__traceback__))
            return
        await super().get(*args, **kwargs)

    def prepare_socket(self, **kwargs: Any) -> None:
        """Check the request before the upgrade; raise a GatewayError to refuse it."""

    def audit_message(
        self, action: str, session_id: str, code: Any, outcome: str = "ok", **detail: Any
    ) -> None:
        """Record an action a message asked for; its code (if any) by size and hash only."""
        facts = code_facts(code) if isinstance(code, str) else {}
        self.audit.record(
            action,
            self.principal,
            outcome,
            session_id=session_id,
            remote=self.request.remote_ip,
            detail={"transport": self.transport, **detail, **facts},
        )

    def send(self, event: dict[str, Any]) -> None:
        """Send one JSON event, unless the client has already gone."""
        self.send_text(json.dumps(event, default=str))

    def send_text(self, text: str) -> None:
        """Send, or disconnect a client that lets more than ``client_write_buffer`` wait for it.

        A client that does not read would otherwise hold whatever a sandbox
        produces in the gateway's memory.
        """
        connection = self.ws_connection
        if connection is None or connection.is_closing():
            return  # the client has gone; what it misses waits in a replay buffer, if any
        stream = connection.stream  # type: ignore[attr-defined]
        limit = self.api_options.client_write_buffer
        stream.max_write_buffer_size = limit
        try:
            self.write_message(text)
        except tornado.iostream.StreamBufferFullError:
            reason = f"the client does not read: over {format_size(limit)} waited for it"
            log.warning("closing a WebSocket: %s", reason)
            stream.max_write_buffer_size = None  # room for the close frame
            self.too_slow = True
            self.close(1008, reason)


def error_json(code: str, message: str) -> str:
    """The API's error body."""
    return json.dumps({"error": {"code": code, "message": message}})


def same_site(origin: str, host: str, cors_origins: Iterable[str]) -> bool:
    """Whether a page from ``origin`` is the gateway's own (its ``host``) or a listed origin."""
    origin = origin.rstrip("/")
    return origin.split("://", 1)[-1] == host or origin in cors_origins


def _is_json(content_type: str) -> bool:
    """Whether a Content-Type is JSON's (``application/json`` or ``+json``), parameters aside."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _not_json(constant: str) -> None:
    """Python's json reads NaN and Infinity; they are not JSON, and no answer could carry them."""
    raise ValueError(f"{constant} is not a JSON number")


def _is_upgrade(headers: Any) -> bool:
    """Whether a request asks for a WebSocket (else Tornado would answer in plain text)."""
    connection = [part.strip().lower() for part in headers.get("Connection", "").split(",")]
    return headers.get("Upgrade", "").lower() == "websocket" and "upgrade" in connection


class NotFoundHandler(JSONHandler):
    """Answers unknown paths with the JSON error shape instead of an HTML page."""

    public = True

    def prepare(self) -> None:
        raise NotFound(f"no such endpoint: {self.request.method} {self.request.path}")
