"""Approvers' API: held executes listed and decided; tenants' policies read and replaced."""

from __future__ import annotations

from pathlib import Path

from ..errors import BadRequest
from .base import JSONHandler
from .forward import passed_on

# Read once at import, like the API document: the page never changes while running.
_PAGE = (Path(__file__).resolve().parent / "pages" / "approvals.html").read_bytes()

_ID = r"(?P<approval_id>[0-9a-f]{32})"
_TENANT = r"(?P<tenant>[^/]+)"
# Content types a policy may be sent as; JSON is YAML too.
_FORMATS = {
    "application/toml": "toml",
    "text/toml": "toml",
    "application/yaml": "yaml",
    "application/x-yaml": "yaml",
    "text/yaml": "yaml",
    "application/json": "yaml",
}


class ApprovalsPageHandler(JSONHandler):
    """The approvers' page: public HTML; it calls the API with the token it is given."""

    public = True

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        # Its own script and styles only; it reaches nothing but this gateway.
        self.set_header(
            "Content-Security-Policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        )

    async def get(self) -> None:
        self.finish(_PAGE)


class ApprovalsHandler(JSONHandler):
    async def get(self) -> None:
        desk = self.desk
        found = await desk.list(self.principal, self.get_argument("state", None))
        self.send({"approvals": found})


class ApprovalHandler(JSONHandler):
    async def get(self, approval_id: str) -> None:
        self.send(await self.desk.get(approval_id, self.principal))


class ApproveHandler(JSONHandler):
    actions = {"POST": "approval.decide"}
    approve = True

    async def post(self, approval_id: str) -> None:
        reason = self.json_body().get("reason")
        desk = self.desk
        session_id = await desk.held_elsewhere(approval_id, self.principal)
        if (
            session_id is not None
            and not passed_on(self.request)
            and self.locations.may_be_elsewhere(session_id)
        ):
            await self._pass_on(session_id)  # to the gateway whose execute waits for it
            if self._finished:
                return
        approval = await desk.decide(approval_id, self.principal, self.approve, reason)
        self.audit_session = approval.session_id
        self.audit_detail.update(approval_id=approval.id, decision=approval.state)
        self.send(approval.to_json())


class DenyHandler(ApproveHandler):
    approve = False


class PolicyHandler(JSONHandler):
    actions = {"PUT": "policy.replace"}

    async def get(self, tenant: str) -> None:
        self.require_admin("reading policies")
        policy = self.book.policy(tenant)
        self.send({"tenant": tenant, "policy": policy.to_json(), "source": policy.source})

    async def put(self, tenant: str) -> None:
        self.require_admin("replacing policies")
        kind = self.request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        fmt = _FORMATS.get(kind)
        if fmt is None:
            raise BadRequest(
                f"send the policy as TOML (Content-Type: application/toml) or YAML "
                f"(application/yaml), not {kind or 'no content type'!r}"
            )
        try:
            text = self.request.body.decode()
        except UnicodeDecodeError:
            raise BadRequest("a policy is UTF-8 text") from None
        policy = await self.book.replace(tenant, text, fmt)
        self.audit_detail["mode"] = policy.mode
        self.send({"tenant": tenant, "policy": policy.to_json(), "source": policy.source})


class PolicyReloadHandler(JSONHandler):
    actions = {"POST": "policy.reload"}

    async def post(self) -> None:
        self.require_admin("reloading policies")
        tenants = await self.book.reload()
        self.send({"tenants": tenants})


routes = [
    (r"/approvals", ApprovalsPageHandler),
    (r"/v1/approvals", ApprovalsHandler),
    (rf"/v1/approvals/{_ID}", ApprovalHandler),
    (rf"/v1/approvals/{_ID}/approve", ApproveHandler),
    (rf"/v1/approvals/{_ID}/deny", DenyHandler),
    (r"/v1/policies/reload", PolicyReloadHandler),
    (rf"/v1/policies/{_TENANT}", PolicyHandler),
]
