"""The audit log, for admins: ``GET /v1/audit`` with filters."""

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


routes = [(r"/v1/audit", AuditHandler)]
