"""Templates' pools under concurrent calls: a tenant's bound and its pools' sizes hold.

Sizing a pool and following a template's version each await the store and
the templates; calls racing them (two PUTs, a PUT and a build's move) must
leave what was asked, not what one of them read before the other wrote.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_manager import build, local_kernels, started, stopped
from test_template_pools import LIMITS, Kept, pools_over

from gateway.access.auth import Principal, Quota
from gateway.errors import LimitExceeded, QuotaExceeded
from gateway.sessions.model import Session
from gateway.sessions.pool import TemplateKey, WarmPool
from gateway.sessions.requests import CreateSession


class Slow(Kept):
    """Templates whose lookups take a turn of the loop, as the store's do."""

    async def resolve(self, tenant: str, name: str) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return await super().resolve(tenant, name)


def test_racing_puts_cannot_pass_the_tenants_bound_together(tmp_path):
    async def scenario() -> None:
        pools, _, pool, store = await pools_over(tmp_path, per_tenant=4)
        pools.templates = kept = Slow()
        try:
            for name in ("geo", "ml", "web"):
                kept.add("alice", name, 1)
            results = await asyncio.gather(
                *(pools.resize("alice", n, 3) for n in ("geo", "ml", "web")),
                return_exceptions=True,
            )
            refused = [r for r in results if isinstance(r, LimitExceeded)]
            assert len(refused) == 2, f"racing PUTs passed the bound of 4: {results}"
            assert sum(pool.sizes.values()) == 3, pool.sizes
        finally:
            await store.close()

    asyncio.run(scenario())


def test_a_pool_emptied_while_it_follows_a_new_version_stays_empty(tmp_path):
    async def scenario() -> None:
        pools, _, pool, store = await pools_over(tmp_path)
        pools.templates = kept = Slow()
        try:
            kept.add("alice", "geo", 1)
            await pools.resize("alice", "geo", 2)
            kept.add("alice", "geo", 2)
            moving = asyncio.create_task(pools.follow("alice", "geo"))  # a build ended
            await asyncio.sleep(0)  # the follow has read the size, and resolves
            await pools.resize("alice", "geo", 0)  # the tenant empties the pool meanwhile
            await moving
            assert pool.sizes == {}, f"sandboxes kept (holding quota) for a pool of 0: {pool.sizes}"
            assert pools.view("alice", "geo")["size"] == 0
        finally:
            await store.close()

    asyncio.run(scenario())


class Launches:
    """A lifecycle whose launches wait to be let through, and quotas that say who holds."""

    def __init__(self, refuse: bool = False) -> None:
        self.go = asyncio.Event()
        self.refuse = refuse
        self.held: set[str] = set()

    def new_session(self, request: CreateSession, tenant: str) -> Session:
        return Session(request.kernel, request.image or "", LIMITS, 60, 60, {}, {}, tenant=tenant)

    async def launch(self, entry: Session) -> None:
        await self.go.wait()

    async def teardown(self, entry: Session) -> None:
        pass

    async def claim(self, entry: Session) -> None:
        if self.refuse:
            await self.go.wait()
            raise QuotaExceeded("tenant 'alice' holds 1 live sessions, its quota of 1")
        self.held.add(entry.id)

    async def let_go(self, pooled_id: str) -> None:
        self.held.discard(pooled_id)


@pytest.mark.parametrize("refuse", [False, True], ids=["started", "over-quota"])
def test_a_pool_removed_while_it_refills_leaves_nothing_behind(refuse):
    async def scenario() -> None:
        fake = Launches(refuse)
        pool = WarmPool(fake, {}, 1, 100, live={})  # type: ignore[arg-type]
        pool.quotas = fake  # type: ignore[assignment]
        key = TemplateKey("alice", "sbxt/alice-geo:1-0123456789ab", "python3", "geo", 1)
        pool.start()
        try:
            pool.resize(key, 1)
            for _ in range(100):
                if pool.starting[key]:
                    break
                await asyncio.sleep(0.01)
            pool.resize(key, 0)  # the template is deleted mid-refill
            await asyncio.sleep(0.05)  # the pool's loop forgets it
            fake.go.set()
            for _ in range(100):
                await asyncio.sleep(0.01)
                if not pool.starting:
                    break
            kept = {
                what: key in held
                for what, held in (("made", pool._made), ("short", pool.short),
                                   ("ready", pool.ready))
            }  # fmt: skip
            assert not any(kept.values()), f"a removed pool is remembered for good: {kept}"
            assert not fake.held, "its sandbox's quota hold was never given back"
        finally:
            await pool.stop()

    asyncio.run(scenario())


def test_a_restart_keeps_recorded_pools_within_the_tenants_bound_as_set_now(tmp_path):
    async def scenario() -> None:
        pools, kept, _, store = await pools_over(tmp_path, per_tenant=4)
        try:
            for name in ("geo", "ml"):
                kept.add("alice", name, 1)
                await pools.resize("alice", name, 2)
            for bound, kept_ready in ((0, 0), (3, 3)):  # the operator lowered the bound
                again, _, pool, other = await pools_over(tmp_path, per_tenant=bound)
                again.templates = kept
                await again.start()
                await other.close()
                held = sum(pool.sizes.values())
                assert held == kept_ready, f"a restart kept {held} ready, over the bound {bound}"
        finally:
            await store.close()

    asyncio.run(scenario())


@pytest.fixture
def kernels_dir(tmp_path):
    return local_kernels(tmp_path)


def test_a_refused_create_leaves_the_servers_pool_as_it_was(tmp_path, kernels_dir):
    """A tenant at its quota sends creates that are refused: the warm sandbox every
    tenant's create takes stays ready (it was torn down and started again for each)."""
    bob = Principal(tenant="bob", token_id="b")

    async def scenario() -> None:
        manager, _, store = build(tmp_path, kernels_dir, pool="python3=1")
        manager.admission.quota = lambda tenant: Quota(0, 8 * 2**30, 8 * 2**30)
        await started(manager, store)
        try:
            pool = manager.pool
            for _ in range(300):
                if pool.ready["python3"]:
                    break
                await asyncio.sleep(0.1)
            warm = pool.ready["python3"][0].id
            for _ in range(3):
                with pytest.raises(QuotaExceeded):
                    await manager.create(CreateSession(), bob)
            await asyncio.sleep(0.2)
            ready = [e.id for e in pool.ready["python3"]]
            assert ready == [warm], f"refused creates spent the server's warm sandbox: {ready}"
        finally:
            await stopped(manager, store)

    asyncio.run(scenario())
