"""Kernels that come back, above the engine: when checkpoints are due and what a crash loses."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.errors import BadRequest, StateNotSaved
from gateway.sessions.crashes import CheckpointOptions, Crashes
from gateway.sessions.requests import CreateSession
from gateway.sessions.state import SavedState


class State:
    def __init__(self, fails: str | None = None) -> None:
        self.fails = fails
        self.saved: list[tuple[str, int | None]] = []
        self.dir = Path(".")

    def state_dir(self, session_id):
        return self.dir

    def choose(self, session, requested):
        return "namespace"

    async def save(self, session, strategy, timeout, target, limit):
        if self.fails:
            raise StateNotSaved(self.fails)
        await asyncio.to_thread(Path(target).write_bytes, b"state")
        self.saved.append((strategy, limit))
        return SavedState(strategy, [{"name": "gen", "type": "generator", "reason": "no"}], 3, 50.0)


def crashes(tmp_path: Path, state: State, now: float = 100.0) -> tuple[Crashes, list]:
    saved: list = []
    placement = SimpleNamespace(session_dir=lambda sid: tmp_path)
    state.dir = tmp_path

    async def save(session) -> None:
        saved.append(dict(session.checkpoint or {}))

    lifecycle = SimpleNamespace(placement=placement)
    options = CheckpointOptions(idle_after=0.01, every=30.0, max_bytes=1000)
    c = Crashes(lifecycle, state, None, save, asyncio.ensure_future, options, lambda: now)  # type: ignore[arg-type]
    return c, saved


def session(**kw) -> SimpleNamespace:
    fields = dict(id="s", survive_crashes=True, state="idle", checkpoint=None, executions=5,
                  lock=asyncio.Lock(), tenant="t", reason=None, running=set())  # fmt: skip
    return SimpleNamespace(**{**fields, **kw})


def test_survive_crashes_is_asked_for_at_create_and_off_by_default():
    assert CreateSession.from_json({}).survive_crashes is False
    assert CreateSession.from_json({"survive_crashes": True}).survive_crashes is True
    with pytest.raises(BadRequest, match="survive_crashes must be true or false"):
        CreateSession.from_json({"survive_crashes": "yes"})


def test_a_checkpoint_is_taken_once_the_session_is_idle_and_kept_in_place(tmp_path):
    state = State()
    c, saved = crashes(tmp_path, state)
    s = session()

    async def scenario() -> None:
        c.executed(s)
        c.executed(session(id="other", survive_crashes=False))
        await asyncio.sleep(0.1)

    asyncio.run(scenario())
    assert state.saved == [("namespace", 1000)], "one checkpoint, bounded by max_bytes"
    assert (tmp_path / "checkpoint").read_bytes() == b"state"
    assert not (tmp_path / "checkpoint.new").exists()
    assert s.checkpoint["execution_count"] == 5, "the session's count, not the kernel's"
    assert saved[-1] == s.checkpoint


def test_the_next_checkpoint_waits_its_interval_and_a_busy_session_gets_none(tmp_path):
    state = State()
    c, _ = crashes(tmp_path, state, now=100.0)
    recent = session(checkpoint={"saved_at": 90.0})  # due at 120: 20 s away
    busy = session(id="busy", state="busy")

    async def scenario() -> list:
        c.executed(recent)
        c.executed(busy)
        await asyncio.sleep(0.1)
        return [c._due[recent.id].when() - asyncio.get_running_loop().time(), busy.id in c._due]

    delay, busy_scheduled = asyncio.run(scenario())
    assert 19 < delay <= 20 and not busy_scheduled and state.saved == []


def test_a_refused_checkpoint_keeps_the_last_one_and_says_why(tmp_path):
    c, _ = crashes(tmp_path, State(fails="the kernel could not save its namespace (OverflowError)"))
    last = {"strategy": "namespace", "lost": [], "execution_count": 2, "saved_at": 10.0}
    s = session(checkpoint=dict(last))
    asyncio.run(c.checkpoint(s))  # type: ignore[arg-type]
    assert s.checkpoint == {**last, "refused": "its namespace is larger than 1000 B"}, s.checkpoint


def test_a_crash_loses_the_cells_since_the_checkpoint_and_the_names_it_could_not_save():
    c, _ = crashes(Path("."), State())
    checkpoint = {"strategy": "namespace", "lost": [{"name": "gen"}], "execution_count": 2,
                  "saved_at": 10.0}  # fmt: skip
    assert c.what_comes_back(session(checkpoint=checkpoint, executions=5)) == {
        "from_execution": 2,
        "lost_cells": [3, 4, 5],
        "lost": [{"name": "gen"}],
        "strategy": "namespace",
    }
    running = session(checkpoint=checkpoint, executions=5, running={"the cell that dies"})
    assert c.what_comes_back(running)["lost_cells"] == [3, 4, 5, 6]
    assert c.what_comes_back(session(checkpoint=None)) is None, "no checkpoint: nothing comes back"
    assert c.what_comes_back(session(checkpoint=checkpoint, survive_crashes=False)) is None
    assert c.what_comes_back(session(checkpoint={"refused": "too big"})) is None


def test_a_kernel_that_keeps_dying_after_coming_back_stays_dead_with_the_reason():
    c, saved = crashes(Path("."), State(), now=1000.0)
    checkpoint = {"strategy": "namespace", "lost": [], "execution_count": 2, "saved_at": 10.0}
    s = session(checkpoint=checkpoint, state="dead", reason="out of memory")
    c._comebacks[s.id] = [300.0, 700.0, 900.0]  # the first is older than the window

    async def die() -> None:
        c.died(s)  # type: ignore[arg-type]
        await asyncio.sleep(0)

    assert c.what_comes_back(s) is not None, "two comebacks in ten minutes: it comes back"
    c._comebacks[s.id].append(950.0)
    assert c.what_comes_back(s) is None
    asyncio.run(die())
    assert s.reason.startswith("out of memory; it died 3 times in 10 minutes"), s.reason
    assert "restart it" in s.reason and saved, "the reason is recorded"
