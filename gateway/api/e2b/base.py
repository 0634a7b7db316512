"""Who an E2B request is for and from, and E2B's error shape.

The stock SDK speaks to two places. The control API (create, list, kill...)
carries the API key in ``X-API-Key``: a gateway token. Sandbox traffic (code,
files, commands) names its sandbox either by the ``E2b-Sandbox-Id`` /
``E2b-Sandbox-Port`` headers (one sandbox URL for all) or by a Host of the
form ``PORT-SANDBOXID.DOMAIN`` (behind a TLS proxy), and carries the sandbox's
access token in ``X-Access-Token`` (or ``E2B-Traffic-Access-Token``, which the
code-interpreter client sends on its context calls). The token proves the
sandbox was handed to the caller; the caller then acts as its tenant.

Errors are E2B's ``{"code": <status>, "message": ...}``. A sandbox that is
not (or no longer) there answers sandbox traffic as E2B's proxy does: 502 and
"The sandbox ... was not found", which the SDK reports as not running.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import time
import urllib.parse
from typing import Any

import tornado.web
from tornado import httputil

from ...access.auth import Principal
from ...access.sandbox_tokens import SandboxTokens
from ...errors import BadRequest, GatewayError, NotFound, SessionNotFound, Unauthorized
from ..base import JSONHandler

ENVD_PORT = 49983  # envd: files, commands, health
JUPYTER_PORT = 49999  # the code interpreter: execute, contexts


@dataclasses.dataclass(frozen=True)
class Address:
    """The sandbox and port a request is for."""

    sandbox_id: str
    port: int


def address_of(headers: httputil.HTTPHeaders, host: str) -> Address | None:
    """The sandbox a request names, by headers or by a ``PORT-SANDBOXID.DOMAIN`` Host."""
    sandbox_id, port = headers.get("E2b-Sandbox-Id"), headers.get("E2b-Sandbox-Port")
    if not sandbox_id:
        label = host.split(".", 1)[0] if "." in host else ""
        port, _, sandbox_id = label.partition("-")
    if not sandbox_id or not port or not port.isdigit():
        return None
    return Address(sandbox_id, int(port))


def sandbox_token(headers: httputil.HTTPHeaders) -> str | None:
    return headers.get("X-Access-Token") or headers.get("E2B-Traffic-Access-Token")


class Credentials:
    """Checks E2B credentials; the edge asks it before a body is read, handlers after."""

    def __init__(self, tokens: SandboxTokens) -> None:
        self.tokens = tokens

    def sandbox(
        self, headers: httputil.HTTPHeaders, host: str, method: str = "GET", query: str = ""
    ) -> Address:
        """The sandbox a request may reach; its token must be that sandbox's (else 401).

        A signed file URL (the SDK's ``download_url`` / ``upload_url``) stands
        in for the token. A wrong token answers alike for a sandbox that
        exists and one that does not, so a token reveals nothing of others.
        """
        address = address_of(headers, host)
        if address is None:
            raise BadRequest(
                "name the sandbox: send E2b-Sandbox-Id and E2b-Sandbox-Port headers, "
                "or a Host of the form PORT-SANDBOXID.DOMAIN"
            )
        token = self.tokens.issue(address.sandbox_id)
        presented = sandbox_token(headers)
        if presented is None and signed(query, method, token):
            return address
        if not self.tokens.valid(address.sandbox_id, presented):
            raise Unauthorized(
                "the sandbox access token is missing or not this sandbox's; use the "
                "envdAccessToken that created (or connected to) the sandbox"
            )
        return address

    def accepts(self, start_line: httputil.RequestStartLine, headers: httputil.HTTPHeaders) -> bool:
        """Whether a request carries a sandbox's own token (the edge then lets its body in)."""
        _, _, query = start_line.path.partition("?")
        try:
            self.sandbox(headers, headers.get("Host", ""), start_line.method, query)
        except GatewayError:
            return False
        return True


def signed(query: str, method: str, token: str) -> bool:
    """Whether ``query`` carries a valid, unexpired v1 file-URL signature for ``method``.

    The SDK signs ``path:operation:user:token[:expiration]`` with SHA-256.
    """
    args = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    signature, expiration = args.get("signature"), args.get("signature_expiration")
    if not signature:
        return False
    if expiration is not None and not (expiration.isdigit() and int(expiration) > time.time()):
        return False
    operation = "write" if method == "POST" else "read"
    raw = f"{args.get('path', '')}:{operation}:{args.get('username', '')}:{token}"
    raw += f":{expiration}" if expiration is not None else ""
    digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
    return hmac.compare_digest(signature, f"v1_{digest}")


class E2BHandler(JSONHandler):
    """Errors in E2B's shape; the API key comes from ``X-API-Key``."""

    def authenticate(self) -> Principal:
        key = self.request.headers.get("X-API-Key")
        if key is None:
            return super().authenticate()  # a Bearer token works as well
        return self.authenticate_token(key)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = self.translate(kwargs.get("exc_info", (None, None, None))[1])
        if isinstance(error, GatewayError):
            status, message = error.status, error.message
            if error.retry_after is not None:
                self.set_header("Retry-After", str(error.retry_after))
        elif isinstance(error, tornado.web.HTTPError):
            status, message = error.status_code, error.log_message or self._reason
        else:
            status, message = 500, "the gateway hit an unexpected error; it has been logged"
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.finish(json.dumps({"code": status, "message": message}))

    def translate(self, error: BaseException | None) -> BaseException | None:
        """The error as this API reports it."""
        return error


class SandboxGone(GatewayError):
    """What E2B's proxy answers for a sandbox it does not know (the SDK: not running)."""

    status = 502
    code = "sandbox_not_found"


class SandboxHandler(E2BHandler):
    """Sandbox traffic: authenticated by the sandbox's access token, for one port's paths."""

    port = ENVD_PORT  # the port whose paths this handler serves
    address: Address

    @property
    def credentials(self) -> Credentials:
        return self.settings["sbx_e2b_credentials"]

    def authenticate(self) -> Principal:
        try:
            request = self.request
            self.address = self.credentials.sandbox(
                request.headers, request.host, request.method, request.query
            )
        except Unauthorized:
            self.audit_refusal(sandbox_token(self.request.headers))
            raise
        owner = self.manager.owner_of(self.address.sandbox_id)
        if owner is None:
            raise SandboxGone(f"The sandbox {self.address.sandbox_id} was not found")
        if self.address.port != self.port:
            raise NotFound(f"port {self.address.port} does not serve {self.request.path}")
        self.audit_session = self.sandbox_id
        self.principal = dataclasses.replace(owner, token_id=f"sandbox:{self.sandbox_id[:8]}")
        return self.principal

    @property
    def sandbox_id(self) -> str:
        return self.address.sandbox_id

    def translate(self, error: BaseException | None) -> BaseException | None:
        if isinstance(error, SessionNotFound):  # ended between the check and the call
            return SandboxGone(f"The sandbox {self.sandbox_id} was not found")
        return error
