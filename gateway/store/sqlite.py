"""SQLite persistence for sessions and executions.

One connection lives on one dedicated thread: sqlite3 objects must stay on
the thread that made them, and a single writer never contends for the WAL
lock. Callers await the results, so the event loop never blocks on disk.
Calls run in batches, in the order queued, one transaction a batch (each
call in a savepoint of its own, so one failing call undoes only itself). A
call someone waits for flushes the batch at the end of the loop's turn;
bookkeeping nobody waits for (an execution's running row, outputs no client
is shown yet, audit events) rides along with the next flush, or goes within
``LAZY_DELAY``. Each batch is one wake-up of the store's thread and one
commit, where an execute's writes would otherwise cost several of each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ..execution.outputs import replay_outputs

T = TypeVar("T")

LAZY_DELAY = 0.05  # seconds a write nobody waits for may wait for company

# Each entry moves the schema one version up (PRAGMA user_version); never edit
# a shipped entry, append a new one.
MIGRATIONS = [
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        created_at TEXT NOT NULL,
        ended_at TEXT,
        doc TEXT NOT NULL
    );
    CREATE INDEX sessions_open ON sessions (ended_at);
    CREATE TABLE executions (
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (id),
        execution_count INTEGER,
        status TEXT NOT NULL,
        code TEXT NOT NULL,
        description TEXT,
        outputs TEXT NOT NULL,
        truncated INTEGER NOT NULL DEFAULT 0,
        error TEXT,
        started_at TEXT NOT NULL,
        ended_at TEXT NOT NULL,
        duration_ms REAL NOT NULL
    );
    CREATE INDEX executions_by_session ON executions (session_id, id);
    """,
    # What a restarted gateway needs to reattach to a live kernel, and the
    # outputs of executions still running, so a crash loses none of them.
    """
    ALTER TABLE sessions ADD COLUMN runtime TEXT;
    CREATE TABLE running_outputs (
        id INTEGER PRIMARY KEY,
        execution_id INTEGER NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
        output TEXT
    );
    CREATE INDEX running_outputs_by_execution ON running_outputs (execution_id, id);
    CREATE INDEX executions_running ON executions (status) WHERE status = 'running';
    """,
    # Who did what, when, to which session, and how it went.
    """
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        tenant TEXT,
        token_id TEXT,
        action TEXT NOT NULL,
        session_id TEXT,
        outcome TEXT NOT NULL,
        status INTEGER,
        remote TEXT,
        detail TEXT
    );
    CREATE INDEX audit_by_time ON audit (at);
    CREATE INDEX audit_by_session ON audit (session_id, id);
    """,
]

AUDIT_FILTERS = ("tenant", "session_id", "action", "outcome")

_EXECUTION_COLUMNS = (
    "execution_count", "status", "outputs", "truncated", "error", "ended_at", "duration_ms"
)  # fmt: skip


