"""The audit log, for admins: ``GET /v1/audit`` with filters, and
``GET /v1/admin/audit/verify``: the records' hash chains walked (store/chain.py)."""

from __future__ import annotations

from ..errors import BadRequest
from ..store.base import AUDIT_FILTERS
from .base import JSONHandler

MAX_EVENTS = 1000


class AuditHandler(JSONHandler):
    async def get(self) -> None:
        self.require_admin("the audit log")
        filters = {
            name: self.get_argument(name) for name in AUDIT_FILTERS if self.get_argument(name, None)
        }
        try:
            limit = int(self.get_argument("limit", "100"))
        except ValueError:
            raise BadRequest("limit must be a whole number") from None
        if not 1 <= limit <= MAX_EVENTS:
            raise BadRequest(f"limit must be between 1 and {MAX_EVENTS}")
        events = await self.audit.events(
            filters,
            since=self.get_argument("since", None),
            until=self.get_argument("until", None),
            limit=limit,
        )
        self.send({"events": events})


class AuditVerifyHandler(JSONHandler):
    async def get(self) -> None:
        self.require_admin("verifying the records' chains")
        tenant = self.get_argument("tenant", None)
        session_id = self.get_argument("session", None)
        if tenant is not None and session_id is not None:
            raise BadRequest("give tenant or session, not both: a session's chain is its own")
        self.send(await self.audit.verify(tenant, session_id))


routes = [(r"/v1/audit", AuditHandler), (r"/v1/admin/audit/verify", AuditVerifyHandler)]
