"""The session list: this gateway's registry alone, or the deployment's store a page at a time."""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace

import pytest

from gateway.access.auth import Principal
from gateway.errors import BadRequest
from gateway.sessions.leases import Leases
from gateway.sessions.listing import Listing
from gateway.store.sqlite import SQLiteStore
from gateway.timestamps import parse_iso

ACME = Principal(tenant="acme", token_id="a")
ADMIN = Principal(tenant="ops", token_id="o", admin=True)


def view(sid: str, tenant: str = "acme", state: str = "idle", **metadata) -> dict:
    return {"id": sid, "tenant": tenant, "state": state, "metadata": metadata,
            "created_at": f"2026-11-28T00:00:{sid[-2:]}.000Z", "ended_at": None}  # fmt: skip


def live(doc: dict) -> SimpleNamespace:
    """A live session as the registry holds it (only what the list reads)."""
    return SimpleNamespace(
        id=doc["id"],
        tenant=doc["tenant"],
        state=doc["state"],
        created_at=parse_iso(doc["created_at"]),
        to_json=lambda: dict(doc),
    )


def listing(tmp_path, shared: bool, registry: dict):
    async def go():
        store = SQLiteStore(tmp_path / "db.sqlite3")
        await store.open()
        leases = Leases(store, 30.0, clock=lambda: 0.0)
        leases.owner, leases.shared = "here", shared  # shared: as if gateways shared this store
        return store, leases, Listing(registry, store, leases, clock=lambda: 1_795_000_000.0)

    return go()


def ids(page) -> list[str]:
    return [v["id"] for v in page[0]]


def test_one_gateway_lists_its_registry_by_tenant_state_and_metadata_a_page_at_a_time(
    tmp_path,
):
    docs = [view("s01", team="a"), view("s02", "zeta"), view("s03", state="paused"),
            view("s04", team="b")]  # fmt: skip
    registry = {d["id"]: live(d) for d in docs}

    async def scenario():
        store, _, lister = await listing(tmp_path, False, registry)
        assert ids(await lister.page(ACME)) == ["s01", "s03", "s04"]
        assert ids(await lister.page(ACME, tenant="zeta")) == []
        assert ids(await lister.page(ADMIN, tenant="zeta")) == ["s02"]
        assert ids(await lister.page(ACME, state="paused")) == ["s03"]
        assert ids(await lister.page(ACME, metadata={"team": "b"})) == ["s04"]
        first, token = await lister.page(ACME, limit=2)
        assert [v["id"] for v in first] == ["s01", "s03"] and token
        assert first[0]["gateway"] == "here" and first[0]["confirmed_at"].startswith("2026-")
        assert await lister.page(ACME, after=token, limit=2) == (
            [{**docs[3], "gateway": "here", "confirmed_at": first[0]["confirmed_at"]}],
            None,
        )
        for bad in ({"state": "gone"}, {"limit": 0}, {"after": "not-a-token"}):
            with pytest.raises(BadRequest):
                await lister.page(ACME, **bad)
        await store.close()

    asyncio.run(scenario())


def test_gateways_sharing_a_store_list_every_ones_sessions_each_with_its_holder(tmp_path):
    mine = view("s02", state="busy")
    registry = {"s02": live(mine)}

    async def scenario():
        store, leases, lister = await listing(tmp_path, True, registry)
        for doc in (view("s01"), {**mine, "state": "idle"}, view("s03", "zeta"), view("s04")):
            await store.save_session(doc)
        assert await store.claim_lease("s01", "there", 30)
        leases._held["s02"] = 10.0  # this gateway holds its own
        page, token = await lister.page(ACME, limit=2)
        theirs, own = page
        assert theirs["id"] == "s01" and theirs["gateway"] == "there" and theirs["confirmed_at"]
        assert own["state"] == "busy" and own["gateway"] == "here", "its own, shown live"
        rest, end = await lister.page(ACME, after=token)
        assert [v["id"] for v in rest] == ["s04"] and end is None
        assert rest[0]["gateway"] is None and rest[0]["confirmed_at"] is None  # nobody holds it
        assert ids(await lister.page(ADMIN)) == ["s01", "s02", "s03", "s04"]
        assert ids(await lister.page(ACME, metadata={"x": "1"})) == []
        # Its own session went busy (not recorded as it happens): listed by its live state.
        assert ids(await lister.page(ACME, state="busy")) == ["s02"]
        assert ids(await lister.page(ACME, state="idle")) == ["s01", "s04"]
        for crafted in ("\x00|x", "2026-11-28T00:00:01.000Z|\x00"):  # a 500 on PostgreSQL
            token = base64.urlsafe_b64encode(crafted.encode()).decode()
            with pytest.raises(BadRequest):
                await lister.page(ACME, after=token)
        with pytest.raises(BadRequest):
            await lister.page(ADMIN, tenant="a\x00")
        await store.close()

    asyncio.run(scenario())
