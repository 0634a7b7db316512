"""The store's behaviour, on both backends: embedded SQLite and a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import psycopg
import pytest

from gateway.store import retention, writer
from gateway.store.base import Retention
from gateway.store.migrations import pending
from gateway.store.postgres import PostgresStore
from gateway.store.sqlite import TERMS, WalCheckpoints
from gateway.store.sqlite import SQLiteStore as Store


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(request, tmp_path):
    """Build a store (again, on the same data) for the backend under test."""
    if request.param == "sqlite":
        return lambda retention=None: Store(tmp_path / "db.sqlite3", retention)
    url = request.getfixturevalue("postgres").database()
    return lambda retention=None: PostgresStore(url, tmp_path, retention)


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
    assert [s.split()[0] for s in quick_statements] == ["INSERT"]
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
    assert wal < 2 << 20, f"the WAL grew to {wal} bytes: it is not checkpointed"


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


def test_a_database_server_is_never_waited_for_on_the_loop(postgres, tmp_path):
    """Only SQLite's small writes run on the loop; a server's every statement is a round trip.

    Run on the loop, a write to a PostgreSQL server that stopped answering
    held every session of the gateway (and its failure reached no caller).
    """

    async def scenario():
        store = PostgresStore(postgres.database(), tmp_path)
        await store.open()
        doc = {"id": "s", "state": "idle", "created_at": "t", "ended_at": None}
        await store.save_session(doc)
        ran_on = await store.db.submit(threading.get_ident, quick=True)
        await store.close()
        return ran_on

    assert asyncio.run(scenario()) != threading.get_ident()


def test_gateways_sharing_a_postgres_store_migrate_once_and_never_share_an_execution_id(
    postgres, tmp_path
):
    url = postgres.database()

    async def scenario():
        stores = [PostgresStore(url, tmp_path / name) for name in ("a", "b")]
        await asyncio.gather(*(store.open() for store in stores))  # both migrate at once
        doc = {"id": "s", "state": "idle", "created_at": "t", "ended_at": None}
        await stores[0].save_session(doc)
        ids = []
        for _ in range(3):
            for store in stores:
                execution_id, written = store.start_execution("s", {"code": "1", "started_at": "t"})
                await written
                ids.append(execution_id)
        gateway_ids = {await store.gateway_id() for store in stores}
        for store in stores:
            await store.close()
        return ids, gateway_ids

    ids, gateway_ids = asyncio.run(scenario())
    assert len(set(ids)) == len(ids), f"two gateways handed out the same execution id: {ids}"
    assert len(gateway_ids) == 2, "gateways sharing a database must keep ids of their own"


def test_concurrent_claims_of_a_session_leave_exactly_one_owner(postgres, tmp_path):
    """Gateways racing for the same sessions, each on its own connection: never a split."""
    url = postgres.database()
    claimers = 8

    async def scenario():
        stores = [PostgresStore(url, tmp_path / f"g{n}") for n in range(claimers)]
        await asyncio.gather(*(store.open() for store in stores))
        winners = []
        for round_ in range(20):
            sid = f"s{round_}"
            won = await asyncio.gather(
                *(store.claim_lease(sid, f"g{n}", 30.0) for n, store in enumerate(stores))
            )
            winners.append([f"g{n}" for n, ok in enumerate(won) if ok])
        # An expired lease goes to exactly one of the gateways that want it.
        await stores[0].claim_lease("short", "g0", 0.05)
        await asyncio.sleep(0.1)
        won = await asyncio.gather(
            *(store.claim_lease("short", f"g{n}", 30.0) for n, store in enumerate(stores[1:], 1))
        )
        renewed = await stores[0].renew_leases("g0", 30.0)
        for store in stores:
            await store.close()
        return winners, sum(won), renewed

    winners, took_expired, renewed = asyncio.run(scenario())
    assert all(len(w) == 1 for w in winners), f"a session had more than one owner: {winners}"
    assert took_expired == 1, f"{took_expired} gateways took over one expired lease"
    assert "short" not in renewed and len(renewed) == sum(w == ["g0"] for w in winners), (
        "a gateway renewed a lease another gateway had taken over"
    )


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


def test_gc_leaves_alone_a_data_dir_whose_store_is_a_shared_database(postgres, tmp_path):
    from gateway.cli.gc import DataDir

    async def start() -> None:
        store = PostgresStore(postgres.database(), tmp_path)
        await store.open()
        await store.gateway_id()
        await store.close()

    asyncio.run(start())
    data_dir = DataDir.read(tmp_path, busy=set())
    assert data_dir.why_orphan("s1") is None, (
        "sbx gc would remove the sandboxes of a gateway on PostgreSQL: it has no SQLite file"
    )


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


# What store/postgres.py ran, in its own list, until the dialects shared one
# (copied as it was): its first entry is SQLite's schema at its ninth.
OLD_POSTGRES_MIGRATIONS = [
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


def make_old_postgres(url: str, version: int) -> None:
    """A database as the old PostgreSQL store left it at ``version`` of its own list."""
    with psycopg.connect(url, autocommit=True) as db, db.transaction():
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        db.execute("INSERT INTO schema_version VALUES (%s)", (version,))
        for script in OLD_POSTGRES_MIGRATIONS[:version]:
            db.execute(script)
        db.execute("UPDATE counters SET value = 4096 WHERE name = 'execution_id'")
        db.execute(
            "INSERT INTO sessions (id, state, created_at, doc) VALUES ('old', 'idle', 't0', %s)",
            ('{"id": "old"}',),
        )
        db.execute(
            "INSERT INTO executions (id, session_id, execution_count, status, code, outputs,"
            " started_at, ended_at, duration_ms) VALUES"
            " (7, 'old', 1, 'ok', '1 + 1', '[]', 't1', 't2', 1.5)"
        )


def postgres_schema(url: str) -> tuple:
    """The schema's version, and every column, index and constraint as the server keeps them."""
    with psycopg.connect(url) as db:
        return (
            db.execute("SELECT version FROM schema_version").fetchall(),
            db.execute(
                "SELECT table_name, ordinal_position, column_name, data_type, is_nullable,"
                " column_default FROM information_schema.columns WHERE table_schema = 'public'"
                " ORDER BY 1, 2"
            ).fetchall(),
            db.execute(
                "SELECT tablename, indexname, indexdef FROM pg_indexes"
                " WHERE schemaname = 'public' ORDER BY 1, 2"
            ).fetchall(),
            db.execute(
                "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)"
                " FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2"
            ).fetchall(),
        )


