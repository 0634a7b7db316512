"""Cold starts take their turn: what waits, what is refused, and what a wait leaves behind.

Over the local placement of test_manager (real kernels as local processes).
"""

from __future__ import annotations

import asyncio

import pytest
from unit.sessions.test_manager import WHO, build, local_kernels, started, stopped

from gateway.errors import Overloaded, SessionEnded
from gateway.sessions.requests import CreateSession


@pytest.fixture
def kernels_dir(tmp_path):
    return local_kernels(tmp_path)


def counting_launches(manager) -> list[str]:
    launched: list[str] = []
    launch = manager.lifecycle.launch

    async def counted(session):
        launched.append(session.id)
        return await launch(session)

    manager.lifecycle.launch = counted
    return launched


def test_a_create_deleted_while_it_waits_its_turn_never_starts_a_sandbox(tmp_path, kernels_dir):
    async def scenario() -> None:
        manager, _, store = build(tmp_path, kernels_dir, start_concurrency=1)
        await started(manager, store)
        launched = counting_launches(manager)
        try:
            async with manager.starts.slot("another tenant"):  # the only slot, taken
                waiting = asyncio.create_task(manager.create(CreateSession(session_id="x"), WHO))
                while "x" not in manager.sessions:  # noqa: ASYNC110 (the registry has no event)
                    await asyncio.sleep(0.01)
                await manager.delete("x", WHO)
            with pytest.raises(SessionEnded, match="while it waited to start"):
                await waiting
            assert launched == [], "a sandbox was started for a session deleted before its turn"
        finally:
            await stopped(manager, store)

    asyncio.run(scenario())


def test_a_create_the_queue_refuses_keeps_no_lease_or_claim(tmp_path, kernels_dir):
    async def scenario() -> None:
        manager, _, store = build(tmp_path, kernels_dir, start_concurrency=1)
        await started(manager, store)
        manager.leases.shared = True  # as on a store gateways share: creates take leases
        try:
            async with manager.starts.slot("another tenant"):
                manager.starts.size = 0  # the queue holds no one
                with pytest.raises(Overloaded):
                    await manager.create(CreateSession(session_id="x"), WHO)
            assert not manager.leases.holds("x") and "x" not in manager.sessions
            assert await store.db.select("SELECT * FROM leases WHERE session_id = 'x'") == []
            assert await store.db.select("SELECT * FROM claims WHERE session_id = 'x'") == []
        finally:
            manager.leases.shared = False
            await stopped(manager, store)

    asyncio.run(scenario())


def test_a_restart_takes_its_turn_and_a_refusal_leaves_the_kernel_as_it_was(tmp_path, kernels_dir):
    async def scenario() -> None:
        manager, _, store = build(tmp_path, kernels_dir, start_concurrency=1)
        await started(manager, store)
        try:
            session = await manager.create(CreateSession(), WHO)
            async with manager.starts.slot("another tenant"):
                manager.starts.size = 0
                with pytest.raises(Overloaded):
                    await manager.restart(session.id, WHO)
            assert session.state == "idle", f"a refused restart left the session {session.state}"
            manager.starts.size = 10
            assert (await manager.restart(session.id, WHO)).state == "idle"
        finally:
            await stopped(manager, store)

    asyncio.run(scenario())
