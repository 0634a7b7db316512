"""Templates' pools under concurrent calls: a tenant's bound and its pools' sizes hold.

Sizing a pool and following a template's version each await the store and
the templates; calls racing them (two PUTs, a PUT and a build's move) must
leave what was asked, not what one of them read before the other wrote.
"""

from __future__ import annotations

import asyncio
from typing import Any

from test_template_pools import Kept, pools_over

from gateway.errors import LimitExceeded


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
