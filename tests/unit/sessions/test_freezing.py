"""A pause's two tiers, above the engine: when a pause freezes, and when a frozen one is saved."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import docker.errors
import pytest

from gateway.errors import SessionEnded, StrategyUnavailable
from gateway.limits import Limits
from gateway.sessions.model import Session
from gateway.sessions.pausing import Pausing
from gateway.sessions.reports import Reports
from gateway.sessions.requests import TakeSnapshot
from gateway.sessions.upkeep import Upkeep


def pausing(freezes: bool = True, freeze_for: float = 300.0) -> Pausing:
    placement = SimpleNamespace(name="swarm" if not freezes else "docker", freezes=freezes)
    lifecycle = SimpleNamespace(placement=placement)
    return Pausing(lifecycle, None, None, None, None, 30.0, None, None, None, freeze_for)  # type: ignore[arg-type]


def test_a_pause_freezes_unless_a_strategy_that_saves_is_named():
    p = pausing()
    assert p._freezes(None) and p._freezes("freeze")
    assert not p._freezes("namespace") and not p._freezes("replay")


def test_a_placement_or_a_gateway_that_does_not_freeze_pauses_deep_and_refuses_a_freeze():
    for p, says in ((pausing(freezes=False), "swarm placement cannot freeze"),
                    (pausing(freeze_for=0), "pause_frozen_for is 0")):  # fmt: skip
        assert not p._freezes(None)
        with pytest.raises(StrategyUnavailable, match=says):
            p._freezes("freeze")


def test_an_engine_that_cannot_freeze_a_sandbox_gets_the_deep_pause():
    p = pausing()

    async def refuse(sandbox_id: str) -> None:
        raise docker.errors.APIError("cgroup freezer unavailable")

    p.lifecycle.placement.freeze = refuse
    deep = object()

    async def paused(session, requested):
        return deep

    p.paused = paused  # type: ignore[method-assign]
    session = SimpleNamespace(id="s", state="idle", kernel=SimpleNamespace(container_id="c"))
    assert asyncio.run(p._freeze(session)) is deep  # type: ignore[arg-type]


class Manager:
    def __init__(self, sessions: list, now: float, saving: asyncio.Event | None = None) -> None:
        self.sessions = {s.id: s for s in sessions}
        self.clock = lambda: now
        self.deepened: list[str] = []
        self.ended: list[str] = []
        self.saving = saving  # a deepen takes until it is set

    async def deepen(self, session) -> None:
        self.deepened.append(session.id)
        if self.saving is not None:
            async with session.lock:
                await self.saving.wait()

    async def end(self, session, reason: str) -> None:
        self.ended.append(session.id)

    def spawn(self, coro) -> asyncio.Task:
        return asyncio.ensure_future(coro)


def frozen(name: str, saved_at: float, deepens_at: float, ends: bool = False) -> SimpleNamespace:
    paused = {"strategy": "freeze", "saved_at": saved_at, "deepens_at": deepens_at}
    return SimpleNamespace(
        id=name, frozen=True, paused=paused, state="paused", lock=asyncio.Lock(),
        expiry=lambda now: "ttl expired" if ends else None,
    )  # fmt: skip


def deepened(sessions: list, now: float, available: int | None, floor: int = 2**30) -> list:
    manager = Manager(sessions, now)
    upkeep = Upkeep(manager, None, None, None, None, 1.0, floor, lambda: available)  # type: ignore[arg-type]

    async def deepen() -> None:
        upkeep._deepen(now)
        await asyncio.sleep(0.01)  # what it started

    asyncio.run(deepen())
    return manager.deepened


def test_frozen_sessions_are_saved_when_their_time_is_up_or_memory_runs_short():
    sessions = [
        frozen("newer", 20.0, 320.0),
        frozen("older", 10.0, 310.0),
        SimpleNamespace(id="idle", frozen=False, paused=None),
    ]
    assert deepened(sessions, now=100.0, available=8 * 2**30) == []
    assert deepened(sessions, now=315.0, available=8 * 2**30) == ["older"]
    assert deepened(sessions, now=400.0, available=None) == ["older", "newer"]
    # Short of memory: the longest frozen first, one a culling interval.
    assert deepened(sessions, now=100.0, available=2**29) == ["older"]
    assert deepened(sessions, now=100.0, available=2**29, floor=0) == []


def test_the_culler_ends_sessions_while_frozen_ones_are_saved_and_saves_none_that_end():
    """Each save waited its turn in the culler (a tenant's namespace can take the kernel's
    start timeout to save): no session of any tenant ended or paused meanwhile."""

    async def cull() -> Manager:
        saving = asyncio.Event()
        sessions = [frozen("slow", 10.0, 20.0), frozen("ends", 10.0, 20.0, ends=True)]
        manager = Manager(sessions, 100.0, saving)
        upkeep = Upkeep(manager, None, None, None, None, 1.0, 0, lambda: None)  # type: ignore[arg-type]
        await asyncio.wait_for(upkeep.cull(), 1.0)
        await asyncio.wait_for(upkeep.cull(), 1.0)  # the next round: still saving
        saving.set()
        await asyncio.sleep(0.01)
        return manager

    manager = asyncio.run(cull())
    assert manager.ended == ["ends", "ends"] and manager.deepened == ["slow"], vars(manager)


class Events:
    def __init__(self) -> None:
        self.told: list[str] = []

    def tell(self, kind: str, session, reason: str | None = None) -> None:
        self.told.append(kind)


def thawing(gate: asyncio.Event) -> tuple[Pausing, Session, list[str]]:
    """A frozen session whose engine thaws it once ``gate`` is set; the records saved."""

    async def thaw(sandbox_id: str) -> None:
        await gate.wait()

    placement = SimpleNamespace(name="docker", freezes=True, thaw=thaw)
    saved: list[str] = []

    async def save(session) -> None:
        saved.append(session.state)

    state = SimpleNamespace(choose=lambda session, requested: requested or "namespace")
    p = Pausing(SimpleNamespace(placement=placement), state, None, None, save, 30.0, Events(),
                None, None, 300.0)  # type: ignore[arg-type]  # fmt: skip
    session = Session("python3", "img", Limits(2**30, 1.0, 64, 2**30, 30.0, 2**20), 60.0, 60.0,
                      {}, {})  # fmt: skip
    session.kernel = SimpleNamespace(container_id="c", connected=True)  # type: ignore[assignment]
    session.state, session.paused = "paused", {"strategy": "freeze", "saved_at": 0.0}
    return p, session, saved


@pytest.mark.parametrize("how", ["resume", "deepen"])
def test_a_session_ended_while_it_thaws_stays_ended(how):
    """Its end came while the engine thawed it: the thaw made it idle again, saved so."""

    async def race() -> None:
        gate = asyncio.Event()
        p, session, saved = thawing(gate)
        thawing_task = asyncio.ensure_future(
            p.resume(session) if how == "resume" else p.deepen(session)
        )
        await asyncio.sleep(0.01)
        session.state, session.reason = "deleted", "deleted by client"  # SessionManager.end
        gate.set()
        with contextlib.suppress(SessionEnded):
            await thawing_task
        assert session.state == "deleted" and saved == [], saved
        assert p.events.told == []

    asyncio.run(race())


def test_a_frozen_sessions_memory_is_reported_as_a_running_ones():
    """Frozen, it holds its memory: its metrics said none (E2B's: 0 bytes used)."""
    _, session, _ = thawing(asyncio.Event())

    async def usage(session_id: str) -> dict:
        return {"cpu_seconds": 1.5, "memory_bytes": 300 * 2**20, "memory_peak_bytes": None}

    manager = SimpleNamespace(get=lambda session_id, who: session)
    reports = Reports(manager, None, SimpleNamespace(usage=usage), None, None)  # type: ignore[arg-type]
    report = asyncio.run(reports.usage(session.id, None))  # type: ignore[arg-type]
    assert report["state"] == "paused" and report["memory_bytes"] == 300 * 2**20, report


def test_a_session_ended_while_it_freezes_stays_ended():
    """Its end came while the engine froze it: the pause made it paused again, saved so."""

    async def race() -> None:
        gate = asyncio.Event()
        p, session, saved = thawing(gate)
        session.state, session.paused = "idle", None

        async def freeze(sandbox_id: str) -> None:
            await gate.wait()

        p.lifecycle.placement.freeze = freeze
        pausing_task = asyncio.ensure_future(p.pause(session, None))
        await asyncio.sleep(0.01)
        session.state, session.reason = "deleted", "deleted by client"  # SessionManager.end
        gate.set()
        with pytest.raises(SessionEnded):
            await pausing_task
        assert session.state == "deleted" and saved == [] and p.events.told == [], saved

    asyncio.run(race())


def test_a_snapshot_of_a_frozen_session_saves_it_by_the_strategy_it_asks_for():
    """Saved by the best strategy, then refused as not the one asked for (or refused after
    the thaw, the session left running): its live-only state lost for nothing."""

    def chosen(session, requested):
        if requested == "checkpoint":
            raise StrategyUnavailable("checkpoint is not available on this gateway")
        return requested or "namespace"

    async def snapshot(strategy: str) -> list:
        p, session, _ = thawing(asyncio.Event())
        thawed: list[str] = []

        async def thaw(sandbox_id: str) -> None:
            thawed.append(sandbox_id)

        async def paused(session, requested, tell=True):
            thawed.append(f"saved by {requested}")

        async def take(session, name, requested, timeout):
            return {}

        p.lifecycle.placement.thaw, p.paused = thaw, paused  # type: ignore[method-assign]
        p.state = SimpleNamespace(choose=chosen)  # type: ignore[assignment]
        p.snapshots = SimpleNamespace(take=take)  # type: ignore[assignment]
        with contextlib.suppress(StrategyUnavailable):
            await p.snapshot(session, TakeSnapshot(None, strategy))
        return [*thawed, session.state, session.frozen]

    assert asyncio.run(snapshot("replay")) == ["c", "saved by replay", "idle", False]
    assert asyncio.run(snapshot("checkpoint")) == ["paused", True], "refused, it stays frozen"


def test_a_restart_of_a_frozen_session_whose_sandbox_went_restarts_it():
    """Its thaw found the sandbox gone and refused the restart, telling to restart it."""

    async def restart_thaw() -> Session:
        p, session, _ = thawing(asyncio.Event())

        async def gone(sandbox_id: str) -> None:
            raise docker.errors.NotFound("No such container: c")

        async def mark_dead(session, reason: str) -> None:
            session.state, session.reason = "dead", reason

        p.lifecycle.placement.thaw, p.mark_dead = gone, mark_dead
        await p.thaw(session)  # SessionManager.restart, before it starts a kernel
        return session

    session = asyncio.run(restart_thaw())
    assert session.state == "dead" and session.paused is None, session.reason


def test_frozen_sessions_are_saved_a_few_at_a_time_and_one_at_a_time_when_memory_is_short():
    """Saved in the background, a save a culling interval started while the others went on:
    each thaws a sandbox and serializes its namespace, in memory the host is short of."""

    async def cull(available: int, deepens_at: float) -> list:
        saving = asyncio.Event()
        sessions = [frozen(f"s{i}", float(i), deepens_at) for i in range(4)]
        manager = Manager(sessions, 100.0, saving)
        upkeep = Upkeep(manager, None, None, None, None, 1.0, 2**30, lambda: available)  # type: ignore[arg-type]
        for _ in range(3):
            await upkeep.cull()
            await asyncio.sleep(0.01)
        saving.set()
        await asyncio.sleep(0.01)
        return manager.deepened

    assert asyncio.run(cull(2**29, 500.0)) == ["s0"], "memory short: one at a time"
    assert asyncio.run(cull(2**33, 50.0)) == ["s0", "s1"], "time up: a few at a time"


def test_a_pause_naming_a_strategy_saves_a_frozen_session_to_disk():
    """It answered as the freeze had, the memory still held, though a named strategy saves."""

    async def pause_again() -> list:
        p, session, _ = thawing(asyncio.Event())
        saved: list = []

        async def thaw(sandbox_id: str) -> None:
            pass

        async def paused(session, requested, tell=True):
            saved.append(requested)
            session.state, session.paused = "paused", {"strategy": requested}

        p.lifecycle.placement.thaw, p.paused = thaw, paused  # type: ignore[method-assign]
        answer = await p.pause(session, "replay")
        return [*saved, answer["strategy"], await p.pause(session, None) == answer]

    assert asyncio.run(pause_again()) == ["replay", "replay", True]


def test_a_save_of_a_frozen_session_that_fails_unexpectedly_is_logged(caplog):
    """In the background, an unexpected error went to no one (the culler had logged it)."""

    class Failing(Manager):
        async def deepen(self, session) -> None:
            raise RuntimeError("the state directory vanished")

    async def cull() -> None:
        manager = Failing([frozen("s", 1.0, 2.0)], 100.0)
        upkeep = Upkeep(manager, None, None, None, None, 1.0, 0, lambda: None)  # type: ignore[arg-type]
        await upkeep.cull()
        await asyncio.sleep(0.01)
        assert not upkeep._deepening, "a failed save still counts as one in flight"

    asyncio.run(cull())
    said = [r for r in caplog.records if r.name == "gateway.sessions.upkeep" and r.exc_info]
    assert said and "the state directory vanished" in caplog.text, caplog.text


def test_a_restart_does_not_wait_for_a_running_cell_to_thaw_nothing():
    """Restarting a busy session interrupts its cell; the thaw before it took its lock first."""
    p = pausing()
    session = SimpleNamespace(frozen=False, lock=asyncio.Lock())

    async def restart_while_busy() -> None:
        async with session.lock:  # a cell is running
            await asyncio.wait_for(p.thaw(session), 1)  # type: ignore[arg-type]

    asyncio.run(restart_while_busy())
