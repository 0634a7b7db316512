"""What sessions used and did: the read side, for live sessions and ended ones alike.

Usage now (the placement's CPU and memory, the proxy's bytes, the workspace's
disk), pages of history and of egress connections (from the store), the
files a session was given (from the audit log, for a replay), its snapshots.
Nothing here changes a session.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ..access.auth import Principal
from ..errors import BadRequest, GatewayError
from ..sandbox.base import Placement
from ..store.base import HISTORY_PAGE, HISTORY_PAGE_MAX, Store
from ..timestamps import iso
from .manager import SessionManager
from .pool import WarmPool
from .snapshots import Snapshots

# Upload events read back for an export's record of inputs (the newest, past this many).
MAX_RECORDED_UPLOADS = 10_000


class History(NamedTuple):
    """A page of a session's executions, its next cursor, and where a fork came from.

    ``forked_from``: the parent session and snapshot (None unless a fork), so a
    reader of the history alone knows its first executions ran elsewhere.
    """

    executions: list[dict[str, Any]]
    next: int | None
    forked_from: dict[str, Any] | None


class Reports:
    """Read-side queries over the manager's sessions and the store."""

    def __init__(
        self,
        sessions: SessionManager,
        store: Store,
        placement: Placement,
        snapshots: Snapshots,
        pool: WarmPool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sessions = sessions
        self.store = store
        self.placement = placement
        self.pool = pool
        self.snapshots = snapshots
        self.clock = clock

    def health(self) -> dict[str, Any]:
        """The gateway's own state for a load balancer: sessions, warm kernels, engine."""
        return {
            "sessions": len(self.sessions.sessions),
            "pool_ready": {name: stats["ready"] for name, stats in self.pool.stats().items()},
            "engine": "down" if self.placement.unavailable() else "up",
        }

    async def usage(self, session_id: str, who: Principal) -> dict[str, Any]:
        """What a live session uses now: CPU, memory (now and at peak), network, disk.

        CPU and memory are the sandbox's (None while paused, but frozen: its memory
        is held, or where the placement cannot tell); network is what passed the
        egress proxy since this gateway started; disk is the workspace's files.
        """
        session = self.sessions.get(session_id, who)
        sandbox: dict[str, Any] = {}
        if session.state in ("idle", "busy") or session.frozen:
            sandbox = await self.placement.usage(session.id)
        disk = None
        if session.workspace is not None and session.state != "paused":
            with contextlib.suppress(GatewayError, OSError):
                disk = await session.workspace.usage()
        limits = session.limits
        return {
            "session_id": session.id,
            "state": session.state,
            "at": iso(self.clock()),
            "cpu_seconds": sandbox.get("cpu_seconds"),
            "cpus_limit": limits.cpus,
            "memory_bytes": sandbox.get("memory_bytes"),
            "memory_peak_bytes": sandbox.get("memory_peak_bytes"),
            "memory_limit_bytes": limits.memory,
            "network": {
                "bytes_sent": session.egress_bytes[0],
                "bytes_received": session.egress_bytes[1],
                "connections": session.egress_recorded,
            },
            "disk_bytes": disk,
            "disk_limit_bytes": limits.disk,
        }

    async def network(
        self, session_id: str, who: Principal, after: int = 0, limit: int = HISTORY_PAGE
    ) -> tuple[list[dict[str, Any]], int | None]:
        """A page of the session's egress connections after the cursor ``after``."""
        _check_page(after, limit)
        await self.sessions.record(session_id, who)  # 404 for unknown ids and others'
        return await self.store.connections(session_id, after, limit)

    async def history(
        self, session_id: str, who: Principal, after: int = 0, limit: int = HISTORY_PAGE
    ) -> History:
        """A page of a session's executions after the cursor ``after`` (an execution id)."""
        _check_page(after, limit)
        record = await self.sessions.record(session_id, who)  # 404 for unknown ids and others'
        page = await self.store.history(session_id, after, limit)
        return History(page.executions, page.next, record.get("forked_from"))

    async def uploads(self, session_id: str, who: Principal) -> list[dict[str, Any]]:
        """Every file uploaded to the session, the last upload of each path, by path.

        What a replay must bring (``path``, ``size``, ``sha256``, ``uploaded_at``),
        read from the audit log, which records each upload's hash.
        """
        await self.sessions.record(session_id, who)
        filters = {"session_id": session_id, "action": "files.upload", "outcome": "ok"}
        events = await self.store.audit_events(filters, limit=MAX_RECORDED_UPLOADS)
        found: dict[str, dict[str, Any]] = {}
        for event in reversed(events):  # oldest first: a later upload of a path wins
            detail = event.get("detail") or {}
            for saved in detail.get("files") or [detail]:  # a multipart batch, or one PUT
                if "path" in saved and "sha256" in saved:
                    path = str(saved["path"]).strip("/")
                    found[path] = {
                        "path": path,
                        "size": saved.get("size"),
                        "sha256": saved["sha256"],
                        "uploaded_at": event["at"],
                    }
        return sorted(found.values(), key=lambda f: f["path"])

    async def chain_head(self, session_id: str, who: Principal) -> dict[str, Any]:
        """The session's hash chain of records (store/chain.py): its count and newest hash."""
        await self.sessions.record(session_id, who)  # 404 for unknown ids and others'
        return await self.store.chain_head(session_id)

    async def check_head(self, session_id: str, who: Principal, head: Any) -> dict[str, Any]:
        """Whether a chain head an export carried (count, hash) is where the session's chain
        was at that count: the export and the gateway's records tell the same story."""
        await self.sessions.record(session_id, who)  # 404 for unknown ids and others'
        if not (
            isinstance(head, dict)
            and type(head.get("count")) is int
            and head["count"] >= 0
            and isinstance(head.get("hash"), str)
        ):
            raise BadRequest(
                "the notebook carries no chain head (metadata.sbx.chain with count and hash):"
                " export it again from a gateway that chains its records"
            )
        now = await self.store.chain_head(session_id, head["count"])
        matches = now.get("at") == head["hash"]
        if matches:
            detail = f"the gateway's chain holds this export's {head['count']} records"
        elif now["count"] < head["count"]:
            detail = f"the gateway's chain holds {now['count']} records; the export says more"
        else:
            detail = (
                f"the export's head does not match the gateway's chain at record {head['count']}"
            )
        return {"session_id": session_id, "matches": matches, "detail": detail,
                "exported": head, "gateway": now}  # fmt: skip

    async def snapshots_of(self, session_id: str, who: Principal) -> list[dict[str, Any]]:
        """A session's snapshots, live or ended, oldest first."""
        await self.sessions.record(session_id, who)  # 404 for unknown ids and others'
        return await self.snapshots.of_session(session_id)


def _check_page(after: int, limit: int) -> None:
    """A 400 for a page cursor or size the store would not answer sensibly."""
    if not 1 <= limit <= HISTORY_PAGE_MAX:
        raise BadRequest(f"limit must be between 1 and {HISTORY_PAGE_MAX}")
    if not 0 <= after < 2**63:  # the store's ids are 64-bit
        raise BadRequest("after must be a cursor from a page's 'next', or 0")
