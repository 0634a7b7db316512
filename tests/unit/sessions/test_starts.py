"""The cold-start queue: a few at once, the rest fairly by tenant, bounded, never stuck."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import Overloaded
from gateway.sessions.starts import StartQueue


async def start(queue: StartQueue, tenant: str, order: list[str], gate: asyncio.Event) -> None:
    async with queue.slot(tenant):
        order.append(tenant)
        await gate.wait()


def test_a_burst_of_one_tenant_does_not_hold_another_tenants_create_behind_it():
    async def scenario():
        queue = StartQueue(concurrency=1, size=20, per_tenant=10, max_wait=30)
        order: list[str] = []
        gate = asyncio.Event()
        tasks = [asyncio.create_task(start(queue, "burst", order, gate)) for _ in range(6)]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(start(queue, "single", order, gate)))
        await asyncio.sleep(0.01)
        assert queue.running == 1 and queue.queued == 6
        for _ in range(7):
            gate.set()
            await asyncio.sleep(0.01)
            gate.clear()
        gate.set()
        await asyncio.gather(*tasks)
        assert queue.running == 0 and queue.queued == 0
        return order

    order = asyncio.run(scenario())
    assert order.index("single") == 2, f"the other tenant's create waited behind the burst: {order}"


def test_past_the_queues_bounds_a_create_is_refused_at_once_with_a_retry_after():
    async def scenario():
        queue = StartQueue(concurrency=2, size=3, per_tenant=2, max_wait=30)
        gate = asyncio.Event()
        held = [asyncio.create_task(start(queue, t, [], gate)) for t in "aabb"]
        await asyncio.sleep(0.01)  # a, a run; b, b wait
        assert queue.running == 2 and queue.queued == 2
        with pytest.raises(Overloaded) as own_share:
            async with queue.slot("b"):
                pass
        held.append(asyncio.create_task(start(queue, "c", [], gate)))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded) as full:
            async with queue.slot("d"):
                pass
        gate.set()
        await asyncio.gather(*held)
        return own_share.value, full.value

    own_share, full = asyncio.run(scenario())
    assert "this tenant already has 2 creates waiting" in own_share.message
    assert "3 creates already wait" in full.message
    slow = StartQueue(concurrency=1, size=10, per_tenant=10, max_wait=5, pace=6.0)
    slow.running = 1
    with pytest.raises(Overloaded, match="about 6 s to start, more than the 5 s"):
        asyncio.run(slow._wait("a"))
    assert full.status == 503 and full.retry_after >= 1


def test_a_create_that_waits_too_long_or_leaves_gives_its_place_back():
    async def scenario():
        queue = StartQueue(concurrency=1, size=10, per_tenant=10, max_wait=0.05, pace=0.01)
        gate = asyncio.Event()
        first = asyncio.create_task(start(queue, "a", [], gate))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded, match=r"waited 0\.05 s"):
            async with queue.slot("b"):
                pass
        leaving = asyncio.create_task(start(queue, "c", [], gate))
        await asyncio.sleep(0.01)
        leaving.cancel()
        await asyncio.sleep(0.01)
        assert queue.queued == 0, "a create that gave up still held a place"
        gate.set()
        await first
        async with queue.slot("d"):  # the slot came back
            assert queue.running == 1
        assert queue.running == 0

    asyncio.run(scenario())


def test_a_tenants_first_create_is_not_refused_for_another_tenants_queue():
    """Round robin starts it second, whatever the other tenant has waiting."""

    async def scenario():
        queue = StartQueue(concurrency=1, size=64, per_tenant=16, max_wait=60, pace=5)
        gate = asyncio.Event()
        burst = [asyncio.create_task(start(queue, "burst", [], gate)) for _ in range(13)]
        await asyncio.sleep(0.01)
        order: list[str] = []
        single = asyncio.create_task(start(queue, "single", order, gate))
        await asyncio.sleep(0.01)
        assert not single.done(), single  # waiting, not refused
        gate.set()
        await asyncio.gather(*burst, single)

    asyncio.run(scenario())


def test_a_start_that_fails_does_not_set_the_pace():
    """A sandbox given almost no CPU hangs to its timeout: that is no measure of a start."""

    async def scenario():
        now = [0.0]
        queue = StartQueue(1, 10, 10, 60, clock=lambda: now[0], pace=2.0)
        with pytest.raises(RuntimeError):
            async with queue.slot("slow"):
                now[0] += 300
                raise RuntimeError("kernel did not answer")
        queue.running = 1
        expected = queue._expected(1)
        queue.running = 0
        return expected

    assert asyncio.run(scenario()) == 2.0
