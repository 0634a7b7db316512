"""Sessions: the registry and their state machine.

A session owns one kernel in one container. States::

    starting -> idle <-> busy
        \\         \\       /
         +-------> dead (reason) --restart--> starting
    idle --pause / idle timeout (idle_action pause)--> paused --resume / execute--> idle
    any state --delete / ttl / idle timeout--> deleted (reason)

Every transition above is made here and nowhere else: an execute takes the
session's ``turn`` (busy, then idle), the Jupyter relay reports a client's
kernel activity through ``kernel_said``, and ``Upkeep`` (deaths, TTL and
idle culling) ends in ``end``, ``mark_dead`` or ``pause_idle``. What runs
code is ``executions.Executions``; what reads about sessions, ``reports``;
their files, ``workspaces``; where another gateway holds one, ``locations``.

``SessionManager`` is handed its collaborators: the ``SandboxLifecycle``
(how sandboxes are made, adopted and removed), the ``Store``, the
``WarmPool``, a clock and its ``SessionOptions``. The composition root
(``gateway.app``) builds them; a unit test can build them with a fake
placement.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from ..access.auth import Principal, Quota
from ..egress.credentials import parse_credentials
from ..errors import (
    BadRequest,
    ConfigError,
    Conflict,
    GatewayError,
    NotAllowed,
    Overloaded,
    SessionEnded,
    SessionNotFound,
    StoreUnavailable,
)
from ..hosts import NetworkPolicy
from ..observe.metrics import GatewayMetrics
from ..policy.gate import Gate
from ..sandbox.base import DeathCallback, VolumeMount
from ..store.base import Store
from ..tasks import TaskSet
from ..validation import seconds
from .admission import Admission, HostCaps
from .commands import Commands
from .contexts import Contexts
from .crashes import CheckpointOptions, Crashes
from .events import SessionEvents
from .leases import Leases
from .lifecycle import SandboxLifecycle
from .model import Session, check_usable, ended_meanwhile, public_view
from .options import SessionOptions
from .pausing import Pausing
from .pool import WarmPool
from .recovery import recover
from .requests import (
    CreateSession,
    MountVolume,
    PauseSession,
    TakeSnapshot,
    UpdateSession,
)
from .snapshots import Snapshots
from .starts import StartQueue
from .state import KernelState
from .templates import Templates
from .volumes import Volumes
from .watchers import Watchers

log = logging.getLogger(__name__)

# Unix socket paths are capped at 107 bytes; the run dir must leave room.
_MAX_SOCKET_PATH = 100


@dataclasses.dataclass
class Turn:
    """An execution's turn in its session (``SessionManager.turn``)."""

    resumed: dict[str, Any] | None  # how a paused session was resumed first
    kernel_died: bool = False


