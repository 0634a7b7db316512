"""The one execute pipeline: everything a tenant can make a sandbox run passes through here.

gate -> hold for approval -> begin record -> kernel -> output caps -> file
changes -> finish. The ways in: ``/v1`` execute and the agent stream, the E2B
edge's code interpreter, replays (``notebooks``), held executes, the Jupyter
channels relay (its cells, silent executes and user expressions, through
``admit``), and commands and terminals beside the kernel (``start_command``,
``run_command``). A new way in calls one of these; it never scans, holds or
records on its own, so a policy that forbids something cannot be walked
around by another route.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shlex
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..access.auth import Principal
from ..errors import (
    BadRequest,
    Conflict,
    Denied,
    PayloadTooLarge,
    SessionBusy,
    StoreUnavailable,
)
from ..execution.kernel import ExecutionResult, Kernel
from ..execution.outputs import OutputCap, OutputListener
from ..execution.recorder import COMMAND, SILENT, ExecutionRecorder
from ..limits import format_size
from ..observe.metrics import GatewayMetrics
from ..policy.approvals import Approval
from ..policy.gate import Gate
from ..policy.model import Decision
from ..store.base import Store
from ..validation import seconds
from .commands import Command, Commands
from .leases import Leases
from .lifecycle import SandboxLifecycle
from .manager import SessionManager
from .model import CodeContext, Session, check_usable
from .requests import ExecuteCode, StartCommand
from .tools import SessionTools, ToolServer, ToolTurn

log = logging.getLogger(__name__)

MAX_EXPRESSIONS = 100  # user expressions in one execute; each is scanned on its own


@dataclasses.dataclass(frozen=True)
class ExecutionLimits:
    """The server's bounds on one execution (``Settings`` builds them)."""

    max_code_size: int
    max_timeout: float
    interrupt_grace: float
    session_output_bytes: int


@dataclasses.dataclass
class Admitted:
    """A Jupyter client's execute that may go to the kernel, recorded from now on."""

    recorder: ExecutionRecorder
    cap: OutputCap
    interrupts: int  # the kernel's interrupt count when it was sent
    started: float = dataclasses.field(default_factory=time.monotonic)
    who: Principal | None = None  # whose tool calls its code makes; None: it may make none
    tool_turn: ToolTurn | None = None  # its window for tool calls, while it runs


