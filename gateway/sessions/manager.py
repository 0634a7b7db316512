"""Sessions: the registry, their state machine, and TTL / idle culling.

A session owns one kernel in one container. States::

    starting -> idle <-> busy
        \\         \\       /
         +-------> dead (reason) --restart--> starting
    any state --delete / ttl / idle timeout--> deleted (reason)

``SessionManager`` is what the HTTP handlers call. It is handed its
collaborators: the ``SandboxLifecycle`` (how sandboxes are made, adopted and
removed), the ``Store``, the ``WarmPool``, a clock and the settings. The
composition root (``gateway.app``) builds them; a unit test can build them
with a fake placement.

Over 500 lines on purpose: the state machine above and every command
that moves a session through it stay in one place, so each transition can
be read next to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from ..access.auth import Principal, Quota
from ..config import Settings
from ..errors import (
    BadRequest,
    ConfigError,
    Conflict,
    GatewayError,
    KernelDied,
    PayloadTooLarge,
    QuotaExceeded,
    SessionEnded,
    SessionNotFound,
    TooManySessions,
)
from ..execution.kernel import ExecutionResult
from ..execution.outputs import OutputCap, OutputListener
from ..execution.recorder import ExecutionRecorder
from ..limits import format_size
from ..sandbox.base import ENGINE_ERRORS
from ..sandbox.files import AsyncWorkspace
from ..sandbox.images import ImageBuilder
from ..sandbox.isolation.manager import IsolationManager
from ..sandbox.kernelspecs import KernelSpecs
from ..store.sqlite import HISTORY_PAGE, HISTORY_PAGE_MAX, HistoryPage, Store
from ..validation import seconds
from .commands import Command, Commands
from .lifecycle import SandboxLifecycle
from .model import Session
from .pool import WarmPool
from .recovery import recover
from .requests import CreateSession, ExecuteCode, StartCommand, UpdateSession
from .tasks import TaskSet

log = logging.getLogger(__name__)

LIVE_STATES = ("starting", "idle", "busy", "dead")
# Unix socket paths are capped at 107 bytes; the run dir must leave room.
_MAX_SOCKET_PATH = 100


class SessionManager:
    """Creates, finds, runs code in, and ends sessions."""

    def __init__(
        self,
        settings: Settings,
        lifecycle: SandboxLifecycle,
        store: Store,
        pool: WarmPool,
        quota: Callable[[str], Quota],
        sessions: dict[str, Session],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``sessions`` starts empty; the pool is handed the same dict to count them."""
        self.settings = settings
        self.lifecycle = lifecycle
        self.store = store
        self.pool = pool
        self.quota = quota  # a tenant's quota, by tenant name
        self.clock = clock
        self.sessions = sessions
        self.tasks = TaskSet()
        self.commands = Commands(lifecycle.placement, self.tasks)
        self.counts: Counter[str] = Counter()  # executions by status, for /metrics
        self._culler: asyncio.Task | None = None
        self._saving: set[str] = set()  # sessions whose record is due to be saved

    @property
    def kernelspecs(self) -> KernelSpecs:
        return self.lifecycle.kernelspecs

    @property
    def images(self) -> ImageBuilder:
        return self.lifecycle.images

    @property
    def isolation(self) -> IsolationManager:
        return self.lifecycle.isolation

    # -- lifecycle of the manager itself -------------------------------------------------

    async def start(self) -> None:
        """Take over what a previous run left (reattach or reap), then watch and cull."""
        placement = self.lifecycle.placement
        socket_path = placement.sessions_dir / str(uuid.uuid4()) / "run" / "k-10"
        if len(str(socket_path)) > _MAX_SOCKET_PATH:
            raise ConfigError(
                f"data_dir {self.settings.data_dir} is too long for kernel sockets; "
                "choose a shorter path"
            )
        for name in self.pool.sizes:
            self.kernelspecs.get(name)  # a pool of an unknown kernel fails at start
        self.lifecycle.gateway_id = await self.store.gateway_id()
        # Watch before recovering, so a container dying meanwhile is not missed.
        await placement.start(self.lifecycle.gateway_id, self._on_container_death, self._resync)
        await recover(self, self.store, self.lifecycle)
        self._culler = asyncio.create_task(self._cull_forever(), name="sbx-culler")
        self.pool.start()

    async def stop(self, end_sessions: bool = False, drain_timeout: float = 0.0) -> None:
        """Stop managing sessions: end them all, or leave them running for the next start.

        Kept sessions first get ``drain_timeout`` seconds to finish running
        cells; a cell still running then is interrupted and recorded as cut
        by the restart, with its outputs so far.
        """
        if self._culler is not None:
            self._culler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._culler
        await self.pool.stop()
        sessions = list(self.sessions.values())
        if end_sessions:
            await asyncio.gather(
                *(self.end(s, "gateway stopped") for s in sessions), return_exceptions=True
            )
        else:
            await self._drain(drain_timeout)
            await asyncio.gather(*(self._detach(s) for s in sessions), return_exceptions=True)
        # Let them clean up after themselves (a pooled kernel half started, say).
        await self.tasks.cancel(timeout=30)
        await self.lifecycle.placement.stop()
        await self.lifecycle.isolation.stop()

    async def _drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(s.running for s in self.sessions.values()):  # noqa: ASYNC110 (many sessions, no one event)
            await asyncio.sleep(0.1)

    async def _detach(self, session: Session) -> None:
        """Leave a session's kernel running and its store record ready for reattaching."""
        kernel = session.kernel
        if kernel is None:
            return
        if session.running:
            with contextlib.suppress(Exception):
                await kernel.interrupt()
        for relay in list(session.parked.values()):
            relay.close()
        self.commands.end(session.id)
        kernel.detach()
        await self.save(session)

    # -- queries ------------------------------------------------------------------------

    def get(self, session_id: str, who: Principal) -> Session:
        """A live session ``who`` may use; someone else's answers as a missing one does."""
        session = self.sessions.get(session_id)
        if session is None or not who.owns(session.tenant):
            raise SessionNotFound(session_id)
        return session

    async def record(self, session_id: str, who: Principal) -> dict[str, Any]:
        """Everything known about a session, live or ended (then from the store)."""
        session = self.sessions.get(session_id)
        doc = session.record() if session is not None else await self.store.get_session(session_id)
        if doc is None or not who.owns(doc.get("tenant", "default")):
            raise SessionNotFound(session_id)
        return doc

    async def describe(self, session_id: str, who: Principal) -> dict[str, Any]:
        """The API view of a session, live or ended."""
        doc = await self.record(session_id, who)
        doc.pop("packages", None)
        return doc

    def list(
        self,
        who: Principal,
        state: str | None = None,
        metadata: dict[str, str] | None = None,
        tenant: str | None = None,
    ) -> list[Session]:
        """Live sessions ``who`` may see, filtered; an admin sees every tenant's."""
        if state is not None and state not in LIVE_STATES:
            raise BadRequest(f"state must be one of {', '.join(LIVE_STATES)}, not {state!r}")
        found = []
        for session in self.sessions.values():
            if not who.owns(session.tenant) or (tenant and session.tenant != tenant):
                continue
            if state is not None and session.state != state:
                continue
            if metadata and any(str(session.metadata.get(k)) != v for k, v in metadata.items()):
                continue
            found.append(session)
        return sorted(found, key=lambda s: s.created_at)

    def owner_of(self, session_id: str | None) -> Principal | None:
        """The tenant a live session belongs to, as a principal acting for it."""
        session = self.sessions.get(session_id or "")
        return session.owner if session else None

    async def image_available(self, ref: str) -> bool:
        return await asyncio.to_thread(self.lifecycle.images.exists, ref)

    async def history(
        self, session_id: str, who: Principal, after: int = 0, limit: int = HISTORY_PAGE
    ) -> HistoryPage:
        """A page of a session's executions after the cursor ``after`` (an execution id)."""
        if not 1 <= limit <= HISTORY_PAGE_MAX:
            raise BadRequest(f"limit must be between 1 and {HISTORY_PAGE_MAX}")
        if after < 0:
            raise BadRequest("after must be an execution id from a page's 'next', or 0")
        await self.record(session_id, who)  # 404 for unknown ids and others' sessions
        return await self.store.history(session_id, after, limit)

    # -- commands -----------------------------------------------------------------------

    async def create(self, request: CreateSession, who: Principal) -> Session:
        """Check a create request against the server and start its kernel; idle on return."""
        session = self.lifecycle.new_session(request, who.tenant)
        if request.session_id is not None and await self.store.get_session(session.id):
            raise Conflict(f"session id {session.id} was used before; ids are never reused")
        self._reserve(session)
        requested_id = session.id
        try:
            warm = await self.pool.claim(session, request)
        finally:
            del self.sessions[requested_id]
            self.sessions[session.id] = session  # a claim gives it the pooled sandbox's id
        if not warm:
            await self.pool.make_room()
            await self.save(session)
            try:
                async with self._ended_meanwhile(session, "started"):
                    await self.lifecycle.launch(session)
            except BaseException as e:
                await self.end(session, f"kernel failed to start: {e}")  # unless it has ended
                raise
        session.state = "idle"
        await self.save(session)
        log.info(
            "session %s started (%s, %s)", session.id, session.image, "warm" if warm else "cold"
        )
        return session

    @staticmethod
    @contextlib.asynccontextmanager
    async def _ended_meanwhile(session: Session, doing: str) -> AsyncIterator[None]:
        """Turn a (re)start cut short by the session's end (its ttl, a delete) into a 409."""

        def ended() -> SessionEnded:
            return SessionEnded(f"session {session.id} ended while it {doing}: {session.reason}")

        try:
            yield
        except BaseException as e:
            # Ending it cancels its kernel client's waits; this task itself goes on.
            task = asyncio.current_task()
            if session.state == "deleted" and not (task and task.cancelling()):
                raise ended() from e
            raise
        if session.state == "deleted":
            raise ended()

    def _reserve(self, new: Session) -> None:
        """Check the limits and register the session in one step, with no await inside.

        Registered at once, so simultaneous creates count each other against
        the server's limit and the tenant's quota, and a client-chosen id is
        taken by exactly one of them.
        """
        if new.id in self.sessions:
            raise Conflict(f"session id {new.id} is in use; ids are never reused")
        if len(self.sessions) >= self.settings.max_sessions:
            raise TooManySessions(
                f"the gateway runs its maximum of {self.settings.max_sessions} sessions; "
                "delete one you no longer need or try again later"
            )
        self._check_quota(new)
        self.sessions[new.id] = new

    def _check_quota(self, new: Session) -> None:
        quota = self.quota(new.tenant)
        held = [s for s in self.sessions.values() if s.tenant == new.tenant]
        if len(held) >= quota.max_sessions:
            raise QuotaExceeded(
                f"tenant {new.tenant!r} holds {len(held)} live sessions, its quota of "
                f"{quota.max_sessions}; delete one it no longer needs"
            )
        for what, limit, advice in (
            ("memory", quota.max_memory, "ask for less memory"),
            ("disk", quota.max_disk, "ask for a smaller workspace (limits.disk)"),
        ):
            used = sum(getattr(s.limits, what) for s in held)
            wanted = getattr(new.limits, what)
            if used + wanted > limit:
                raise QuotaExceeded(
                    f"tenant {new.tenant!r} would use {format_size(used + wanted)} of {what}, "
                    f"over its quota of {format_size(limit)} ({format_size(used)} in use); "
                    f"{advice} or delete a session"
                )

    async def execute(
        self,
        session_id: str,
        who: Principal,
        request: ExecuteCode,
        on_output: OutputListener | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> ExecutionResult:
        """Run code in the session's kernel, one execution at a time per session.

        The request's ``description`` is the caller's markdown narrative for this
        step; it is recorded and becomes a markdown cell in the notebook export.
        ``on_start`` is called when this execution's turn comes (others may be
        queued ahead). ``on_output`` hears of each output once it is stored.
        """
        session = self.get(session_id, who)
        code = request.code
        if len(code.encode(errors="surrogatepass")) > self.settings.max_code_size:
            raise PayloadTooLarge(
                f"the code is larger than the limit of {format_size(self.settings.max_code_size)}"
                "; put large data in a file (PUT /v1/sessions/{id}/files/...) and read it"
            )
        limit = seconds(
            request.timeout, "timeout", session.limits.timeout, self.settings.max_timeout
        )
        if request.env and session.language_info.get("name") != "python":
            raise BadRequest("environment variables for one run are offered for Python kernels")
        async with session.lock:
            self._check_usable(session)
            session.state = "busy"
            session.touch()
            assert session.kernel is not None and session.workspace is not None
            recorder = self.begin_execution(session, code, request.description)
            await session.workspace.baseline()
            async with session.kernel.environment(request.env):
                result = await session.kernel.execute(
                    code,
                    timeout=limit,
                    cap=self.output_cap(session),
                    grace=self.settings.interrupt_grace,
                    on_output=recorder.listener(on_output),
                    on_start=on_start,
                )
            if result.status == "dead":
                advice = "; restart the session to continue" if session.state == "dead" else ""
                result.error = {
                    "ename": "KernelDied",
                    "evalue": f"{session.reason}{advice}",
                    "traceback": [],
                }
            elif session.state == "busy":
                session.state = "idle"
            result.artifacts, result.artifacts_truncated = await session.workspace.changes()
            await self.finish_execution(session, recorder, result)
        return result

    def output_cap(self, session: Session) -> OutputCap:
        """The execution's own cap, or what is left of the session's, whichever is less."""
        total = self.settings.session_output_bytes
        left = max(0, total - session.output_bytes)
        if left >= session.limits.output_bytes:
            return OutputCap(session.limits.output_bytes)
        return OutputCap(
            left,
            f"this session's output limit of {format_size(total)}, all its executions "
            "together (start a new session, or write large results to files)",
        )

    def begin_execution(
        self, session: Session, code: str, description: str | None = None
    ) -> ExecutionRecorder:
        """Record an execution as running, however it is run (v1 API or Jupyter client)."""
        recorder = ExecutionRecorder(self.store, session.id, code, description)
        session.running.add(recorder)
        return recorder

    async def finish_execution(
        self, session: Session, recorder: ExecutionRecorder, result: ExecutionResult
    ) -> None:
        """Store an execution's outcome in place of its running record.

        The caller answers only once the outcome is on disk; the session's
        own record (its counters) follows within a second.
        """
        self.counts[result.status] += 1
        session.running.discard(recorder)
        session.touch()
        session.executions += 1
        session.output_bytes += result.output_bytes
        finished = recorder.finish(result)
        self.save_soon(session)
        await finished

    def save_soon(self, session: Session) -> None:
        """Save the session's record within a second.

        What changes on every execute (last activity, the execution count) is
        worth one write a second, not one per execute; state changes are
        saved at once (``save``), and a stop or an end saves everything.
        """
        if session.id in self._saving:
            return
        self._saving.add(session.id)

        def flush() -> None:
            self._saving.discard(session.id)
            if session.state != "deleted":
                self.tasks.spawn(self.save(session))

        asyncio.get_running_loop().call_later(1.0, flush)

    def _check_usable(self, session: Session) -> None:
        if session.state == "dead":
            raise KernelDied(
                f"the session's kernel died ({session.reason}); "
                f"POST /v1/sessions/{session.id}/restart to get a fresh kernel"
            )
        if session.state == "deleted":
            raise SessionEnded(f"session {session.id} has ended ({session.reason})")

    async def interrupt(self, session_id: str, who: Principal) -> Session:
        session = self.get(session_id, who)
        self._check_usable(session)
        assert session.kernel is not None
        await session.kernel.interrupt()
        session.touch()
        return session

    async def restart(self, session_id: str, who: Principal) -> Session:
        """Give the session a fresh kernel; works on a dead session too."""
        session = self.get(session_id, who)
        if session.state == "deleted":
            raise SessionEnded(f"session {session.id} has ended ({session.reason})")
        assert session.kernel is not None
        session.state = "starting"
        session.reason = None
        try:
            async with self._ended_meanwhile(session, "restarted"):
                await session.kernel.restart()
        except GatewayError as e:
            if session.state == "starting":  # not ended meanwhile: say why, allow another try
                await self.mark_dead(session, f"restart failed: {e.message}")
            raise
        session.state = "idle"
        session.touch()
        await self.save(session)
        return session

    async def update(self, session_id: str, who: Principal, request: UpdateSession) -> Session:
        """Change ttl / idle_timeout (seconds, from creation / last activity)."""
        session = self.get(session_id, who)
        s = self.settings
        session.ttl = seconds(request.ttl, "ttl", session.ttl, s.max_ttl)
        session.idle_timeout = seconds(
            request.idle_timeout, "idle_timeout", session.idle_timeout, s.max_idle_timeout
        )
        session.touch()
        await self.save(session)
        return session

    def files(self, session_id: str, who: Principal) -> AsyncWorkspace:
        """The session's files; usable while its kernel is busy or dead."""
        session = self.get(session_id, who)
        if session.workspace is None:
            raise Conflict(f"session {session_id} is still starting; retry in a moment")
        return session.workspace

    async def start_command(
        self, session_id: str, who: Principal, request: StartCommand
    ) -> Command:
        """Start a command in the session's sandbox, beside its kernel (busy or not)."""
        session = self.get(session_id, who)
        self._check_usable(session)
        if session.kernel is None or session.kernel.container_id is None:
            raise Conflict(f"session {session_id} is still starting; retry in a moment")
        session.touch()
        return await self.commands.start(session.id, session.kernel.container_id, request)

    def command(self, session_id: str, who: Principal, pid: int) -> Command:
        """A running command of the session, by its pid in the sandbox."""
        self.get(session_id, who)
        return self.commands.get(session_id, pid)

    async def run_command(
        self, session_id: str, who: Principal, request: StartCommand
    ) -> dict[str, Any]:
        """Run a command to its end; its output is capped as an execution's is."""
        session = self.get(session_id, who)
        limit = seconds(
            request.timeout, "timeout", session.limits.timeout, self.settings.max_timeout
        )
        command = await self.start_command(session_id, who, request)
        return await self.commands.run(command, limit, session.limits.output_bytes)

    async def delete(self, session_id: str, who: Principal) -> None:
        await self.end(self.get(session_id, who), "deleted by client")

    # -- endings ------------------------------------------------------------------------

    async def end(self, session: Session, reason: str) -> None:
        """Stop the kernel, free the sandbox, and record why the session ended."""
        if session.state == "deleted":
            return
        session.state = "deleted"
        session.reason = reason
        session.ended_at = self.clock()
        self.sessions.pop(session.id, None)
        if session.stream is not None:
            session.stream.close()
        for relay in list(session.parked.values()):
            relay.close()
        if session.kernel is not None:
            session.kernel.died.set()  # lets an in-flight execute return instead of hanging
            # Give that execute a moment to finish and record itself.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    async with session.lock:
                        pass
        await self.lifecycle.teardown(session)
        await self.save(session)
        log.info("session %s ended: %s", session.id, reason)

    def _on_container_death(self, session_id: str, container_id: str, exit_code: int) -> None:
        """Called on the loop by the watcher when one of our containers stops."""
        session = self.sessions.get(session_id)
        if session is None and self.pool.forget(session_id):
            return  # a pooled kernel died; the pool replaces it
        if session is None or session.kernel is None or session.state in ("starting", "deleted"):
            return  # expected: a delete or a restart stopped it
        if session.kernel.restarting or session.kernel.container_id != container_id:
            return
        self.spawn(self._mark_dead(session, container_id, exit_code))

    def _resync(self) -> None:
        """Called on the loop by the watcher when deaths may have gone unreported."""
        self.spawn(self._reconcile())

    async def _reconcile(self) -> None:
        """Mark dead every session whose sandbox stopped or vanished while nobody watched."""
        placement = self.lifecycle.placement
        try:
            found = {s.id: s for s in await placement.sandboxes(self.lifecycle.gateway_id)}
            for sandbox in found.values():
                if not sandbox.running:
                    self.pool.forget(sandbox.session_id)  # a pooled one is replaced
            for session in list(self.sessions.values()):
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
                    await self.mark_dead(session, f"{reason} (while the engine was unreachable)")
        except ENGINE_ERRORS as e:  # down again: the watcher asks once more when it is back
            log.warning("could not check the sessions' containers: %s", e)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run a background task that shutdown cancels instead of leaking (relays use it)."""
        return self.tasks.spawn(coro)

    async def _mark_dead(self, session: Session, container_id: str, exit_code: int) -> None:
        placement = self.lifecycle.placement
        reason = await placement.death_reason(session.limits, container_id, exit_code)
        kernel = session.kernel
        if session.state == "deleted" or kernel is None or kernel.container_id != container_id:
            return  # ended or restarted meanwhile
        await self.mark_dead(session, reason)

    async def mark_dead(self, session: Session, reason: str) -> None:
        """Record that the session's kernel is gone; a restart brings it back."""
        session.state = "dead"
        session.reason = reason
        if session.kernel is not None:
            session.kernel.died.set()
        log.warning("session %s died: %s", session.id, reason)
        await self.save(session)

    async def _cull_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.cull_interval)
            try:
                await self.cull()
            except Exception:
                log.exception("culling failed; will retry")

    async def cull(self) -> None:
        """End sessions past their TTL, and idle ones past their idle timeout."""
        now = self.clock()
        for session in list(self.sessions.values()):
            if now >= session.expires_at:
                await self.end(session, f"ttl expired after {session.ttl:g} s")
            elif (
                session.state in ("idle", "dead")
                and session.connections == 0
                and now >= session.idle_deadline
            ):
                await self.end(session, f"idle for {session.idle_timeout:g} s")

    async def save(self, session: Session) -> None:
        """Store the session's record, and its kernel's runtime info while it is open."""
        runtime = session.kernel.runtime_info() if session.kernel is not None else None
        await self.store.save_session(session.record(), runtime)
