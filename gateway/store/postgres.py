"""PostgreSQL: the store several gateways share (psycopg 3).

The same facade, writer and repositories as SQLite's, over psycopg in
autocommit mode, so the batches' BEGIN/SAVEPOINT/COMMIT are the store's own.
What the dialect does its own way is what a shared server needs:

- execution ids come from a counter row all gateways draw ranges from, so
  ids stay unique across gateways and grow within a session whoever owns it;
- the schema's version is a row, and migrations run under an advisory lock,
  so gateways starting together migrate once;
- a gateway's id (which labels its containers) is a file in its own data
  directory, not a row: every gateway has its own;
- a connection the server dropped is made again before the next batch; while
  the server does not answer, every call fails with ``StoreUnavailable`` and
  ``down`` says why, until a batch goes through again;
- every statement is a round trip: none runs on the loop.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import psycopg

from .base import Retention
from .database import Database, Dialect, format_placeholders
from .facade import StoreFacade
from .migrations import pending

ID_RANGE = 4096  # execution ids a gateway draws at a time
CONNECT_TIMEOUT = 5  # seconds; an unreachable server fails the batch, not the gateway
MIGRATION_LOCK = 0x5B5_0001  # advisory lock key held while migrating
CLAIMS_LOCK = 0x5B5_0002  # advisory lock key a quota claim's transaction holds (claims.py)
GATEWAY_ID_FILE = "gateway-id"  # in the data dir: a gateway whose store is a shared database
# schema_version counted this dialect's own list of migrations until there was one
# list: its first entry made what migrations 1 to 9 make, so its 1, 2 and 3 are 9,
# 10 and 11. A database the one list migrated is never below 11: it is migrated
# in one transaction.
OWN_LIST_VERSIONS = 3
OWN_LIST_OFFSET = 8

TERMS = {
    "counters": (
        "\n    CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);"
        "\n    INSERT INTO counters VALUES ('execution_id', 0);"
    ),
    "seq": "\n        seq BIGSERIAL,",
    "bigint": "BIGINT",
    "serial": "BIGSERIAL",
    "flag": "BOOLEAN",
    "false": "false",
    "real": "DOUBLE PRECISION",
    "blob": "BYTEA",
    "doc_tenant": "doc::json ->> 'tenant'",
    "doc_memory": "coalesce((doc::json -> 'limits' ->> 'memory')::bigint, 0)",
    "doc_cpus": "coalesce((doc::json -> 'limits' ->> 'cpus')::double precision, 0)",
    "doc_disk": "coalesce((doc::json -> 'limits' ->> 'disk')::bigint, 0)",
}


class PostgresStore(StoreFacade):
    """The store on a PostgreSQL server shared by every gateway of a deployment."""

    def __init__(self, url: str, data_dir: Path, retention: Retention | None = None) -> None:
        super().__init__(PostgresDialect(url, data_dir), retention)


class PostgresDialect(Dialect):
    """A server at ``url``; this gateway's own files (its id) in ``data_dir``."""

    now = "extract(epoch from clock_timestamp())::double precision"
    row_order = "seq"
    shared = True
    loop_writes = False
    connection_errors = (psycopg.OperationalError,)
    # One lock, not one per tenant: a batch claiming for two tenants cannot deadlock.
    claims_lock = f"SELECT pg_advisory_xact_lock({CLAIMS_LOCK})"
    statement = staticmethod(format_placeholders)

    def __init__(self, url: str, data_dir: Path) -> None:
        self.url = url
        self.data_dir = data_dir

    def connect(self) -> psycopg.Connection:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self._connect()

    def _connect(self) -> psycopg.Connection:
        return psycopg.connect(
            self.url, autocommit=True, row_factory=_rows, connect_timeout=CONNECT_TIMEOUT
        )

    def usable(self, db: psycopg.Connection) -> psycopg.Connection:
        if db.broken:
            db.close()
            return self._connect()
        return db

    def migrate(self, db: psycopg.Connection) -> None:
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                db.execute("INSERT INTO schema_version VALUES (0)")
            stored = row[0] if row else 0
            version = stored + OWN_LIST_OFFSET if 0 < stored <= OWN_LIST_VERSIONS else stored
            for number, script in pending(version, TERMS):
                db.execute(script)
                version = number
            if version != stored:
                db.execute("UPDATE schema_version SET version = %s", (version,))

    def ids(self, database: Database) -> SharedIds:
        return SharedIds(database)

    def gateway_id(self, database: Database) -> str:
        """This gateway's own id, a file in its data directory: the database is shared."""
        path = self.data_dir / GATEWAY_ID_FILE
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            new = uuid.uuid4().hex[:12]
            path.write_text(new + "\n")
            return new


class SharedIds:
    """Execution ids in ranges drawn from the ``counters`` row every gateway draws from."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._next = 1
        self._range_end = 0  # the held range is [_next, _range_end)
        self._spare: asyncio.Future[int] | None = None  # the next range, drawn ahead

    def start(self) -> None:
        first = self._claim(ID_RANGE)
        self._next, self._range_end = first, first + ID_RANGE

    def _claim(self, count: int) -> int:
        """On the store's thread: draw ``count`` ids no other gateway will get; the first."""
        rows = self.database.rows(
            "UPDATE counters SET value = value + ? WHERE name = 'execution_id' RETURNING value - ?",
            (count, count),
        )
        return rows[0][0] + 1

    def next(self) -> int:
        """An id from the held range; the next range is drawn when half is used."""
        if self._next == self._range_end:
            spare, self._spare = self._spare, None
            if spare is None or not spare.done() or spare.exception() is not None:
                raise RuntimeError("no execution ids at hand: the database has not answered")
            self._next = spare.result()
            self._range_end = self._next + ID_RANGE
        if self._spare is None and self._range_end - self._next <= ID_RANGE // 2:
            self._spare = self.database.submit(self._claim, ID_RANGE, lazy=True)
            self._spare.add_done_callback(self._drop_failed_spare)
        self._next += 1
        return self._next - 1

    def _drop_failed_spare(self, spare: asyncio.Future[int]) -> None:
        if spare.cancelled() or spare.exception() is not None:
            self._spare = None  # drawn again by the next execution

    async def reserve(self, count: int) -> int:
        return await self.database.run(self._claim, count)

    def keep_newest(self) -> None:
        """Nothing to keep: the counter row never goes back."""


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
