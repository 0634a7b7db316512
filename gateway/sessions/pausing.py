"""The paused side of the state machine: idle -> paused -> idle, and snapshots.

A pause saves the kernel's state (``KernelState``, by strategy) and removes
its sandbox; the workspace stays. A resume starts a kernel (from the warm
pool when one fits) over the workspace and gives its state back; a failure
leaves the session paused with its state kept. Snapshots save the same
state and the workspace while the session carries on. The manager resolves
who asks and hands the session over; nothing here looks sessions up.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import Conflict, NotPaused, SessionBusy
from ..sandbox.base import ENGINE_ERRORS
from .events import SessionEvents
from .lifecycle import SandboxLifecycle
from .model import Session, check_usable, ended_meanwhile
from .pool import WarmPool
from .requests import TakeSnapshot
from .snapshots import Snapshots
from .starts import StartQueue
from .state import STATE_DIR, KernelState, SavedState

log = logging.getLogger(__name__)

Save = Callable[[Session], Awaitable[None]]


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
    ) -> None:
        """``save`` stores a session's record (the manager's, which knows who owns it);
        ``events`` hears of each pause and resume; a cold resume takes its turn in ``starts``."""
        self.lifecycle = lifecycle
        self.state = state
        self.pool = pool
        self.snapshots = snapshots
        self.save = save
        self.start_timeout = start_timeout
        self.events = events
        self.starts = starts

    async def pause(self, session: Session, strategy: str | None) -> dict[str, Any]:
        """Save the kernel's state and remove its sandbox; the workspace stays on disk.

        Refused while a cell runs. Pausing a paused session answers as the pause did.
        """
        if session.state == "paused" and session.paused is not None:
            return session.paused
        _check_idle(session, session.lock.locked())
        async with session.lock:
            _check_idle(session)
            saved = await self.paused(session, strategy)
        return saved.to_json()

    async def pause_idle(self, session: Session) -> None:
        """Pause a session past its idle timeout (GatewayError: it cannot be paused)."""
        if session.lock.locked():
            return  # an execute just came in
        async with session.lock:
            if session.state == "idle":
                await self.paused(session, None)

    async def paused(self, session: Session, requested: str | None) -> SavedState:
        """Pause with the session's lock held.

        The record says paused before the sandbox goes: a gateway killed in
        between finds a paused session and removes the leftover container.
        """
        strategy = self.state.choose(session, requested)
        saved = await self.state.save(session, strategy, self.start_timeout)
        session.state = "paused"
        session.paused = saved.to_json()
        await self.save(session)
        self.events.tell("paused", session)
        if session.stream is not None:
            session.stream.close()
            session.stream = None
        for relay in list(session.parked.values()):
            relay.close()
        assert session.kernel is not None
        try:
            await session.kernel.stop()
        except ENGINE_ERRORS as e:  # the next start's recovery removes what is left
            log.warning("session %s: its paused sandbox is left for later: %s", session.id, e)
        log.info("session %s paused (%s)", session.id, strategy)
        return saved

    async def snapshot(self, session: Session, request: TakeSnapshot) -> dict[str, Any]:
        """Save an idle (or paused) session's kernel state and workspace; it carries on."""
        if session.state != "paused":
            _check_idle(session, session.lock.locked())
        async with session.lock:
            if session.state != "paused":
                _check_idle(session)
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

    async def _resume_warm(self, session: Session, saved: SavedState) -> bool:
        """Move a resuming session into a pooled sandbox if one fits; False: start it cold.

        Its namespace loads into the pooled kernel while its files are copied.
        """
        pooled = await self.pool.take_for(session)
        if pooled is None:
            return False
        loading = self.state.load_pooled(session, saved, pooled)
        return await self.lifecycle.move_in(session, pooled, STATE_DIR, loading)


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
