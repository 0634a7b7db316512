"""Records chained by hash (store/chain.py): every way of rewriting them directly in the
database is found, and says which record; tests/test_store_postgres.py runs those taking
``make_store`` again on PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from gateway.store.base import Retention

TENANT = "acme"
TABLES = ("audit", "connections", "executions")
EDITS = {"audit": ("action", "'session.delete'"), "connections": ("record", "'{}'"),
         "executions": ("code", "'rm -rf /'")}  # fmt: skip


def connection(at: str, host: str) -> dict:
    return {"at": at, "host": host, "port": 443, "decision": "allowed", "bytes_up": 1,
            "bytes_down": 2, "sni": None}  # fmt: skip


async def record_some(store, session_id: str = "s1", count: int = 3, started: str = "2026") -> None:
    """``count`` records of each chained kind in a session of ``TENANT``."""
    doc = {"id": session_id, "tenant": TENANT, "state": "idle", "created_at": "t", "ended_at": None}
    await store.save_session(doc)
    for n in range(count):
        at = f"{started}-01-0{n + 1}T00:00:00.000Z"
        await store.add_audit({"at": at, "tenant": TENANT, "token_id": "k", "action": f"a{n}",
                               "session_id": session_id, "outcome": "ok", "status": 200,
                               "detail": {"n": n}})  # fmt: skip
        await store.add_connection(session_id, None, connection(at, f"h{n}.example"))
        execution_id, _ = store.start_execution(session_id, {"code": f"{n}", "started_at": at})
        await store.finish_execution(execution_id, {
            "status": "ok", "execution_count": n + 1, "outputs": [], "error": None,
            "ended_at": at, "duration_ms": 1, "truncated": n == 2,
        })  # fmt: skip


async def verified(make_store, retention=None, **scope) -> dict:
    store = make_store(retention)
    await store.open()
    try:
        return await store.verify_chains(**scope)
    finally:
        await store.close()


def recorded(make_store) -> None:
    async def scenario():
        store = make_store()
        await store.open()
        await record_some(store)
        await store.close()

    asyncio.run(scenario())


def tamper(path, *statements: str) -> None:
    with sqlite3.connect(path) as db:
        for statement in statements:
            db.execute(statement)


def ids(path, table: str) -> list[int]:
    with sqlite3.connect(path) as db:
        return [r[0] for r in db.execute(f"SELECT id FROM {table} ORDER BY id")]


def problems(report: dict) -> set[tuple[str, int, str]]:
    return {(p["table"], p["id"], p["problem"]) for p in report["problems"]}


def check_both_scopes(make_store, found: set) -> None:
    for scope in ({"session_id": "s1"}, {"tenant": TENANT}, {}):
        report = asyncio.run(verified(make_store, **scope))
        assert not report["ok"], f"{scope}: the tampering went unnoticed"
        assert found <= problems(report), (scope, report["problems"])


def test_an_untouched_chain_verifies_in_every_scope_and_names_its_head(make_store, tmp_path):
    recorded(make_store)
    for scope in ({"session_id": "s1"}, {"tenant": TENANT}, {}):
        report = asyncio.run(verified(make_store, **scope))
        assert report["ok"] and report["problems"] == [], (scope, report)
    report = asyncio.run(verified(make_store, session_id="s1"))
    [chain] = report["chains"]
    assert chain["chain"] == "session:s1" and chain["count"] == 9 and len(chain["head"]) == 64

    async def head():
        store = make_store()
        await store.open()
        try:
            return await store.chain_head("s1")
        finally:
            await store.close()

    assert asyncio.run(head()) == {"count": 9, "hash": chain["head"]}


@pytest.mark.parametrize("table", TABLES)
def test_an_edited_record_is_found(make_store, tmp_path, table):
    recorded(make_store)
    path = tmp_path / "db.sqlite3"
    second = ids(path, table)[1]
    column, value = EDITS[table]
    tamper(path, f"UPDATE {table} SET {column} = {value} WHERE id = {second}")
    check_both_scopes(make_store, {(table, second, "edited")})


@pytest.mark.parametrize("table", TABLES)
def test_a_deleted_record_is_found(make_store, tmp_path, table):
    recorded(make_store)
    path = tmp_path / "db.sqlite3"
    second = ids(path, table)[1]
    tamper(path, f"DELETE FROM {table} WHERE id = {second}")
    check_both_scopes(make_store, {(table, second, "deleted")})


@pytest.mark.parametrize("table", TABLES)
def test_a_forged_record_is_found(make_store, tmp_path, table):
    recorded(make_store)
    path = tmp_path / "db.sqlite3"
    forged = ids(path, table)[-1] + 1000
    with sqlite3.connect(path) as db:
        columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})") if r[1] != "id"]
        listed = ", ".join(columns)
        db.execute(f"INSERT INTO {table} (id, {listed}) SELECT {forged}, {listed} FROM {table}"
                   f" WHERE id = {ids(path, table)[0]}")  # fmt: skip
    check_both_scopes(make_store, {(table, forged, "inserted")})


@pytest.mark.parametrize("table", TABLES)
def test_two_records_swapped_are_found_reordered(make_store, tmp_path, table):
    recorded(make_store)
    path = tmp_path / "db.sqlite3"
    first, second = ids(path, table)[:2]
    spare = second + 1000
    tamper(
        path,
        f"UPDATE {table} SET id = {spare} WHERE id = {first}",
        f"UPDATE {table} SET id = {first} WHERE id = {second}",
        f"UPDATE {table} SET id = {second} WHERE id = {spare}",
    )
    check_both_scopes(make_store, {(table, first, "reordered"), (table, second, "reordered")})


def test_a_record_deleted_with_its_chain_entry_breaks_the_chain_there(make_store, tmp_path):
    recorded(make_store)
    path = tmp_path / "db.sqlite3"
    second = ids(path, "audit")[1]
    tamper(
        path,
        f"DELETE FROM audit WHERE id = {second}",
        f"DELETE FROM chain WHERE kind = 'audit' AND record_id = {second}",
    )
    report = asyncio.run(verified(make_store, session_id="s1"))
    assert not report["ok"]
    assert {p["table"] for p in report["problems"]} == {"chain"}, report["problems"]


def test_the_newest_records_cut_off_with_their_entries_are_found_at_the_head(make_store, tmp_path):
    recorded(make_store)
    path = tmp_path / "db.sqlite3"
    newest = ids(path, "chain")[-1]
    with sqlite3.connect(path) as db:
        kind, record = db.execute(
            f"SELECT kind, record_id FROM chain WHERE id = {newest}"
        ).fetchone()
    table = {"audit": "audit", "connection": "connections", "execution": "executions"}[kind]
    tamper(
        path, f"DELETE FROM {table} WHERE id = {record}", f"DELETE FROM chain WHERE id = {newest}"
    )
    report = asyncio.run(verified(make_store, session_id="s1"))
    assert not report["ok"] and report["problems"][0]["table"] == "chain_heads", report


def test_records_pruned_by_the_retention_are_told_apart_from_deleted_ones(make_store, tmp_path):
    async def scenario():
        store = make_store(Retention(max_age=3600))
        await store.open()
        await record_some(store, started="2020")
        await store.prune()
        report = await store.verify_chains(session_id="s1")
        await store.close()
        return report

    report = asyncio.run(scenario())
    assert report["ok"], report["problems"]
    assert report["chains"][0]["pruned"] == 5  # three executions, the connections but the newest


def test_records_from_before_the_chain_are_an_unchained_prefix(make_store, tmp_path):
    """A database migrated from before the chain: its rows are counted, not flagged."""
    path = tmp_path / "db.sqlite3"
    recorded(make_store)
    with sqlite3.connect(path) as db:  # as if they were written before the migration
        db.execute("DELETE FROM chain")
        db.execute("DELETE FROM chain_heads WHERE name NOT LIKE 'unchained:%'")
        for table in TABLES:
            db.execute(f"UPDATE chain_heads SET count = (SELECT max(id) FROM {table})"
                       f" WHERE name = 'unchained:{table}'")  # fmt: skip

    async def scenario():
        store = make_store()
        await store.open()
        await record_some(store, "s2", count=1)
        report = await store.verify_chains(tenant=TENANT)
        await store.close()
        return report

    report = asyncio.run(scenario())
    assert report["ok"], report["problems"]
    assert report["unchained_before"] == {"audit": 3, "connections": 3, "executions": 3}
    assert report["chains"][0]["count"] == 3


def test_a_forked_sessions_copied_history_is_chained_in_the_fork(make_store):
    async def scenario():
        store = make_store()
        await store.open()
        await record_some(store)
        doc = {"id": "fork", "tenant": TENANT, "state": "idle", "created_at": "t", "ended_at": None}
        await store.save_session(doc)
        await store.copy_history("s1", "fork", await store.last_execution("s1"))
        report = await store.verify_chains(session_id="fork")
        await store.close()
        return report

    report = asyncio.run(scenario())
    assert report["ok"] and report["chains"][0]["count"] == 3, report


def test_records_appended_while_a_chain_is_walked_are_walked_too(make_store, monkeypatch):
    """The head is read after the last page: what another batch appended in between is read
    on, not taken for a head that says more than the chain holds."""
    from gateway.store.chain import Chain

    check = Chain._check_head
    event = ("2026-02-01T00:00:00.000Z", TENANT, "k", "late", "s1", "ok", 200, None, None)

    def appended_before_the_head_is_read(self, walk, report):
        if not getattr(self, "appended", False):
            self.appended = True  # as if another batch committed just now
            self.begin()
            self.insert("audit", event, "s1", TENANT)
            self.seal()
            self.committed()
        return check(self, walk, report)

    monkeypatch.setattr(Chain, "_check_head", appended_before_the_head_is_read)
    recorded(make_store)
    report = asyncio.run(verified(make_store, session_id="s1"))
    assert report["ok"], report["problems"]
    assert report["chains"][0]["count"] == 10
