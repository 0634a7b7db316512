"""Code contexts: more kernels in one session's sandbox, each a namespace of its own.

A session's own kernel is its default context. ``Contexts`` adds up to
``MAX_CONTEXTS`` more, each a kernel of a kernelspec the session's image
holds, started beside it in the same sandbox (same files, limits and user,
separate variables) through ``Placement.context_sandbox``. Their executes go
through ``Executions`` as any other (a session runs one at a time, whatever
its context); each is recorded with its context's id, so the history and the
notebook export keep one notebook per context.

A context's kernel lives as long as the sandbox it was started in. A freeze
keeps it (its processes are frozen with the sandbox). Whatever stops or
replaces the sandbox (a pause saved to disk and its resume, a restart of the
session, its death and a crash comeback, a gateway restart) leaves the
context defined but its kernel stopped: the next execute in it starts it
empty, and the context's view and that execute's reply say why its variables
are gone. Snapshots and forks hold the session's own kernel only.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any

from ..errors import (
    BadRequest,
    Conflict,
    GatewayError,
    KernelStartFailed,
    NotFound,
    SessionEnded,
    TooManyContexts,
)
from ..execution.kernel import Kernel
from ..sandbox.base import exit_reason
from .lifecycle import SandboxLifecycle
from .model import CodeContext, Session
from .starts import StartQueue

MAX_CONTEXTS = 8  # per session, besides its own kernel; they share its memory and CPU
# Memory each kernel of a session keeps of its limit: a context past that would start
# only to be killed by the sandbox's OOM killer (an idle ipykernel holds about 50 MiB).
KERNEL_MEMORY = 64 * 2**20
DEFAULT = "default"  # the id that names the session's own kernel
WORKSPACE = "/workspace"


class Contexts:
    """Creates, finds, restarts and removes sessions' code contexts and their kernels."""

    def __init__(
        self,
        lifecycle: SandboxLifecycle,
        starts: StartQueue,
        turn: Callable[[Session], AbstractAsyncContextManager[Any]],
        save: Callable[[Session], Awaitable[None]],
        spawn: Callable[[Coroutine[Any, Any, Any]], Any],
        limit: int = MAX_CONTEXTS,
    ) -> None:
        """``turn``: the session's turn to run (resumed first if paused, busy meanwhile);
        ``spawn`` runs background work that shutdown cancels."""
        self.spawn = spawn
        # A kernel that stopped on its own, being cleaned up: its files share their names
        # with its context's next kernel's, so that one starts once this is done.
        self._stopping: dict[CodeContext, asyncio.Task] = {}
        self.lifecycle = lifecycle
        self.starts = starts
        self.turn = turn
        self.save = save
        self.limit = limit

    # -- reading ------------------------------------------------------------------------

    def default(self, session: Session) -> dict[str, Any]:
        """The session's own kernel, as a context."""
        return {
            "id": DEFAULT,
            "kernel": session.kernel_name,
            "language": self._language(session.kernel_name),
            "cwd": WORKSPACE + (f"/{session.working_dir}" if session.working_dir else ""),
            "state": "stopped" if session.state in ("paused", "dead") else "running",
            "default": True,
        }

    def views(self, session: Session) -> list[dict[str, Any]]:
        """Every context of the session, its own kernel's first."""
        return [self.default(session), *(c.to_json() for c in session.contexts.values())]

    def view(self, session: Session, context_id: str) -> dict[str, Any]:
        """One context's view, the session's own kernel's for ``default``."""
        context = self.find(session, context_id)
        return self.default(session) if context is None else context.to_json()

    def find(self, session: Session, context_id: str | None) -> CodeContext | None:
        """A context by id; None for the session's own kernel (no id, or ``default``)."""
        if context_id in (None, DEFAULT):
            return None
        context = session.contexts.get(str(context_id))
        if context is None:
            raise NotFound(
                f"context {str(context_id)[:64]!r} does not exist in session {session.id}; "
                f"GET /v1/sessions/{session.id}/contexts lists them"
            )
        return context

    def offered(self, session: Session) -> dict[str, str]:
        """The kernels the session's image holds, by name, with their languages.

        Those whose kernelspec names the same image directory as the session's
        kernel, when the session runs that kernel's own image; else its kernel only.
        """
        specs = self.lifecycle.kernelspecs
        own = specs.sandbox(session.kernel_name).get("image", session.kernel_name)
        names = [session.kernel_name]
        if session.image.startswith(f"sbx/{own}:"):
            names += [n for n in specs.names() if specs.sandbox(n).get("image", n) == own]
        return {name: self._language(name) for name in dict.fromkeys(names)}

    def _language(self, kernel_name: str) -> str:
        return self.lifecycle.kernelspecs.get(kernel_name).language.lower()

    def choose(self, session: Session, kernel: str | None, language: str | None) -> str:
        """The kernel a new context runs: named, the one of a language, or the session's own."""
        offered = self.offered(session)
        if kernel is None and language is None:
            return session.kernel_name
        wanted = (kernel or language or "").lower()
        if wanted in offered:
            return wanted
        if kernel is None:
            if offered[session.kernel_name] == wanted:
                return session.kernel_name
            match = next((n for n, lang in offered.items() if lang == wanted), None)
            if match is not None:
                return match
        held = ", ".join(f"{lang} ({name})" for name, lang in offered.items())
        raise BadRequest(
            f"this session's image holds no {'kernel' if kernel else 'language'} "
            f"{wanted[:64]!r}; it holds: {held}. Start a session of another kernel for it"
        )

    # -- changing -----------------------------------------------------------------------

    async def create(
        self,
        session: Session,
        kernel: str | None = None,
        language: str | None = None,
        cwd: str | None = None,
    ) -> CodeContext:
        """A new context with its kernel running (a paused session resumes first)."""
        name = self.choose(session, kernel, language)
        where = working_dir(cwd)
        if len(session.contexts) >= self.limit:
            raise TooManyContexts(
                f"session {session.id} has {len(session.contexts)} code contexts besides its "
                f"own kernel, the most it may have (they share its memory and CPU); remove one "
                f"(DELETE /v1/sessions/{session.id}/contexts/ID) first"
            )
        kernels = session.limits.memory // KERNEL_MEMORY
        if len(session.contexts) + 2 > kernels:
            raise TooManyContexts(
                f"session {session.id}'s {session.limits.memory >> 20} MiB of memory holds "
                f"{kernels} kernels of {KERNEL_MEMORY >> 20} MiB, its own and "
                f"{len(session.contexts)} contexts; remove a context or create the session "
                f"with more memory"
            )
        context = CodeContext(_new_id(session), name, self._language(name), where, time.time())
        session.contexts[context.id] = context  # counted from now: creates at once are bounded
        try:
            async with self.turn(session):
                if where:
                    assert session.workspace is not None
                    await session.workspace.make_dir(where)
                await self._start(session, context)
        except BaseException:
            session.contexts.pop(context.id, None)
            raise
        await self.save(session)
        return context

    async def restart(self, session: Session, context_id: str) -> CodeContext:
        """Give a context a fresh kernel: its variables go, its files stay."""
        context = self._named(session, context_id)
        async with self.turn(session):
            await _stop(context)
            context.stopped = context.restarted = None
            await self._start(session, context)
        return context

    async def remove(self, session: Session, context_id: str) -> None:
        """Stop a context's kernel and forget it; its executions stay in the history."""
        context = self._named(session, context_id)
        session.contexts.pop(context.id, None)
        await _stop(context)
        await self.save(session)

    def _named(self, session: Session, context_id: str) -> CodeContext:
        context = self.find(session, context_id)
        if context is None:
            raise BadRequest(
                "the default context is the session's own kernel: restart the session "
                f"(POST /v1/sessions/{session.id}/restart) instead; it cannot be removed"
            )
        return context

    async def interrupt(self, session: Session, context_id: str | None) -> None:
        """Interrupt the cell running in a context (None: the session's own kernel)."""
        context = self.find(session, context_id)
        kernel = session.kernel if context is None else context.kernel
        if kernel is not None:
            await kernel.interrupt()

    async def kernel(
        self, session: Session, context: CodeContext | None
    ) -> tuple[Kernel, str | None]:
        """The kernel an execute in ``context`` runs on, and why it started empty for it
        (None: it was running). Called within the session's turn."""
        if context is None:
            assert session.kernel is not None
            return session.kernel, None
        restarted = None
        if context.kernel is None:
            restarted = context.stopped or "it had no kernel running"
            await self._start(session, context)
            context.restarted, context.stopped = restarted, None
        assert context.kernel is not None
        return context.kernel, restarted

    async def _start(self, session: Session, context: CodeContext) -> None:
        own = session.kernel
        if own is None or own.container_id is None:
            raise Conflict(f"session {session.id} is still starting; retry in a moment")
        stopping = self._stopping.get(context)
        if stopping is not None:
            await asyncio.shield(stopping)
        kernel: Kernel | None = None

        def exited(code: int) -> None:
            if kernel is not None and context.kernel is kernel:
                context.kernel = None
                context.stopped = _why_stopped(session, code)
                kernel.died.set()  # an execute in it returns at once, as 'dead'
                task = self._stopping[context] = self.spawn(_stop_kernel(kernel))
                task.add_done_callback(lambda _: self._stopping.pop(context, None))

        spec = self.lifecycle.placement.context_sandbox(
            own.sandbox, own.container_id, context.id, context.cwd, exited, context.leftover
        )
        timeout = session.start_timeout or self.lifecycle.settings.kernel_start_timeout
        kernel = Kernel(context.kernel_name, self.lifecycle.kernelspecs.manager, spec, timeout)
        try:
            try:
                await self.starts.run(session.tenant, kernel.start)
            except KernelStartFailed as e:  # it ran out of the session's own limits, most likely
                limits = session.limits
                raise Conflict(
                    f"{e}; session {session.id}'s limits ({limits.memory >> 20} MiB of memory, "
                    f"{limits.pids} processes, shared by its kernels) may not hold another "
                    f"kernel: remove a context or create the session with more"
                ) from None
            if session.state == "deleted":  # ended meanwhile: nothing of it may stay
                raise SessionEnded(f"session {session.id} ended while a context started")
            if session.contexts.get(context.id) is not context:  # removed as it started
                raise NotFound(f"context {context.id} was removed while its kernel started")
        except BaseException:
            await _stop_kernel(kernel)
            raise
        context.kernel = kernel
        context.leftover = False

    async def sandbox_gone(self, session: Session, why: str) -> None:
        """The session's sandbox stopped (its kernel died): every context's kernel went with it."""
        await self.close(session)
        for context in session.contexts.values():
            context.stopped = why

    async def close(self, session: Session) -> None:
        """Let go of every context's kernel: the session ends, or the gateway stops.

        Their processes end with the sandbox (or, after a gateway restart, when
        the context starts again).
        """
        for context in session.contexts.values():
            kernel, context.kernel = context.kernel, None
            if kernel is not None:
                kernel.died.set()
                with contextlib.suppress(Exception):
                    await kernel.let_go()


