"""Executions and the outputs of those still running: written as they run, read as history.

A row is written as ``running`` before the kernel sees the code (its id
handed out at once, from ``Ids``), each output is appended as it is kept,
and the outcome replaces the row at the end. When the running row is still
queued at the end (a quick execute: all of it in one batch), the outcome is
written in its place, as one row, and its queued outputs are dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from .base import HISTORY_PAGE, HistoryPage
from .chain import TABLES, Chain
from .connections import Connections
from .database import Database

PAGE_BYTES = 4 << 20  # code and outputs (as stored) a page of history holds at most

_EXECUTION_COLUMNS = (
    "execution_count", "status", "outputs", "truncated", "error", "ended_at", "duration_ms",
    "files",
)  # fmt: skip

_CHAINED = ", ".join(TABLES["execution"][1])  # the columns an execution's digest covers

_INSERT_FINISHED = (
    "INSERT INTO executions (id, session_id, code, description, started_at, review, "
    + ", ".join(_EXECUTION_COLUMNS)
    + ") VALUES ("
    + ", ".join("?" * (6 + len(_EXECUTION_COLUMNS)))
    + ")"
)


class Executions:
    """The ``executions`` and ``running_outputs`` tables."""

    def __init__(
        self, db: Database, connections: Connections, chain: Chain, grew: Callable[[str], None]
    ) -> None:
        """``grew``: told of each session an execution was added to (retention prunes it)."""
        self.db = db
        self.connections = connections
        self.chain = chain
        self.grew = grew
        self._unwritten: dict[int, _Unwritten] = {}  # running rows still in the queue
        db.writer.on_flush(self._unwritten.clear)

    def start_execution(
        self, session_id: str, record: dict[str, Any]
    ) -> tuple[int, asyncio.Future]:
        """Record an execution as ``running``; return its id at once, and the write.

        Ids are handed out here, from a range this process holds, so nothing
        waits for the insert: later writes for the execution queue behind it
        on the store's thread.
        """
        execution_id = self.db.ids.next()
        self.grew(session_id)
        started = (
            execution_id,
            session_id,
            record["code"],
            record.get("description"),
            record["started_at"],
            json.dumps(record["review"]) if record.get("review") else None,
        )
        self._unwritten[execution_id] = _Unwritten(self.db.writer.queued(), started)
        written = self.db.submit(
            self.db.rows,
            "INSERT INTO executions (id, session_id, code, description, started_at, review,"
            " status, outputs, ended_at, duration_ms) VALUES (?, ?, ?, ?, ?, ?, 'running', '[]',"
            " ?, 0)",
            (*started, record["started_at"]),
            lazy=True,
            quick=True,
        )
        return execution_id, written

    def add_output(
        self, execution_id: int, output: dict[str, Any] | None, shown: bool = False
    ) -> asyncio.Future:
        """Append one output of a running execution (``None`` records a clear_output).

        Returns the write's future without awaiting it: writes complete in the
        order they were asked for, so a caller can release each output to its
        client once the output is on disk, without holding up the kernel.
        ``shown``: a client waits to be shown it, so it is flushed at once.
        """
        values = (execution_id, None if output is None else json.dumps(output))
        unwritten = self._unwritten.get(execution_id)
        if unwritten is not None:  # its place, now that nothing can fail before it is taken
            unwritten.outputs.append(self.db.writer.queued())
        return self.db.submit(
            self.db.rows,
            "INSERT INTO running_outputs (execution_id, output) VALUES (?, ?)",
            values,
            lazy=not shown,
            quick=True,
        )

    def finish_execution(self, execution_id: int, record: dict[str, Any]) -> asyncio.Future:
        """Replace a running execution's row with its final outcome, chained; returns the write.

        When the running row is still queued (a quick execute: all of it in one
        batch), the outcome is inserted in its place and its queued outputs are
        dropped: they would be deleted in the same transaction. Nothing in
        between was committed, so a crash loses no more than before. If that
        insert fails, the returned write fails with it, as the update would.
        A ``review`` in ``record`` replaces the one it began with (it adds the
        tool calls its code made).
        """
        unwritten = self._unwritten.pop(execution_id, None)
        review = json.dumps(record["review"]) if record.get("review") else None  # + tool calls
        if unwritten is not None:
            started = unwritten.started if review is None else (*unwritten.started[:5], review)
            values = (*started, *_execution_values(record))
            failed: list[Exception] = []

            def insert() -> None:
                failed.clear()  # a batch that failed elsewhere is run again
                try:
                    self.db.cursor(_INSERT_FINISHED, values)
                    self.chain.append("execution", execution_id, values[1:], values[1])
                except Exception as e:
                    failed.append(e)
                    raise

            def confirm() -> None:
                if failed:
                    raise failed[-1]

            self.db.writer.take_over(unwritten.at, insert)
            for at in unwritten.outputs:
                self.db.writer.take_over(at, _nothing)
            return self.db.submit(confirm, quick=True)

        def update() -> None:  # one transaction with the rest of its batch
            reviewed = () if review is None else ("review",)
            self.db.cursor(
                "UPDATE executions SET "
                + ", ".join(f"{c} = ?" for c in (*_EXECUTION_COLUMNS, *reviewed))
                + " WHERE id = ?",
                (*_execution_values(record), *(() if review is None else (review,)), execution_id),
            )
            self.db.cursor("DELETE FROM running_outputs WHERE execution_id = ?", (execution_id,))
            self._chain(execution_id, execution_id + 1)

        return self.db.submit(update, quick=True)

    async def running_executions(self) -> list[dict[str, Any]]:
        """Executions still marked running, each with the outputs recorded so far."""

        def select() -> list[dict[str, Any]]:
            rows = self.db.rows(
                "SELECT id, session_id, started_at FROM executions"
                " WHERE status = 'running' ORDER BY id"
            )
            return [{**dict(row), "outputs": self._running_outputs(row["id"])} for row in rows]

        return await self.db.run(select)

    def _running_outputs(self, execution_id: int) -> list[dict[str, Any] | None]:
        rows = self.db.rows(
            "SELECT output FROM running_outputs WHERE execution_id = ? ORDER BY id",
            (execution_id,),
        )
        return [json.loads(r["output"]) if r["output"] else None for r in rows]

    async def history(
        self, session_id: str, after: int = 0, limit: int = HISTORY_PAGE
    ) -> HistoryPage:
        """A page of a session's executions, oldest first (running ones so far).

        The page holds executions with an id above ``after``: at most
        ``limit`` of them, and no more than ``PAGE_BYTES`` of code and
        outputs (but always one), so a page costs the gateway that much
        memory, whatever the session holds.
        """

        def select() -> HistoryPage:
            rows = self.db.cursor(
                "SELECT *, length(code) + length(outputs) AS size FROM executions"
                " WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?",
                (session_id, after, limit + 1),
            )
            page: list[dict[str, Any]] = []
            size = 0
            for row in rows:  # one row at a time: the page stops at its budget
                size += row["size"]
                if len(page) == limit or (page and size > PAGE_BYTES):
                    return HistoryPage(page, page[-1]["id"])
                page.append(self._execution(row))
            return HistoryPage(page, None)

        return await self.db.run(select)

    def _execution(self, r: Any) -> dict[str, Any]:
        running = r["status"] == "running"
        return {
            "id": r["id"],
            "execution_count": r["execution_count"],
            "status": r["status"],
            "code": r["code"],
            "description": r["description"],
            "truncated": bool(r["truncated"]),
            "outputs": (
                replay_outputs(self._running_outputs(r["id"]))
                if running
                else json.loads(r["outputs"])
            ),
            "error": json.loads(r["error"]) if r["error"] else None,
            "started_at": r["started_at"],
            "ended_at": None if running else r["ended_at"],
            "duration_ms": r["duration_ms"],
            "files": json.loads(r["files"]) if r["files"] else [],
            "network": self.connections.network(r["id"]),
            "review": json.loads(r["review"]) if r["review"] else None,
        }

    async def last_execution(self, session_id: str) -> int:
        """The id of a session's newest execution (0 for none): where a snapshot stands."""
        rows = await self.db.select(
            "SELECT coalesce(max(id), 0) FROM executions WHERE session_id = ?", (session_id,)
        )
        return rows[0][0]

    async def copy_history(self, source: str, target: str, up_to: int) -> int:
        """Give a fork the executions its source had when the snapshot was taken; count them."""
        where = "WHERE session_id = ? AND id <= ? AND status != 'running'"
        rows = await self.db.select(f"SELECT count(*) FROM executions {where}", (source, up_to))
        first = await self.db.ids.reserve(rows[0][0])
        columns = ", ".join(("code", "description", *_EXECUTION_COLUMNS, "started_at"))

        def copy() -> None:
            self.db.cursor(
                f"INSERT INTO executions (id, session_id, {columns})"
                f" SELECT ? + row_number() OVER (ORDER BY id) - 1, ?, {columns}"
                f" FROM executions {where} ORDER BY id",
                (first, target, source, up_to),
            )
            self._chain(first, first + rows[0][0])

        await self.db.run(copy)
        return rows[0][0]

    def _chain(self, first: int, end: int) -> None:
        """On the store's thread: chain the final executions with ids in [first, end) as stored."""
        for row in self.db.rows(
            f"SELECT id, {_CHAINED} FROM executions WHERE id >= ? AND id < ? ORDER BY id",
            (first, end),
        ):
            self.chain.append("execution", row[0], tuple(row)[1:], row[1])


