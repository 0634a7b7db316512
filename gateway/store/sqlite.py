"""SQLite: the store in a file of the gateway's data dir, one gateway's alone.

In WAL mode with ``synchronous=NORMAL``: a commit writes to the WAL without
waiting for the disk, so small batches may commit on the loop (see
``writer``), and the WAL is copied into the database beside the writes
(``WalCheckpoints``), never in line with them unless they kept adding.
This process is the file's only writer: execution ids come from a counter
it keeps, and the gateway's id is a row of the file.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from pathlib import Path

from .base import Retention
from .database import Database, Dialect
from .facade import StoreFacade
from .migrations import pending

CHECKPOINT_TRIES = 3  # copies beside the writes before the rest is copied in line

TERMS = {
    "counters": "",
    "seq": "",
    "bigint": "INTEGER",
    "serial": "INTEGER",
    "flag": "INTEGER",
    "false": "0",
    "real": "REAL",
    "blob": "BLOB",
    "doc_tenant": "json_extract(doc, '$.tenant')",
    "doc_memory": "coalesce(json_extract(doc, '$.limits.memory'), 0)",
    "doc_cpus": "coalesce(json_extract(doc, '$.limits.cpus'), 0)",
    "doc_disk": "coalesce(json_extract(doc, '$.limits.disk'), 0)",
}


class SQLiteStore(StoreFacade):
    """The store in an SQLite file at ``path``."""

    def __init__(self, path: Path, retention: Retention | None = None) -> None:
        super().__init__(SQLiteDialect(path), retention)


class SQLiteDialect(Dialect):
    """A file in WAL mode; versions in ``PRAGMA user_version``."""

    now = "((julianday('now') - 2440587.5) * 86400.0)"
    row_order = "rowid"
    shared = False
    loop_writes = True

    def __init__(self, path: Path) -> None:
        self.path = path

    def connect(self) -> sqlite3.Connection:
        # Kernel keys are stored here: the directory is the gateway's alone.
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path.parent.chmod(0o700)
        # Used from the loop too, never at the same time as from the thread (``Writer``).
        db = self.connect_file()
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA foreign_keys=ON")
        return db

    def connect_file(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints wait for the disk: never in line
        return db

    def migrate(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0 and db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone():
            version = 1  # made before versioning, by the first schema
        for number, script in pending(version, TERMS):
            db.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")

    def ids(self, database: Database) -> FileIds:
        return FileIds(database)

    def checkpoints(self, database: Database) -> WalCheckpoints:
        return WalCheckpoints(self, database)

    def gateway_id(self, database: Database) -> str:
        """The data directory's id, a row of its file."""
        rows = database.rows("SELECT value FROM meta WHERE key = 'gateway_id'")
        if rows:
            return rows[0]["value"]
        new = uuid.uuid4().hex[:12]
        database.rows("INSERT INTO meta (key, value) VALUES ('gateway_id', ?)", (new,))
        return new


class FileIds:
    """Execution ids from this process's counter: it is the file's only writer."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._next = 1

    def start(self) -> None:
        newest = self.database.rows(
            "SELECT max(coalesce((SELECT max(id) FROM executions), 0), coalesce("
            " (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'max_execution_id'), 0))"
        )[0][0]
        self._next = newest + 1

    def next(self) -> int:
        self._next += 1
        return self._next - 1

    async def reserve(self, count: int) -> int:
        first = self._next
        self._next += count
        return first

    def keep_newest(self) -> None:
        """Remember the newest id in ``meta``, so pruning it never frees it."""
        self.database.cursor(
            "INSERT INTO meta (key, value) SELECT 'max_execution_id', max(id) FROM executions"
            " HAVING max(id) IS NOT NULL ON CONFLICT (key) DO UPDATE"
            " SET value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))"
        )


class WalCheckpoints:
    """The WAL copied into the database on a connection of its own, beside the writes."""

    def __init__(self, dialect: SQLiteDialect, database: Database) -> None:
        self.dialect = dialect
        self.database = database
        self._db: sqlite3.Connection | None = None
        database.on_open(self._connect)

    def _connect(self) -> None:
        self._db = self.dialect.connect_file()

    def copy(self) -> bool:
        """Copy the WAL as the writes go on, and again what they added meanwhile, a few times.

        Whether it all went (then the next write starts the WAL over).
        """
        for _ in range(CHECKPOINT_TRIES):
            if self._db is None:
                return True
            [(_, frames, copied)] = self._db.execute(
                "PRAGMA wal_checkpoint(PASSIVE)"
            ).fetchall()  # to the end: a statement left open keeps a reader on the WAL
            if copied == frames:
                return True
        return False

    def catch_up(self) -> None:
        """Copy the WAL's last pages into the database, the writes held."""
        if self.database.is_open():
            self.database.cursor("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            db.close()


def read_open_sessions(path: Path) -> tuple[str | None, set[str]]:
    """A store's gateway id and open session ids, read-only (``sbx gc``, beside a gateway)."""
    uri = f"file:{path}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'gateway_id'").fetchone()
        ids = {r[0] for r in db.execute("SELECT id FROM sessions WHERE ended_at IS NULL")}
    return (row[0] if row else None), ids
