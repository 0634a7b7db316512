"""PostgreSQL persistence: the store several gateways share.

The same facade as ``sqlite.Store`` (one connection on the store's thread,
calls batched into one transaction each, a savepoint per call), over
psycopg 3 in autocommit mode, so the batches' BEGIN/SAVEPOINT/COMMIT are
the store's own. What differs is only what a shared server needs:

- execution ids come from a counter row all gateways draw ranges from, so
  ids stay unique across gateways and grow within a session whoever owns it;
- the schema's version is a row, and migrations run under an advisory lock,
  so gateways starting together migrate once;
- a gateway's id (which labels its containers) is a file in its own data
  directory, not a row: every gateway has its own;
- a connection the server dropped is made again before the next batch; while
  the server does not answer, every call fails with ``StoreUnavailable`` and
  ``down`` says why, until a batch goes through again.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from pathlib import Path
from typing import Any

import psycopg

from ..errors import StoreUnavailable
from .sqlite import Retention, Store

ID_RANGE = 4096  # execution ids a gateway draws at a time
CONNECT_TIMEOUT = 5  # seconds; an unreachable server fails the batch, not the gateway
MIGRATION_LOCK = 0x5B5_0001  # advisory lock key held while migrating
GATEWAY_ID_FILE = "gateway-id"  # in the data dir: a gateway whose store is a shared database

# Each entry moves the schema one version up (schema_version); never edit a
# shipped entry, append a new one. The first is SQLite's schema at its ninth.
MIGRATIONS = [
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
    INSERT INTO counters VALUES ('execution_id', 0);
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        seq BIGSERIAL,
        state TEXT NOT NULL,
        created_at TEXT NOT NULL,
        ended_at TEXT,
        doc TEXT NOT NULL,
        runtime TEXT
    );
    CREATE INDEX sessions_open ON sessions (ended_at);
    CREATE TABLE executions (
        id BIGINT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (id),
        execution_count INTEGER,
        status TEXT NOT NULL,
        code TEXT NOT NULL,
        description TEXT,
        outputs TEXT NOT NULL,
        truncated BOOLEAN NOT NULL DEFAULT false,
        error TEXT,
        started_at TEXT NOT NULL,
        ended_at TEXT NOT NULL,
        duration_ms DOUBLE PRECISION NOT NULL,
        files TEXT,
        review TEXT
    );
    CREATE INDEX executions_by_session ON executions (session_id, id);
    CREATE INDEX executions_running ON executions (status) WHERE status = 'running';
    CREATE INDEX executions_by_start ON executions (started_at);
    CREATE TABLE running_outputs (
        id BIGSERIAL PRIMARY KEY,
        execution_id BIGINT NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
        output TEXT
    );
    CREATE INDEX running_outputs_by_execution ON running_outputs (execution_id, id);
    CREATE TABLE audit (
        id BIGSERIAL PRIMARY KEY,
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
    CREATE TABLE secrets (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        sealed BYTEA NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (tenant, name)
    );
    CREATE TABLE connections (
        id BIGSERIAL PRIMARY KEY,
        session_id TEXT NOT NULL,
        execution_id BIGINT,
        at TEXT NOT NULL,
        record TEXT NOT NULL
    );
    CREATE INDEX connections_by_session ON connections (session_id, id);
    CREATE INDEX connections_by_execution ON connections (execution_id);
    CREATE INDEX connections_by_time ON connections (at);
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at TEXT NOT NULL,
        doc TEXT NOT NULL
    );
    CREATE INDEX approvals_by_state ON approvals (state, created_at);
    CREATE TABLE snapshots (
        id TEXT PRIMARY KEY,
        seq BIGSERIAL,
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        size_bytes BIGINT NOT NULL,
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
        expires_at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX leases_by_owner ON leases (owner);
    """,
    # Where each gateway sharing the store answers: requests for its sessions go there.
    """
    CREATE TABLE gateways (
        id TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        seen_at DOUBLE PRECISION NOT NULL
    );
    """,
]


class Row(tuple):
    """A row read by position or by column name, as ``sqlite3.Row`` is."""

    columns: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            key = self.columns[key]
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self.columns)


def _rows(cursor: psycopg.Cursor) -> Any:
    """psycopg's row factory for ``Row``."""
    columns = {c.name: i for i, c in enumerate(cursor.description or ())}

    def make(values: Any) -> Row:
        row = Row(values)
        row.columns = columns
        return row

    return make