def replay_outputs(recorded: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Rebuild the outputs of an execution cut short from what was recorded as it ran.

    ``recorded`` holds each output as it was released (already capped), and
    ``None`` where the kernel cleared the outputs. A stream continues the
    stream before it of the same name, as ``execution.outputs`` kept them.
    """
    outputs: list[dict[str, Any]] = []
    tail: list[str] = []  # text that continues the last output's stream, joined once
    for output in recorded:
        if output is None:
            outputs.clear()
            tail.clear()
        elif (
            output["output_type"] == "stream"
            and outputs
            and outputs[-1]["output_type"] == "stream"
            and outputs[-1]["name"] == output["name"]
        ):
            tail.append(output["text"])
        else:
            _join(outputs, tail)
            outputs.append(dict(output))
    _join(outputs, tail)
    return outputs


def _join(outputs: list[dict[str, Any]], tail: list[str]) -> None:
    if tail:
        outputs[-1]["text"] += "".join(tail)
        tail.clear()


@dataclasses.dataclass
class _Unwritten:
    """An execution whose running row waits in the queue (at ``at``), and its outputs' places."""

    at: int
    started: tuple  # the running row's values, as _INSERT_FINISHED begins
    outputs: list[int] = dataclasses.field(default_factory=list)


def _nothing() -> None:
    """A queued call whose write another took over; it settles with its batch."""


def _execution_values(record: dict[str, Any]) -> tuple:
    return (
        record["execution_count"],
        record["status"],
        json.dumps(record["outputs"]),
        bool(record.get("truncated")),
        json.dumps(record["error"]) if record["error"] else None,
        record["ended_at"],
        record["duration_ms"],
        json.dumps(record.get("files") or []),
    )
