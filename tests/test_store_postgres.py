"""The store on a real PostgreSQL server: what only a shared database does, and the unit
tier's store tests (those taking ``make_store``) again, on this backend."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest
from unit.store.conftest import in_store  # noqa: F401 (over this module's make_store)
from unit.store.test_chain import (  # noqa: F401 (run again here, on PostgreSQL)
    test_a_forked_sessions_copied_history_is_chained_in_the_fork,
    test_records_pruned_by_the_retention_are_told_apart_from_deleted_ones,
)
from unit.store.test_claims import (  # noqa: F401 (run again here, on PostgreSQL)
    CAPS,
    claim,
    test_a_claim_in_flight_counts_until_it_is_no_longer_extended_or_its_session_ends,
    test_a_restarted_gateway_gives_back_what_it_had_in_flight,
    test_an_open_session_nobody_has_held_for_a_long_time_stops_counting,
    test_claims_hold_a_tenants_quota_and_an_ended_session_gives_its_claim_back,
    test_creates_per_minute_count_ended_sessions_but_not_creates_that_never_started,
    test_open_sessions_are_listed_a_page_at_a_time_with_their_holder,
)
from unit.store.test_store import (  # noqa: F401 (run again here, on PostgreSQL)
    test_a_dead_gateways_open_sessions_are_orphans_for_the_others_to_adopt,
    test_a_lease_is_held_renewed_and_released_by_its_owner_only,
    test_an_execution_that_ends_before_its_running_row_is_written_is_written_once,
    test_an_outcome_that_cannot_be_stored_fails_its_finish_even_when_written_in_one_row,
    test_store_batches_keep_order_and_a_failing_call_undoes_only_itself,
    test_store_prunes_egress_connections_past_the_history_age,
    test_store_prunes_history_past_its_retention_in_batches,
    test_store_records_executions_as_they_run_and_closes_cut_ones,
)
from unit.store.test_template_tag_records import (  # noqa: F401 (run again here, on PostgreSQL)
    test_a_tag_moves_between_versions_and_goes_with_its_version,
    test_tags_outlive_the_store_being_opened_again,
)
from unit.store.test_volume_records import (  # noqa: F401 (run again here, on PostgreSQL)
    test_a_mount_is_taken_whole_or_not_at_all,
    test_a_name_wins_over_an_id_when_a_volume_is_named_as_another_ones_id,
    test_a_volume_deleted_meanwhile_is_not_mounted,
    test_a_volume_name_is_taken_once_per_tenant_and_another_tenants_is_invisible,
    test_readers_share_a_volume_and_a_writer_holds_it_alone_while_its_claim_holds,
    test_volumes_count_toward_the_tenants_disk_beside_its_sessions,
)
from unit.store.test_webhook_deliveries import (  # noqa: F401 (run again here, on PostgreSQL)
    delivery,
    test_a_full_endpoint_drops_new_deliveries_and_logs_why,
    test_a_restart_releases_what_it_was_sending_and_a_retry_waits_its_turn,
    test_a_sessions_next_delivery_waits_for_the_one_before_and_a_dead_claim_for_its_lease,
    test_an_endpoint_has_one_attempt_in_flight_and_endpoints_take_turns,
    test_each_delivery_is_claimed_once_however_many_claim_at_once,
)

from gateway.store.postgres import PostgresStore


@pytest.fixture
def make_store(postgres, tmp_path):
    """Build a store (again, on the same data) in a database of its own."""
    url = postgres.database()
    return lambda retention=None: PostgresStore(url, tmp_path, retention)


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


def test_two_gateways_appending_to_one_tenants_chain_at_once_never_fork_it(postgres, tmp_path):
    """Each batch locks the heads of its chains (in the order of their names) to the commit:
    two gateways' appends take turns, and the tenant's chain verifies end to end."""
    url = postgres.database()
    rounds = 30

    async def scenario():
        stores = [PostgresStore(url, tmp_path / name) for name in ("a", "b")]
        await asyncio.gather(*(store.open() for store in stores))
        for name, store in zip("ab", stores, strict=True):
            doc = {"id": name, "tenant": "acme", "state": "idle", "created_at": "t",
                   "ended_at": None}  # fmt: skip
            await store.save_session(doc)

        async def append(name: str, store: PostgresStore) -> None:
            for n in range(rounds):
                event = {"at": f"t{n}", "tenant": "acme", "action": f"{name}{n}",
                         "session_id": name, "outcome": "ok"}  # fmt: skip
                store.add_audit(event)  # queued: several in a batch
                await store.add_connection(name, None, {"at": f"t{n}", "host": "h"})

        gateways = list(zip("ab", stores, strict=True))
        await asyncio.gather(*(append(name, store) for name, store in gateways))
        tenant = await stores[0].verify_chains(tenant="acme")
        sessions = [await store.verify_chains(session_id=name) for name, store in gateways]
        for store in stores:
            await store.close()
        return tenant, sessions

    tenant, sessions = asyncio.run(scenario())
    assert tenant["ok"], tenant["problems"]
    assert tenant["chains"][0]["count"] == 4 * rounds
    assert all(s["ok"] and s["chains"][0]["count"] == 2 * rounds for s in sessions), sessions


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
        after = postgres_schema(old)[1:]  # only the one list's own entries ran (and added)
        assert all(set(b) <= set(a) for a, b in zip(after, before[1:], strict=True)), (
            "a database at its newest was migrated"
        )


def at_once(gateways: int, run) -> list:
    """``run(n)`` for each gateway n, each on a thread (a loop and a connection) of its own,
    all at once; the items they return, together."""
    found: list = []
    threads = [threading.Thread(target=lambda n=n: found.extend(run(n))) for n in range(gateways)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return found


def test_thirty_claims_at_once_from_three_gateways_grant_exactly_the_quota(postgres, tmp_path):
    """Each gateway's claims run on its own connection; the lock makes them count each other."""
    url = postgres.database()
    caps = {**CAPS, "sessions": 3}

    async def gateway(n: int) -> list:
        store = PostgresStore(url, tmp_path / f"g{n}")
        await store.open()
        try:
            return await asyncio.gather(
                *(store.claim_quota(claim(f"g{n}-{i}"), caps, 60) for i in range(10))
            )
        finally:
            await store.close()

    answers = at_once(3, lambda n: asyncio.run(gateway(n)))
    assert len(answers) == 30
    assert sum(a is None for a in answers) == 3, answers
    assert all(a is None or a["what"] == "sessions" for a in answers), answers