@functools.lru_cache(maxsize=512)
def _dialect(sql: str) -> str:
    """SQLite's ``?`` placeholders as psycopg's ``%s`` (no statement holds a literal ``?``)."""
    return sql.replace("?", "%s")


class PostgresStore(Store):
    """The store on a PostgreSQL server shared by every gateway of a deployment."""

    ROW_ORDER = "seq"
    NOW = "extract(epoch from clock_timestamp())::double precision"
    SHARED = True
    LOOP_WRITES = False

    def __init__(self, url: str, data_dir: Path, retention: Retention | None = None) -> None:
        super().__init__(data_dir / "gateway.sqlite3", retention)  # path: only its directory
        self.url = url
        self._range_end = 0  # the held id range is [_next_execution, _range_end)
        self._spare: asyncio.Future[int] | None = None  # the next range, drawn ahead
        self.down: str | None = None  # why the server did not answer the last batch

    def _connect(self) -> psycopg.Connection:
        return psycopg.connect(
            self.url, autocommit=True, row_factory=_rows, connect_timeout=CONNECT_TIMEOUT
        )

    def _open(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        db = self._connect()
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                db.execute("INSERT INTO schema_version VALUES (0)")
            version = row[0] if row else 0
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                db.execute(script)
                db.execute("UPDATE schema_version SET version = %s", (number,))
        self._db = db
        first = self._claim_ids(ID_RANGE)
        self._next_execution, self._range_end = first, first + ID_RANGE
        if self.retention.max_executions:
            over = self._exec(
                "SELECT session_id FROM executions GROUP BY session_id HAVING count(*) > ?",
                (self.retention.max_executions,),
            )
            self._grown.update(row[0] for row in over)

    def _run_batch(self, calls: list) -> list[tuple[bool, Any]]:
        try:
            if self._db is not None and self._db.broken:
                self._db.close()
                self._db = self._connect()
            outcomes = super()._run_batch(calls)
        except psycopg.OperationalError as e:
            self.down = str(e).splitlines()[0]
            raise StoreUnavailable(
                f"the gateway's database does not answer ({self.down}); try again shortly"
            ) from e
        self.down = None
        return outcomes

    def _cursor(self, sql: str, params: tuple = ()) -> Any:
        assert self._db is not None, "store is not open"
        return self._db.execute(_dialect(sql), params)

    def _exec(self, sql: str, params: tuple = ()) -> list[Row]:
        cursor = self._cursor(sql, params)
        return cursor.fetchall() if cursor.description else []

    def _claim_ids(self, count: int) -> int:
        """On the store's thread: draw ``count`` ids no other gateway will get; the first."""
        rows = self._exec(
            "UPDATE counters SET value = value + ? WHERE name = 'execution_id' RETURNING value - ?",
            (count, count),
        )
        return rows[0][0] + 1

    def _next_id(self) -> int:
        """Hand out an id from the held range; draw the next range when half is used."""
        if self._next_execution == self._range_end:
            spare, self._spare = self._spare, None
            if spare is None or not spare.done() or spare.exception() is not None:
                raise RuntimeError("no execution ids at hand: the database has not answered")
            self._next_execution = spare.result()
            self._range_end = self._next_execution + ID_RANGE
        if self._spare is None and self._range_end - self._next_execution <= ID_RANGE // 2:
            self._spare = self._submit(self._claim_ids, ID_RANGE, lazy=True)
            self._spare.add_done_callback(self._drop_failed_spare)
        return super()._next_id()

    def _drop_failed_spare(self, spare: asyncio.Future[int]) -> None:
        if spare.cancelled() or spare.exception() is not None:
            self._spare = None  # drawn again by the next execution

    async def _reserve_ids(self, count: int) -> int:
        return await self._run(self._claim_ids, count)

    def _keep_newest_id(self) -> None:
        """Nothing to keep: the counter row never goes back."""

    async def gateway_id(self) -> str:
        """Return this gateway's own id, kept in its data directory: the database is shared."""

        def get_or_create() -> str:
            path = self.path.parent / GATEWAY_ID_FILE
            try:
                return path.read_text().strip()
            except FileNotFoundError:
                new = uuid.uuid4().hex[:12]
                path.write_text(new + "\n")
                return new

        return await self._run(get_or_create)
