"""A pooled sandbox taken for a create or a resume is never left running for nobody.

Between leaving the pool and becoming a session's, a sandbox is fitted
(its limits updated in place, the session's env set in its kernel): each of
those steps awaits, and may fail (the engine refuses the update, the kernel
dies) or be cut short (the create's task cancelled: a client gone, an MCP
call cancelled). Each scenario here is cancelled after every number of
steps in turn; afterwards each sandbox taken is the session's, ready in the
pool again, or removed (once), and a template's sandbox has given its
tenant's quota hold back exactly once unless it is ready again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import types
from collections import Counter
from typing import Any

import pytest
from test_manager import build, local_kernels, started, stopped
from test_template_pools import LIMITS, image

from gateway.access.auth import Principal, Quota
from gateway.errors import KernelDied
from gateway.sessions.model import Session
from gateway.sessions.pool import TemplateKey, WarmPool, pool_key
from gateway.sessions.requests import CreateSession

ASKED = dataclasses.replace(LIMITS, memory=2**29)  # /tmp stays the size it is
TEMPLATE = image("alice", "geo", 1)


class Engine:
    """The placement, the lifecycle and the quotas as the pool uses them; each step
    awaits once (a point a cancel can land), and ``fails`` names the step that raises."""

    name = "fake"
    resizes_in_place = True
    hands_over = True

    def __init__(self, fails: str | None) -> None:
        self.fails = fails
        self.placement = self
        self.torn: Counter[str] = Counter()
        self.given_back: Counter[str] = Counter()

    def tmp_bytes(self, limits) -> int:
        return min(64 * 2**20, limits.memory // 4)

    async def update_limits(self, sandbox_id: str, limits) -> None:
        await asyncio.sleep(0)
        if self.fails == "update":
            raise RuntimeError("the engine refused the update")

    def new_session(self, request: CreateSession, tenant: str) -> Session:
        entry = Session(request.kernel, request.image or "sbx/python:local", LIMITS, 60, 60, {},
                        {}, tenant=tenant)  # fmt: skip
        entry.kernel = Kernel(self, entry.id)  # type: ignore[assignment]
        entry.language_info = {"name": "python"}
        return entry

    async def launch(self, entry: Session) -> None:
        pass

    async def claim(self, entry: Session) -> None:
        pass

    async def teardown(self, entry: Session) -> None:
        self.torn[entry.id] += 1
        await asyncio.sleep(0)

    async def let_go(self, pooled_id: str) -> None:
        self.given_back[pooled_id] += 1  # shielded where it is real: done once begun
        await asyncio.sleep(0)


class Kernel:
    def __init__(self, engine: Engine, entry_id: str) -> None:
        self.engine = engine
        self.container_id = f"c-{entry_id}"
        self.sandbox = types.SimpleNamespace(limits=LIMITS, env={})

    async def run_silently(self, code: str) -> None:
        await asyncio.sleep(0)
        if self.engine.fails == "env":
            raise KernelDied("the kernel died")


def asking(tenant: str) -> Session:
    """A session the pooled sandbox fits, with other limits and env: both are applied."""
    return Session("python3", TEMPLATE if tenant else "sbx/python:local", ASKED, 60, 60,
                   {"MODE": "warm"}, {}, tenant=tenant or "bob")  # fmt: skip


async def create(pool: WarmPool, session: Session) -> bool:
    """The pool's part of a create, as ``SessionManager._create`` takes it."""
    requested = session.id
    try:
        await pool.reserve(session, CreateSession())
        await asyncio.sleep(0)  # the create's own quota claim
        return await pool.claim(session)
    finally:
        pool.unreserve(requested)


async def resume(pool: WarmPool, session: Session) -> bool:
    """A resume's take: what it gets is the resuming session's (it moves in)."""
    got = await pool.take_for(session)
    if got is not None:
        session.kernel = got.kernel
    return got is not None


@pytest.mark.parametrize("fails", [None, "update", "env"], ids=["fitted", "refused", "died"])
@pytest.mark.parametrize("tenant", ["", "alice"], ids=["servers", "template"])
@pytest.mark.parametrize("take", [create, resume])
def test_a_taken_sandbox_is_the_sessions_ready_again_or_removed_at_every_step(take, tenant, fails):
    async def once(steps: int) -> bool:
        """Take with a cancel after ``steps`` turns of the loop; whether it was cut short."""
        engine = Engine(fails)
        pool = WarmPool(engine, {}, 1, 100, live={})  # type: ignore[arg-type]
        pool.quotas = engine  # type: ignore[assignment]
        session = asking(tenant)
        if take is resume:
            session.state = "paused"
        key = pool_key(session)
        pool.resize(key, 1)
        entry = await pool._start(key)  # as a refill makes it (a template's holds quota)
        pool.ready[key] = [entry]
        task = asyncio.create_task(take(pool, session))
        for _ in range(steps):
            await asyncio.sleep(0)
        cut = not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            served = await task
            assert served == (fails is None), f"served {served} with a fit that {fails}"
        while pool.tasks._tasks:
            await asyncio.gather(*pool.tasks._tasks)
        where = Counter()
        where["the session's"] = session.kernel is entry.kernel
        where["ready"] = entry in pool.ready[key]
        where["set aside"] = entry in pool.reserved.values()
        where["removed"] = engine.torn[entry.id]
        at = f"cut short after {steps} steps" if cut else "run to its end"
        assert sorted(where.values()) == [0, 0, 0, 1], f"{at}, the sandbox is: {dict(where)}"
        if isinstance(key, TemplateKey):
            given = engine.given_back[entry.id]
            assert given == (0 if where["ready"] else 1), (
                f"{at}: its quota hold given back {given}x"
            )
        return cut

    async def scenario() -> None:
        for steps in range(40):
            if not await once(steps):
                return
        raise AssertionError("never ran to its end")

    asyncio.run(scenario())