def test_three_gateways_claiming_webhook_deliveries_at_once_send_each_once(postgres, tmp_path):
    """Each gateway claims on its own connection; a row another took is skipped, not sent twice."""
    url = postgres.database()

    async def gateway(n: int) -> list[str]:
        store = PostgresStore(url, tmp_path / f"g{n}")
        await store.open()
        try:
            if n == 0:
                rows = [delivery(f"d{i}", f"s{i}", f"e{i}") for i in range(60)]
                await store.add_deliveries(rows, 100)
            claimed: list[str] = []
            for _ in range(40):
                found = await asyncio.gather(
                    *(store.claim_deliveries(f"g{n}", 2, 60) for _ in "ab")
                )
                claimed += [row["id"] for rows in found for row in rows]
                await asyncio.sleep(0.005)
            return claimed
        finally:
            await store.close()

    claimed = at_once(3, lambda n: asyncio.run(gateway(n)))
    assert sorted(claimed) == sorted(f"d{i}" for i in range(60)), claimed


def test_three_gateways_tagging_one_template_at_once_never_pass_its_cap(postgres, tmp_path):
    """Each counts the template's tags and adds its own in a transaction of its own
    connection: without a lock, each saw room and all added (two gateways were enough)."""
    from unit.store.test_template_tag_records import build

    url = postgres.database()
    cap = 8

    async def gateway(n: int, work) -> object:
        store = PostgresStore(url, tmp_path / f"g{n}")
        await store.open()
        try:
            return await work(store)
        finally:
            await store.close()

    asyncio.run(gateway(0, lambda store: store.save_template(build("b1", 1))))

    def tagging(n: int) -> list:
        tags = [[f"g{n}-{i}"] for i in range(10)]
        work = lambda store: asyncio.gather(  # noqa: E731
            *(store.tag_template("b1", "acme", "geo", t, 1.0, cap) for t in tags)
        )
        return asyncio.run(gateway(n, work))

    answers = at_once(3, tagging)
    held = asyncio.run(gateway(0, lambda store: store.template_tags("acme", "geo")))
    assert sum(a is None for a in answers) == cap == len(held), answers