class SessionManager:
    """Creates, finds, runs code in, and ends sessions."""

    def __init__(
        self,
        settings: SessionOptions,
        lifecycle: SandboxLifecycle,
        store: Store,
        pool: WarmPool,
        quota: Callable[[str], Quota],
        sessions: dict[str, Session],
        state: KernelState,
        snapshots: Snapshots,
        clock: Callable[[], float] = time.time,
        *,
        gate: Gate,
        templates: Templates | None = None,
        leases: Leases | None = None,
        metrics: GatewayMetrics | None = None,
        volumes: Volumes | None = None,
    ) -> None:
        """``sessions`` starts empty; the pool is handed the same dict to count them.

        ``gate``: the policies, scanner and approvals every execute passes.
        ``leases``: which sessions this gateway owns when gateways share the
        store (by default, from the store: all of them when nobody shares it).
        ``state`` saves and restores kernels' state for pause and resume;
        ``snapshots`` keeps snapshots, and forks start from them.
        ``metrics`` hears of every create and execution (a fresh one by default).
        ``volumes``: the tenants' named volumes a create mounts (None: none can be).
        """
        self.settings = settings
        self.gate = gate
        self.templates = templates  # tenants' templates, which creates start from by name
        self.lifecycle = lifecycle
        self.store = store
        self.pool = pool
        self.quota = quota  # a tenant's quota, by tenant name
        self.clock = clock
        self.sessions = sessions
        self.state = state
        self.snapshots = snapshots
        self.volumes = volumes
        self.leases = leases or Leases(store, settings.lease_ttl)
        host = HostCaps(settings.host_id, settings.host_max_sessions, settings.host_max_memory)
        self.admission = Admission(sessions, quota, settings.max_sessions, store, self.leases, host)
        pool.quotas = self.admission  # a template's pooled sandboxes hold their tenant's quota
        self.tasks = TaskSet()
        self.ending: set[str] = set()  # sessions being ended (recovery.Registry)
        self.metrics = metrics or GatewayMetrics()
        self.commands = Commands(lifecycle.placement, self.tasks)
        self.watchers = Watchers(self.tasks)
        self.events = SessionEvents()  # told each transition; app adds the webhooks' sink
        self.starts = StartQueue(
            settings.start_concurrency or os.cpu_count() or 2,
            settings.start_queue,
            settings.start_queue_per_tenant,
            settings.start_wait,
        )
        self.contexts = Contexts(lifecycle, self.starts, self.turn, self.save, self.spawn)
        self.pausing = Pausing(
            lifecycle, state, pool, snapshots, self.save, settings.kernel_start_timeout,
            self.events, self.starts, self.mark_dead, settings.pause_frozen_for, clock,
        )  # fmt: skip
        self.crashes = Crashes(
            lifecycle, state, self.starts, self.save, self.spawn,
            CheckpointOptions(
                settings.checkpoint_idle_after, settings.checkpoint_every,
                settings.checkpoint_max_size, settings.kernel_start_timeout,
            ),
            clock,
        )  # fmt: skip
        self._saving: set[str] = set()  # sessions whose record is due to be saved

    # -- lifecycle of the manager itself -------------------------------------------------

    async def start(self, on_death: DeathCallback, on_resync: Callable[[], None]) -> None:
        """Take over what a previous run left (reattach or reap), watching sandboxes die.

        ``on_death`` and ``on_resync`` hear of sandboxes that stop (``Upkeep``).
        """
        placement = self.lifecycle.placement
        socket_path = placement.sessions_dir / str(uuid.uuid4()) / "run" / "k-10"
        if len(str(socket_path)) > _MAX_SOCKET_PATH:
            raise ConfigError(
                f"data_dir {self.settings.data_dir} is too long for kernel sockets; "
                "choose a shorter path"
            )
        for name in self.pool.sizes:
            self.lifecycle.kernelspecs.get(name)  # a pool of an unknown kernel fails at start
        self.lifecycle.gateway_id = self.leases.owner = await self.store.gateway_id()
        # Watch before recovering, so a container dying meanwhile is not missed.
        await placement.start(self.lifecycle.gateway_id, on_death, on_resync)
        await recover(self, self.store, self.lifecycle, self.leases)
        for session in list(self.sessions.values()):  # a comeback the restart cut short
            if session.state == "dead":
                self.crashes.died(session)
        self.leases.start(on_lost=self._lose)
        await self.store.release_stale_claims(self.leases.owner)
        self.admission.start()
        await self.gate.desk.close_orphans(self.leases.owner)
        await self.snapshots.sweep()
        self.pool.start()

    async def stop(self, end_sessions: bool = False, drain_timeout: float = 0.0) -> None:
        """Stop managing sessions: end them all, or leave them running for the next start.

        Kept sessions first get ``drain_timeout`` seconds to finish running
        cells; a cell still running then is interrupted and recorded as cut
        by the restart, with its outputs so far.
        """
        await self.pool.stop()
        await self.leases.stop()
        await self.admission.stop()
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
        for relay in list(session.parked.values()):  # its agent stream drains on its own
            relay.close()
        self.commands.end(session.id)
        self.watchers.end(session.id)
        await self.contexts.close(session)
        kernel.detach()
        await self.save(session)

    # -- queries ------------------------------------------------------------------------

    def get(self, session_id: str, who: Principal) -> Session:
        """A live session ``who`` may use; someone else's answers as a missing one does."""
        session = self.sessions.get(session_id)
        if session is not None and not self.leases.holds(session_id):
            self._lose(session_id)  # its lease ran out before a renewal said so
            session = None
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
        return public_view(await self.record(session_id, who))

    def check_available(self) -> None:
        """Refuse new work (503) while the database does not answer; work in flight goes on."""
        if self.store.down is not None:
            raise StoreUnavailable(
                f"the gateway's database does not answer ({self.store.down}); nothing new "
                "can be recorded, so nothing new starts: try again shortly"
            )

    def owner_of(self, session_id: str | None) -> Principal | None:
        """The tenant a live session belongs to, as a principal acting for it."""
        session = self.sessions.get(session_id or "")
        return session.owner if session else None

    def mcp_token_of(self, session_id: str) -> dict[str, str] | None:
        """A live session's E2B MCP token registration, if it has one."""
        session = self.sessions.get(session_id)
        return session.mcp_token if session else None

    async def image_available(self, ref: str) -> bool:
        return await asyncio.to_thread(self.lifecycle.images.exists, ref)

    # -- commands -----------------------------------------------------------------------

    async def create(self, request: CreateSession, who: Principal) -> Session:
        """Check a create request against the server and start its kernel; idle on return.

        A fork (``from_snapshot``) then gets the snapshot's history, files and
        kernel state; if that fails, it ends and the error says why.
        """
        started = time.monotonic()
        outcome, start, kernel = "ok", "cold", request.kernel or "snapshot"
        try:
            session, warm = await self._create(request, who)
            kernel, start = session.kernel_name, "warm" if warm else "cold"
            return session
        except BaseException as e:
            outcome = e.code if isinstance(e, GatewayError) else "internal_error"
            raise
        finally:
            self.metrics.created(kernel, who.tenant, outcome, time.monotonic() - started, start)

    async def _create(self, request: CreateSession, who: Principal) -> tuple[Session, bool]:
        """Create, and say whether a warm kernel served it."""
        if request.template is not None:
            if self.templates is None:
                raise BadRequest("this gateway builds no templates; name a kernel instead")
            request = await self.templates.session_request(request, who.tenant)
        snapshot = None
        if request.from_snapshot is not None:
            snapshot = await self.snapshots.get(request.from_snapshot, who)
            request = _fork_request(request, snapshot)
        session = self.lifecycle.new_session(request, who.tenant)
        session.network = self.gate.bound_network(who.tenant, session.policy, session.network)
        await self.lifecycle.unseal(session)
        if request.session_id is not None and await self.store.get_session(session.id):
            raise Conflict(f"session id {session.id} was used before; ids are never reused")
        self.admission.reserve(session)
        requested = session.id
        try:
            # Set aside before the quota is claimed: a template's pooled sandbox gives its
            # share back.
            await self.pool.reserve(session, request)
            await self.admission.claim(session)
        except BaseException:
            self.pool.unreserve(requested)
            raise
        started = False
        try:
            session.volumes = await self._mount_volumes(session, request, who)
            warm = await self._start(session, snapshot)
            started = True
        except BaseException:
            if session.kernel is not None:  # in a sandbox (a pooled one, or launched): not left up
                await self.end(session, "its create was cut short before the session was ready")
            raise
        finally:
            self.pool.unreserve(requested)  # what a create cut short never took
            await self.admission.done(session, started)
        return session, warm

    async def _mount_volumes(
        self, session: Session, request: CreateSession, who: Principal
    ) -> tuple[VolumeMount, ...]:
        """Take the volumes a create names; its quota claim holds them until it ends."""
        if not request.volumes:
            return ()
        if self.volumes is None or not self.lifecycle.placement.mounts_volumes:
            raise NotAllowed(
                f"the {self.lifecycle.placement.name} placement cannot mount named volumes "
                "(a Swarm node does not hold this host's volumes); create the session without "
                "volumes and copy files in"
            )
        return await self.volumes.mount(session.id, who, request.volumes)

    async def _start(self, session: Session, snapshot: dict[str, Any] | None) -> bool:
        """Start an admitted session's kernel (a warm one if the pool has it); whether it was."""
        requested_id = session.id
        try:
            warm = await self.pool.claim(session)
        finally:
            del self.sessions[requested_id]
            self.sessions[session.id] = session  # a claim gives it the pooled sandbox's id
            self.admission.rebind(requested_id, session.id)
        try:
            leased = await self.leases.claim(session.id)
        except BaseException:  # cut short: end() would take it for another gateway's
            if warm and not self.leases.holds(session.id):  # a pooled id: this gateway's alone
                session.state, session.reason = "deleted", "its create was cut short"
                self.sessions.pop(session.id, None)
                await asyncio.shield(self.spawn(self.lifecycle.teardown(session)))
            raise
        if not leased:
            await self.end(session, "another gateway made a session with this id")
            raise Conflict(f"session id {session.id} is taken")
        if not warm:
            async with self.starts.slot(session.tenant):  # a few cold starts at once
                if session.state == "deleted":  # ended while it waited its turn
                    raise SessionEnded(
                        f"session {session.id} ended while it waited to start ({session.reason})"
                    )
                await self.pool.make_room()
                await self.save(session)
                try:
                    async with ended_meanwhile(session, "started"):
                        await self.lifecycle.launch(session)
                except BaseException as e:
                    await self.end(session, f"kernel failed to start: {e}")  # unless it ended
                    raise
        if snapshot is not None:
            await self._fork(session, snapshot)
        await self._enter_working_dir(session)
        session.state = "idle"
        await self.save(session)
        self.events.tell("created", session)
        log.info(
            "session %s started (%s, %s)", session.id, session.image, "warm" if warm else "cold"
        )
        return warm

    async def _enter_working_dir(self, session: Session) -> None:
        """Move the new kernel to its working directory; a kernel that cannot go there ends."""
        try:
            await self.lifecycle.enter_working_dir(session)
        except Exception as e:
            await self.end(session, f"could not enter working directory {session.working_dir}")
            raise BadRequest(
                f"the kernel could not enter KERNEL_WORKING_DIR {session.working_dir!r} ({e}); "
                "give a directory inside /workspace"
            ) from e

    async def _fork(self, session: Session, snapshot: dict[str, Any]) -> None:
        """Give a new session a snapshot's history, files and state; end it if that fails."""
        session.forked_from = {
            "session_id": snapshot["session_id"],
            "snapshot_id": snapshot["id"],
            "snapshot_name": snapshot["name"],
        }
        await self.save(session)
        try:
            session.executions = await self.store.copy_history(
                snapshot["session_id"], session.id, snapshot["last_execution"]
            )
            await self.snapshots.restore_into(session, snapshot)
        except BaseException as e:
            reason = e.message if isinstance(e, GatewayError) else repr(e)
            await self.end(session, f"could not be forked from snapshot {snapshot['id']}: {reason}")
            raise

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

    @contextlib.asynccontextmanager
    async def turn(self, session: Session) -> AsyncIterator[Turn]:
        """The session's one turn to run code: resumed first if paused, busy until it ends.

        Executions take turns, so this is the one place a session goes busy and
        back to idle (unless its kernel died meanwhile: ``Turn.kernel_died``).
        """
        async with session.lock:
            turn = Turn(await self.pausing.resumed(session) if session.state == "paused" else None)
            check_usable(session)
            session.state = "busy"
            session.touch()
            try:
                yield turn
            finally:
                if session.state == "busy" and not turn.kernel_died:
                    session.state = "idle"

    def kernel_said(self, session: Session, state: str) -> None:
        """A Jupyter client's request made the kernel busy or idle: show it, outside any turn.

        During a turn the execute in it decides the state; a client's execute
        sent meanwhile only queues in the kernel behind it.
        """
        if state in ("busy", "idle") and session.state in ("idle", "busy"):
            if not session.lock.locked():
                session.state = state

    async def interrupt(self, session_id: str, who: Principal) -> Session:
        session = self.get(session_id, who)
        check_usable(session)
        assert session.kernel is not None
        await session.kernel.interrupt()
        session.touch()
        return session

    async def restart(self, session_id: str, who: Principal) -> Session:
        """Give the session a fresh kernel; works on a dead or paused one too (its state goes)."""
        session = self.get(session_id, who)
        if session.state == "deleted":
            raise SessionEnded(f"session {session.id} has ended ({session.reason})")
        assert session.kernel is not None
        await self.pausing.thaw(session)  # frozen: its kernel restarts where it is
        paused, before = session.state == "paused", session.state  # paused: no kernel to stop
        session.state = "starting"
        session.reason = None
        await self.crashes.restarted(session)  # a later death must not bring back the old state
        start = session.kernel.start if paused else session.kernel.restart
        try:
            async with ended_meanwhile(session, "restarted"):
                try:
                    await self.starts.run(session.tenant, start)  # a cold start takes its turn
                except Overloaded:
                    session.state = before  # refused before anything stopped or started
                    raise
                if paused:
                    session.paused = None
                    await self.state.forget(session)
                await self.lifecycle.connect_packages(session)
                await self.lifecycle.enter_working_dir(session)
        except GatewayError as e:
            if session.state == "starting":  # not ended meanwhile: say why, allow another try
                await self.mark_dead(session, f"restart failed: {e.message}")
            raise
        session.state = "idle"
        session.touch()
        await self.save(session)
        return session

    async def pause(
        self, session_id: str, who: Principal, request: PauseSession
    ) -> tuple[Session, dict[str, Any]]:
        """Save the kernel's state and remove its sandbox (``Pausing.pause``)."""
        session = self.get(session_id, who)
        return session, await self.pausing.pause(session, request.strategy)

    async def snapshot(
        self, session_id: str, who: Principal, request: TakeSnapshot
    ) -> dict[str, Any]:
        """Save an idle (or paused) session's kernel state and workspace; it carries on."""
        return await self.pausing.snapshot(self.get(session_id, who), request)

    async def wake(self, session_id: str, who: Principal) -> None:
        """Resume a session if it is paused (a Jupyter client connecting to its kernel)."""
        await self.pausing.wake(self.get(session_id, who))

    async def resume(self, session_id: str, who: Principal) -> tuple[Session, dict[str, Any]]:
        """Start a fresh kernel over the session's workspace and give it its state back."""
        session = self.get(session_id, who)
        return session, await self.pausing.resume(session)

    async def update(self, session_id: str, who: Principal, request: UpdateSession) -> Session:
        """Change ttl / idle_timeout (seconds, from creation / last activity).

        ``expires_in`` is a ttl given from now, by this gateway's clock.
        """
        session = self.get(session_id, who)
        s = self.settings
        ttl = request.ttl
        if request.expires_in is not None:  # an activity ttl restarts now (touched below)
            since = 0.0 if session.ttl_from == "activity" else self.clock() - session.created_at
            ttl = since + request.expires_in
        session.ttl = seconds(ttl, "ttl", session.ttl, s.max_ttl)
        session.idle_timeout = seconds(
            request.idle_timeout, "idle_timeout", session.idle_timeout, s.max_idle_timeout
        )
        session.touch()
        await self.save(session)
        return session

    async def delete(self, session_id: str, who: Principal) -> None:
        await self.end(self.get(session_id, who), "deleted by client")

    # -- endings ------------------------------------------------------------------------

    async def end(self, session: Session, reason: str) -> None:
        """Stop the kernel, free the sandbox, and record why the session ended."""
        if session.state == "deleted":
            return
        if not self.leases.holds(session.id):
            self._lose(session.id)  # its sandbox is another gateway's to end
            return
        session.state = "deleted"
        session.reason = reason
        session.ended_at = self.clock()
        # Until its record says so, taking sessions back must not mistake it for one let go.
        self.ending.add(session.id)
        try:
            await self._end(session, reason)
        finally:
            self.ending.discard(session.id)

    async def _end(self, session: Session, reason: str) -> None:
        self.sessions.pop(session.id, None)
        self._cut_off(session)
        self.crashes.forget(session)
        if session.kernel is not None:
            session.kernel.died.set()  # lets an in-flight execute return instead of hanging
            # Give that execute a moment to finish and record itself.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    async with session.lock:
                        pass
        await self.contexts.close(session)  # their processes go with the sandbox
        await self.lifecycle.teardown(session)
        await self.save(session)
        self.events.tell("ended", session, reason)
        for tell in list(session.on_end):  # once its record says why, for a client that asks
            tell(reason)
        await self.leases.release(session.id)
        log.info("session %s ended: %s", session.id, reason)

    def _lose(self, session_id: str) -> None:
        """Stop acting for a session another gateway owns now; its kernel is theirs.

        Nothing of the session is written any more, its clients are cut off
        (they reconnect to its owner) and an execute in flight returns at once.
        """
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        log.warning("session %s: this gateway lost its lease; another gateway owns it", session_id)
        session.reason = (
            "this gateway lost the session's lease to another gateway; send the request again"
        )
        self._cut_off(session)
        if session.kernel is not None:
            session.kernel.died.set()
            self.spawn(self._let_go(session))

    def _cut_off(self, session: Session) -> None:
        """Close every client and helper of a session this gateway stops serving."""
        if session.stream is not None:
            session.stream.close()
        for relay in list(session.parked.values()):
            relay.close()
        self.commands.end(session.id)
        self.watchers.end(session.id)

    async def _let_go(self, session: Session) -> None:
        """Close a lost session's kernel channels once its execute in flight has returned."""
        assert session.kernel is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                async with session.lock:
                    pass
        await self.contexts.close(session)
        session.kernel.detach()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run a background task that shutdown cancels instead of leaking (relays use it)."""
        return self.tasks.spawn(coro)

    async def taken_over(self, session_ids: set[str]) -> None:
        """Executes a dead gateway held for approval died with it: their requests are denied."""
        await self.gate.desk.close_orphans(self.leases.owner, of=session_ids)

    async def mark_dead(self, session: Session, reason: str) -> None:
        """Record that the session's kernel is gone; a restart brings it back."""
        session.state = "dead"
        session.reason = reason
        if session.kernel is not None:
            session.kernel.died.set()
        log.warning("session %s died: %s", session.id, reason)
        await self.contexts.sandbox_gone(session, f"the session's kernel died ({reason})")
        await self.save(session)
        self.events.tell("died", session, reason)
        self.crashes.died(session)

    async def deepen(self, session: Session) -> None:
        """Save a frozen session's state to disk (``Pausing.deepen``); a failure is logged."""
        try:
            await self.pausing.deepen(session)
        except GatewayError as e:  # dead (said so) or left idle, its kernel running
            log.warning("session %s: its frozen state could not be saved: %s", session.id, e)

    async def pause_idle(self, session: Session) -> None:
        """Pause a session past its idle timeout; one that cannot be paused ends as before."""
        try:
            await self.pausing.pause_idle(session)
        except GatewayError as e:
            await self.end(session, f"idle for {session.idle_timeout:g} s ({e.message})")

    async def save(self, session: Session) -> None:
        """Store the session's record, and its kernel's runtime info while it is open."""
        if not self.leases.holds(session.id):
            return  # another gateway's record now
        if session.state == "starting" and self.crashes.coming_back(session):
            return  # dead until it is back: recovery would end a session found 'starting'
        runtime = session.kernel.runtime_info() if session.kernel is not None else None
        await self.store.save_session(session.record(), runtime)


