"""The webhook delivery log on SQLite; tests/test_store_postgres.py runs these again on
PostgreSQL, and has three gateways claim at once."""

from __future__ import annotations

import asyncio
import json
import sqlite3


def delivery(delivery_id: str, session_id: str, endpoint: str = "main") -> dict:
    body = json.dumps({"id": "e" + delivery_id, "session_id": session_id})
    return {"id": delivery_id, "event_id": "e" + delivery_id, "type": "sandbox.lifecycle.created",
            "tenant": "acme", "endpoint": endpoint, "session_id": session_id,
            "body": body}  # fmt: skip


async def opened(make_store):
    store = make_store()
    await store.open()
    return store


def ids(rows: list[dict]) -> list[str]:
    return [row["id"] for row in rows]


def test_each_delivery_is_claimed_once_however_many_claim_at_once(make_store):
    async def scenario():
        store = await opened(make_store)
        rows = [delivery(f"d{n}", f"s{n}", f"e{n}") for n in range(30)]  # one per endpoint
        await store.add_deliveries(rows, 100)
        claims = await asyncio.gather(
            *(store.claim_deliveries(f"g{n % 3}", 4, 60) for n in range(12))
        )
        again = await store.claim_deliveries("g9", 100, 60)  # nothing is due again yet
        await store.close()
        return [row["id"] for found in claims for row in found], again

    claimed, again = asyncio.run(scenario())
    assert len(claimed) == len(set(claimed)) == 30 and again == []


def test_a_sessions_next_delivery_waits_for_the_one_before_and_a_dead_claim_for_its_lease(
    make_store,
):
    async def scenario():
        store = await opened(make_store)
        rows = [delivery("d1", "s1"), delivery("d2", "s1"), delivery("d3", "s1", "other")]
        await store.add_deliveries(rows, 100)
        first = ids(await store.claim_deliveries("g1", 10, 0.2))  # then g1 dies
        waiting = ids(await store.claim_deliveries("g2", 10, 60))
        await asyncio.sleep(0.3)
        taken_over = ids(await store.claim_deliveries("g2", 10, 60))
        await store.finish_attempt("d1", {"status": 204}, "delivered", 0)
        after = ids(await store.claim_deliveries("g2", 10, 60))
        row = await store.get_delivery("d1")
        await store.close()
        return first, waiting, taken_over, after, row

    first, waiting, taken_over, after, row = asyncio.run(scenario())
    assert first == ["d1", "d3"]  # d2 waits for d1: same session, same endpoint
    assert waiting == [] and taken_over == ["d1", "d3"] and after == ["d2"]
    assert row["state"] == "delivered" and row["attempts"] == 2 and row["log"] == [{"status": 204}]


def test_a_restart_releases_what_it_was_sending_and_a_retry_waits_its_turn(make_store):
    async def scenario():
        store = await opened(make_store)
        await store.add_deliveries([delivery("d1", "s1"), delivery("d2", "s2", "other")], 100)
        await store.claim_deliveries("g1", 10, 60)
        await store.finish_attempt("d2", {"status": 500}, "pending", 60)  # retry in a minute
        await store.close()
        store = await opened(make_store)
        released = await store.release_deliveries("g1")
        due = ids(await store.claim_deliveries("g1", 10, 60))
        await store.close()
        return released, due

    assert asyncio.run(scenario()) == (1, ["d1"])


def test_a_full_endpoint_drops_new_deliveries_and_logs_why(make_store):
    async def scenario():
        store = await opened(make_store)
        await store.add_deliveries([delivery(f"d{n}", f"s{n}") for n in range(3)], 2)
        page = await store.deliveries("acme", None, None, 10)
        older = await store.deliveries("acme", "pending", page[0]["seq"], 10)
        await store.close()
        return page, older

    page, older = asyncio.run(scenario())
    assert [r["state"] for r in page] == ["dropped", "pending", "pending"]
    assert "waiting" in page[0]["log"][0]["error"] and ids(older) == ["d1", "d0"]


def test_an_endpoint_has_one_attempt_in_flight_and_endpoints_take_turns(make_store):
    """One tenant's receiver that never answers holds one slot, not the worker's every slot:
    the oldest due rows of all tenants were taken, so 40 of its rows held back another's."""

    async def scenario():
        store = await opened(make_store)
        slow = [delivery(f"s{n}", f"s{n}", "slow") for n in range(5)]
        await store.add_deliveries([*slow, delivery("f1", "f1", "fast")], 100)
        first = ids(await store.claim_deliveries("g1", 4, 60))
        busy = ids(await store.claim_deliveries("g1", 4, 60))  # both endpoints are in flight
        await store.finish_attempt("s0", {"status": 500}, "pending", 0)  # a retry, due now
        await store.finish_attempt("f1", {"status": 204}, "delivered", 0)
        again = ids(await store.claim_deliveries("g1", 4, 60))
        await store.close()
        return first, busy, again

    first, busy, again = asyncio.run(scenario())
    assert first == ["s0", "f1"] and busy == [] and again == ["s0"]


def test_the_queue_cap_count_and_the_prune_read_an_index_not_the_whole_log(make_store, tmp_path):
    """Each delivery queued counted its endpoint's rows of the whole 7-day log, and each prune
    scanned the table: the plans had no index on (tenant, endpoint, state) or on created_at."""

    async def scenario():
        store = await opened(make_store)
        await store.close()

    asyncio.run(scenario())
    db = sqlite3.connect(tmp_path / "db.sqlite3")
    waiting = db.execute(
        "EXPLAIN QUERY PLAN SELECT count(*) FROM webhook_deliveries WHERE tenant = ?"
        " AND endpoint = ? AND state IN ('pending', 'sending')",
        ("acme", "main"),
    ).fetchall()
    pruned = db.execute(
        "EXPLAIN QUERY PLAN DELETE FROM webhook_deliveries WHERE created_at < ?"
        " AND state NOT IN ('pending', 'sending')",
        (0,),
    ).fetchall()
    db.close()
    assert "webhook_deliveries_waiting (tenant=? AND endpoint=? AND state=?)" in str(waiting)
    assert "webhook_deliveries_by_age (created_at<?)" in str(pruned)
