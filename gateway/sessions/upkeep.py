"""What keeps the registry true while nobody asks: deaths the engine reports (or that
went unreported while it was away), TTL and idle culling, and, when gateways
share a store, taking back sessions whose owner is gone.

Each ends in one of the manager's transitions (``end``, ``mark_dead``,
``pause_idle``): the rules for a session's state stay in ``manager.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ..sandbox.base import ENGINE_ERRORS
from ..store.base import Store
from ..tasks import end_task
from .leases import Leases
from .lifecycle import SandboxLifecycle
from .manager import SessionManager
from .model import Session
from .pool import WarmPool
from .recovery import take_back

log = logging.getLogger(__name__)

_NOT_RUNNING = ("starting", "deleted", "paused")  # a sandbox's death is no news then
# Frozen sessions saved at once: each thaws its sandbox and serializes its namespace.
DEEPENS_AT_ONCE = 2


class Upkeep:
    """Watches sandboxes die, culls, and takes sessions back, in the background."""

    def __init__(
        self,
        sessions: SessionManager,
        lifecycle: SandboxLifecycle,
        pool: WarmPool,
        leases: Leases,
        store: Store,
        cull_interval: float,
        memory_floor: int = 0,
        available_memory: Callable[[], int | None] | None = None,
    ) -> None:
        """Below ``memory_floor`` bytes of ``available_memory`` (the host's), frozen
        sessions are saved to disk, the longest frozen first, one at a time."""
        self.sessions = sessions
        self.lifecycle = lifecycle
        self.pool = pool
        self.leases = leases
        self.store = store
        self.cull_interval = cull_interval
        self.memory_floor = memory_floor
        self.available_memory = available_memory or host_available_memory
        self._tasks: list[asyncio.Task] = []
        self._deepening: set[str] = set()  # frozen sessions being saved

    def start(self) -> None:
        """Cull, and take sessions back when the store is shared (after the manager started)."""
        self._tasks.append(asyncio.create_task(self._cull_forever(), name="sbx-culler"))
        if self.leases.shared:
            self._tasks.append(asyncio.create_task(self._take_back_forever(), name="sbx-take-back"))

    async def stop(self) -> None:
        await asyncio.gather(*(end_task(task) for task in self._tasks))
        self._tasks.clear()

    # -- deaths -------------------------------------------------------------------------

    def on_death(self, session_id: str, container_id: str, exit_code: int) -> None:
        """Called on the loop by the placement's watcher when one of our containers stops."""
        live = self.sessions.sessions
        session = live.get(session_id)
        if session is None and self.pool.forget(session_id):
            return  # a pooled kernel died; the pool replaces it
        if session is None:  # a resume took it from the pool: it keeps the pooled label
            session = next(
                (s for s in live.values() if s.kernel and s.kernel.container_id == container_id),
                None,
            )
        if session is None or session.kernel is None or session.state in _NOT_RUNNING:
            return  # expected: a delete, a restart or a pause stopped it
        if session.kernel.restarting or session.kernel.container_id != container_id:
            return
        self.sessions.spawn(self._mark_dead(session, container_id, exit_code))

    def resync(self) -> None:
        """Called on the loop by the watcher when deaths may have gone unreported."""
        self.sessions.spawn(self._reconcile())

    async def _mark_dead(self, session: Session, container_id: str, exit_code: int) -> None:
        placement = self.lifecycle.placement
        reason = await placement.death_reason(session.limits, container_id, exit_code)
        kernel = session.kernel
        if session.state == "deleted" or kernel is None or kernel.container_id != container_id:
            return  # ended or restarted meanwhile
        await self.sessions.mark_dead(session, reason)

    async def _reconcile(self) -> None:
        """Mark dead every session whose sandbox stopped or vanished while nobody watched."""
        placement = self.lifecycle.placement
        live = self.sessions.sessions
        try:
            sandboxes = await placement.sandboxes(self.lifecycle.gateway_id, list(live))
            found = {s.id: s for s in sandboxes}
            for sandbox in found.values():
                if not sandbox.running:
                    self.pool.forget(sandbox.session_id)  # a pooled one is replaced
            for session in list(live.values()):
                kernel = session.kernel
                if kernel is None or session.state not in ("idle", "busy") or kernel.restarting:
                    continue  # starting, restarting or ended: their own path decides
                container_id = kernel.container_id
                sandbox = found.get(container_id or "")
                if sandbox is not None and sandbox.running:
                    continue
                reason = (
                    await placement.stopped_reason(session.limits, sandbox.id)
                    if sandbox is not None
                    else "its container was removed"
                )
                if session.state in ("idle", "busy") and kernel.container_id == container_id:
                    await self.sessions.mark_dead(
                        session, f"{reason} (while the engine was unreachable)"
                    )
        except ENGINE_ERRORS as e:  # down again: the watcher asks once more when it is back
            log.warning("could not check the sessions' containers: %s", e)

    # -- culling and taking back -----------------------------------------------------------

    async def _cull_forever(self) -> None:
        while True:
            await asyncio.sleep(self.cull_interval)
            try:
                await self.cull()
            except Exception:
                log.exception("culling failed; will retry")

    async def cull(self) -> None:
        """End sessions past their TTL (paused too), pause or end idle ones, deepen frozen ones."""
        now = self.sessions.clock()
        self._deepen(now)
        for session in list(self.sessions.sessions.values()):
            expired = session.expiry(now)
            if expired is not None:
                await self.sessions.end(session, expired)
            elif (
                session.state in ("idle", "dead")
                and session.connections == 0
                and now >= session.idle_deadline
            ):
                if session.state == "idle" and session.idle_action == "pause":
                    await self.sessions.pause_idle(session)
                else:
                    await self.sessions.end(session, f"idle for {session.idle_timeout:g} s")

    def _deepen(self, now: float) -> None:
        """Save the frozen sessions whose time is up, or the longest frozen if memory is short.

        In the background, ``DEEPENS_AT_ONCE`` at most (one when memory is short):
        a save may take the kernel's start timeout, and culling goes on meanwhile.
        One being saved or resumed is left alone; one past its ttl is ended, not saved.
        """
        frozen = sorted(
            (
                s
                for s in self.sessions.sessions.values()
                if s.frozen and not s.lock.locked() and s.expiry(now) is None
            ),
            key=lambda s: s.paused["saved_at"] if s.paused else 0.0,
        )
        due = [s for s in frozen if s.paused and now >= s.paused["deepens_at"]]
        if frozen and not due and not self._deepening:
            available = self.available_memory()
            if available is not None and available < self.memory_floor:
                log.info("%d bytes of memory available: saving a frozen session", available)
                due = frozen[:1]
        for session in due[: max(0, DEEPENS_AT_ONCE - len(self._deepening))]:
            self._deepening.add(session.id)
            self.sessions.spawn(self._deepened(session))

    async def _deepened(self, session: Session) -> None:
        try:
            await self.sessions.deepen(session)
        except Exception:  # in the background: nobody else hears of it
            log.exception("session %s: saving its frozen state failed", session.id)
        finally:
            self._deepening.discard(session.id)

    async def _take_back_forever(self) -> None:
        """Take back sessions let go of while the database was silent, and adopt dead gateways'.

        As often as leases are renewed: a dead gateway's sessions answer again
        within about a lease and a third of it.
        """
        while True:
            await asyncio.sleep(self.leases.ttl / 3)
            try:
                await take_back(self.sessions, self.store, self.lifecycle, self.leases)
            except Exception as e:  # the database is still away: next time
                log.debug("taking sessions back failed: %s", e)


def host_available_memory() -> int | None:
    """The host's available memory (``MemAvailable``); None where /proc does not say."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None
