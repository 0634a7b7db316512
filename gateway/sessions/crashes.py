"""Kernels that come back: checkpoints off the hot path, and a restore when a kernel dies.

A session created with ``survive_crashes`` has its kernel's state
checkpointed by the pause strategies (``KernelState``: the namespace for
Python, replay for the rest). Never during an execute: ``idle_after``
seconds after one ends, if the session is still idle and nothing holds it,
and no sooner than ``every`` seconds after the last checkpoint, the
namespace is saved in the session's state directory, which a resume into a
pooled sandbox carries along (at most ``max_bytes``, checked in the kernel
and again on the host; a larger one is refused and the previous one kept).
A restart drops it. When the kernel dies
(out of memory, a segfault, ``os._exit``), the session gets a fresh kernel
with the last checkpoint and says what was lost: the cells that ran since
it (the one that died among them) and the names the checkpoint could not
save, in the dying cell's reply, the session view (``recovered``) and so
the history. Replay checkpoints save nothing: they mark how far a replay
goes.

Off by default: a checkpoint holds the kernel for as long as its
namespace takes to save (a next execute waits for it) and keeps a copy of
the namespace on disk, and a replay re-runs cells whose side effects may
not bear repeating. A session that wants it asks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from ..errors import GatewayError
from ..limits import format_size
from .lifecycle import SandboxLifecycle
from .model import Session, ended_meanwhile
from .starts import StartQueue
from .state import CHECKPOINT_FILE, KernelState, SavedState

log = logging.getLogger(__name__)

# A kernel that keeps dying (its checkpoint's own code kills it) comes back this
# often in COMEBACK_WINDOW seconds at most, then stays dead until restarted.
COMEBACKS = 3
COMEBACK_WINDOW = 600.0

Save = Callable[[Session], Awaitable[None]]
Spawn = Callable[[Coroutine[Any, Any, Any]], asyncio.Task]


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    idle_after: float = 2.0  # seconds idle after an execute before a checkpoint
    every: float = 30.0  # seconds between two checkpoints at least
    max_bytes: int = 2**30  # a larger namespace is not checkpointed
    timeout: float = 120.0  # seconds a checkpoint may take


class Crashes:
    """Checkpoints sessions that asked to survive crashes, and brings their kernels back."""

    def __init__(
        self,
        lifecycle: SandboxLifecycle,
        state: KernelState,
        starts: StartQueue,
        save: Save,
        spawn: Spawn,
        options: CheckpointOptions,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``save`` stores a session's record; ``spawn`` runs a task shutdown cancels."""
        self.lifecycle = lifecycle
        self.state = state
        self.starts = starts
        self.save = save
        self.spawn = spawn
        self.options = options
        self.clock = clock
        self._due: dict[str, asyncio.TimerHandle] = {}
        self._comebacks: dict[str, list[float]] = {}  # when each session last came back
        self._coming: set[str] = set()  # sessions coming back: their record still says dead

    def coming_back(self, session: Session) -> bool:
        """Whether the session's record must stay as its death left it while it starts.

        A gateway killed mid-comeback then finds it dead, not 'starting' (which
        recovery takes for a create cut short, and ends).
        """
        return session.id in self._coming

    def path(self, session: Session) -> Path:
        """In the state directory: a resume in a pooled sandbox carries it along."""
        return self.state.state_dir(session.id) / CHECKPOINT_FILE

    # -- checkpoints --------------------------------------------------------------------

    def executed(self, session: Session) -> None:
        """An execute ended: checkpoint once the session has been idle a while."""
        if not session.survive_crashes or session.state != "idle":
            return
        last = (session.checkpoint or {}).get("saved_at", 0.0)
        delay = max(self.options.idle_after, last + self.options.every - self.clock())
        self._cancel(session)
        self._due[session.id] = asyncio.get_running_loop().call_later(
            delay, lambda: self.spawn(self._checkpoint_when_idle(session))
        )

    async def _checkpoint_when_idle(self, session: Session) -> None:
        self._due.pop(session.id, None)
        if session.state != "idle" or session.lock.locked():
            return  # the next execute schedules another
        async with session.lock:
            if session.state == "idle":
                await self.checkpoint(session)

    async def checkpoint(self, session: Session) -> None:
        """Checkpoint an idle session's kernel, with its lock held; a failure keeps the last."""
        try:
            strategy = self.state.choose(session, None)
            target = self.path(session)
            fresh = target.with_name(CHECKPOINT_FILE + ".new")
            saved = await self.state.save(
                session, strategy, self.options.timeout, fresh, self.options.max_bytes
            )
            if strategy == "namespace":
                await asyncio.to_thread(os.replace, fresh, target)
        except (GatewayError, OSError) as e:
            why = getattr(e, "message", None) or str(e)
            if "OverflowError" in why:
                why = f"its namespace is larger than {format_size(self.options.max_bytes)}"
            log.info("session %s: no checkpoint taken: %s", session.id, why)
            session.checkpoint = {**(session.checkpoint or {}), "refused": why[:500]}
        else:  # counted as the session counts its executions, not as the kernel numbers cells
            session.checkpoint = {**saved.to_json(), "execution_count": session.executions}
        await self.save(session)

    async def restarted(self, session: Session) -> None:
        """A restart throws the kernel's state away: its checkpoint goes too, never to come back."""
        self._cancel(session)
        session.checkpoint = None
        await asyncio.to_thread(self.path(session).unlink, True)

    def forget(self, session: Session) -> None:
        """The session ended: no checkpoint is due any more (its files go with its directory)."""
        self._cancel(session)
        self._comebacks.pop(session.id, None)

    def _cancel(self, session: Session) -> None:
        due = self._due.pop(session.id, None)
        if due is not None:
            due.cancel()

    # -- coming back --------------------------------------------------------------------

    def what_comes_back(self, session: Session) -> dict[str, Any] | None:
        """What a dying kernel's session gets back, for the reply of the cell that died."""
        checkpoint = session.checkpoint or {}
        if not session.survive_crashes or "strategy" not in checkpoint or self._dying(session):
            return None
        since = checkpoint["execution_count"]
        last = session.executions + (1 if session.running else 0)  # the cell that died, if any
        return {
            "from_execution": since,
            "lost_cells": list(range(since + 1, last + 1)),
            "lost": checkpoint["lost"],
            "strategy": checkpoint["strategy"],
        }

    def _dying(self, session: Session) -> bool:
        """Whether the session came back too often lately to come back again."""
        since = self.clock() - COMEBACK_WINDOW
        recent = [t for t in self._comebacks.get(session.id, ()) if t > since]
        self._comebacks[session.id] = recent
        return len(recent) >= COMEBACKS

    def died(self, session: Session) -> None:
        """The session's kernel died: bring it back, if it asked and a checkpoint is there."""
        if not session.survive_crashes:
            return
        if self.what_comes_back(session) is not None:
            self._cancel(session)
            self.spawn(self._come_back(session))
        elif self._dying(session):
            session.reason = (
                f"{session.reason}; it died {COMEBACKS} times in {COMEBACK_WINDOW / 60:g} "
                "minutes after coming back, so it stays dead: restart it"
            )
            self.spawn(self.save(session))

    async def _come_back(self, session: Session) -> None:
        """Restart the kernel with the last checkpoint once the dying cell's turn is over."""
        async with session.lock:
            coming = self.what_comes_back(session)
            if session.state != "dead" or session.kernel is None or coming is None:
                return  # restarted, deleted or recovered meanwhile
            reason = session.reason
            checkpoint = SavedState.from_json(session.checkpoint or {})
            # The kernel numbers its next cell after the last one recorded.
            saved = dataclasses.replace(checkpoint, execution_count=session.executions + 1)
            start = functools.partial(self.starts.run, session.tenant, session.kernel.restart)
            session.state = "starting"
            self._coming.add(session.id)
            try:
                try:
                    async with ended_meanwhile(session, "brought back"):
                        await self.state.restore(
                            session, saved, start, self.path(session), upto=coming["from_execution"]
                        )
                        await self.lifecycle.connect_packages(session)
                        await self.lifecycle.enter_working_dir(session)
                finally:  # cancelled too (a shutdown): the record stays as the death left it
                    self._coming.discard(session.id)
            except GatewayError as e:
                if session.state == "starting":
                    session.state = "dead"
                    session.reason = f"{reason}; it could not come back: {e.message}"
                    await self.save(session)
                log.warning("session %s did not come back: %s", session.id, e.message)
                return
            self._comebacks.setdefault(session.id, []).append(self.clock())
            session.recovered = {"at": self.clock(), "reason": reason, **coming}
            session.state = "idle"
            session.reason = None
            session.touch()
            await self.save(session)
            log.info("session %s came back from its checkpoint (%s)", session.id, reason)
