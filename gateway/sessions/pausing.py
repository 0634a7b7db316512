"""The paused side of the state machine: idle -> paused -> idle, and snapshots.

A pause has two tiers. First it freezes the sandbox where it is (where the
placement can): no CPU, memory kept, and a resume in milliseconds with every
object, file and connection as it was. After ``freeze_for`` seconds frozen,
when the host runs short of memory, or before a snapshot, it deepens: the
kernel's state is saved (``KernelState``, by strategy) and its sandbox goes;
the workspace stays. A pause that names a strategy goes deep at once. A deep
resume starts a kernel (from the warm pool when one fits) over the workspace
and gives its state back; a failure leaves the session paused with its state
kept. Its stdio tool servers' sandboxes follow its own: frozen and thawed
with it, removed with it on the deep tier (the next tool call starts them
again). Snapshots save the same state and the workspace while the session
carries on. The manager resolves who asks and hands the session over;
nothing here looks sessions up.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import (
    Conflict,
    KernelDied,
    KernelStartFailed,
    NotPaused,
    SessionBusy,
    StrategyUnavailable,
)
from ..sandbox.base import ENGINE_ERRORS
from .events import SessionEvents
from .lifecycle import SandboxLifecycle
from .model import Session, check_usable, ended_meanwhile
from .pool import WarmPool
from .requests import FREEZE, TakeSnapshot
from .snapshots import Snapshots
from .starts import StartQueue
from .state import STATE_DIR, KernelState, SavedState

log = logging.getLogger(__name__)

Save = Callable[[Session], Awaitable[None]]
MarkDead = Callable[[Session, str], Awaitable[None]]


class Pausing:
    """Pauses, resumes and snapshots sessions."""

    def __init__(
        self,
        lifecycle: SandboxLifecycle,
        state: KernelState,
        pool: WarmPool,
        snapshots: Snapshots,
        save: Save,
        start_timeout: float,
        events: SessionEvents,
        starts: StartQueue,
        mark_dead: MarkDead,
        freeze_for: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``save`` stores a session's record (the manager's, which knows who owns it);
        ``events`` hears of each pause and resume; a cold resume takes its turn in ``starts``;
        ``mark_dead`` records a frozen sandbox found gone; ``freeze_for`` is a pause's first
        tier in seconds (0: every pause saves at once)."""
        self.lifecycle = lifecycle
        self.state = state
        self.pool = pool
        self.snapshots = snapshots
        self.save = save
        self.start_timeout = start_timeout
        self.events = events
        self.starts = starts
        self.mark_dead = mark_dead
        self.freeze_for = freeze_for
        self.clock = clock

    async def pause(self, session: Session, strategy: str | None) -> dict[str, Any]:
        """Freeze the sandbox, or save the kernel's state and remove it (a strategy named).

        Refused while a cell runs. Pausing a paused session answers as the pause did;
        a frozen one asked for a strategy that saves is saved to disk first.
        """
        if session.frozen and strategy not in (None, FREEZE):
            async with session.lock:
                if session.frozen:
                    await self._deepened(session, strategy)
        if session.state == "paused" and session.paused is not None:
            return session.paused
        freeze = self._freezes(strategy)
        _check_idle(session, session.lock.locked())
        async with session.lock:
            _check_idle(session)
            saved = await (self._freeze(session) if freeze else self.paused(session, strategy))
        return saved.to_json()

    async def pause_idle(self, session: Session) -> None:
        """Pause a session past its idle timeout (GatewayError: it cannot be paused)."""
        if session.lock.locked():
            return  # an execute just came in
        async with session.lock:
            if session.state == "idle":
                await (self._freeze(session) if self._freezes(None) else self.paused(session, None))

    def _freezes(self, requested: str | None) -> bool:
        """Whether a pause asking for ``requested`` freezes first; 409 for a freeze refused."""
        placement = self.lifecycle.placement
        if requested == FREEZE and not placement.freezes:
            raise StrategyUnavailable(
                f"the {placement.name} placement cannot freeze a sandbox: ask for a strategy "
                "that saves the state to disk, or for none"
            )
        if requested == FREEZE and self.freeze_for <= 0:
            raise StrategyUnavailable(
                "this gateway saves every pause to disk at once (pause_frozen_for is 0): ask "
                "for a strategy that does, or for none"
            )
        return requested in (None, FREEZE) and placement.freezes and self.freeze_for > 0

    async def _freeze(self, session: Session) -> SavedState:
        """The first tier, with the lock held: the sandbox frozen, nothing saved yet.

        An engine that cannot freeze it gets the deep pause instead; one ended
        meanwhile stays ended (SessionEnded), its end's to remove.
        """
        assert session.kernel is not None and session.kernel.container_id is not None
        try:
            async with ended_meanwhile(session, "froze"):
                await self.lifecycle.placement.freeze(session.kernel.container_id)
        except ENGINE_ERRORS as e:
            log.warning("session %s: could not freeze its sandbox, saving it: %s", session.id, e)
            return await self.paused(session, None)
        if session.tools is not None:  # its stdio servers' sandboxes with it
            await session.tools.freeze(self.lifecycle.placement.freeze)
        now = self.clock()
        saved = SavedState(FREEZE, [], session.executions, now, now + self.freeze_for)
        session.state = "paused"
        session.paused = saved.to_json()
        await self.save(session)
        self.events.tell("paused", session)
        _let_clients_go(session)
        log.info("session %s paused (frozen)", session.id)
        return saved

    async def deepen(self, session: Session) -> None:
        """Save a frozen session's state to disk and free its memory; it stays paused.

        Its time frozen is up, or the host runs short of memory. Skipped while
        a request holds the session (it is resuming or ending).
        """
        if session.lock.locked():
            return
        async with session.lock:
            if session.frozen:
                await self._deepened(session)

    async def _deepened(self, session: Session, requested: str | None = None) -> None:
        """Deepen with the lock held, by ``requested`` (a snapshot's strategy: one refused
        leaves it frozen); a kernel that cannot be saved is left running, idle."""
        self.state.choose(session, requested)
        await self._thaw(session)
        session.state = "idle"
        try:
            await self.paused(session, requested, tell=False)
        except Exception:
            if session.state == "idle":
                session.touch()
                await self.save(session)
            raise

    async def _thaw(self, session: Session) -> None:
        """Let a frozen sandbox run again; one found gone leaves the session dead.

        One ended meanwhile stays ended (SessionEnded), its end's to remove.
        """
        assert session.kernel is not None and session.kernel.container_id is not None
        if session.tools is not None:  # its stdio servers' sandboxes, frozen with it
            await session.tools.thaw(self.lifecycle.placement.thaw)
        try:
            async with ended_meanwhile(session, "thawed"):
                await self.lifecycle.placement.thaw(session.kernel.container_id)
                if not session.kernel.connected:  # frozen across a gateway restart
                    await session.kernel.connect()
        except (*ENGINE_ERRORS, KernelStartFailed) as e:
            session.paused = None
            await self.mark_dead(session, f"its frozen sandbox is gone ({e})")
            check_usable(session)
        session.paused = None

    async def thaw(self, session: Session) -> None:
        """Thaw a frozen session for a restart; it is idle again, or dead (its sandbox went:
        the restart starts another all the same). Anything else is left as it is, at
        once: a restart interrupts a running cell, it does not wait for its lock."""
        if not session.frozen:
            return
        async with session.lock:
            if session.frozen:
                with contextlib.suppress(KernelDied):
                    await self._thaw(session)
                    session.state = "idle"

    async def paused(
        self, session: Session, requested: str | None, tell: bool = True
    ) -> SavedState:
        """Pause deep with the session's lock held (``tell``: a pause, not a frozen one deepened).

        The record says paused before the sandbox goes: a gateway killed in
        between finds a paused session and removes the leftover container.
        """
        strategy = self.state.choose(session, requested)
        saved = await self.state.save(session, strategy, self.start_timeout)
        session.state = "paused"
        session.paused = saved.to_json()
        await self.save(session)
        if tell:
            self.events.tell("paused", session)
        _let_clients_go(session)
        assert session.kernel is not None
        try:
            await session.kernel.stop()
        except ENGINE_ERRORS as e:  # the next start's recovery removes what is left
            log.warning("session %s: its paused sandbox is left for later: %s", session.id, e)
        if session.tools is not None:  # the next tool call starts its stdio servers again
            await session.tools.rest()
        log.info("session %s paused (%s)", session.id, strategy)
        return saved

    async def snapshot(self, session: Session, request: TakeSnapshot) -> dict[str, Any]:
        """Save an idle (or paused) session's kernel state and workspace; it carries on."""
        if session.state != "paused":
            _check_idle(session, session.lock.locked())
        async with session.lock:
            if session.state != "paused":
                _check_idle(session)
            if session.frozen:  # a snapshot is kept on disk: so is the pause from now on
                await self._deepened(session, request.strategy)
            return await self.snapshots.take(
                session, request.name, request.strategy, self.start_timeout
            )

    async def wake(self, session: Session) -> None:
        """Resume a session if it is paused (a Jupyter client connecting to its kernel)."""
        if session.state == "paused":
            async with session.lock:
                if session.state == "paused":
                    await self.resumed(session)

    async def resume(self, session: Session) -> dict[str, Any]:
        """Start a fresh kernel over the session's workspace and give it its state back."""
        _check_paused(session)  # at once, not after a running cell's turn
        async with session.lock:
            _check_paused(session)
            return await self.resumed(session)

    async def resumed(self, session: Session) -> dict[str, Any]:
        """Resume with the session's lock held; a failure leaves it paused, its state kept."""
        if session.frozen:
            return await self._thawed(session)
        assert session.paused is not None and session.kernel is not None
        saved = SavedState.from_json(session.paused)
        session.state = "starting"
        try:
            async with ended_meanwhile(session, "resumed"):
                if await self._resume_warm(session, saved):
                    report = await self.state.restore(session, saved, _already_running, loaded=True)
                else:
                    start = functools.partial(self.starts.run, session.tenant, session.kernel.start)
                    report = await self.state.restore(session, saved, start)
                    await self.lifecycle.connect_packages(session)
                await self.lifecycle.enter_working_dir(session)
        except BaseException:
            if session.state == "starting":
                session.state = "paused"
                with contextlib.suppress(Exception):
                    await session.kernel.stop()
            raise
        session.paused = None
        session.state = "idle"
        session.touch()
        await self.save(session)
        self.events.tell("resumed", session)
        await self.state.forget(session)
        log.info("session %s resumed (%s)", session.id, saved.strategy)
        return report

    async def _thawed(self, session: Session) -> dict[str, Any]:
        """Resume a frozen session where it is: nothing was saved, so nothing is lost."""
        await self._thaw(session)
        session.state = "idle"
        session.touch()
        await self.save(session)
        self.events.tell("resumed", session)
        log.info("session %s resumed (thawed)", session.id)
        return {"strategy": FREEZE, "lost": []}

    async def _resume_warm(self, session: Session, saved: SavedState) -> bool:
        """Move a resuming session into a pooled sandbox if one fits; False: start it cold.

        Its namespace loads into the pooled kernel while its files are copied.
        """
        pooled = await self.pool.take_for(session)
        if pooled is None:
            return False
        loading = self.state.load_pooled(session, saved, pooled)
        return await self.lifecycle.move_in(session, pooled, STATE_DIR, loading)


def _let_clients_go(session: Session) -> None:
    """Close a paused session's stream and Jupyter connections: clients reconnect to resume."""
    if session.stream is not None:
        session.stream.close()
        session.stream = None
    for relay in list(session.parked.values()):
        relay.close()


def _check_paused(session: Session) -> None:
    if session.state != "paused":
        raise NotPaused(f"session {session.id} is {session.state}, not paused")


def _check_idle(session: Session, executing: bool = False) -> None:
    """Refuse to save a kernel's state while a cell runs (``executing``: one is queued)."""
    check_usable(session)
    if session.state == "starting":
        raise Conflict(f"session {session.id} is still starting; retry in a moment")
    if executing or session.running or session.state == "busy":
        raise SessionBusy(
            f"session {session.id} is running a cell; its state can be saved once the cell "
            f"finishes: wait for it, or POST /v1/sessions/{session.id}/interrupt"
        )


async def _already_running() -> None:
    """A resume's kernel taken from the pool is up already."""
