"""The store's behaviour on embedded SQLite; tests/test_store_postgres.py runs the tests
that take ``make_store`` again on a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import psycopg
import pytest

from gateway.store import retention, writer
from gateway.store.base import Retention
from gateway.store.migrations import pending
from gateway.store.sqlite import TERMS, WalCheckpoints
from gateway.store.sqlite import SQLiteStore as Store


def test_store_records_executions_as_they_run_and_closes_cut_ones(make_store):
    from gateway.execution.recorder import CUT_BY_RESTART, close_cut_executions

    async def scenario():
        store = make_store()
        await store.open()
        gid = await store.gateway_id()
        assert gid == await store.gateway_id()
        doc = {"id": "s1", "state": "idle", "created_at": "t0", "ended_at": None}
        await store.save_session(doc, {"container_id": "c1"})
        assert await store.open_sessions("g") == [(doc, {"container_id": "c1"})]
        started = {"code": "print(1)", "started_at": "2026-01-01T00:00:00.000Z"}
        done_id, _ = store.start_execution("s1", started)
        cut_id, begun = store.start_execution("s1", {**started, "code": "loop()"})
        await begun
        await store.add_output(cut_id, {"output_type": "stream", "name": "stdout", "text": "a"})
        await store.add_output(cut_id, None)  # clear_output
        for text in ("b", "c"):
            out = {"output_type": "stream", "name": "stdout", "text": text}
            await store.add_output(cut_id, out)
        running = (await store.history("s1")).executions[1]
        assert running["status"] == "running" and running["ended_at"] is None
        assert running["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "bc"}]
        record = {
            "status": "ok", "execution_count": 1, "outputs": [], "error": None,
            "ended_at": "t2", "duration_ms": 1.5,
        }  # fmt: skip
        await store.finish_execution(done_id, record)
        await store.close()
        # A new process on the same file: the cut execution is closed with its outputs.
        store = make_store()
        await store.open()
        assert await close_cut_executions(store, {"s1"}) == {"s1"}
        await store.save_session({**doc, "state": "deleted", "ended_at": "t3"}, {"x": 1})
        assert await store.open_sessions("g") == []
        history = (await store.history("s1")).executions
        await store.close()
        return history

    done, cut = asyncio.run(scenario())
    assert done["code"] == "print(1)" and done["status"] == "ok" and done["duration_ms"] == 1.5
    assert cut["status"] == CUT_BY_RESTART and cut["error"]["ename"] == "GatewayRestarted"
    assert cut["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "bc"}]


def test_sqlite_store_migrates_a_database_made_before_schema_versions(tmp_path):

    db = sqlite3.connect(tmp_path / "db.sqlite3")
    db.executescript(next(pending(0, TERMS))[1])  # what the first release created, unversioned
    db.execute("INSERT INTO sessions VALUES ('old', 'deleted', 't0', 't1', '{}')")
    db.commit()
    db.close()

    async def scenario():
        store = Store(tmp_path / "db.sqlite3")
        await store.open()
        await store.save_session(
            {"id": "new", "state": "idle", "created_at": "t", "ended_at": None}, {"k": 1}
        )
        sessions = await store.open_sessions("g")
        await store.close()
        return sessions

    assert [(d["id"], r) for d, r in asyncio.run(scenario())] == [("new", {"k": 1})]


def test_store_prunes_history_past_its_retention_in_batches(make_store, monkeypatch):
    monkeypatch.setattr(retention, "PRUNE_BATCH", 3)
    old, new = "2020-01-01T00:00:00.000Z", "2999-01-01T00:00:00.000Z"
    done = {"status": "ok", "execution_count": 1, "outputs": [], "error": None,
            "ended_at": new, "duration_ms": 1.0}  # fmt: skip

    async def record(store: Store, session_id: str, started_at: str, finish: bool = True) -> int:
        execution_id, _ = store.start_execution(session_id, {"code": "1", "started_at": started_at})
        if finish:
            await store.finish_execution(execution_id, done)
        return execution_id

    async def codes(store: Store, session_id: str) -> list[int]:
        return [e["id"] for e in (await store.history(session_id)).executions]

    async def scenario():
        store = make_store(Retention(max_age=3600, max_executions=4))
        await store.open()
        for sid, ended in (("live", None), ("gone", old), ("recent", new)):
            doc = {"id": sid, "state": "idle", "created_at": old, "ended_at": ended}
            await store.save_session(doc)
        stuck = await record(store, "live", old, finish=False)  # running: never pruned
        kept = [await record(store, "live", new) for _ in range(7)]
        aged = [await record(store, "gone", old) for _ in range(2)]  # the newest ids
        passes = [await store.prune() for _ in range(4)]
        assert passes[0] is True and passes[-1] is False, "a backlog goes in bounded batches"
        assert await codes(store, "live") == [stuck, *kept[-4:]]
        assert await codes(store, "gone") == []
        assert await store.get_session("gone") is None, "an ended session past the age goes"
        assert await store.get_session("recent") and await store.get_session("live")
        await store.close()
        # A restart counts on: ids are never reused, even when the newest were pruned.
        store = make_store()
        await store.open()
        again = await record(store, "live", new)
        await store.close()
        return again, aged[-1]

    again, newest = asyncio.run(scenario())
    assert again > newest, "a pruned execution's id was handed out again"


def test_store_prunes_egress_connections_past_the_history_age(make_store):
    def connection(at: str) -> dict:
        return {"at": at, "host": "h.example", "decision": "allowed", "bytes_up": 1,
                "bytes_down": 2, "sni": None}  # fmt: skip

    async def scenario():
        store = make_store(Retention(max_age=3600))
        await store.open()
        await store.add_connection("s", None, connection("2020-01-01T00:00:00.000Z"))
        await store.add_connection("s", None, connection("2999-01-01T00:00:00.000Z"))
        await store.prune()
        page, _ = await store.connections("s")
        await store.close()
        return [c["at"] for c in page]

    assert asyncio.run(scenario()) == ["2999-01-01T00:00:00.000Z"]


def test_store_batches_keep_order_and_a_failing_call_undoes_only_itself(make_store):
    async def scenario():
        store = make_store()
        await store.open()
        doc = {"id": "s", "state": "idle", "created_at": "t", "ended_at": None}
        first = store.save_session(doc)
        broken = store.db.submit(store.db.rows, "INSERT INTO no_such_table VALUES (1)")
        second = store.save_session({**doc, "id": "t"})
        await first
        with pytest.raises((sqlite3.OperationalError, psycopg.errors.UndefinedTable)):
            await broken
        await second
        kept = sorted(d["id"] for d, _ in await store.open_sessions("g"))
        await store.close()
        return kept

    assert asyncio.run(scenario()) == ["s", "t"]


def test_an_execution_that_ends_before_its_running_row_is_written_is_written_once(make_store):
    """A quick execute's running row, outputs and outcome share one batch: only the outcome
    is written, as one row, where it would have been the row, its outputs, their deletion
    and an update (each a statement, and on SQLite pages of the WAL)."""

    async def scenario():
        store = make_store()
        await store.open()
        doc = {"id": "s", "state": "idle", "created_at": "t", "ended_at": None}
        await store.save_session(doc)
        statements = []
        cursor = store.db.cursor
        store.db.cursor = lambda sql, params=(): statements.append(sql) or cursor(sql, params)
        started = {"code": "1 + 1", "description": "add", "started_at": "t1",
                   "review": {"decision": {"action": "allow"}}}  # fmt: skip
        quick, _ = store.start_execution("s", started)
        out = {"output_type": "execute_result", "data": {"text/plain": "2"}, "metadata": {}}
        stored = store.add_output(quick, out)
        record = {"status": "ok", "execution_count": 1, "outputs": [out], "error": None,
                  "ended_at": "t2", "duration_ms": 1.5}  # fmt: skip
        await store.finish_execution(quick, record)
        await stored
        quick_statements, statements[:] = list(statements), []
        slow, begun = store.start_execution("s", {**started, "code": "sleep(1)"})
        await begun  # written as running: its outcome then replaces it, as before
        await store.add_output(slow, out)
        await store.finish_execution(slow, {**record, "execution_count": 2})
        history = (await store.history("s")).executions
        leftover = await store.db.run(store.db.rows, "SELECT count(*) FROM running_outputs")
        await store.close()
        return quick_statements, statements, history, leftover[0][0]

    quick_statements, slow_statements, history, leftover = asyncio.run(scenario())
    chained = ("chain", "FROM sessions")  # its chain entry (store/chain.py), made at commit
    execution = [s for s in quick_statements if not any(word in s for word in chained)]
    assert [s.split()[0] for s in execution] == ["INSERT"]
    assert "running_outputs" not in quick_statements[0]
    assert any(s.startswith("UPDATE executions") for s in slow_statements)
    first, second = history
    assert (first["code"], first["description"], first["status"]) == ("1 + 1", "add", "ok")
    assert (
        first["outputs"]
        == second["outputs"]
        == [{"output_type": "execute_result", "data": {"text/plain": "2"}, "metadata": {}}]
    )
    assert (first["started_at"], first["ended_at"], first["duration_ms"]) == ("t1", "t2", 1.5)
    assert first["review"] == second["review"] == {"decision": {"action": "allow"}}
    assert (first["execution_count"], second["execution_count"]) == (1, 2)
    assert leftover == 0


def test_sqlite_writes_made_on_the_loop_keep_the_wal_checkpointed(tmp_path, monkeypatch):
    """Small writes commit on the loop, never checkpointing: threads do that, every so often.

    Without those checkpoints the WAL would grow by every write for good (6 MB
    here). With them it holds about the batches between two, at times a few
    times that: a write that starts while a read is open does not start it over.
    """
    monkeypatch.setattr(writer, "CHECKPOINT_EVERY", 10)
    path = tmp_path / "db.sqlite3"

    async def scenario():
        store = Store(path)
        await store.open()
        for i in range(300):  # a batch each: awaited one by one
            doc = {"id": f"s{i}", "state": "idle", "created_at": "t", "ended_at": None}
            await store.save_session(doc, {"kernel_id": f"k{i}", "pad": "x" * 2000})
            for _ in range(500):  # a checkpoint under way ends (how soon is the disk's)
                if not store.db.writer.checkpointing:
                    break
                await asyncio.sleep(0.01)
        wal = (tmp_path / "db.sqlite3-wal").stat().st_size
        kept = len(await store.open_sessions("g"))
        await store.close()
        return wal, kept

    wal, kept = asyncio.run(scenario())
    assert kept == 300
    # Under load a few checkpoints each find a read open and leave the WAL whole (3 MB
    # was seen beside the full suite); without any it grows to 6 MB.
    assert wal < 4 << 20, f"the WAL grew to {wal} bytes: it is not checkpointed"


def test_a_wal_checkpoint_does_not_hold_up_the_writes_made_on_the_loop(tmp_path, monkeypatch):
    """A checkpoint copies the WAL into the database alongside the loop's writes, not before them.

    It ran on the store's one thread, in line: every write queued behind it
    (tens of milliseconds under load, each execute of every session waiting).
    """
    monkeypatch.setattr(writer, "CHECKPOINT_EVERY", 3)
    copying = threading.Event()
    let_go = threading.Event()
    checkpoint = WalCheckpoints.copy

    def slow_checkpoint(self):
        copying.set()
        let_go.wait(10)
        return checkpoint(self)

    monkeypatch.setattr(WalCheckpoints, "copy", slow_checkpoint)

    async def scenario():
        store = Store(tmp_path / "db.sqlite3")
        await store.open()
        saved = 0

        async def save() -> None:
            nonlocal saved
            doc = {"id": f"s{saved}", "state": "idle", "created_at": "t", "ended_at": None}
            await asyncio.wait_for(store.save_session(doc), 2)
            saved += 1

        while not copying.is_set() and saved < 1000:
            await save()
            await asyncio.sleep(0.001)  # the checkpoint's thread gets its turn
        assert copying.is_set(), "no checkpoint began: the test shows nothing"
        for _ in range(20):  # each would time out if it waited for the checkpoint
            await save()
        let_go.set()
        kept = len(await store.open_sessions("g"))
        await store.close()
        await store.close()  # a second close has nothing left to do
        return saved, kept

    saved, kept = asyncio.run(scenario())
    assert kept == saved


def test_a_lease_is_held_renewed_and_released_by_its_owner_only(make_store):
    async def scenario():
        store = make_store()
        await store.open()
        assert await store.claim_lease("s", "a", 30.0)
        assert await store.claim_lease("s", "a", 30.0), "the owner claims its own lease again"
        assert not await store.claim_lease("s", "b", 30.0)
        assert await store.renew_leases("a", 30.0) == {"s"}
        assert await store.renew_leases("b", 30.0) == set()
        await store.release_lease("s", "b")  # not b's to release
        assert not await store.claim_lease("s", "b", 30.0)
        await store.release_lease("s", "a")
        assert await store.claim_lease("s", "b", 30.0)
        for sid in ("s", "free"):
            await store.save_session(
                {"id": sid, "state": "idle", "created_at": "t", "ended_at": None}
            )
        assert [d["id"] for d, _ in await store.open_sessions("a")] == ["free"], (
            "a restarting gateway was handed another gateway's session"
        )
        assert [d["id"] for d, _ in await store.open_sessions("b")] == ["s", "free"]
        await store.announce("b", "http://10.0.0.2:8765")
        found = await store.owner_address("s"), await store.owner_address("free")
        await store.close()
        return found

    assert asyncio.run(scenario()) == (("b", "http://10.0.0.2:8765"), None)


def test_a_dead_gateways_open_sessions_are_orphans_for_the_others_to_adopt(make_store):
    async def scenario():
        store = make_store()
        await store.open()
        for sid in ("lapsed", "live", "ended", "unleased"):
            await store.save_session(
                {"id": sid, "state": "idle", "created_at": "t", "ended_at": None}, {"c": sid}
            )
        await store.save_session({"id": "ended", "state": "deleted", "created_at": "t",
                                  "ended_at": "t"})  # fmt: skip
        assert await store.claim_lease("lapsed", "dead", 0.05)
        assert await store.claim_lease("ended", "dead", 0.05)
        assert await store.claim_lease("live", "alive", 30.0)
        await asyncio.sleep(0.1)
        orphans = {
            gateway: [(d["id"], runtime) for d, runtime in await store.orphans(gateway)]
            for gateway in ("other", "dead")
        }
        elsewhere = await store.owned_elsewhere("alive"), await store.owned_elsewhere("dead")
        unheld = {sid for sid in ("lapsed", "live", "ended", "unleased") if await store.unheld(sid)}
        await store.close()
        return orphans, elsewhere, unheld

    orphans, elsewhere, unheld = asyncio.run(scenario())
    assert unheld == {"lapsed"}, "only an open session whose lease ran out is held by nobody"
    assert orphans == {"other": [("lapsed", {"c": "lapsed"})], "dead": []}, (
        "only an open session whose lease ran out is another gateway's to adopt"
    )
    assert elsewhere == ({"lapsed"}, {"live"})


def test_an_outcome_that_cannot_be_stored_fails_its_finish_even_when_written_in_one_row(make_store):
    """The one-row write of a quick execute reports its failure where the update did."""

    async def scenario():
        store = make_store()
        await store.open()
        await store.save_session({"id": "s", "state": "idle", "created_at": "t", "ended_at": None})
        quick, _ = store.start_execution("s", {"code": "1", "started_at": "t1"})
        record = {"status": "ok", "execution_count": 2**63, "outputs": [], "error": None,
                  "ended_at": "t2", "duration_ms": 1.0}  # fmt: skip
        finish = store.finish_execution(quick, record)
        finished = await asyncio.gather(finish, return_exceptions=True)
        await store.close()
        return finished[0]

    outcome = asyncio.run(scenario())
    assert isinstance(outcome, Exception), "an execution was lost and its finish said ok"
