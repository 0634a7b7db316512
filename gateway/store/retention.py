"""Old history pruned in the background, by the ``Retention`` the store is given.

A bounded batch at a time, each one call on the store's thread, so pruning
a large backlog never holds up the writes around it for long.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..tasks import end_task
from ..timestamps import iso
from .base import Retention
from .database import Database

log = logging.getLogger(__name__)

PRUNE_BATCH = 200  # rows one pruning call deletes at most
BACKLOG_PAUSE = 0.05  # seconds between two batches of a backlog


class Pruner:
    """Deletes executions, egress connections and ended sessions past the retention."""

    def __init__(self, db: Database, retention: Retention) -> None:
        self.db = db
        self.retention = retention
        self._grown: set[str] = set()  # sessions that may hold more than max_executions
        self._task: asyncio.Task | None = None
        if retention.max_executions:
            db.on_open(self._find_grown)

    def grew(self, session_id: str) -> None:
        """A session got one more execution: it may now hold more than it keeps."""
        self._grown.add(session_id)

    def _find_grown(self) -> None:
        over = self.db.rows(
            "SELECT session_id FROM executions GROUP BY session_id HAVING count(*) > ?",
            (self.retention.max_executions,),
        )
        self._grown.update(row[0] for row in over)

    def start(self) -> None:
        if self.retention.max_age or self.retention.max_executions:
            self._task = asyncio.create_task(self._prune_forever(), name="sbx-store-prune")

    async def stop(self) -> None:
        await end_task(self._task)

    async def _prune_forever(self) -> None:
        """Prune a batch at a time: back to back while there is a backlog, else each interval."""
        while True:
            try:
                backlog = await self.prune()
            except Exception:
                log.exception("pruning old history failed; trying again later")
                backlog = False
            await asyncio.sleep(BACKLOG_PAUSE if backlog else self.retention.interval)

    async def prune(self) -> bool:
        """Delete one batch of history past the retention; whether more may be due."""
        retention = self.retention
        cutoff = iso(time.time() - retention.max_age) if retention.max_age else None
        sessions, self._grown = self._grown, set()

        def delete() -> bool:
            cursor = self.db.cursor
            budget = PRUNE_BATCH
            self.db.ids.keep_newest()
            if cutoff is not None:
                budget -= cursor(
                    "DELETE FROM executions WHERE id IN (SELECT id FROM executions"
                    " WHERE started_at < ? AND status != 'running' ORDER BY started_at LIMIT ?)",
                    (cutoff, budget),
                ).rowcount
                budget -= cursor(  # never the newest: SQLite would hand its id out again
                    "DELETE FROM connections WHERE id IN (SELECT id FROM connections"
                    " WHERE at < ? AND id < (SELECT max(id) FROM connections) ORDER BY at"
                    " LIMIT ?)",
                    (cutoff, max(budget, 0)),
                ).rowcount
                budget -= cursor(
                    "DELETE FROM sessions WHERE id IN (SELECT id FROM sessions s"
                    " WHERE ended_at < ? AND NOT EXISTS"
                    " (SELECT 1 FROM executions e WHERE e.session_id = s.id) LIMIT ?)",
                    (cutoff, max(budget, 0)),
                ).rowcount
            for session_id in sessions if retention.max_executions else ():
                if budget <= 0:
                    self._grown.add(session_id)  # not reached in this batch
                    continue
                newest_cut = cursor(
                    "SELECT id FROM executions WHERE session_id = ?"
                    " ORDER BY id DESC LIMIT 1 OFFSET ?",
                    (session_id, retention.max_executions),
                ).fetchone()
                if newest_cut is None:
                    continue
                deleted = cursor(
                    "DELETE FROM executions WHERE id IN (SELECT id FROM executions"
                    " WHERE session_id = ? AND id <= ? AND status != 'running'"
                    " ORDER BY id LIMIT ?)",
                    (session_id, newest_cut[0], budget),
                ).rowcount
                if deleted == budget:
                    self._grown.add(session_id)  # more of it next time
                budget -= deleted
            return budget <= 0

        try:
            return await self.db.run(delete)
        except Exception:
            self._grown |= sessions  # their turn comes again
            raise
