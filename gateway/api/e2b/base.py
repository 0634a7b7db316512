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

import dataclasses
import json
import re
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import tornado.web
from tornado import httputil

from ...access.auth import Authenticator, Principal, presented_token
from ...access.file_urls import FileUrls, Grant, signed
from ...access.mcp_tokens import McpTokens, Registration
from ...access.sandbox_tokens import SandboxTokens
from ...access.volume_tokens import VolumeTokens
from ...errors import BadRequest, GatewayError, NotFound, SessionNotFound, Unauthorized
from ..base import JSONHandler

ENVD_PORT = 49983  # envd: files, commands, health
FILES = "/files"  # envd's file route: the only one a signed URL opens
JUPYTER_PORT = 49999  # the code interpreter: execute, contexts
MCP_PORT = 50005  # the sandbox's MCP URL (``get_mcp_url()``): its own token only (mcp.py)
_VOLUME_CONTENT = re.compile(r"/volumecontent/([^/]+)/(?:dir|path|file)")


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


def content_volume(path: str) -> str | None:
    """The volume a path of E2B's volume content API names (``/volumecontent/{id}/...``)."""
    match = _VOLUME_CONTENT.fullmatch(path)
    return urllib.parse.unquote(match[1]) if match else None


def volume_token(headers: httputil.HTTPHeaders) -> str | None:
    """What the SDK's volume client sends: its volume's token, as a Bearer token."""
    return presented_token(headers.get("Authorization"), None)


def sandbox_token(headers: httputil.HTTPHeaders) -> str | None:
    return headers.get("X-Access-Token") or headers.get("E2B-Traffic-Access-Token")


@dataclasses.dataclass(frozen=True)
class Access:
    """Who may reach which sandbox: a sandbox token's holder, or a signed URL's ``grant``."""

    address: Address
    holder: str  # the id of the API token the sandbox token was handed to
    grant: Grant | None = None  # a signed file URL: this one operation on this one path


