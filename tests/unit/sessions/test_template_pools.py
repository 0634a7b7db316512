"""Templates' warm pools: keyed by tenant and version, bounded per tenant, the tenant's alone.

The keying and the sizes are checked with a stand-in for the templates and a
pool that is never started; the claims with the manager over local kernels
(``test_manager``'s harness), as the kernelspec pool's own test does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_manager import build, local_kernels, started, stopped
from test_template_builds import _built, templates  # noqa: F401 (its fixture)

from gateway.access.auth import Principal, Quota
from gateway.errors import Conflict, LimitExceeded, NotAllowed, QuotaExceeded
from gateway.limits import Limits
from gateway.sessions import admission
from gateway.sessions.admission import Admission
from gateway.sessions.leases import Leases
from gateway.sessions.model import Session
from gateway.sessions.pool import PoolTargets, TemplateKey, WarmPool, pool_key
from gateway.sessions.requests import CreateSession
from gateway.sessions.template_pools import TemplatePools
from gateway.sessions.templates import TemplateNotFound
from gateway.store.sqlite import SQLiteStore

LIMITS = Limits(memory=2**28, cpus=1.0, pids=64, disk=2**28, timeout=30.0, output_bytes=2**20)


def image(tenant: str, name: str, version: int) -> str:
    return f"sbxt/{tenant}-{name}:{version}-0123456789ab"


class Kept:
    """The templates, as far as the pools ask: ready versions by (tenant, name)."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str], list[int]] = {}
        self.moved: list[Any] = []
        self.unavailable: str | None = None

    def add(self, tenant: str, name: str, version: int) -> None:
        self.docs.setdefault((tenant, name), []).insert(0, version)

    async def versions(self, tenant: str, name: str) -> list[dict[str, Any]]:
        if (tenant, name) not in self.docs:
            raise TemplateNotFound(f"you have no template {name!r}")
        return [self._doc(tenant, name, v) for v in self.docs[(tenant, name)]]

    async def resolve(self, tenant: str, name: str) -> dict[str, Any]:
        docs = await self.versions(tenant, name)
        if not docs:
            raise Conflict(f"template {name!r} has no ready version yet")
        return docs[0]

    @staticmethod
    def _doc(tenant: str, name: str, version: int) -> dict[str, Any]:
        return {"version": version, "kernel": "python3", "image": image(tenant, name, version)}


async def pools_over(tmp_path, per_tenant: int = 4) -> tuple[TemplatePools, Kept, WarmPool, Any]:
    store = SQLiteStore(tmp_path / "gateway.sqlite3")
    await store.open()
    kept = Kept()
    pool = WarmPool(None, {}, 1, 100, live={})  # never started: its targets are what is checked
    return TemplatePools(kept, pool, store, per_tenant), kept, pool, store  # type: ignore[arg-type]


def session(tenant: str, image_ref: str) -> Session:
    return Session("python3", image_ref, LIMITS, 60, 60, {}, {}, tenant=tenant)


def test_a_template_session_is_keyed_by_its_tenant_and_version_a_kernelspec_one_by_name():
    ours = pool_key(session("alice", image("a", "geo", 2)))
    assert ours == TemplateKey("alice", image("a", "geo", 2), "python3", "geo", 2)
    assert ours != pool_key(session("bob", image("a", "geo", 2))), "another tenant shares a pool"
    assert ours != pool_key(session("alice", image("a", "geo", 1))), "two versions share a pool"
    assert pool_key(session("alice", "sbx/python:local")) == "python3"
    targets = PoolTargets({"python3": 2}, {}, 60)
    targets.set(ours, 3)
    targets.missed(ours)  # a tenant's pool is the size it asked for, not grown by demand
    assert targets.sizes == {"python3": 2, ours: 3}
    targets.set(ours, 0)
    assert targets.sizes == {"python3": 2} and ours not in targets.base


def test_a_tenants_template_pools_are_bounded_together_and_named_templates_only(tmp_path):
    async def scenario() -> None:
        pools, kept, pool, store = await pools_over(tmp_path, per_tenant=4)
        try:
            kept.add("alice", "geo", 1)
            kept.add("alice", "ml", 1)
            kept.add("bob", "geo", 1)
            view = await pools.resize("alice", "geo", 3)
            assert view == {"size": 3, "version": 1, "ready": 0, "starting": 0, "served": 0,
                            "waiting": None}  # fmt: skip
            with pytest.raises(LimitExceeded, match=r"would keep 5 sandboxes.*over the 4"):
                await pools.resize("alice", "ml", 2)
            await pools.resize("alice", "ml", 1)
            await pools.resize("alice", "geo", 3)  # its own size again: not counted twice
            await pools.resize("bob", "geo", 4)  # another tenant's bound is its own
            for bad in (-1, 1.5, "2", True, None):
                with pytest.raises(LimitExceeded, match="whole number"):
                    await pools.resize("alice", "geo", bad)
            for size in (1, 0):  # a name the tenant lacks (bob's is not carol's)
                with pytest.raises(TemplateNotFound):
                    await pools.resize("carol", "geo", size)
            kept.unavailable = "the swarm placement runs sessions on other nodes"
            with pytest.raises(NotAllowed, match="not offered here: the swarm"):
                await pools.resize("bob", "geo", 1)
            assert {k: n for k, n in pool.sizes.items()} == {
                TemplateKey("alice", image("alice", "geo", 1), "python3"): 3,
                TemplateKey("alice", image("alice", "ml", 1), "python3"): 1,
                TemplateKey("bob", image("bob", "geo", 1), "python3"): 4,
            }
        finally:
            await store.close()

    asyncio.run(scenario())