class Executions:
    """Runs code and commands in sessions, each through the policy gate and into the record."""

    def __init__(
        self,
        sessions: SessionManager,
        gate: Gate,
        store: Store,
        lifecycle: SandboxLifecycle,
        commands: Commands,
        leases: Leases,
        metrics: GatewayMetrics,
        limits: ExecutionLimits,
        tools: SessionTools | None = None,
    ) -> None:
        """``tools``: sessions' tools, whose calls an execute's code may make while it runs."""
        self.sessions = sessions
        self.tools = tools
        self.gate = gate
        self.store = store
        self.lifecycle = lifecycle
        self.commands = commands
        self.leases = leases
        self.metrics = metrics
        self.limits = limits
        self._holds: dict[str, list[str]] = {}  # a session's pending approvals, oldest first

    # -- cells --------------------------------------------------------------------------

    async def execute(
        self,
        session_id: str,
        who: Principal,
        request: ExecuteCode,
        on_output: OutputListener | None = None,
        on_start: Callable[[], None] | None = None,
        on_hold: Callable[[Approval], None] | None = None,
        client: ToolServer | None = None,
        on_tool_hold: Callable[[Approval], None] | None = None,
    ) -> ExecutionResult:
        """Run code in the session's kernel, one execution at a time per session.

        The request's ``description`` is the caller's markdown narrative for this
        step; it is recorded and becomes a markdown cell in the notebook export.
        ``on_start`` is called when this execution's turn comes (others may be
        queued ahead). ``on_output`` hears of each output once it is stored.
        The code first passes the policy's gate: refused, it raises Denied;
        held, ``on_hold`` hears of the approval request and the session stays
        busy (its other work queued) until an approver decides. ``client`` answers the
        request's client tools (the agent stream's caller); ``on_tool_hold`` hears of each
        tool call of its code held for an approver.
        """
        session = self.sessions.get(session_id, who)
        if self.tools is not None:
            self.tools.check_client_tools(session, request.tools, client is not None)
        elif request.tools:
            raise BadRequest("this gateway offers no tools")
        code = request.code
        self._check_size(code)
        limit = seconds(request.timeout, "timeout", session.limits.timeout, self.limits.max_timeout)
        context = self.sessions.contexts.find(session, request.context)
        language = session.language if context is None else context.language
        if request.env and language.lower() != "python":
            raise BadRequest("environment variables for one run are offered for Python kernels")
        decision = await self.gate.review(session.tenant, session.policy, language, code)
        if request.env and decision.action == "hold":  # the approver sees all that runs
            note = session.masker.text(f"it runs with the environment {_assignments(request.env)}")
            decision = dataclasses.replace(decision, reasons=(*decision.reasons, note))
        review: dict[str, Any] = {"decision": decision.to_json()}
        if context is not None:  # recorded with it: its history is a notebook of its own
            review["context"] = context.id
        if decision.action == "deny":
            raise await self._refuse(session, code, request.description, review, decision)
        _check_not_held(session)
        async with self.sessions.turn(session) as turn:
            assert session.kernel is not None and session.workspace is not None
            if decision.action == "hold":
                review["approval"] = await self._hold(
                    session, who, code, request.description, review, decision, on_hold
                )
            kernel, restarted = await self.sessions.contexts.kernel(session, context)
            recorder = self.begin(session, code, request.description, review)
            await session.workspace.baseline()
            async with (
                self._tool_turn(
                    session, who, recorder, kernel, request.tools, client, on_tool_hold
                ) as begun,
                kernel.environment(request.env),
            ):
                result = await kernel.execute(
                    code,
                    timeout=limit,
                    cap=self.output_cap(session),
                    grace=self.limits.interrupt_grace,
                    on_output=recorder.listener(on_output),
                    on_start=on_start,
                    mask=session.masker,
                    on_begun=begun,
                )
            if context is not None:
                context.executions += 1
                result.context = _in_context(context, restarted, result)
            elif result.status == "dead":
                turn.kernel_died = True
                result.error = _died(session, self.sessions.crashes.what_comes_back(session))
            if context is None and (result.error or {}).get("kernel_restarted"):  # no relay yet
                await self.lifecycle.connect_packages(session)
                await self.lifecycle.enter_working_dir(session)
            result.files, result.artifacts_truncated = await session.workspace.changes()
            result.artifacts = [c for c in result.files if c["change"] != "deleted"]
            result.resumed = turn.resumed
            await self.finish(session, recorder, result)
        if context is None:
            self.sessions.crashes.executed(session)
        return result

    async def submit(
        self, session_id: str, who: Principal, request: ExecuteCode
    ) -> ExecutionResult | Approval:
        """Run an execute; if it is held, return its approval request as soon as it is made.

        A held execute goes on in the background: it runs once approved (its
        outcome in the session's history) or ends denied.
        """
        held: asyncio.Future[Approval | None] = asyncio.get_running_loop().create_future()
        run = self.sessions.spawn(
            self.execute(session_id, who, request, on_hold=_settle_with(held))
        )
        run.add_done_callback(_retrieve)
        run.add_done_callback(lambda _: _settle_with(held)(None))
        approval = await held  # a caller gone cancels it; the execute goes on
        return run.result() if approval is None else approval

    def output_cap(self, session: Session) -> OutputCap:
        """The execution's own cap, or what is left of the session's, whichever is less."""
        total = self.limits.session_output_bytes
        left = max(0, total - session.output_bytes)
        if left >= session.limits.output_bytes:
            return OutputCap(session.limits.output_bytes)
        return OutputCap(
            left,
            f"this session's output limit of {format_size(total)}, all its executions "
            "together (start a new session, or write large results to files)",
        )

    def begin(
        self,
        session: Session,
        code: str,
        description: str | None = None,
        review: dict[str, Any] | None = None,
        running: bool = True,
    ) -> ExecutionRecorder:
        """Record an execution as running (``running``: it holds the session busy meanwhile)."""
        mask = session.masker
        recorder = ExecutionRecorder(
            self.store,
            session.id,
            mask.text(code),
            description and mask.text(description),
            mask.tree(review),
        )
        if running:
            session.running.add(recorder)
        return recorder

    async def finish(
        self, session: Session, recorder: ExecutionRecorder, result: ExecutionResult
    ) -> None:
        """Store an execution's outcome in place of its running record.

        The caller answers only once the outcome is on disk; the session's
        own record (its counters) follows within a second.
        """
        self.metrics.executed(
            session.kernel_name, session.tenant, result.status, result.duration_ms / 1000
        )
        session.running.discard(recorder)
        if not self.leases.holds(session.id):
            return  # its new owner closes the execution as cut, with the outputs stored
        session.touch()
        session.executions += 1
        session.output_bytes += result.output_bytes
        finished = recorder.finish(result)
        self.sessions.save_soon(session)
        try:
            await finished
        except StoreUnavailable as e:  # the caller still gets what its code did
            log.warning("session %s: an execution could not be recorded: %s", session.id, e)

    # -- the Jupyter channels -------------------------------------------------------------

    async def admit(self, session: Session, who: Principal, content: Mapping[str, Any]) -> Admitted:
        """Pass a Jupyter client's execute_request through the gate before it is relayed.

        Every part of it that runs is judged: the cell, and each user
        expression (the kernel evaluates each on its own, so each is scanned
        alone). A silent execute is judged
        and recorded as well, as ``silent`` (the notebook export leaves it out).
        Refused, Denied is raised once its refusal is recorded; held, this waits
        for an approver (the relay queues the client's later requests).
        """
        code = str(content.get("code", ""))
        expressions = content.get("user_expressions") or {}
        apart = (
            tuple(str(e) for e in expressions.values()) if isinstance(expressions, Mapping) else ()
        )
        if len(apart) > MAX_EXPRESSIONS:
            raise BadRequest(
                f"{len(apart)} user expressions in one execute; at most {MAX_EXPRESSIONS} "
                "(evaluate more in the cell itself)"
            )
        recorded = "\n".join([code, *apart])
        self._check_size(recorded)
        decision = await self.gate.review(
            session.tenant, session.policy, session.language, code, apart=apart
        )
        review: dict[str, Any] = {"decision": decision.to_json()}
        if content.get("silent"):
            review["kind"] = SILENT
        if decision.action == "deny":
            raise await self._refuse(session, recorded, None, review, decision)
        if decision.action == "hold":
            review["approval"] = await self._hold(session, who, recorded, None, review, decision)
        assert session.kernel is not None
        caller = None
        if self.tools is not None and not content.get("silent"):  # its calls on no notebook
            await self.tools.ready(session, session.kernel)
            caller = who
        recorder = self.begin(session, recorded, review=review, running=False)
        if self.tools is not None and caller is not None:
            self.tools.expect(session.id, recorder)
        cap = self.output_cap(session)
        return Admitted(recorder, cap, session.kernel.interrupts, who=caller)

    def cell_started(self, session: Session, admitted: Admitted) -> None:
        """A relayed execute began running in the kernel (busy for it): open its window for
        tool calls, recorded on its record as an execute's are."""
        if self.tools is not None and admitted.who is not None and admitted.tool_turn is None:
            kernel = session.kernel
            admitted.tool_turn = self.tools.open(session, admitted.who, admitted.recorder, kernel)

    def cell_ended(self, session: Session, admitted: Admitted) -> None:
        """A relayed execute ended (its reply, or idle for it), or will never be seen to: close
        its window."""
        if self.tools is not None:
            self.tools.end(session.id, admitted.tool_turn, admitted.recorder)

    def debugger_refusal(self, session: Session) -> str | None:
        """Why the session's policy refuses a debugger request, or None if it allows it.

        What a debugger evaluates is code no scan reads, so it is refused
        rather than judged (``Gate.review_debugger``).
        """
        decision = self.gate.review_debugger(session.tenant, session.policy)
        return "; ".join(decision.reasons) if decision.action == "deny" else None

    # -- commands -----------------------------------------------------------------------

    async def start_command(
        self,
        session_id: str,
        who: Principal,
        request: StartCommand,
        on_hold: Callable[[Approval], None] | None = None,
    ) -> Command:
        """Start a command (or a terminal) beside the session's kernel, busy or not.

        A command is a shell: the policy's ``shell`` rule decides it, and its
        patterns for shells are matched against the command line (its
        environment written before it, as ``env A=1 cmd``). It is recorded in
        the history as a ``command`` with its exit code. A paused session resumes
        for it once it passes the gate, as for an execute (E2B's ``auto_resume``).
        """
        session = self.sessions.get(session_id, who)
        if session.state != "paused":
            check_usable(session)
        line = shlex.join(request.argv)
        if request.env:  # what it runs with is judged, held and recorded with it
            line = f"env {_assignments(request.env)} {line}"
        self._check_size(line)
        decision = await self.gate.review_command(session.tenant, session.policy, line)
        review: dict[str, Any] = {"decision": decision.to_json(), "kind": COMMAND}
        if decision.action == "deny":
            raise await self._refuse(session, line, None, review, decision)
        if decision.action == "hold":
            review["approval"] = await self._hold(
                session, who, line, None, review, decision, on_hold
            )
        await self.sessions.wake(session_id, who)
        check_usable(session)
        if session.kernel is None or session.kernel.container_id is None:
            raise Conflict(f"session {session_id} is still starting; retry in a moment")
        session.touch()
        command = await self.commands.start(
            session.id, session.kernel.container_id, request, session.masker
        )
        recorder = self.begin(session, line, review=review, running=False)
        self.sessions.spawn(self._record_command(session, recorder, command))
        return command

    async def run_command(
        self, session_id: str, who: Principal, request: StartCommand
    ) -> dict[str, Any]:
        """Run a command to its end; its output is capped as an execution's is."""
        session = self.sessions.get(session_id, who)
        limit = seconds(request.timeout, "timeout", session.limits.timeout, self.limits.max_timeout)
        command = await self.start_command(session_id, who, request)
        return await self.commands.run(command, limit, session.limits.output_bytes)

    def command(self, session_id: str, who: Principal, pid: int) -> Command:
        """A running command of the session, by its pid in the sandbox."""
        self.sessions.get(session_id, who)
        return self.commands.get(session_id, pid)

    def running_commands(self, session_id: str, who: Principal) -> list[Command]:
        self.sessions.get(session_id, who)
        return self.commands.running(session_id)

    async def _record_command(
        self, session: Session, recorder: ExecutionRecorder, command: Command
    ) -> None:
        code = await asyncio.shield(command.exit_code)
        error = None
        if code != 0:
            error = {"ename": "CommandFailed", "evalue": f"exit code {code}", "traceback": []}
        duration = (time.monotonic() - command.started) * 1000
        result = ExecutionResult("ok" if code == 0 else "error", None, [], error, duration)
        await self.finish(session, recorder, result)

    def _tool_turn(
        self,
        session: Session,
        who: Principal,
        recorder: ExecutionRecorder,
        kernel: Kernel | None,
        client_tools: tuple[dict[str, Any], ...],
        client: ToolServer | None,
        on_hold: Callable[[Approval], None] | None,
    ) -> contextlib.AbstractAsyncContextManager[Callable[[], None] | None]:
        """The window in which the execute's code may call the session's tools (and its own
        client tools, answered by ``client``): opened by the function it gives, once the
        kernel begins the code."""
        if self.tools is None:
            return contextlib.nullcontext()
        return self.tools.turn(
            session, who, recorder, kernel, client_tools, client, on_hold, at_begin=True
        )

    # -- the gate's outcomes ----------------------------------------------------------------

    def _check_size(self, code: str) -> None:
        if len(code.encode(errors="surrogatepass")) > self.limits.max_code_size:
            raise PayloadTooLarge(
                f"the code is larger than the limit of {format_size(self.limits.max_code_size)}"
                "; put large data in a file (PUT /v1/sessions/{id}/files/...) and read it"
            )

    async def _hold(
        self,
        session: Session,
        who: Principal,
        code: str,
        description: str | None,
        review: dict[str, Any],
        decision: Decision,
        on_hold: Callable[[Approval], None] | None = None,
    ) -> dict[str, Any]:
        """Wait for an approver; the approval's record if approved, else Denied (recorded)."""
        assert session.kernel is not None
        desk = self.gate.desk
        approval = await desk.request(
            session.id, session.tenant, who, session.masker.text(code), session.language, decision
        )
        if on_hold is not None:
            on_hold(approval)
        holds = self._holds.setdefault(session.id, [])
        holds.append(approval.id)
        session.held_for = approval.id
        try:
            await desk.wait(approval, session.kernel.died)
        finally:  # another of its executes (a Jupyter client's, a command) may still be held
            holds.remove(approval.id)
            session.held_for = holds[-1] if holds else None
            if not holds:
                del self._holds[session.id]
        if approval.state == "approved":
            return approval.record()
        who_denied = "the gateway" if approval.decided_by == "gateway" else "an approver"
        why = approval.reason or "no reason given"
        refused = {**review, "approval": approval.record()}
        raise await self._refuse(
            session,
            code,
            description,
            refused,
            decision,
            (f"approval {approval.id} was denied by {who_denied}: {why}",),
        )

    async def _refuse(
        self,
        session: Session,
        code: str,
        description: str | None,
        review: dict[str, Any],
        decision: Decision,
        reasons: tuple[str, ...] | None = None,
    ) -> Denied:
        """Record an execute that never ran; the Denied error that says why, to raise."""
        message = "the policy refused this code: " + "; ".join(reasons or decision.reasons)
        recorder = self.begin(session, code, description, review)
        error = {"ename": "Denied", "evalue": message, "traceback": []}
        await self.finish(session, recorder, ExecutionResult("denied", None, [], error, 0.0))
        return Denied(message)