@pytest.mark.parametrize("version", range(1, len(OLD_POSTGRES_MIGRATIONS) + 1))
def test_a_postgres_database_the_old_store_made_upgrades_and_reads(postgres, tmp_path, version):
    """Its own list's versions count on in the one list: 3 (its newest) is the one list's 11."""
    old, fresh = postgres.database(), postgres.database()
    make_old_postgres(old, version)
    before = postgres_schema(old)

    async def scenario(url: str, data_dir: str) -> tuple:
        store = PostgresStore(url, tmp_path / data_dir)
        await store.open()
        if data_dir == "fresh":  # only its schema counts
            return await store.close()
        sessions = [doc["id"] for doc, _ in await store.open_sessions("g")]
        history = [(e["id"], e["code"]) for e in (await store.history("old")).executions]
        execution_id, written = store.start_execution("old", {"code": "2", "started_at": "t3"})
        await written
        await store.close()
        return sessions, history, execution_id

    sessions, history, execution_id = asyncio.run(scenario(old, "old"))
    assert (sessions, history) == (["old"], [(7, "1 + 1")])
    assert execution_id > 4096, "execution ids go on from the counter the old store drew from"
    asyncio.run(scenario(fresh, "fresh"))
    assert postgres_schema(old) == postgres_schema(fresh)
    if version == len(OLD_POSTGRES_MIGRATIONS):
        assert postgres_schema(old)[1:] == before[1:], "a database at its newest was migrated"