def _fork_request(request: CreateSession, snapshot: dict[str, Any]) -> CreateSession:
    """A create request for a fork: the snapshot's kernel and image, or a 409 naming them.

    Unless it names its own, a fork asks for the secrets its snapshot's session held: its
    replay runs with them, and its masker masks them. It keeps the source's brokered
    credentials (their values stay with the egress proxy, never its sandbox) and, unless it
    asks for one, the source's network.
    """
    for what, asked in (("kernel", request.kernel), ("image", request.image)):
        if asked and asked != snapshot[what]:
            raise Conflict(
                f"snapshot {snapshot['id']} holds the state of a {snapshot[what]} {what}; a "
                f"fork of it cannot run {asked}: leave {what} out"
            )
    credentials = request.credentials or parse_credentials(snapshot.get("credentials"))
    bound = {c.secret for c in credentials}
    secrets = request.secrets or tuple(snapshot.get("secrets", ()))
    network = request.network
    if network.is_none and "network" in snapshot:
        network = NetworkPolicy.parse(snapshot["network"])
    volumes = request.volumes
    if volumes is None:  # the source's volumes, read-only: their files were never snapshotted
        volumes = tuple(
            MountVolume(v["name"], v["path"], read_only=True) for v in snapshot.get("volumes", ())
        )
    return dataclasses.replace(
        request,
        kernel=snapshot["kernel"],
        image=snapshot["image"],
        secrets=tuple(name for name in secrets if name not in bound),
        credentials=credentials,
        network=network,
        volumes=volumes,
    )