class Credentials:
    """Checks E2B credentials; the edge asks it before a body is read, handlers after.

    ``holders``: the ids of the API tokens that may hold a sandbox's token
    (those acting for its tenant; none once the sandbox is gone).
    ``principal_of``: the API token with an id, while it is configured.
    ``mcp_of``: a live sandbox's MCP token registration (``mcp_tokens.py``).
    """

    def __init__(
        self,
        tokens: SandboxTokens,
        urls: FileUrls,
        holders: Callable[[str], Iterable[str]],
        principal_of: Callable[[str], Principal | None],
        mcp_of: Callable[[str], Registration | None],
    ) -> None:
        self.tokens = tokens
        self.volumes = VolumeTokens(tokens)
        self.mcp_tokens = McpTokens(tokens, mcp_of)
        self.urls = urls
        self.holders = holders
        self.principal_of = principal_of

    @classmethod
    def in_data_dir(
        cls,
        data_dir: Path,
        auth: Authenticator,
        owner_of: Callable[[str], Principal | None],
        mcp_of: Callable[[str], Registration | None],
    ) -> Credentials:
        """Under the key and the revocations kept in ``data_dir``; a sandbox's token may be
        held by any token acting for its tenant (``owner_of`` a sandbox: its tenant)."""
        tokens = SandboxTokens.in_data_dir(data_dir)

        def holders(sandbox_id: str) -> Iterable[str]:
            owner = owner_of(sandbox_id)
            return auth.holders(owner.tenant) if owner is not None else ()

        urls = FileUrls.in_data_dir(tokens, data_dir)
        return cls(tokens, urls, holders, auth.principal_of, mcp_of)

    def volume_holder(self, volume_id: str, token: str | None) -> Principal | None:
        """The API token a volume token was handed to, if it was for ``volume_id`` and that
        API token is still configured; else None."""
        holder = self.volumes.holder(volume_id, token)
        return None if holder is None else self.principal_of(holder)

    async def revoke(self, sandbox_id: str, url: object) -> None:
        """A signed file URL of the sandbox stops working now."""
        await self.urls.revoke(sandbox_id, url, self.holders(sandbox_id))

    def sandbox(
        self, headers: httputil.HTTPHeaders, host: str, method: str, path: str, query: str
    ) -> Access:
        """The sandbox a request may reach; its token must be that sandbox's (else 401).

        A signed file URL (the SDK's ``download_url`` / ``upload_url``) stands
        in for the token on envd's ``/files`` only, for what it was signed for.
        A wrong token answers alike for a sandbox that exists and one that does
        not, so a token reveals nothing of others.
        """
        address = address_of(headers, host)
        if address is None:
            raise BadRequest(
                "name the sandbox: send E2b-Sandbox-Id and E2b-Sandbox-Port headers, "
                "or a Host of the form PORT-SANDBOXID.DOMAIN"
            )
        if address.port == MCP_PORT:
            return self._mcp_access(address, headers)
        presented = sandbox_token(headers)
        if presented is None and signed(query):
            if (address.port, path) != (ENVD_PORT, FILES):
                raise Unauthorized(
                    "a signed URL is good only for the file it was signed for, on /files; "
                    "send the sandbox's access token (X-Access-Token) for anything else"
                )
            holders = self.holders(address.sandbox_id)
            grant = self.urls.grant(address.sandbox_id, method, query, holders)
            return Access(address, grant.holder, grant)
        holder = self.tokens.holder(address.sandbox_id, presented)
        if holder is None:
            raise Unauthorized(
                "the sandbox access token is missing or not this sandbox's; use the "
                "envdAccessToken that created (or connected to) the sandbox"
            )
        return Access(address, holder)

    def _mcp_access(self, address: Address, headers: httputil.HTTPHeaders) -> Access:
        """The MCP URL opens to the sandbox's MCP token only (a Bearer token), while the API
        token it was registered under still acts for the sandbox's tenant."""
        bearer = presented_token(headers.get("Authorization"), None)
        holder = self.mcp_tokens.holder(address.sandbox_id, bearer)
        if holder is None or holder not in self.holders(address.sandbox_id):
            raise Unauthorized(
                "the MCP token is missing or not this sandbox's; send the sandbox's "
                "get_mcp_token() as 'Authorization: Bearer <token>'"
            )
        return Access(address, holder)

    def accepts(self, start_line: httputil.RequestStartLine, headers: httputil.HTTPHeaders) -> bool:
        """Whether a request carries a sandbox's own token, or on a volume's content path that
        volume's (the edge then lets its body in)."""
        path, _, query = start_line.path.partition("?")
        volume_id = content_volume(path)
        if volume_id is not None:
            return self.volume_holder(volume_id, volume_token(headers)) is not None
        try:
            self.sandbox(headers, headers.get("Host", ""), start_line.method, path, query)
        except GatewayError:
            return False
        return True


class E2BHandler(JSONHandler):
    """Errors in E2B's shape; the API key comes from ``X-API-Key``."""

    @property
    def credentials(self) -> Credentials:
        return self.settings["sbx_e2b_credentials"]

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
    grant: Grant | None = None  # set when a signed file URL stands in for the token

    def authenticate(self) -> Principal:
        """The sandbox's tenant, with no rights of the token the sandbox token was handed to
        (admin, approver); what it asks for is that token's (``acting_for``)."""
        request = self.request
        try:
            access = self.credentials.sandbox(
                request.headers, request.host, request.method, request.path, request.query
            )
        except Unauthorized:
            self.audit_refusal(sandbox_token(request.headers))
            raise
        self.address, self.grant = access.address, access.grant
        owner = self.manager.owner_of(self.address.sandbox_id)
        if owner is None:
            raise SandboxGone(f"The sandbox {self.address.sandbox_id} was not found")
        if self.address.port != self.port:
            raise NotFound(f"port {self.address.port} does not serve {request.path}")
        self.audit_session = self.sandbox_id
        self.principal = Principal(
            tenant=owner.tenant, token_id=f"sandbox:{self.sandbox_id[:8]}", acting_for=access.holder
        )
        return self.principal

    @property
    def sandbox_id(self) -> str:
        return self.address.sandbox_id

    def translate(self, error: BaseException | None) -> BaseException | None:
        if isinstance(error, SessionNotFound):  # ended between the check and the call
            return SandboxGone(f"The sandbox {self.sandbox_id} was not found")
        return error