def _assignments(env: Mapping[str, str]) -> str:
    """Environment variables as a shell writes them: ``A=1 B='two words'``."""
    return shlex.join(f"{name}={value}" for name, value in env.items())


def _check_not_held(session: Session) -> None:
    """A 409 at once, not a wait of up to the approval timeout, behind a held execute."""
    if session.held_for is not None:
        raise SessionBusy(
            f"session {session.id} waits for an approver to decide approval "
            f"{session.held_for} (GET /v1/approvals/{session.held_for}); send this once "
            "it is decided"
        )


def _settle_with(future: asyncio.Future[Any]) -> Callable[[Any], None]:
    """Set ``future``'s result unless it is done (or cancelled) already."""

    def settle(value: Any) -> None:
        if not future.done():
            future.set_result(value)

    return settle


def _retrieve(task: asyncio.Task) -> None:
    """Mark a background execute's failure as seen: its caller had its 202 already."""
    if not task.cancelled():
        task.exception()


def _in_context(
    context: CodeContext, restarted: str | None, result: ExecutionResult
) -> dict[str, Any]:
    """What a reply says of the code context it ran in: its id, whether its kernel started
    empty for it (and why), and, if its kernel died under it, what the next execute does."""
    if result.status == "dead":
        result.error = {
            "ename": "KernelDied",
            "evalue": f"the context's kernel stopped ({context.stopped or 'no reason known'}); "
            "the next execute in it starts it again, empty",
            "traceback": [],
        }
    return {"id": context.id, "kernel": context.kernel_name, "restarted": restarted}


def _died(session: Session, coming: dict[str, Any] | None) -> dict[str, Any]:
    """The error of a cell whose kernel died: what to do, or what comes back and what not."""
    if coming is not None:
        lost = ", ".join(map(str, coming["lost_cells"]))
        advice = (
            f"; it comes back with its checkpoint after cell {coming['from_execution']} in "
            f"a moment: the effects of cells {lost} are lost (the session's 'recovered' says so)"
        )
    elif session.state == "dead":
        advice = "; restart the session to continue"
    else:
        advice = ""
    error = {"ename": "KernelDied", "evalue": f"{session.reason}{advice}", "traceback": []}
    return error if coming is None else {**error, "recovery": coming}
