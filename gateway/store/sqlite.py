"""SQLite persistence for sessions and executions.

One connection lives on one dedicated thread: sqlite3 objects must stay on
the thread that made them, and a single writer never contends for the WAL
lock. Callers await the results, so the event loop never blocks on disk.
Calls run in batches, in the order queued, one transaction a batch (each
call in a savepoint of its own, so one failing call undoes only itself). A
call someone waits for flushes the batch at the end of the loop's turn;
bookkeeping nobody waits for (an execution's running row, outputs no client
is shown yet, audit events) rides along with the next flush, or goes within
``LAZY_DELAY``. Each batch is one commit, where an execute's writes would
otherwise cost several.

A batch of nothing but single-row writes (an execute's records, audit
events) runs on the loop itself when the thread is idle: in WAL mode with
``synchronous=NORMAL`` its commit writes to the WAL without waiting for the
disk, and handing it to the thread cost more (two thread switches) than the
write. Anything that may read or touch many rows, or finds the thread busy,
goes to the thread as before.

The WAL's checkpoints wait for the disk. Every ``CHECKPOINT_EVERY`` batches
one copies the WAL into the database on a thread and connection of its own,
while the writes go on, and again what they added meanwhile; if they kept
adding, a short one in line with the writes copies the rest. Either way the
WAL starts over at the next write and stays small. Run in line whole, a
checkpoint held up every write behind it: at 20 busy sessions, 12 ms every
second or so, each session's execute waiting.

Old history is pruned in the background by the ``Retention`` the store is
given: a bounded batch at a time, each one call on the same thread, so
pruning a large backlog never holds up the writes around it for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import queue
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from ..execution.outputs import replay_outputs
from ..sandbox.workspace import iso

log = logging.getLogger(__name__)

T = TypeVar("T")

LAZY_DELAY = 0.05  # seconds a write nobody waits for may wait for company
CHECKPOINT_EVERY = 200  # batches committed between two checkpoints of the WAL
CHECKPOINT_TRIES = 3  # copies beside the writes before the rest is copied in line
HISTORY_PAGE = 100  # executions in a page of history unless asked otherwise
HISTORY_PAGE_MAX = 1000
PAGE_BYTES = 4 << 20  # code and outputs (as stored) a page of history holds at most
PRUNE_BATCH = 200  # rows one pruning call deletes at most

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
    # Retention finds executions past their age without reading the table.
    """
    CREATE INDEX executions_by_start ON executions (started_at);
    """,
    # Tenants' sealed secrets: only ciphertext (access.secrets holds the key).
    """
    CREATE TABLE secrets (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        sealed BLOB NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (tenant, name)
    );
    """,
    # What each execution did to the workspace: created, modified, deleted files.
    """
    ALTER TABLE executions ADD COLUMN files TEXT;
    """,
    # Every connection a session made through the egress proxy, allowed or denied.
    """
    CREATE TABLE connections (
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        execution_id INTEGER,
        at TEXT NOT NULL,
        record TEXT NOT NULL
    );
    CREATE INDEX connections_by_session ON connections (session_id, id);
    CREATE INDEX connections_by_execution ON connections (execution_id);
    CREATE INDEX connections_by_time ON connections (at);
    """,
    # What the policy made of each execution (findings, decision), and approvals.
    """
    ALTER TABLE executions ADD COLUMN review TEXT;
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at TEXT NOT NULL,
        doc TEXT NOT NULL
    );
    CREATE INDEX approvals_by_state ON approvals (state, created_at);
    """,
    # Snapshots of sessions' kernel state and workspace; they outlive their sessions.
    """
    CREATE TABLE snapshots (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        size_bytes INTEGER NOT NULL,
        doc TEXT NOT NULL
    );
    CREATE INDEX snapshots_by_tenant ON snapshots (tenant);
    CREATE INDEX snapshots_by_session ON snapshots (session_id, created_at);
    """,
    # Which gateway owns each open session, until when (seconds, the database's clock).
    """
    CREATE TABLE leases (
        session_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE INDEX leases_by_owner ON leases (owner);
    """,
    # Where each gateway sharing the store answers: requests for its sessions go there.
    """
    CREATE TABLE gateways (
        id TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        seen_at REAL NOT NULL
    );
    """,
]

AUDIT_FILTERS = ("tenant", "session_id", "action", "outcome")

_EXECUTION_COLUMNS = (
    "execution_count", "status", "outputs", "truncated", "error", "ended_at", "duration_ms",
    "files",
)  # fmt: skip


class HistoryPage(NamedTuple):
    """Executions, and the cursor (an execution id) of the next page, None at the end."""

    executions: list[dict[str, Any]]
    next: int | None


@dataclasses.dataclass(frozen=True)
class Retention:
    """How much history is kept; 0 keeps everything.

    ``max_age``: seconds an execution (and an ended session's record, once
    its executions are gone) is kept after it started (ended).
    ``max_executions``: the newest executions kept per session. Running
    executions are never pruned. ``interval``: seconds between pruning passes.
    """

    max_age: float = 0.0
    max_executions: int = 0
    interval: float = 60.0


class Store:
    """Async facade over the gateway's SQLite database.

    ``store.postgres.PostgresStore`` is the same facade over a shared
    PostgreSQL server: it overrides only what the two dialects do differently.
    """

    # Small writes may commit on the loop: SQLite's commit in WAL mode does not
    # wait for the disk. A database server's every statement is a round trip.
    LOOP_WRITES = True

    ROW_ORDER = "rowid"  # the column that orders rows as they were inserted
    NOW = "((julianday('now') - 2440587.5) * 86400.0)"  # the database's clock, in seconds
    SHARED = False  # whether other gateways may use the same database
    down: str | None = None  # why the database does not answer, while it does not

    def __init__(self, path: Path, retention: Retention | None = None) -> None:
        self.path = path
        self.retention = retention or Retention()
        self._grown: set[str] = set()  # sessions that may hold more than max_executions
        self._pruner: asyncio.Task | None = None
        self._thread = StoreThread("sbx-store")
        self._db: sqlite3.Connection | None = None
        # Checkpoints alongside the writes: a thread and a connection of their own.
        self._checkpointer = StoreThread("sbx-store-checkpoint") if self.LOOP_WRITES else None
        self._checkpoint_db: sqlite3.Connection | None = None
        self._checkpointing = False  # from the start of a checkpoint to the end of its catch-up
        self._next_execution = 1
        self._queue: list[tuple[Callable[..., Any], tuple, asyncio.Future]] = []
        self._unwritten: dict[int, _Unwritten] = {}  # running rows still in the queue
        self._quick = True  # the queued calls are all single-row writes
        self._flush_due: asyncio.Handle | None = None
        self._flush_now = False
        self._in_thread = 0  # batches (and catch-ups) handed to the thread and not settled yet
        self._commits = 0  # batches committed since the last checkpoint

    async def open(self) -> None:
        await self._run(self._open)
        if self.retention.max_age or self.retention.max_executions:
            self._pruner = asyncio.create_task(self._prune_forever(), name="sbx-store-prune")

    def _open(self) -> None:
        # Kernel keys are stored here: the directory is the gateway's alone.
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path.parent.chmod(0o700)
        # Used from the loop too, never at the same time as from the thread (``_flush``).
        db = self._connect_file()
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA foreign_keys=ON")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0 and db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone():
            version = 1  # made before versioning, by the first schema
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            db.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")
        newest = db.execute(
            "SELECT max(coalesce((SELECT max(id) FROM executions), 0), coalesce("
            " (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'max_execution_id'), 0))"
        ).fetchone()[0]
        self._next_execution = newest + 1
        if self.retention.max_executions:
            over = db.execute(
                "SELECT session_id FROM executions GROUP BY session_id HAVING count(*) > ?",
                (self.retention.max_executions,),
            )
            self._grown.update(row[0] for row in over)
        self._checkpoint_db = self._connect_file()
        self._db = db

    def _connect_file(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints wait for the disk: never in line
        return db

    async def close(self) -> None:
        """Stop pruning, finish what is queued, then close the connection."""
        if self._pruner is not None:
            self._pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruner
        if self._db is not None:
            await self._run(lambda: None)
            db, self._db = self._db, None
            await self._thread.run(db.close)
        if self._checkpoint_db is not None:  # after the checkpoint under way, if any
            checkpoint_db, self._checkpoint_db = self._checkpoint_db, None
            await self._checkpointer.run(checkpoint_db.close)
            self._checkpointer.stop()
        self._thread.stop()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._submit(fn, *args)

    def _submit(
        self, fn: Callable[..., T], *args: Any, lazy: bool = False, quick: bool = False
    ) -> asyncio.Future[T]:
        """Queue a call for the store; calls run in the order submitted.

        ``lazy``: nobody waits for it, so it may wait for the next flush;
        ``quick``: a single-row write, which may run on the loop (see the
        module's docstring).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.append((fn, args, future))
        self._quick = self._quick and quick
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
        self._unwritten.clear()
        quick, self._quick = self._quick, True
        calls = [(fn, args) for fn, args, _ in batch]
        self._commits += 1
        if self._commits >= CHECKPOINT_EVERY and self._checkpointer and not self._checkpointing:
            self._commits = 0
            self._checkpointing = True
            self._checkpointer.run(self._checkpoint).add_done_callback(self._checkpointed)
        if self.LOOP_WRITES and quick and self._in_thread == 0 and self._db:
            # Nothing runs on the thread: the connection is the loop's for this batch.
            try:
                outcomes = self._run_batch(calls)
            except Exception as e:  # the transaction itself failed: each caller hears of it
                outcomes = [(False, e)] * len(batch)
            for (_, _, future), outcome in zip(batch, outcomes, strict=True):
                _deliver(future, outcome)
            return
        self._in_thread += 1
        done = self._thread.run(self._run_batch, calls)
        done.add_done_callback(lambda finished: self._settled(batch, finished))

    def _settled(self, batch: list[tuple[Any, Any, asyncio.Future]], done: asyncio.Future) -> None:
        self._in_thread -= 1
        _settle(batch, done)

    def _checkpoint(self) -> bool:
        """On the checkpoint thread: copy the WAL into the database file as the writes go on.

        Copies again what they added meanwhile, a few times; whether it all went
        (then the next write starts the WAL over).
        """
        for _ in range(CHECKPOINT_TRIES):
            if self._checkpoint_db is None:
                return True
            [(_, frames, copied)] = self._checkpoint_db.execute(
                "PRAGMA wal_checkpoint(PASSIVE)"
            ).fetchall()  # to the end: a statement left open keeps a reader on the WAL
            if copied == frames:
                return True
        return False

    def _checkpointed(self, done: asyncio.Future) -> None:
        _warn_if_failed(done)
        if self._db is None or (not done.cancelled() and not done.exception() and done.result()):
            self._checkpointing = False
            return
        # The writes kept adding to the WAL: a short checkpoint in line copies
        # the rest, so no reader or writer is left on the WAL and it starts over.
        self._in_thread += 1
        self._thread.run(self._catch_up).add_done_callback(self._caught_up)

    def _catch_up(self) -> None:
        """On the store's thread, writes held: copy the WAL's last pages into the database."""
        if self._db is not None:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _caught_up(self, done: asyncio.Future) -> None:
        self._in_thread -= 1
        self._checkpointing = False
        _warn_if_failed(done)

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
        try:  # the usual case, nothing fails: no savepoints (they cost as much as the writes)
            outcomes = [(True, fn(*args)) for fn, args in calls]
        except Exception:
            db.execute("ROLLBACK")
        else:
            db.execute("COMMIT")
            return outcomes
        # Again from the start, each call in a savepoint: a failing one undoes only itself.
        outcomes = []
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

    def _cursor(self, sql: str, params: tuple = ()) -> Any:
        """On the store's thread: run one statement; its cursor (rows, rowcount)."""
        assert self._db is not None, "store is not open"
        return self._db.execute(sql, params)

    def _exec(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        return self._cursor(sql, params).fetchall()

    def _next_id(self) -> int:
        """Hand out one execution id, on the loop: this process is the file's only writer."""
        self._next_execution += 1
        return self._next_execution - 1

    async def _reserve_ids(self, count: int) -> int:
        """Hand out ``count`` consecutive execution ids; the first."""
        first = self._next_execution
        self._next_execution += count
        return first

    def _keep_newest_id(self) -> None:
        """On the store's thread: remember the newest id, so pruning it never frees it."""
        self._cursor(
            "INSERT INTO meta (key, value) SELECT 'max_execution_id', max(id) FROM executions"
            " HAVING max(id) IS NOT NULL ON CONFLICT (key) DO UPDATE"
            " SET value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))"
        )

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
            quick=True,
        )

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        rows = await self._run(self._exec, "SELECT doc FROM sessions WHERE id = ?", (session_id,))
        return json.loads(rows[0]["doc"]) if rows else None

    async def open_sessions(self, owner: str) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        """Open sessions of ``owner`` (or of no one), with their runtime info.

        What a restart of that gateway must account for: never another
        gateway's sessions, whose leases say so.
        """
        return await self._open_sessions(
            "LEFT JOIN leases ON session_id = id WHERE ended_at IS NULL"
            " AND (owner IS NULL OR owner = ?)",
            owner,
        )

    async def orphans(self, owner: str) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        """Open sessions whose owner's lease ran out: a dead gateway's, for ``owner`` to adopt."""
        return await self._open_sessions(
            f"JOIN leases ON session_id = id WHERE ended_at IS NULL AND owner <> ?"
            f" AND expires_at < {self.NOW}",
            owner,
        )

    async def _open_sessions(
        self, where: str, owner: str
    ) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        rows = await self._run(
            self._exec,
            f"SELECT doc, runtime FROM sessions {where} ORDER BY sessions.{self.ROW_ORDER}",
            (owner,),
        )
        return [
            (json.loads(r["doc"]), json.loads(r["runtime"]) if r["runtime"] else None) for r in rows
        ]

    async def unheld(self, session_id: str) -> bool:
        """Whether an open session's lease ran out: its owner is gone, another adopts it soon."""
        rows = await self._run(
            self._exec,
            "SELECT 1 FROM leases JOIN sessions ON id = session_id"
            f" WHERE session_id = ? AND ended_at IS NULL AND expires_at < {self.NOW}",
            (session_id,),
        )
        return bool(rows)

    async def owned_elsewhere(self, owner: str) -> set[str]:
        """Open sessions another gateway holds or held a lease on: never ``owner``'s to reap."""
        rows = await self._run(
            self._exec,
            "SELECT session_id FROM leases JOIN sessions ON id = session_id"
            " WHERE ended_at IS NULL AND owner <> ?",
            (owner,),
        )
        return {row[0] for row in rows}

    async def claim_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        """Own a session for ``ttl`` seconds unless another owner's lease still runs.

        One statement, so two gateways claiming at once cannot both win: the
        database serialises them on the lease's row and the second sees the first.
        """
        rows = await self._run(
            self._exec,
            f"INSERT INTO leases (session_id, owner, expires_at) VALUES (?, ?, {self.NOW} + ?)"
            " ON CONFLICT (session_id) DO UPDATE"
            " SET owner = excluded.owner, expires_at = excluded.expires_at"
            f" WHERE leases.owner = excluded.owner OR leases.expires_at < {self.NOW}"
            " RETURNING owner",
            (session_id, owner, ttl),
        )
        return bool(rows)

    async def renew_leases(self, owner: str, ttl: float) -> set[str]:
        """Extend every lease ``owner`` still holds; the sessions whose lease was extended.

        A lease that ran out is not extended, even if nobody took it yet:
        another gateway may be adopting its session right now.
        """
        rows = await self._run(
            self._exec,
            f"UPDATE leases SET expires_at = {self.NOW} + ?"
            f" WHERE owner = ? AND expires_at >= {self.NOW} RETURNING session_id",
            (ttl, owner),
        )
        return {row[0] for row in rows}

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Give up a session's lease, if ``owner`` holds it (an ended session's)."""
        await self._run(
            self._exec, "DELETE FROM leases WHERE session_id = ? AND owner = ?", (session_id, owner)
        )

    async def announce(self, gateway_id: str, address: str) -> None:
        """Record where a gateway answers (its base URL), for requests others pass on."""
        await self._run(
            self._exec,
            f"INSERT INTO gateways (id, address, seen_at) VALUES (?, ?, {self.NOW})"
            " ON CONFLICT (id) DO UPDATE"
            " SET address = excluded.address, seen_at = excluded.seen_at",
            (gateway_id, address),
        )

    async def owner_address(self, session_id: str) -> tuple[str, str] | None:
        """The gateway holding a running lease on the session, and where it answers."""
        rows = await self._run(
            self._exec,
            "SELECT owner, address FROM leases JOIN gateways ON gateways.id = owner"
            f" WHERE session_id = ? AND expires_at >= {self.NOW}",
            (session_id,),
        )
        return (rows[0][0], rows[0][1]) if rows else None

    async def add_snapshot(self, doc: dict[str, Any]) -> None:
        await self._run(
            self._exec,
            "INSERT INTO snapshots (id, tenant, session_id, created_at, size_bytes, doc)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                doc["id"],
                doc["tenant"],
                doc["session_id"],
                doc["created_at"],
                doc["size_bytes"],
                json.dumps(doc),
            ),
        )

    async def get_snapshot(self, snapshot_id: str) -> dict[str, Any] | None:
        rows = await self._run(self._exec, "SELECT doc FROM snapshots WHERE id = ?", (snapshot_id,))
        return json.loads(rows[0]["doc"]) if rows else None

    async def snapshots_of(self, session_id: str) -> list[dict[str, Any]]:
        rows = await self._run(
            self._exec,
            f"SELECT doc FROM snapshots WHERE session_id = ? ORDER BY created_at, {self.ROW_ORDER}",
            (session_id,),
        )
        return [json.loads(r["doc"]) for r in rows]

    async def snapshots_of_tenant(self, tenant: str) -> list[dict[str, Any]]:
        rows = await self._run(
            self._exec,
            f"SELECT doc FROM snapshots WHERE tenant = ? ORDER BY created_at, {self.ROW_ORDER}",
            (tenant,),
        )
        return [json.loads(r["doc"]) for r in rows]

    async def snapshot_usage(self, tenant: str) -> tuple[int, int]:
        """How many snapshots a tenant keeps, and their bytes on disk."""
        rows = await self._run(
            self._exec,
            "SELECT count(*), coalesce(sum(size_bytes), 0) FROM snapshots WHERE tenant = ?",
            (tenant,),
        )
        return rows[0][0], rows[0][1]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._run(self._exec, "DELETE FROM snapshots WHERE id = ?", (snapshot_id,))

    async def last_execution(self, session_id: str) -> int:
        """The id of a session's newest execution (0 for none): where a snapshot stands."""
        rows = await self._run(
            self._exec,
            "SELECT coalesce(max(id), 0) FROM executions WHERE session_id = ?",
            (session_id,),
        )
        return rows[0][0]

    async def copy_history(self, source: str, target: str, up_to: int) -> int:
        """Give a fork the executions its source had when the snapshot was taken; count them."""
        where = "WHERE session_id = ? AND id <= ? AND status != 'running'"
        rows = await self._run(
            self._exec, f"SELECT count(*) FROM executions {where}", (source, up_to)
        )
        first = await self._reserve_ids(rows[0][0])
        columns = ", ".join(("code", "description", *_EXECUTION_COLUMNS, "started_at"))
        await self._run(
            self._exec,
            f"INSERT INTO executions (id, session_id, {columns})"
            f" SELECT ? + row_number() OVER (ORDER BY id) - 1, ?, {columns}"
            f" FROM executions {where} ORDER BY id",
            (first, target, source, up_to),
        )
        return rows[0][0]

    def start_execution(
        self, session_id: str, record: dict[str, Any]
    ) -> tuple[int, asyncio.Future]:
        """Record an execution as ``running``; return its id at once, and the write.

        Ids are handed out here, from a range this process holds, so nothing
        waits for the insert: later writes for the execution queue behind it
        on the store's thread.
        """
        execution_id = self._next_id()
        self._grown.add(session_id)
        started = (
            execution_id,
            session_id,
            record["code"],
            record.get("description"),
            record["started_at"],
            json.dumps(record["review"]) if record.get("review") else None,
        )
        self._unwritten[execution_id] = _Unwritten(len(self._queue), started)
        written = self._submit(
            self._exec,
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
            unwritten.outputs.append(len(self._queue))
        return self._submit(
            self._exec,
            "INSERT INTO running_outputs (execution_id, output) VALUES (?, ?)",
            values,
            lazy=not shown,
            quick=True,
        )

    def finish_execution(self, execution_id: int, record: dict[str, Any]) -> asyncio.Future:
        """Replace a running execution's row with its final outcome; returns the write.

        When the running row is still queued (a quick execute: all of it in one
        batch), the outcome is inserted in its place and its queued outputs are
        dropped: they would be deleted in the same transaction. Nothing in
        between was committed, so a crash loses no more than before. If that
        insert fails, the returned write fails with it, as the update would.
        """
        unwritten = self._unwritten.pop(execution_id, None)
        if unwritten is not None:
            values = (*unwritten.started, *_execution_values(record))
            failed: list[Exception] = []

            def insert() -> None:
                failed.clear()  # a batch that failed elsewhere is run again
                try:
                    self._cursor(_INSERT_FINISHED, values)
                except Exception as e:
                    failed.append(e)
                    raise

            def confirm() -> None:
                if failed:
                    raise failed[-1]

            self._queue[unwritten.at] = (insert, (), self._queue[unwritten.at][2])
            for at in unwritten.outputs:
                self._queue[at] = (_nothing, (), self._queue[at][2])
            return self._submit(confirm, quick=True)

        def update() -> None:  # one transaction with the rest of its batch
            self._cursor(
                "UPDATE executions SET "
                + ", ".join(f"{c} = ?" for c in _EXECUTION_COLUMNS)
                + " WHERE id = ?",
                (*_execution_values(record), execution_id),
            )
            self._cursor("DELETE FROM running_outputs WHERE execution_id = ?", (execution_id,))

        return self._submit(update, quick=True)

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
            quick=True,
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

    async def put_secret(
        self, tenant: str, name: str, sealed: bytes, at: str, overwrite: bool
    ) -> tuple[dict[str, str], bool] | None:
        """Store a sealed value: (its dates, whether new); None if it exists, not to overwrite."""

        def put() -> tuple[dict[str, str], bool] | None:
            found = self._exec(
                "SELECT 1 FROM secrets WHERE tenant = ? AND name = ?", (tenant, name)
            )
            if found and not overwrite:
                return None
            self._exec(
                "INSERT INTO secrets (tenant, name, sealed, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, name) DO UPDATE"
                " SET sealed = excluded.sealed, updated_at = excluded.updated_at",
                (tenant, name, sealed, at, at),
            )
            row = self._exec(
                "SELECT name, created_at, updated_at FROM secrets WHERE tenant = ? AND name = ?",
                (tenant, name),
            )[0]
            return dict(row), not found

        return await self._run(put)

    async def delete_secret(self, tenant: str, name: str) -> bool:
        """Forget a secret; whether there was one."""

        def delete() -> bool:
            sql = "DELETE FROM secrets WHERE tenant = ? AND name = ?"
            return self._cursor(sql, (tenant, name)).rowcount > 0

        return await self._run(delete)

    async def secret_dates(self, tenant: str) -> list[dict[str, str]]:
        """A tenant's secrets by name with their dates; never their values."""
        rows = await self._run(
            self._exec,
            "SELECT name, created_at, updated_at FROM secrets WHERE tenant = ? ORDER BY name",
            (tenant,),
        )
        return [dict(row) for row in rows]

    async def sealed_secrets(self, tenant: str, names: list[str]) -> dict[str, bytes]:
        """The sealed values of those of ``names`` the tenant holds."""
        marks = ", ".join("?" * len(names))
        rows = await self._run(
            self._exec,
            f"SELECT name, sealed FROM secrets WHERE tenant = ? AND name IN ({marks})",
            (tenant, *names),
        )
        return {row["name"]: bytes(row["sealed"]) for row in rows}

    def add_connection(
        self, session_id: str, execution_id: int | None, record: dict[str, Any]
    ) -> asyncio.Future:
        """Append one egress connection of a session (and the execution it ran in)."""
        return self._submit(
            self._exec,
            "INSERT INTO connections (session_id, execution_id, at, record) VALUES (?, ?, ?, ?)",
            (session_id, execution_id, record["at"], json.dumps(record)),
            lazy=True,
            quick=True,
        )

    async def connections(
        self, session_id: str, after: int = 0, limit: int = HISTORY_PAGE
    ) -> tuple[list[dict[str, Any]], int | None]:
        """A page of a session's connections, oldest first, and the next page's cursor."""
        rows = await self._run(
            self._exec,
            "SELECT id, execution_id, record FROM connections WHERE session_id = ? AND id > ?"
            " ORDER BY id LIMIT ?",
            (session_id, after, limit + 1),
        )
        page = [
            {"id": r["id"], "execution_id": r["execution_id"], **json.loads(r["record"])}
            for r in rows[:limit]
        ]
        return page, (page[-1]["id"] if len(rows) > limit else None)

    def _network(self, execution_id: int) -> dict[str, Any] | None:
        """What an execution's connections add up to, for its history row and notebook cell."""
        rows = self._exec(
            "SELECT record FROM connections WHERE execution_id = ? ORDER BY id", (execution_id,)
        )
        if not rows:
            return None
        records = [json.loads(r["record"]) for r in rows]
        return {
            "connections": len(records),
            "refused": sum(r["decision"] != "allowed" for r in records),
            "bytes_up": sum(r["bytes_up"] for r in records),
            "bytes_down": sum(r["bytes_down"] for r in records),
            "hosts": sorted({_reached(r) for r in records}),
        }

    async def _prune_forever(self) -> None:
        """Prune a batch at a time: back to back while there is a backlog, else each interval."""
        while True:
            try:
                backlog = await self.prune()
            except Exception:
                log.exception("pruning old history failed; trying again later")
                backlog = False
            await asyncio.sleep(LAZY_DELAY if backlog else self.retention.interval)

    async def prune(self) -> bool:
        """Delete one batch of history past the retention; whether more may be due."""
        retention = self.retention
        cutoff = iso(time.time() - retention.max_age) if retention.max_age else None
        sessions, self._grown = self._grown, set()

        def delete() -> bool:
            budget = PRUNE_BATCH
            self._keep_newest_id()
            if cutoff is not None:
                budget -= self._cursor(
                    "DELETE FROM executions WHERE id IN (SELECT id FROM executions"
                    " WHERE started_at < ? AND status != 'running' ORDER BY started_at LIMIT ?)",
                    (cutoff, budget),
                ).rowcount
                budget -= self._cursor(
                    "DELETE FROM connections WHERE id IN (SELECT id FROM connections"
                    " WHERE at < ? ORDER BY at LIMIT ?)",
                    (cutoff, max(budget, 0)),
                ).rowcount
                budget -= self._cursor(
                    "DELETE FROM sessions WHERE id IN (SELECT id FROM sessions s"
                    " WHERE ended_at < ? AND NOT EXISTS"
                    " (SELECT 1 FROM executions e WHERE e.session_id = s.id) LIMIT ?)",
                    (cutoff, max(budget, 0)),
                ).rowcount
            for session_id in sessions if retention.max_executions else ():
                if budget <= 0:
                    self._grown.add(session_id)  # not reached in this batch
                    continue
                newest_cut = self._cursor(
                    "SELECT id FROM executions WHERE session_id = ?"
                    " ORDER BY id DESC LIMIT 1 OFFSET ?",
                    (session_id, retention.max_executions),
                ).fetchone()
                if newest_cut is None:
                    continue
                deleted = self._cursor(
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
            return await self._run(delete)
        except Exception:
            self._grown |= sessions  # their turn comes again
            raise

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
            rows = self._cursor(
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
            "files": json.loads(r["files"]) if r["files"] else [],
            "network": self._network(r["id"]),
            "review": json.loads(r["review"]) if r["review"] else None,
        }

    def save_approval(self, doc: dict[str, Any]) -> asyncio.Future:
        """Insert or replace an approval request's record."""
        return self._submit(
            self._exec,
            "INSERT INTO approvals (id, tenant, session_id, state, created_at, doc)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE"
            " SET state = excluded.state, doc = excluded.doc",
            (
                doc["id"],
                doc["tenant"],
                doc["session_id"],
                doc["state"],
                doc["created_at"],
                json.dumps(doc),
            ),
            quick=True,
        )

    async def approvals(
        self, tenant: str | None = None, state: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Approval records, oldest first, of one tenant (None: all) and state (None: any)."""
        where, params = [], []
        for column, value in (("tenant", tenant), ("state", state)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = "SELECT doc FROM approvals"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = await self._run(
            self._exec, sql + " ORDER BY created_at, id LIMIT ?", (*params, limit)
        )
        return [json.loads(r["doc"]) for r in rows]

    async def get_approval(self, approval_id: str) -> dict[str, Any] | None:
        rows = await self._run(self._exec, "SELECT doc FROM approvals WHERE id = ?", (approval_id,))
        return json.loads(rows[0]["doc"]) if rows else None


class StoreThread:
    """The store's one thread: runs calls in order, hands each outcome back to the loop.

    Leaner per batch than a one-worker executor, whose every call makes a
    ``concurrent.futures`` future (a lock and a condition) and chains it to an
    asyncio one.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        future = asyncio.get_running_loop().create_future()
        self._calls.put((future, fn, args))
        return future

    def stop(self) -> None:
        """Finish the calls queued, then end the thread."""
        self._calls.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            try:
                outcome = (True, fn(*args))
            except BaseException as e:  # handed to the caller, whatever it is
                outcome = (False, e)
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                future.get_loop().call_soon_threadsafe(_deliver, future, outcome)


def _warn_if_failed(checkpoint: asyncio.Future) -> None:
    if not checkpoint.cancelled() and checkpoint.exception() is not None:
        log.warning("checkpointing the store's WAL failed: %s", checkpoint.exception())


def _deliver(future: asyncio.Future, outcome: tuple[bool, Any]) -> None:
    ok, value = outcome
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _settle(batch: list[tuple[Any, Any, asyncio.Future]], finished: asyncio.Future) -> None:
    """Hand each caller its call's outcome (or the batch's failure)."""
    if finished.cancelled() or finished.exception() is not None:
        error = finished.exception() if not finished.cancelled() else asyncio.CancelledError()
        outcomes: list[tuple[bool, Any]] = [(False, error)] * len(batch)
    else:
        outcomes = finished.result()
    for (_, _, future), outcome in zip(batch, outcomes, strict=True):
        _deliver(future, outcome)


_INSERT_FINISHED = (
    "INSERT INTO executions (id, session_id, code, description, started_at, review, "
    + ", ".join(_EXECUTION_COLUMNS)
    + ") VALUES ("
    + ", ".join("?" * (6 + len(_EXECUTION_COLUMNS)))
    + ")"
)


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


def _reached(connection: dict[str, Any]) -> str:
    """``host:port`` a connection went to (its TLS name if it sent one), bare if unparsed."""
    name = connection["sni"] or connection["host"]
    return f"{name}:{connection['port']}" if connection.get("port") else name


def read_open_sessions(path: Path) -> tuple[str | None, set[str]]:
    """A store's gateway id and open session ids, read-only (``sbx gc``, beside a gateway)."""
    uri = f"file:{path}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'gateway_id'").fetchone()
        ids = {r[0] for r in db.execute("SELECT id FROM sessions WHERE ended_at IS NULL")}
    return (row[0] if row else None), ids