def test_a_template_pool_follows_its_newest_version_goes_with_its_template_and_outlives_a_restart(
    tmp_path,
):
    async def scenario() -> None:
        pools, kept, pool, store = await pools_over(tmp_path)
        try:
            kept.add("alice", "geo", 1)
            await pools.resize("alice", "geo", 2)
            kept.add("alice", "geo", 2)  # a new version is built ...
            await pools.follow("alice", "geo")  # ... and the templates tell the pools
            assert pool.sizes == {TemplateKey("alice", image("alice", "geo", 2), "python3"): 2}
            assert pools.view("alice", "geo")["version"] == 2
            again, _, pool_again, _ = await pools_over(tmp_path)  # a restarted gateway
            again.templates = kept
            await again.start()
            assert pool_again.sizes == pool.sizes, "the pool was forgotten at the restart"
            del kept.docs[("alice", "geo")]  # deleted
            await pools.follow("alice", "geo")
            assert pool.sizes == {} and pools.view("alice", "geo")["size"] == 0
            assert await store.template_pools() == [], "a deleted template's pool is recorded"
        finally:
            await store.close()

    asyncio.run(scenario())


@pytest.fixture
def kernels_dir(tmp_path):
    return local_kernels(tmp_path)


def test_a_pooled_template_sandbox_serves_its_tenant_alone_and_holds_its_quota(
    tmp_path, kernels_dir
):
    alice, bob = Principal(tenant="alice", token_id="a"), Principal(tenant="bob", token_id="b")
    ours = image("alice", "geo", 1)

    async def ready(pool: WarmPool, key: TemplateKey) -> None:
        for _ in range(300):
            if pool.ready.get(key):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the pool never filled: {pool.stats_of(key)}")

    async def scenario() -> None:
        manager, _, store = build(tmp_path, kernels_dir)
        # alice may hold one session: her pooled sandbox holds it while it waits
        manager.admission.quota = lambda tenant: Quota(1, 8 * 2**30, 8 * 2**30)
        await started(manager, store)
        try:
            pool, key = manager.pool, TemplateKey("alice", ours, "python3", "geo", 1)
            pool.resize(key, 1)
            await ready(pool, key)
            pooled_id = pool.ready[key][0].id
            with pytest.raises(QuotaExceeded, match="'alice' holds 1 live sessions"):
                await manager.create(CreateSession(), alice)  # a cold one: her quota is held
            theirs = await manager.create(CreateSession(image=ours), bob)  # the same image
            assert theirs.id != pooled_id and pool.ready[key], "bob took alice's sandbox"
            session = await manager.create(CreateSession(image=ours, env={"X": "1"}), alice)
            assert session.id == pooled_id, "alice's create from her template started cold"
            assert pool.stats_of(key)["hits"] == 1 and not pool.served[pool_key(theirs)]
            assert pool.claims[("python3", "miss")] == 1, "bob's cold start is no miss of python3"
            for _ in range(100):  # the refill waits: alice's quota is her session's now
                if pool.short.get(key):
                    break
                await asyncio.sleep(0.1)
            assert "quota" in pool.short[key] and not pool.ready[key]
            await manager.end(session, "test")
            await ready(pool, key)  # room again: the pool fills
            pool.resize(key, 0)
            for _ in range(100):  # its sandbox goes, and gives alice's quota back
                if key not in pool.ready and not pool.tasks._tasks:
                    break
                await asyncio.sleep(0.1)
            assert key not in pool.served and key not in pool.starting, "a removed pool stays"
            await manager.create(CreateSession(), alice)
        finally:
            await stopped(manager, store)

    asyncio.run(scenario())


def test_the_servers_pool_stats_show_no_tenants_template():
    pool = WarmPool(None, {"python3": 1}, 1, 10, live={})  # type: ignore[arg-type]
    pool.resize(TemplateKey("alice", image("alice", "geo", 1), "python3"), 2)
    assert set(pool.stats()) == {"python3"}, "a tenant's template shows in /healthz"


def test_the_pool_moves_with_what_the_templates_name_resolves_to(templates):  # noqa: F811
    async def scenario() -> None:
        t = await templates()
        pool = WarmPool(None, {}, 1, 100, live={})  # type: ignore[arg-type]
        pools = TemplatePools(t, pool, t.store, 4)
        kept = lambda: {(k.version, n) for k, n in pool.sizes.items()}  # noqa: E731
        await _built(t, "alice", "geo")
        await pools.resize("alice", "geo", 2)
        await _built(t, "alice", "geo")  # a new version takes ``default``: the pool follows
        assert kept() == {(2, 2)}
        await t.assign("alice", "geo:1", ["default"])  # a rollback of the bare name
        assert kept() == {(1, 2)}
        await t.remove("alice", "geo", ["default"])  # no default: the newest ready
        assert kept() == {(2, 2)}
        await t.delete("alice", "geo")
        assert kept() == set() and await t.store.template_pools() == []

    asyncio.run(scenario())


def test_a_pooled_sandboxs_quota_hold_stays_fresh_on_a_store_nobody_shares(tmp_path, monkeypatch):
    monkeypatch.setattr(admission, "UNSHARED_CLAIM", 0.3)  # seconds an unextended claim counts

    async def scenario() -> None:
        store = SQLiteStore(tmp_path / "gateway.sqlite3")
        await store.open()
        held = Admission({}, lambda t: Quota(1, 8 * 2**30, 8 * 2**30), 10, store, Leases(store, 30))
        held.start()
        try:
            await held.claim(session("alice", image("alice", "geo", 1)))  # a pooled one's hold
            await asyncio.sleep(1.0)
            with pytest.raises(QuotaExceeded, match="holds 1 live sessions"):
                await held.claim(session("alice", "sbx/python:local"))
        finally:
            await held.stop()
            await store.close()

    asyncio.run(scenario())
