"""Lifecycle events: what the manager, pausing and the approval desk tell, as documents.

The domain only tells (``SessionEvents.tell``, the desk's listener ``approval``);
whoever listens is a sink ``app`` adds (the webhooks' ``publish``), so nothing
here knows HTTP and with no sink nothing is built. Event types follow E2B's
lifecycle webhooks (``sandbox.lifecycle.*``) where E2B defines one; a death
and the approvals are the gateway's own. An event never carries env values,
and a reason passes the session's masker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from ..timestamps import iso
from .model import Session

TYPES = {
    "created": "sandbox.lifecycle.created",
    "paused": "sandbox.lifecycle.paused",
    "resumed": "sandbox.lifecycle.resumed",
    "ended": "sandbox.lifecycle.killed",  # E2B's name for a sandbox's end
    "died": "sandbox.lifecycle.died",
    "approval_pending": "sandbox.approval.pending",
    "approval_decided": "sandbox.approval.decided",
}
# What an approval event keeps of the request: no code, no findings (read them from the API).
APPROVAL_FIELDS = (
    "id", "state", "requested_by", "reasons", "created_at", "expires_at", "decided_by",
    "decided_at", "reason",
)  # fmt: skip

Sink = Callable[[dict[str, Any]], None]


def event(kind: str, tenant: str, session_id: str, template: str, data: dict[str, Any]) -> dict:
    """One event's document: E2B's fields (``sandboxId``, ``sandboxTeamId``, ``eventData``)
    and the gateway's names for the same (``session_id``, ``tenant``)."""
    return {
        "version": "v2",
        "id": uuid.uuid4().hex,
        "type": TYPES[kind],
        "timestamp": iso(time.time()),
        "tenant": tenant,
        "session_id": session_id,
        "sandboxId": session_id,
        "sandboxTeamId": tenant,
        "sandboxTemplateId": template,
        "eventData": data,
    }


class SessionEvents:
    """The one seam the domain tells its transitions through."""

    def __init__(self) -> None:
        self.sinks: list[Sink] = []

    def tell(self, kind: str, session: Session, reason: str | None = None) -> None:
        """``session`` was created, paused, resumed, ended or died (``reason``: why)."""
        if not self.sinks:
            return
        data: dict[str, Any] = {
            "state": session.state,
            "kernel": session.kernel_name,
            "image": session.image,
            "sandbox_metadata": session.metadata,
        }
        if reason is not None:
            data["reason"] = session.masker.text(reason)
        if kind in ("paused", "ended", "died"):  # E2B's execution details, as it sends them
            now = session.ended_at or time.time()
            data["execution"] = {
                "started_at": iso(session.created_at),
                "vcpu_count": _number(session.limits.cpus),  # E2B's is whole; a typed reader's too
                "memory_mb": session.limits.memory // 2**20,
                "execution_time": round((now - session.created_at) * 1000),
            }
        self._send(event(kind, session.tenant, session.id, session.kernel_name, data))

    def approval(self, doc: dict[str, Any]) -> None:
        """The approval desk's listener: a held execute was requested or decided."""
        if not self.sinks:
            return
        kind = "approval_pending" if doc["state"] == "pending" else "approval_decided"
        data = {"approval": {key: doc.get(key) for key in APPROVAL_FIELDS}}
        self._send(event(kind, doc["tenant"], doc["session_id"], "", data))

    def _send(self, doc: dict[str, Any]) -> None:
        for sink in list(self.sinks):
            sink(doc)


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value