def working_dir(cwd: str | None) -> str:
    """A context's directory relative to the workspace: given under it (or E2B's home)."""
    if cwd is None:
        return ""
    if not isinstance(cwd, str):
        raise BadRequest("cwd must be a directory path in /workspace")
    for home in (WORKSPACE, "/home/user"):
        if cwd == home or cwd.startswith(home + "/"):
            cwd = cwd[len(home) :]
            break
    else:
        if cwd.startswith("/"):
            raise BadRequest(
                f"a context's cwd is a directory in /workspace (the session's files), not "
                f"{cwd[:200]!r}"
            )
    parts = [p for p in cwd.split("/") if p not in ("", ".")]
    if any(p == ".." or "\0" in p for p in parts) or len(cwd) > 1024:
        raise BadRequest(f"a context's cwd stays inside /workspace; {cwd[:200]!r} does not")
    return "/".join(parts)


def _new_id(session: Session) -> str:
    while (context_id := secrets.token_hex(4)) in session.contexts:
        pass
    return context_id


def _why_stopped(session: Session, code: int) -> str:
    """Why a context's kernel stopped on its own, from what its session is doing."""
    if session.state == "paused":
        return "the session was paused to disk, which keeps only its own kernel's state"
    if session.state == "starting" or (session.kernel is not None and session.kernel.restarting):
        return "the session's kernel was restarted in a new sandbox"
    return f"its kernel stopped: {exit_reason(code)}"


async def _stop(context: CodeContext) -> None:
    kernel, context.kernel = context.kernel, None
    if kernel is not None:
        kernel.died.set()
        await _stop_kernel(kernel)


async def _stop_kernel(kernel: Kernel) -> None:
    """Stop a kernel and what the gateway holds for it; one already gone is fine."""
    try:
        await kernel.shutdown()
    except (GatewayError, OSError, RuntimeError):
        with contextlib.suppress(Exception):
            await kernel.let_go()