@pytest.fixture
def kernels_dir(tmp_path):
    return local_kernels(tmp_path)


def test_a_create_cut_short_once_it_holds_the_warm_sandbox_removes_it(tmp_path, kernels_dir):
    """After the claim the session runs in the pooled sandbox; until its record says idle,
    a cancel (at its lease, its working directory, its record) ends it, sandbox and all, and
    its quota claim goes: the tenant may hold one session, and each next create gets it."""
    alice = Principal(tenant="alice", token_id="a")

    async def scenario() -> None:
        manager, placement, store = build(tmp_path, kernels_dir, pool="python3=1")
        manager.admission.quota = lambda tenant: Quota(1, 8 * 2**30, 8 * 2**30)
        await started(manager, store)
        reached, hold = asyncio.Event(), asyncio.Event()

        async def gate(*args: Any) -> None:
            reached.set()
            await hold.wait()

        async def at_the_record(session: Session) -> None:
            if session.state == "idle":
                await gate()
            await save(session)

        save = manager.save
        at = {
            "lease": (manager.leases, "claim"),
            "working dir": (manager.lifecycle, "enter_working_dir"),
            "record": (manager, "save"),
        }
        try:
            for point, (owner, name) in at.items():
                for _ in range(300):
                    if manager.pool.ready["python3"]:
                        break
                    await asyncio.sleep(0.1)
                pooled_id = manager.pool.ready["python3"][0].id
                real = getattr(owner, name)
                setattr(owner, name, at_the_record if point == "record" else gate)
                reached.clear()
                creating = asyncio.create_task(manager.create(CreateSession(), alice))
                await asyncio.wait_for(reached.wait(), 10)
                creating.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await creating
                setattr(owner, name, real)
                assert pooled_id in placement.removed, f"cut short at its {point}: left running"
                assert pooled_id not in manager.sessions, f"cut short at its {point}: still kept"
            session = await manager.create(CreateSession(), alice)  # its quota was given back
            assert session.state == "idle"
        finally:
            await stopped(manager, store)

    asyncio.run(scenario())


class Pooled:
    """A pooled sandbox's kernel as ``move_in`` hands it over; ``let_go`` may be held."""

    container_id = "c-pooled"

    def __init__(self, hold: asyncio.Event | None) -> None:
        self.hold = hold
        self.shut = False

    def runtime_info(self) -> dict[str, Any]:
        return {"container_id": self.container_id}

    async def let_go(self) -> None:
        if self.hold is not None:
            await self.hold.wait()

    async def shutdown(self) -> None:
        self.shut = True


@pytest.mark.parametrize("point", ["files", "hand-over"])
def test_a_resume_cut_short_while_it_moves_in_removes_the_pooled_sandbox(
    tmp_path, kernels_dir, point
):
    """A resume's pooled sandbox is its caller's from ``take_for``; cancelled while the
    session's files are copied in, or as the kernel is handed over, it is removed."""

    async def scenario() -> None:
        manager, placement, _ = build(tmp_path, kernels_dir)
        held, reached = asyncio.Event(), asyncio.Event()

        async def copying(*args: Any) -> None:
            reached.set()
            if point == "files":
                await held.wait()

        placement.fill_pooled = copying  # type: ignore[method-assign]
        pooled = Session("python3", "sbx/python:local", LIMITS, 60, 60, {}, {})
        pooled.kernel = Pooled(held if point == "hand-over" else None)  # type: ignore[assignment]
        paused = Session("python3", "sbx/python:local", LIMITS, 60, 60, {}, {})
        moving = asyncio.create_task(manager.lifecycle.move_in(paused, pooled, "state"))
        await asyncio.wait_for(reached.wait(), 5)
        for _ in range(5):
            await asyncio.sleep(0)
        moving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await moving
        assert placement.removed == [pooled.id], f"cut short at its {point}: left running"

    asyncio.run(scenario())


def test_a_create_cut_short_at_its_lease_on_a_shared_store_removes_the_warm_sandbox(
    tmp_path, kernels_dir
):
    """On a shared store the lease is a call to it; a create cancelled during that call
    holds no lease yet, so ending it took the session for another gateway's: the pooled
    sandbox was only let go, left running for nobody (no record says it exists)."""
    alice = Principal(tenant="alice", token_id="a")

    async def scenario() -> None:
        manager, placement, store = build(tmp_path, kernels_dir, pool="python3=1")
        await started(manager, store)
        manager.leases.shared = True  # as on a shared store: the lease is the store's
        reached, hold = asyncio.Event(), asyncio.Event()

        async def claim_lease(*args: Any) -> bool:
            reached.set()
            await hold.wait()
            return True

        try:
            for _ in range(300):
                if manager.pool.ready["python3"]:
                    break
                await asyncio.sleep(0.1)
            pooled_id = manager.pool.ready["python3"][0].id
            store.claim_lease = claim_lease
            creating = asyncio.create_task(manager.create(CreateSession(), alice))
            await asyncio.wait_for(reached.wait(), 10)
            creating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await creating
            assert pooled_id in placement.removed, "left running for nobody"
            assert pooled_id not in manager.sessions
        finally:
            await stopped(manager, store)

    asyncio.run(scenario())
