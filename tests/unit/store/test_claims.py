"""Quota claims and the deployment's session listing, on SQLite; tests/test_store_postgres.py
runs them again on PostgreSQL, with gateways claiming at once."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

from gateway.store.claims import ORPHANED
from gateway.store.migrations import pending
from gateway.store.sqlite import TERMS, SQLiteStore

CAPS = {"sessions": 2, "memory": 3 * 2**30, "cpus": 8.0, "disk": 100 * 2**30, "per_minute": 0}
GIB = 2**30


def claim(session_id: str, tenant: str = "acme", memory: int = GIB) -> dict:
    return {"session_id": session_id, "tenant": tenant, "owner": "g1", "memory": memory,
            "cpus": 1.0, "disk": GIB}  # fmt: skip


def doc(session_id: str, tenant: str = "acme", ended: bool = False, **extra) -> dict:
    return {"id": session_id, "tenant": tenant, "state": "deleted" if ended else "idle",
            "created_at": f"2026-11-28T00:00:0{session_id[-1]}.000Z",
            "ended_at": "t9" if ended else None, **extra}  # fmt: skip


def opened(make_store):
    async def go():
        store = make_store()
        await store.open()
        return store

    return go()


def test_claims_hold_a_tenants_quota_and_an_ended_session_gives_its_claim_back(make_store):
    async def scenario():
        store = await opened(make_store)
        assert await store.claim_quota(claim("s1"), CAPS, 60) is None
        assert await store.claim_quota(claim("s2"), CAPS, 60) is None
        refused = await store.claim_quota(claim("s3"), CAPS, 60)
        assert refused == {"what": "sessions", "used": 2, "cap": 2, "wanted": 1}
        assert await store.claim_quota(claim("s3", tenant="zeta"), CAPS, 60) is None
        await store.save_session(doc("s1"))
        await store.save_session(doc("s1", ended=True))
        big = await store.claim_quota(claim("s4", memory=2 * GIB + 1), CAPS, 60)
        assert big == {"what": "memory", "used": GIB, "cap": 3 * GIB, "wanted": 2 * GIB + 1}
        assert await store.claim_quota(claim("s4"), CAPS, 60) is None
        again = await store.claim_quota(claim("s4"), CAPS, 60)  # an id is claimed once
        assert again is not None and again["what"] in ("id", "sessions")
        await store.close()

    asyncio.run(scenario())


def test_a_claim_in_flight_counts_until_it_is_no_longer_extended_or_its_session_ends(
    make_store,
):
    async def scenario():
        store = await opened(make_store)
        caps = {**CAPS, "sessions": 1}
        assert await store.claim_quota(claim("s1"), caps, 0.3) is None
        await asyncio.sleep(0.2)
        await store.extend_claims(["s1"], 0.3)
        await asyncio.sleep(0.2)
        assert (await store.claim_quota(claim("s2"), caps, 60))["what"] == "sessions"
        await asyncio.sleep(0.2)  # its gateway died mid-create: nobody extends it
        assert await store.claim_quota(claim("s2"), caps, 0.1) is None
        await store.rebind_claim("s2", "pool-2")  # a warm sandbox's id
        await store.save_session(doc("pool-2"))
        await asyncio.sleep(0.2)  # past its time, but its session is open: it counts
        assert (await store.claim_quota(claim("s3"), caps, 60))["what"] == "sessions"
        await store.save_session(doc("pool-2", ended=True))
        assert await store.claim_quota(claim("s3"), caps, 60) is None
        await store.close()

    asyncio.run(scenario())


def test_a_restarted_gateway_gives_back_what_it_had_in_flight(make_store):
    async def scenario():
        store = await opened(make_store)
        caps = {**CAPS, "sessions": 2}
        for sid in ("s1", "s2"):
            assert await store.claim_quota(claim(sid), caps, 3600) is None
        await store.save_session(doc("s1"))
        assert await store.release_stale_claims("g1") == 1  # s2 never started
        assert await store.release_stale_claims("g1") == 0
        assert await store.claim_quota(claim("s3"), caps, 60) is None
        await store.close()

    asyncio.run(scenario())


def test_creates_per_minute_count_ended_sessions_but_not_creates_that_never_started(make_store):
    async def scenario():
        store = await opened(make_store)
        caps = {**CAPS, "per_minute": 2}
        assert await store.claim_quota(claim("refused"), caps, 60) is None
        await store.release_claim("refused")  # refused before it started: no create
        for sid in ("s1", "s2"):
            assert await store.claim_quota(claim(sid), caps, 60) is None
            await store.save_session(doc(sid))
            await store.save_session(doc(sid, ended=True))
        refused = await store.claim_quota(claim("s3"), caps, 60)
        assert refused == {"what": "per_minute", "used": 2, "cap": 2, "wanted": 1}
        await store.close()

    asyncio.run(scenario())


def test_open_sessions_are_listed_a_page_at_a_time_with_their_holder(make_store):
    async def scenario():
        store = await opened(make_store)
        for sid, tenant in (("s1", "acme"), ("s2", "zeta"), ("s3", "acme"), ("s4", "acme")):
            await store.save_session(doc(sid, tenant))
        await store.save_session(doc("s4", ended=True))
        await store.save_session(doc("s3", state="paused"))
        before = time.time()
        assert await store.claim_lease("s1", "g2", 30)
        first = await store.open_page("acme", None, None, 1)
        (listed, owner, renewed) = first[0]
        assert listed["id"] == "s1" and owner == "g2" and renewed >= before - 5
        rest = await store.open_page("acme", None, ("2026-11-28T00:00:01.000Z", "s1"), 10)
        assert [(d["id"], o, r) for d, o, r in rest] == [("s3", None, None)]
        assert [d["id"] for d, _, _ in await store.open_page(None, None, None, 10)] == [
            "s1", "s2", "s3",
        ]  # fmt: skip
        assert [d["id"] for d, _, _ in await store.open_page("acme", "paused", None, 10)] == ["s3"]
        await store.close()

    asyncio.run(scenario())


def test_an_open_session_nobody_has_held_for_a_long_time_stops_counting(make_store):
    """Its gateway died on a host no other gateway can adopt from, and never came back."""

    async def scenario():
        store = await opened(make_store)
        caps = {**CAPS, "sessions": 1}
        assert await store.claim_quota(claim("s1"), caps, -1) is None  # counts by its session
        await store.save_session(doc("s1"))
        assert await store.claim_lease("s1", "gone", -60)  # ran out a minute ago
        assert (await store.claim_quota(claim("s2"), caps, 60))["what"] == "sessions"
        assert await store.claim_lease("s1", "gone", -(ORPHANED + 1))
        assert await store.claim_quota(claim("s2"), caps, 60) is None
        await store.close()

    asyncio.run(scenario())


def test_sessions_open_when_the_claims_came_are_claimed_as_they_stand(tmp_path):
    before = next(n for n, script in pending(0, TERMS) if "CREATE TABLE claims" in script) - 1
    db = sqlite3.connect(tmp_path / "db.sqlite3", isolation_level=None)
    for number, script in pending(0, TERMS):
        if number <= before:
            db.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")
    limits = {"memory": 3 * GIB, "cpus": 2.0, "disk": GIB}
    db.execute(
        "INSERT INTO sessions (id, state, created_at, ended_at, doc) VALUES (?, ?, ?, ?, ?)",
        ("old", "idle", "t0", None, json.dumps({**doc("old"), "limits": limits})),
    )
    db.close()

    async def scenario():
        store = SQLiteStore(tmp_path / "db.sqlite3")
        await store.open()
        refused = await store.claim_quota(claim("new"), {**CAPS, "sessions": 5}, 60)
        await store.close()
        return refused

    assert asyncio.run(scenario()) == {"what": "memory", "used": 3 * GIB, "cap": 3 * GIB,
                                       "wanted": GIB}  # fmt: skip
