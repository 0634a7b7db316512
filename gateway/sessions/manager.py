"""Sessions: the registry, their state machine, and TTL / idle culling.

A session owns one kernel in one container. States::

    starting -> idle <-> busy
        \\         \\       /
         +-------> dead (reason) --restart--> starting
    idle --pause / idle timeout (idle_action pause)--> paused --resume / execute--> idle
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
import dataclasses
import logging
import time
import uuid
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
    NotPaused,
    OwnerUnavailable,
    QuotaExceeded,
    SessionBusy,
    SessionEnded,
    SessionNotFound,
    StoreUnavailable,
    TooManySessions,
)
from ..limits import format_size
from ..observe.metrics import GatewayMetrics
from ..policy.gate import Gate
from ..sandbox.base import ENGINE_ERRORS
from ..sandbox.egress import EgressConnection
from ..sandbox.files import AsyncWorkspace
from ..sandbox.images import ImageBuilder
from ..sandbox.isolation.manager import IsolationManager
from ..sandbox.kernelspecs import KernelSpecs
from ..sandbox.workspace import iso
from ..store.sqlite import HISTORY_PAGE, HISTORY_PAGE_MAX, HistoryPage, Store
from ..validation import seconds
from .commands import Command, Commands
from .leases import Leases
from .lifecycle import SandboxLifecycle
from .model import Session, public_view
from .pool import WarmPool
from .recovery import recover, take_back
from .requests import (
    CreateSession,
    PauseSession,
    TakeSnapshot,
    UpdateSession,
)
from .snapshots import Snapshots
from .state import STATE_DIR, KernelState, SavedState
from .tasks import TaskSet
from .watchers import Watcher, Watchers

log = logging.getLogger(__name__)

# Upload events read back for an export's record of inputs (the newest, past this many).
MAX_RECORDED_UPLOADS = 10_000

# Egress connections recorded per session (by this process); past it they are only counted.
MAX_CONNECTION_RECORDS = 10_000
LIVE_STATES = ("starting", "idle", "busy", "dead", "paused")
_NOT_RUNNING = ("starting", "deleted", "paused")  # a sandbox's death is no news then
# Unix socket paths are capped at 107 bytes; the run dir must leave room.
_MAX_SOCKET_PATH = 100
LOCATIONS_KEPT = 10_000  # other gateways' sessions whose owner is remembered, at most


@dataclasses.dataclass
class Turn:
    """An execution's turn in its session (``SessionManager.turn``)."""

    resumed: dict[str, Any] | None  # how a paused session was resumed first
    kernel_died: bool = False


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
        state: KernelState,
        snapshots: Snapshots,
        clock: Callable[[], float] = time.time,
        *,
        gate: Gate,
        leases: Leases | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        """``sessions`` starts empty; the pool is handed the same dict to count them.

        ``gate``: the policies, scanner and approvals every execute passes.
        ``leases``: which sessions this gateway owns when gateways share the
        store (by default, from the store: all of them when nobody shares it).
        ``state`` saves and restores kernels' state for pause and resume;
        ``snapshots`` keeps snapshots, and forks start from them.
        ``metrics`` hears of every create and execution (a fresh one by default).
        """
        self.settings = settings
        self.gate = gate
        self.lifecycle = lifecycle
        self.store = store
        self.pool = pool
        self.quota = quota  # a tenant's quota, by tenant name
        self.clock = clock
        self.sessions = sessions
        self.state = state
        self.snapshots = snapshots
        self.leases = leases or Leases(store, settings.lease_ttl)
        self.tasks = TaskSet()
        self.ending: set[str] = set()  # sessions being ended (recovery.Registry)
        self.metrics = metrics or GatewayMetrics()
        self.commands = Commands(lifecycle.placement, self.tasks)
        self.watchers = Watchers(self.tasks)
        self._culler: asyncio.Task | None = None
        self._taker: asyncio.Task | None = None
        self._saving: set[str] = set()  # sessions whose record is due to be saved
        self._locations: dict[str, tuple[str, float]] = {}  # other gateways' sessions: where, until

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
        self.lifecycle.gateway_id = self.leases.owner = await self.store.gateway_id()
        # Watch before recovering, so a container dying meanwhile is not missed.
        await placement.start(self.lifecycle.gateway_id, self._on_container_death, self._resync)
        await recover(self, self.store, self.lifecycle, self.leases)
        self.leases.start(on_lost=self._lose)
        if self.leases.shared:
            self._taker = asyncio.create_task(self._take_back_forever(), name="sbx-take-back")
        await self.gate.desk.close_orphans()
        await self.snapshots.sweep()
        self._culler = asyncio.create_task(self._cull_forever(), name="sbx-culler")
        self.pool.start()

    async def stop(self, end_sessions: bool = False, drain_timeout: float = 0.0) -> None:
        """Stop managing sessions: end them all, or leave them running for the next start.

        Kept sessions first get ``drain_timeout`` seconds to finish running
        cells; a cell still running then is interrupted and recorded as cut
        by the restart, with its outputs so far.
        """
        for task in (self._culler, self._taker):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.pool.stop()
        await self.leases.stop()
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

    def check_available(self) -> None:
        """Refuse new work (503) while the database does not answer; work in flight goes on."""
        if self.store.down is not None:
            raise StoreUnavailable(
                f"the gateway's database does not answer ({self.store.down}); nothing new "
                "can be recorded, so nothing new starts: try again shortly"
            )

    def may_be_elsewhere(self, session_id: str) -> bool:
        """Whether another gateway may own the session (``locate`` finds out)."""
        return self.leases.shared and session_id not in self.sessions

    async def locate(self, session_id: str) -> str | None:
        """Where the other gateway that owns the session answers; None if none does.

        Raises OwnerUnavailable while an open session's lease has run out and
        nobody has adopted it yet: it is not gone, and a retry finds it.

        An answer is kept for a third of a lease (``forget_location`` drops it
        sooner): a session changes owner only once a lease has run out.
        """
        now = time.monotonic()
        known = self._locations.get(session_id)
        if known is not None and known[1] > now:
            return known[0]
        found = await self.store.owner_address(session_id)
        if found is None and await self.store.unheld(session_id):
            raise OwnerUnavailable(
                "the gateway that owned this session stopped answering; another one takes "
                "it over within seconds if it can reach its kernel, else it answers again "
                "once that gateway is back: try again"
            )
        if found is None or found[0] == self.leases.owner:
            self._locations.pop(session_id, None)
            return None
        if len(self._locations) > LOCATIONS_KEPT:
            self._locations.clear()
        self._locations[session_id] = (found[1], now + self.leases.ttl / 3)
        return found[1]

    def forget_location(self, session_id: str) -> None:
        """Drop where ``locate`` found the session: its owner did not have it."""
        self._locations.pop(session_id, None)

    def owner_of(self, session_id: str | None) -> Principal | None:
        """The tenant a live session belongs to, as a principal acting for it."""
        session = self.sessions.get(session_id or "")
        return session.owner if session else None

    def record_connection(self, connection: EgressConnection) -> None:
        """Keep a connection the egress proxy saw, under its session and the running execution.

        Host names and reasons are masked of the session's secrets; past
        ``MAX_CONNECTION_RECORDS`` a session's connections are only counted.
        """
        session = self.sessions.get(connection.session_id)
        if session is None:
            return
        session.egress_recorded += 1
        session.egress_bytes[0] += connection.bytes_up
        session.egress_bytes[1] += connection.bytes_down
        if session.egress_recorded > MAX_CONNECTION_RECORDS:
            if session.egress_recorded == MAX_CONNECTION_RECORDS + 1:
                log.warning("session %s: further egress connections are not recorded", session.id)
            return
        mask = session.masker
        running = next(iter(session.running), None)
        record = dataclasses.asdict(connection)
        record.update(
            at=iso(record.pop("started")),
            duration_ms=round(connection.duration_ms, 3),
            host=mask.text(connection.host),
            sni=connection.sni and mask.text(connection.sni),
            reason=connection.reason and mask.text(connection.reason),
        )
        del record["session_id"]
        self.store.add_connection(session.id, running.id if running else None, record)

    async def usage(self, session_id: str, who: Principal) -> dict[str, Any]:
        """What a live session uses now: CPU, memory (now and at peak), network, disk.

        CPU and memory are the sandbox's (None while paused or where the placement
        cannot tell); network is what passed the egress proxy since this gateway
        started; disk is the workspace's files.
        """
        session = self.get(session_id, who)
        sandbox: dict[str, Any] = {}
        if session.state in ("idle", "busy"):
            sandbox = await self.lifecycle.placement.usage(session.id)
        disk = None
        if session.workspace is not None and session.state != "paused":
            with contextlib.suppress(GatewayError, OSError):
                disk = await session.workspace.usage()
        limits = session.limits
        return {
            "session_id": session.id,
            "state": session.state,
            "at": iso(self.clock()),
            "cpu_seconds": sandbox.get("cpu_seconds"),
            "cpus_limit": limits.cpus,
            "memory_bytes": sandbox.get("memory_bytes"),
            "memory_peak_bytes": sandbox.get("memory_peak_bytes"),
            "memory_limit_bytes": limits.memory,
            "network": {
                "bytes_sent": session.egress_bytes[0],
                "bytes_received": session.egress_bytes[1],
                "connections": session.egress_recorded,
            },
            "disk_bytes": disk,
            "disk_limit_bytes": limits.disk,
        }

    async def network(
        self, session_id: str, who: Principal, after: int = 0, limit: int = HISTORY_PAGE
    ) -> tuple[list[dict[str, Any]], int | None]:
        """A page of the session's egress connections after the cursor ``after``."""
        _check_page(after, limit)
        await self.record(session_id, who)  # 404 for unknown ids and others' sessions
        return await self.store.connections(session_id, after, limit)

    def redact(self, session_id: str, text: str) -> str:
        """``text`` with a live session's secrets masked (the egress proxy's log lines)."""
        session = self.sessions.get(session_id)
        return session.masker.text(text) if session else text

    async def image_available(self, ref: str) -> bool:
        return await asyncio.to_thread(self.lifecycle.images.exists, ref)

    async def history(
        self, session_id: str, who: Principal, after: int = 0, limit: int = HISTORY_PAGE
    ) -> HistoryPage:
        """A page of a session's executions after the cursor ``after`` (an execution id)."""
        _check_page(after, limit)
        await self.record(session_id, who)  # 404 for unknown ids and others' sessions
        return await self.store.history(session_id, after, limit)

    async def uploads(self, session_id: str, who: Principal) -> list[dict[str, Any]]:
        """Every file uploaded to the session, the last upload of each path, by path.

        What a replay must bring (``path``, ``size``, ``sha256``, ``uploaded_at``),
        read from the audit log, which records each upload's hash.
        """
        await self.record(session_id, who)
        filters = {"session_id": session_id, "action": "files.upload", "outcome": "ok"}
        events = await self.store.audit_events(filters, limit=MAX_RECORDED_UPLOADS)
        found: dict[str, dict[str, Any]] = {}
        for event in reversed(events):  # oldest first: a later upload of a path wins
            detail = event.get("detail") or {}
            for saved in detail.get("files") or [detail]:  # a multipart batch, or one PUT
                if "path" in saved and "sha256" in saved:
                    path = str(saved["path"]).strip("/")
                    found[path] = {
                        "path": path,
                        "size": saved.get("size"),
                        "sha256": saved["sha256"],
                        "uploaded_at": event["at"],
                    }
        return sorted(found.values(), key=lambda f: f["path"])

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
        snapshot = None
        if request.from_snapshot is not None:
            snapshot = await self.snapshots.get(request.from_snapshot, who)
            request = _fork_request(request, snapshot)
        session = self.lifecycle.new_session(request, who.tenant)
        await self.lifecycle.unseal(session)
        if request.session_id is not None and await self.store.get_session(session.id):
            raise Conflict(f"session id {session.id} was used before; ids are never reused")
        self._reserve(session)
        requested_id = session.id
        try:
            warm = await self.pool.claim(session, request)
        finally:
            del self.sessions[requested_id]
            self.sessions[session.id] = session  # a claim gives it the pooled sandbox's id
        if not await self.leases.claim(session.id):
            await self.end(session, "another gateway made a session with this id")
            raise Conflict(f"session id {session.id} is taken")
        if not warm:
            await self.pool.make_room()
            await self.save(session)
            try:
                async with self._ended_meanwhile(session, "started"):
                    await self.lifecycle.launch(session)
            except BaseException as e:
                await self.end(session, f"kernel failed to start: {e}")  # unless it has ended
                raise
        if snapshot is not None:
            await self._fork(session, snapshot)
        await self._enter_working_dir(session)
        session.state = "idle"
        await self.save(session)
        log.info(
            "session %s started (%s, %s)", session.id, session.image, "warm" if warm else "cold"
        )
        return session, warm

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
            turn = Turn(await self._resume(session) if session.state == "paused" else None)
            self.check_usable(session)
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

    def check_usable(self, session: Session) -> None:
        """Refuse work for a dead, ended or paused session, saying what to do."""
        if session.state == "dead":
            raise KernelDied(
                f"the session's kernel died ({session.reason}); "
                f"POST /v1/sessions/{session.id}/restart to get a fresh kernel"
            )
        if session.state == "deleted":
            raise SessionEnded(f"session {session.id} has ended ({session.reason})")
        if session.state == "paused":
            raise Conflict(
                f"session {session.id} is paused and runs nothing; POST "
                f"/v1/sessions/{session.id}/resume (or execute: it resumes first)"
            )

    async def interrupt(self, session_id: str, who: Principal) -> Session:
        session = self.get(session_id, who)
        self.check_usable(session)
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
        paused = session.state == "paused"  # no kernel to stop: start one
        session.state = "starting"
        session.reason = None
        try:
            async with self._ended_meanwhile(session, "restarted"):
                await (session.kernel.start() if paused else session.kernel.restart())
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
        """Save the kernel's state and remove its sandbox; the workspace stays on disk.

        Refused while a cell runs. Pausing a paused session answers as the pause did.
        """
        session = self.get(session_id, who)
        if session.state == "paused" and session.paused is not None:
            return session, session.paused
        self._check_idle(session, session.lock.locked())
        async with session.lock:
            self._check_idle(session)
            saved = await self._pause(session, request.strategy)
        return session, saved.to_json()

    def _check_idle(self, session: Session, executing: bool = False) -> None:
        """Refuse to save a kernel's state while a cell runs (``executing``: one is queued)."""
        self.check_usable(session)
        if session.state == "starting":
            raise Conflict(f"session {session.id} is still starting; retry in a moment")
        if executing or session.running or session.state == "busy":
            raise SessionBusy(
                f"session {session.id} is running a cell; its state can be saved once the cell "
                f"finishes: wait for it, or POST /v1/sessions/{session.id}/interrupt"
            )

    async def _pause(self, session: Session, requested: str | None) -> SavedState:
        """Pause with the session's lock held.

        The record says paused before the sandbox goes: a gateway killed in
        between finds a paused session and removes the leftover container.
        """
        strategy = self.state.choose(session, requested)
        saved = await self.state.save(session, strategy, self.settings.kernel_start_timeout)
        session.state = "paused"
        session.paused = saved.to_json()
        await self.save(session)
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

    async def snapshot(
        self, session_id: str, who: Principal, request: TakeSnapshot
    ) -> dict[str, Any]:
        """Save an idle (or paused) session's kernel state and workspace; it carries on."""
        session = self.get(session_id, who)
        if session.state != "paused":
            self._check_idle(session, session.lock.locked())
        async with session.lock:
            if session.state != "paused":
                self._check_idle(session)
            return await self.snapshots.take(
                session, request.name, request.strategy, self.settings.kernel_start_timeout
            )

    async def snapshots_of(self, session_id: str, who: Principal) -> list[dict[str, Any]]:
        """A session's snapshots, live or ended, oldest first."""
        await self.record(session_id, who)  # 404 for unknown ids and others' sessions
        return await self.snapshots.of_session(session_id)

    async def wake(self, session_id: str, who: Principal) -> None:
        """Resume a session if it is paused (a Jupyter client connecting to its kernel)."""
        session = self.get(session_id, who)
        if session.state == "paused":
            async with session.lock:
                if session.state == "paused":
                    await self._resume(session)

    async def resume(self, session_id: str, who: Principal) -> tuple[Session, dict[str, Any]]:
        """Start a fresh kernel over the session's workspace and give it its state back."""
        session = self.get(session_id, who)
        async with session.lock:
            if session.state != "paused":
                raise NotPaused(f"session {session.id} is {session.state}, not paused")
            report = await self._resume(session)
        return session, report

    async def _resume(self, session: Session) -> dict[str, Any]:
        """Resume with the session's lock held; a failure leaves it paused, its state kept."""
        assert session.paused is not None and session.kernel is not None
        saved = SavedState.from_json(session.paused)
        session.state = "starting"
        try:
            async with self._ended_meanwhile(session, "resumed"):
                if await self._resume_warm(session, saved):
                    report = await self.state.restore(session, saved, _already_running, loaded=True)
                else:
                    report = await self.state.restore(session, saved, session.kernel.start)
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

    def files(self, session_id: str, who: Principal) -> AsyncWorkspace:
        """The session's files; usable while its kernel is busy or dead."""
        session = self.get(session_id, who)
        if session.workspace is None:
            raise Conflict(f"session {session_id} is still starting; retry in a moment")
        return session.workspace

    async def approve_host(self, session_id: str, target: str) -> bool:
        """Whether a first connection to ``target`` may go ahead (the egress proxy asks)."""
        session = self.sessions.get(session_id)
        if session is None or session.kernel is None:
            return False
        return await self.gate.approve_host(
            session.id, session.tenant, session.policy, session.owner, session.kernel.died, target
        )

    def check_file(self, session_id: str, who: Principal, op: str, size: int = 0) -> int:
        """Refuse a files API ``op`` the session's policy forbids; its download limit (0: none)."""
        session = self.get(session_id, who)
        return self.gate.check_file(session.tenant, session.policy, op, size)

    def command(self, session_id: str, who: Principal, pid: int) -> Command:
        """A running command of the session, by its pid in the sandbox."""
        self.get(session_id, who)
        return self.commands.get(session_id, pid)

    async def watch(self, session_id: str, who: Principal, path: str, recursive: bool) -> Watcher:
        """Watch a directory of the session's workspace (paused or not) for changes."""
        workspace = self.files(session_id, who)
        return await self.watchers.start(session_id, workspace, path, recursive)

    def watcher(self, session_id: str, who: Principal, watcher_id: str) -> Watcher:
        self.get(session_id, who)
        return self.watchers.get(session_id, watcher_id)

    def unwatch(self, session_id: str, who: Principal, watcher_id: str) -> None:
        self.get(session_id, who)
        self.watchers.stop(session_id, watcher_id)

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
        if session.kernel is not None:
            session.kernel.died.set()  # lets an in-flight execute return instead of hanging
            # Give that execute a moment to finish and record itself.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    async with session.lock:
                        pass
        await self.lifecycle.teardown(session)
        await self.save(session)
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
        session.kernel.detach()

    def _on_container_death(self, session_id: str, container_id: str, exit_code: int) -> None:
        """Called on the loop by the watcher when one of our containers stops."""
        session = self.sessions.get(session_id)
        if session is None and self.pool.forget(session_id):
            return  # a pooled kernel died; the pool replaces it
        if session is None:  # a resume took it from the pool: it keeps the pooled label
            session = next(
                (
                    s
                    for s in self.sessions.values()
                    if s.kernel and s.kernel.container_id == container_id
                ),
                None,
            )
        if session is None or session.kernel is None or session.state in _NOT_RUNNING:
            return  # expected: a delete, a restart or a pause stopped it
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
            sandboxes = await placement.sandboxes(self.lifecycle.gateway_id, list(self.sessions))
            found = {s.id: s for s in sandboxes}
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

    async def _take_back_forever(self) -> None:
        """Take back sessions let go of while the database was silent, and adopt dead gateways'.

        As often as leases are renewed: a dead gateway's sessions answer again
        within about a lease and a third of it.
        """
        while True:
            await asyncio.sleep(self.leases.ttl / 3)
            try:
                await take_back(self, self.store, self.lifecycle, self.leases)
            except Exception as e:  # the database is still away: next time
                log.debug("taking sessions back failed: %s", e)

    async def _cull_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.cull_interval)
            try:
                await self.cull()
            except Exception:
                log.exception("culling failed; will retry")

    async def cull(self) -> None:
        """End sessions past their TTL (paused too), and pause or end idle ones."""
        now = self.clock()
        for session in list(self.sessions.values()):
            expired = session.expiry(now)
            if expired is not None:
                await self.end(session, expired)
            elif (
                session.state in ("idle", "dead")
                and session.connections == 0
                and now >= session.idle_deadline
            ):
                if session.state == "idle" and session.idle_action == "pause":
                    await self._pause_idle(session)
                else:
                    await self.end(session, f"idle for {session.idle_timeout:g} s")

    async def _pause_idle(self, session: Session) -> None:
        """Pause a session past its idle timeout; one that cannot be paused ends as before."""
        if session.lock.locked():
            return  # an execute just came in
        try:
            async with session.lock:
                if session.state == "idle":
                    await self._pause(session, None)
        except GatewayError as e:
            await self.end(session, f"idle for {session.idle_timeout:g} s ({e.message})")

    async def save(self, session: Session) -> None:
        """Store the session's record, and its kernel's runtime info while it is open."""
        if not self.leases.holds(session.id):
            return  # another gateway's record now
        runtime = session.kernel.runtime_info() if session.kernel is not None else None
        await self.store.save_session(session.record(), runtime)


async def _already_running() -> None:
    """A resume's kernel taken from the pool is up already."""


def _check_page(after: int, limit: int) -> None:
    """A 400 for a page cursor or size the store would not answer sensibly."""
    if not 1 <= limit <= HISTORY_PAGE_MAX:
        raise BadRequest(f"limit must be between 1 and {HISTORY_PAGE_MAX}")
    if after < 0:
        raise BadRequest("after must be a cursor from a page's 'next', or 0")


def _fork_request(request: CreateSession, snapshot: dict[str, Any]) -> CreateSession:
    """A create request for a fork: the snapshot's kernel and image, or a 409 naming them."""
    for what, asked in (("kernel", request.kernel), ("image", request.image)):
        if asked and asked != snapshot[what]:
            raise Conflict(
                f"snapshot {snapshot['id']} holds the state of a {snapshot[what]} {what}; a "
                f"fork of it cannot run {asked}: leave {what} out"
            )
    return dataclasses.replace(request, kernel=snapshot["kernel"], image=snapshot["image"])
