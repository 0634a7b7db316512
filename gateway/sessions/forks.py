"""Many sessions from one session's state at once (E2B's ``fork(count=...)``).

One snapshot is taken, ``count`` sessions are forked from it side by side,
and the snapshot is deleted: it is only the means, and the forks hold its
state once made. Each fork succeeds or fails on its own, so a caller learns
which did (a quota reached halfway stops only the rest).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..access.auth import Principal
from ..errors import BadRequest, GatewayError
from .model import Session
from .requests import CreateSession, TakeSnapshot, seconds_of

if TYPE_CHECKING:
    from .manager import SessionManager

MAX_FORKS = 20  # forks from one call (E2B's own bound)


class Forks:
    """Forks a live session ``count`` times through one throwaway snapshot."""

    def __init__(self, manager: SessionManager, max_ttl: float) -> None:
        """``max_ttl``: the server's longest ttl, which an auto-pausing fork lives to."""
        self.manager = manager
        self.max_ttl = max_ttl

    async def fork(
        self, session_id: str, who: Principal, count: Any, timeout: Any
    ) -> tuple[str, list[Session | GatewayError]]:
        """The snapshot's id and each fork (or why it failed), in order.

        A fork ends ``timeout`` seconds from now, or, if the source auto-pauses,
        pauses once idle that long, as its source does.
        """
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_FORKS:
            raise BadRequest(f"count must be an integer from 1 to {MAX_FORKS}")
        seconds = seconds_of(timeout, "timeout")
        source = self.manager.get(session_id, who)
        doc = await self.manager.snapshot(session_id, who, TakeSnapshot())
        auto_pause = source.idle_action == "pause"
        request = CreateSession(
            ttl=self.max_ttl if auto_pause else seconds,
            idle_timeout=seconds,
            idle_action=source.idle_action,
            survive_crashes=source.survive_crashes,
            metadata=source.metadata,
            from_snapshot=doc["id"],
            kernel="",
        )
        try:
            results = await asyncio.gather(
                *(self.manager.create(request, who) for _ in range(count)),
                return_exceptions=True,
            )
        finally:
            await self.manager.snapshots.delete(doc["id"], who)
        forks: list[Session | GatewayError] = []
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, GatewayError):
                raise result
            forks.append(result)
        return doc["id"], forks
