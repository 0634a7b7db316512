"""The store on a real PostgreSQL server: what only a shared database does, and the unit
tier's store tests (those taking ``make_store``) again, on this backend."""

from __future__ import annotations

import asyncio
import threading

import pytest
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
        ran_on = await store._submit(threading.get_ident, quick=True)
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
