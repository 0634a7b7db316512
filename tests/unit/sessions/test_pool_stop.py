"""A warm pool stops when the gateway stops, whatever its filler was doing."""

from __future__ import annotations

import asyncio

from test_pool_claims_cut_short import Engine

from gateway.sessions.pool import WarmPool


def test_a_pool_stopped_the_moment_its_filler_is_woken_stops():
    """Python 3.11's ``asyncio.wait_for`` drops a cancel that lands as the event it waits
    for is set: the filler woke, looped and waited again, and the stop waited on it for
    ever (a refill ending as the gateway stopped hung a unit test in CI)."""

    async def scenario() -> None:
        pool = WarmPool(Engine(None), {}, 1, 100, live={})  # type: ignore[arg-type]
        pool.start()
        for _ in range(5):
            await asyncio.sleep(0)  # the filler waits to be woken
        pool._wake.set()  # a refill ends, say
        stopping = asyncio.create_task(pool.stop())
        done, _ = await asyncio.wait([stopping], timeout=10)
        assert done, "the pool's stop waited on its filler for ever"

    asyncio.run(scenario())