class Store:
    """Async facade over the gateway's SQLite database."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sbx-store")
        self._db: sqlite3.Connection | None = None
        self._next_execution = 1
        self._queue: list[tuple[Callable[..., Any], tuple, asyncio.Future]] = []
        self._flush_due: asyncio.Handle | None = None
        self._flush_now = False

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        # Kernel keys are stored here: the directory is the gateway's alone.
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path.parent.chmod(0o700)
        db = sqlite3.connect(self.path, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0 and db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone():
            version = 1  # made before versioning, by the first schema
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            db.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")
        self._next_execution = (db.execute("SELECT max(id) FROM executions").fetchone()[0] or 0) + 1
        self._db = db

    async def close(self) -> None:
        """Finish what is queued, then close the connection."""
        if self._db is not None:
            await self._run(lambda: None)
            db, self._db = self._db, None
            await asyncio.get_running_loop().run_in_executor(self._pool, db.close)
        self._pool.shutdown(wait=True)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._submit(fn, *args)

    def _submit(self, fn: Callable[..., T], *args: Any, lazy: bool = False) -> asyncio.Future[T]:
        """Queue a call for the store's thread; calls run in the order submitted.

        ``lazy``: nobody waits for it, so it may wait for the next flush (see
        the module's docstring).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.append((fn, args, future))
        if not lazy and not self._flush_now:
            if self._flush_due is not None:
                self._flush_due.cancel()
            self._flush_due = loop.call_soon(self._flush)
            self._flush_now = True
        elif self._flush_due is None:
            self._flush_due = loop.call_later(LAZY_DELAY, self._flush)
        return future

    def _flush(self) -> None:
        self._flush_due, self._flush_now = None, False
        batch, self._queue = self._queue, []
        calls = [(fn, args) for fn, args, _ in batch]
        done = asyncio.get_running_loop().run_in_executor(self._pool, self._run_batch, calls)
        done.add_done_callback(lambda finished: _settle(batch, finished))

    def _run_batch(self, calls: list[tuple[Callable[..., Any], tuple]]) -> list[tuple[bool, Any]]:
        """On the store's thread: run calls in one transaction; (ok, result or error) each."""
        db = self._db
        outcomes: list[tuple[bool, Any]] = []
        if db is None:  # opening: the migrations manage their own transactions
            for fn, args in calls:
                try:
                    outcomes.append((True, fn(*args)))
                except Exception as e:
                    outcomes.append((False, e))
            return outcomes
        db.execute("BEGIN")
        try:
            for fn, args in calls:
                db.execute("SAVEPOINT call")
                try:
                    outcomes.append((True, fn(*args)))
                except Exception as e:
                    db.execute("ROLLBACK TO call")
                    outcomes.append((False, e))
                db.execute("RELEASE call")
        finally:
            db.execute("COMMIT")
        return outcomes

    def _exec(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        assert self._db is not None, "store is not open"
        return self._db.execute(sql, params).fetchall()

    async def gateway_id(self) -> str:
        """Return this data directory's stable id, used to label its containers."""

        def get_or_create() -> str:
            rows = self._exec("SELECT value FROM meta WHERE key = 'gateway_id'")
            if rows:
                return rows[0]["value"]
            new = uuid.uuid4().hex[:12]
            self._exec("INSERT INTO meta (key, value) VALUES ('gateway_id', ?)", (new,))
            return new

        return await self._run(get_or_create)

    def save_session(
        self, doc: dict[str, Any], runtime: dict[str, Any] | None = None
    ) -> asyncio.Future:
        """Insert or replace a session's record, and what reattaching to it needs.

        ``runtime`` (connection info, key, container) is kept only while the
        session is open: an ended session has nothing to reattach to.
        """
        kept = json.dumps(runtime) if runtime is not None and not doc["ended_at"] else None
        return self._submit(
            self._exec,
            "INSERT INTO sessions (id, state, created_at, ended_at, doc, runtime)"
            " VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET state = excluded.state,"
            " ended_at = excluded.ended_at, doc = excluded.doc, runtime = excluded.runtime",
            (doc["id"], doc["state"], doc["created_at"], doc["ended_at"], json.dumps(doc), kept),
        )

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        rows = await self._run(self._exec, "SELECT doc FROM sessions WHERE id = ?", (session_id,))
        return json.loads(rows[0]["doc"]) if rows else None

    async def open_sessions(self) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        """Sessions not marked ended, with their runtime info: what a restart must account for."""
        rows = await self._run(
            self._exec, "SELECT doc, runtime FROM sessions WHERE ended_at IS NULL ORDER BY rowid"
        )
        return [
            (json.loads(r["doc"]), json.loads(r["runtime"]) if r["runtime"] else None) for r in rows
        ]

    def start_execution(
        self, session_id: str, record: dict[str, Any]
    ) -> tuple[int, asyncio.Future]:
        """Record an execution as ``running``; return its id at once, and the write.

        Ids are handed out here (this process is the database's only writer),
        so nothing waits for the insert: later writes for the execution queue
        behind it on the store's thread.
        """
        execution_id = self._next_execution
        self._next_execution += 1
        written = self._submit(
            self._exec,
            "INSERT INTO executions (id, session_id, status, code, description, outputs,"
            " started_at, ended_at, duration_ms) VALUES (?, ?, 'running', ?, ?, '[]', ?, ?, 0)",
            (
                execution_id,
                session_id,
                record["code"],
                record.get("description"),
                record["started_at"],
                record["started_at"],
            ),
            lazy=True,
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
        return self._submit(
            self._exec,
            "INSERT INTO running_outputs (execution_id, output) VALUES (?, ?)",
            (execution_id, None if output is None else json.dumps(output)),
            lazy=not shown,
        )

    def finish_execution(self, execution_id: int, record: dict[str, Any]) -> asyncio.Future:
        """Replace a running execution's row with its final outcome; returns the write."""

        def update() -> None:  # one transaction with the rest of its batch
            assert self._db is not None, "store is not open"
            self._db.execute(
                "UPDATE executions SET "
                + ", ".join(f"{c} = ?" for c in _EXECUTION_COLUMNS)
                + " WHERE id = ?",
                (*_execution_values(record), execution_id),
            )
            self._db.execute("DELETE FROM running_outputs WHERE execution_id = ?", (execution_id,))

        return self._submit(update)

    async def running_executions(self) -> list[dict[str, Any]]:
        """Executions still marked running, each with the outputs recorded so far."""

        def select() -> list[dict[str, Any]]:
            rows = self._exec(
                "SELECT id, session_id, started_at FROM executions"
                " WHERE status = 'running' ORDER BY id"
            )
            return [{**dict(row), "outputs": self._running_outputs(row["id"])} for row in rows]

        return await self._run(select)

    def _running_outputs(self, execution_id: int) -> list[dict[str, Any] | None]:
        rows = self._exec(
            "SELECT output FROM running_outputs WHERE execution_id = ? ORDER BY id",
            (execution_id,),
        )
        return [json.loads(r["output"]) if r["output"] else None for r in rows]

    def add_audit(self, event: dict[str, Any]) -> asyncio.Future:
        """Append one audit event; returns the write's future (callers need not wait)."""
        return self._submit(
            self._exec,
            "INSERT INTO audit (at, tenant, token_id, action, session_id, outcome, status,"
            " remote, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                event["at"],
                event.get("tenant"),
                event.get("token_id"),
                event["action"],
                event.get("session_id"),
                event["outcome"],
                event.get("status"),
                event.get("remote"),
                json.dumps(event["detail"]) if event.get("detail") else None,
            ),
            lazy=True,
        )

    async def audit_events(
        self,
        filters: dict[str, str],
        since: str | None = None,
        until: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Audit events matching every filter, newest first."""
        where = [f"{name} = ?" for name in AUDIT_FILTERS if name in filters]
        params: list[Any] = [filters[name] for name in AUDIT_FILTERS if name in filters]
        if since:
            where.append("at >= ?")
            params.append(since)
        if until:
            where.append("at < ?")
            params.append(until)
        sql = "SELECT * FROM audit"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = await self._run(self._exec, sql + " ORDER BY id DESC LIMIT ?", (*params, limit))
        return [
            {**dict(r), "detail": json.loads(r["detail"]) if r["detail"] else None} for r in rows
        ]

    async def history(self, session_id: str) -> list[dict[str, Any]]:
        """Every recorded execution of a session, oldest first (running ones so far)."""

        def select() -> list[dict[str, Any]]:
            rows = self._exec(
                "SELECT * FROM executions WHERE session_id = ? ORDER BY id", (session_id,)
            )
            return [self._execution(row) for row in rows]

        return await self._run(select)

    def _execution(self, r: sqlite3.Row) -> dict[str, Any]:
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
        }


def _settle(batch: list[tuple[Any, Any, asyncio.Future]], finished: asyncio.Future) -> None:
    """Hand each caller its call's outcome (or the batch's failure)."""
    if finished.cancelled() or finished.exception() is not None:
        error = finished.exception() if not finished.cancelled() else asyncio.CancelledError()
        outcomes: list[tuple[bool, Any]] = [(False, error)] * len(batch)
    else:
        outcomes = finished.result()
    for (_, _, future), (ok, value) in zip(batch, outcomes, strict=True):
        if future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _execution_values(record: dict[str, Any]) -> tuple:
    return (
        record["execution_count"],
        record["status"],
        json.dumps(record["outputs"]),
        bool(record.get("truncated")),
        json.dumps(record["error"]) if record["error"] else None,
        record["ended_at"],
        record["duration_ms"],
    )


def read_open_sessions(path: Path) -> tuple[str | None, set[str]]:
    """A store's gateway id and open session ids, read-only (``sbx gc``, beside a gateway)."""
    uri = f"file:{path}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'gateway_id'").fetchone()
        ids = {r[0] for r in db.execute("SELECT id FROM sessions WHERE ended_at IS NULL")}
    return (row[0] if row else None), ids
