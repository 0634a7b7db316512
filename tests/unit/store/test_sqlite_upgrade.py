"""An SQLite database made by the store before its migrations became one list opens as before.

``OLD_MIGRATIONS`` is the list ``store/sqlite.py`` ran until then, copied
as it was: a file it made at any version must upgrade to the schema a new
file gets, and one at its newest version must be taken as up to date.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from gateway.store.migrations import LATEST, pending
from gateway.store.sqlite import TERMS, SQLiteStore

OLD_MIGRATIONS = [
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


def make_old(path: Path, version: int) -> None:
    """A database as the old store left it at ``version`` (0: the first, unversioned)."""
    db = sqlite3.connect(path, isolation_level=None)
    for number, script in enumerate(OLD_MIGRATIONS[: max(version, 1)], start=1):
        stamp = f"PRAGMA user_version = {number};" if version else ""
        db.executescript(f"BEGIN; {script}; {stamp} COMMIT;")
    db.execute("INSERT INTO sessions (id, state, created_at, ended_at, doc)"
               " VALUES ('old', 'idle', 't0', NULL, '{\"id\": \"old\"}')")  # fmt: skip
    db.execute(
        "INSERT INTO executions (id, session_id, execution_count, status, code, outputs,"
        " started_at, ended_at, duration_ms) VALUES (7, 'old', 1, 'ok', '1 + 1', '[]', 't1',"
        " 't2', 1.5)"
    )
    db.close()


def schema(path: Path) -> tuple[int, list[tuple[str, str, str]]]:
    """The file's version and every table's and index's definition, as SQLite keeps it."""
    with sqlite3.connect(path) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        rows = db.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY type, name"
        ).fetchall()
    return version, rows


def test_the_one_list_makes_the_schema_the_old_list_made(tmp_path):
    """The one list's first entries are the old list (later ones are the one list's own)."""
    db = sqlite3.connect(tmp_path / "new.sqlite3", isolation_level=None)
    for number, script in pending(0, TERMS):
        if number <= len(OLD_MIGRATIONS):
            db.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")
    db.close()
    make_old(tmp_path / "old.sqlite3", len(OLD_MIGRATIONS))
    assert LATEST >= len(OLD_MIGRATIONS)
    assert schema(tmp_path / "new.sqlite3") == schema(tmp_path / "old.sqlite3")


@pytest.mark.parametrize("version", range(len(OLD_MIGRATIONS) + 1))
def test_a_database_the_old_store_made_upgrades_and_reads(tmp_path, version):
    path = tmp_path / "db.sqlite3"
    make_old(path, version)
    before = schema(path)
    sessions, history, next_id = asyncio.run(opened(path))
    assert [doc["id"] for doc, _ in sessions] == ["old"]
    assert [(e["id"], e["code"], e["status"]) for e in history] == [(7, "1 + 1", "ok")]
    assert next_id == 8, "execution ids go on from the newest in the file"
    asyncio.run(opened(tmp_path / "fresh.sqlite3"))
    assert schema(path) == schema(tmp_path / "fresh.sqlite3")
    if version == len(OLD_MIGRATIONS):  # only the one list's own entries run
        # Later entries may add columns: SQLite appends them to the table's definition.
        after = {(kind, name): sql for kind, name, sql in schema(path)[1]}
        for kind, name, sql in before[1]:
            assert after[kind, name].startswith(sql.rstrip(")")), (
                f"the old list's newest was migrated again: {name}"
            )


async def opened(path: Path) -> tuple[list, list, int]:
    """Open a store on ``path``: its open sessions, the history of 'old', the next id."""
    store = SQLiteStore(path)
    await store.open()
    sessions = await store.open_sessions("g")
    history = (await store.history("old")).executions if sessions else []
    next_id = store.db.ids.next()
    await store.close()
    return sessions, history, next_id
