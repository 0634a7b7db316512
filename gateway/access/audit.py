"""The audit trail: who did what to which session, when, and how it went.

Every state-changing API action and every authentication failure becomes
one event, stored in SQLite and written to the log as one JSON line (logger
``gateway.audit``). Code is recorded by size and SHA-256, never verbatim
(the history holds it for those allowed to read it); tokens only by the
short id of their digest. Writes go to the store's thread without holding
up the request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

from ..sandbox.egress.proxy import EgressDenial
from ..sandbox.workspace import iso
from ..store.sqlite import Store
from .auth import Principal

log = logging.getLogger("gateway.audit")


def code_facts(code: str) -> dict[str, Any]:
    """How an execute's code is audited: its size and hash, not its text."""
    data = code.encode(errors="surrogatepass")
    return {"code_bytes": len(data), "code_sha256": hashlib.sha256(data).hexdigest()}


class AuditLog:
    """Records audit events; the admin API reads them back."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def record(
        self,
        action: str,
        who: Principal | None,
        outcome: str,
        *,
        session_id: str | None = None,
        status: int | None = None,
        remote: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Log and store one event; ``outcome`` is ok, denied, failed or error."""
        event = {
            "at": iso(time.time()),
            "tenant": who.tenant if who else None,
            "token_id": who.token_id if who else None,
            "action": action,
            "session_id": session_id,
            "outcome": outcome,
            "status": status,
            "remote": remote,
            "detail": detail or None,
        }
        log.info(json.dumps({k: v for k, v in event.items() if v is not None}))
        written = self.store.add_audit(event)
        written.add_done_callback(_report_failure)

    def egress_denied(self, denial: EgressDenial, owner: Principal | None) -> None:
        """Record a request a session's network policy refused, under its owner's tenant."""
        self.record(
            "egress.denied",
            owner,
            "denied",
            session_id=denial.session_id,
            detail={
                "method": denial.method,
                "target": denial.target,
                "reason": denial.reason,
                "suppressed": denial.suppressed,
            },
        )

    async def events(
        self, filters: dict[str, str], since: str | None, until: str | None, limit: int
    ) -> list[dict[str, Any]]:
        """Stored events matching every filter, newest first: what the admin API reads."""
        return await self.store.audit_events(filters, since, until, limit)


def _report_failure(done: Any) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("an audit event could not be stored: %s", done.exception())
