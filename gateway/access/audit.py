"""The audit trail: who did what to which session, when, and how it went.

Every state-changing API action and every authentication failure becomes
one event, stored in SQLite and written to the log as one JSON line (logger
``gateway.audit``). Code is recorded by size and SHA-256, never verbatim
(the history holds it for those allowed to read it); tokens only by the
short id of their digest. Writes go to the store's thread without holding
up the request.

Authentication failures are folded: the first from an address is one event
at once, the rest from that address in the same minute one more event when
the minute ends (or the gateway stops), whose ``detail.count`` says how many
it stands for. A caller guessing tokens in a loop so costs two rows and two
log lines a minute, not one per guess.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from typing import Any

from ..egress.packages import Install
from ..egress.proxy import EgressDenial
from ..store.base import Store
from ..timestamps import iso
from .auth import Principal, token_id

log = logging.getLogger("gateway.audit")

FOLD_SECONDS = 60.0  # authentication failures from one address become one event per this long
MAX_FOLDS = 4096  # addresses folded separately at once; failures from more fold under "*"


def code_facts(code: str) -> dict[str, Any]:
    """How an execute's code is audited: its size and hash, not its text."""
    data = code.encode(errors="surrogatepass")
    return {"code_bytes": len(data), "code_sha256": hashlib.sha256(data).hexdigest()}


class AuditLog:
    """Records audit events; the admin API reads them back."""

    def __init__(self, store: Store, fold_seconds: float = FOLD_SECONDS) -> None:
        self.store = store
        self.fold_seconds = fold_seconds
        self._folds: dict[str | None, _Fold] = {}

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

    def approval(self, doc: dict[str, Any], who: Principal | None) -> None:
        """Record a held execute's request or decision: who, when, what (by hash), why."""
        self.record(
            f"approval.{doc['state']}",
            who or Principal(tenant=doc["tenant"], token_id=doc["decided_by"] or "gateway"),
            "ok",
            session_id=doc["session_id"],
            detail={
                "approval_id": doc["id"],
                "requested_by": doc["requested_by"],
                "reasons": doc["reasons"],
                "reason": doc["reason"],
                **code_facts(doc["code"]),
            },
        )

    def auth_failure(self, remote: str | None, method: str, path: str, token: str | None) -> bool:
        """Record a refused token (401), folded per address and minute.

        Returns whether it was logged now (the first from its address this
        minute): callers keep their own log lines for those only.
        """
        detail = {"method": method, "path": path, "token_id": token_id(token) if token else None}
        if remote not in self._folds and len(self._folds) >= MAX_FOLDS:
            remote = "*"
        fold = self._folds.get(remote)
        if fold is not None:
            fold.count += 1
            fold.detail = detail
            return False
        timer = asyncio.get_running_loop().call_later(self.fold_seconds, self._unfold, remote)
        self._folds[remote] = _Fold(detail, timer)
        self.record(
            "auth.failure", None, "denied", status=401, remote=remote, detail={**detail, "count": 1}
        )
        return True

    def _unfold(self, remote: str | None) -> None:
        fold = self._folds.pop(remote)
        fold.timer.cancel()
        if fold.count:
            detail = {**fold.detail, "count": fold.count, "seconds": self.fold_seconds}
            self.record("auth.failure", None, "denied", status=401, remote=remote, detail=detail)

    def close(self) -> None:
        """Write the failures still being folded; the gateway calls it before closing the store."""
        for remote in list(self._folds):
            self._unfold(remote)

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

    def package_install(self, install: Install, owner: Principal | None) -> None:
        """Record a package file a session installed from the cache, or one its policy refused."""
        detail = {
            "name": install.name,
            "version": install.version,
            "filename": install.filename,
            "installer": install.installer,
        }
        if install.refused is not None:
            self.record("package.refused", owner, "denied", session_id=install.session_id,
                        detail={**detail, "reason": install.refused})  # fmt: skip
            return
        detail.update(size=install.size, sha256=install.sha256, cached=install.cached)
        self.record("package.install", owner, "ok", session_id=install.session_id, detail=detail)

    async def events(
        self, filters: dict[str, str], since: str | None, until: str | None, limit: int
    ) -> list[dict[str, Any]]:
        """Stored events matching every filter, newest first: what the admin API reads."""
        return await self.store.audit_events(filters, since, until, limit)

    async def verify(self, tenant: str | None, session_id: str | None) -> dict[str, Any]:
        """Walk the records' hash chains (a session's, a tenant's, or all): what is wrong."""
        return await self.store.verify_chains(tenant, session_id)


class _Fold:
    """Failures from one address after its first, this minute: how many, and the latest."""

    def __init__(self, detail: dict[str, Any], timer: asyncio.TimerHandle) -> None:
        self.count = 0
        self.detail = detail
        self.timer = timer


def _report_failure(done: Any) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("an audit event could not be stored: %s", done.exception())
