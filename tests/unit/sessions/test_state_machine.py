"""The session state machine of ``sessions/manager.py``'s docstring, walked as a table.

Each row puts a fresh session into a state (idle, busy, dead, paused, deleted)
and sends it one command; the cell says the state it ends in, or the error
that refuses the command. The placement is local kernel processes (no
Docker); everything above it is the real manager, pipeline and upkeep.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from test_manager import (
    LocalKernelProvisioner,
    LocalPlacement,
    LocalSpec,
    build,
    kernels_dir,  # noqa: F401 (a fixture)
)

from gateway.access.auth import Principal
from gateway.app import build_domain
from gateway.errors import Conflict, KernelDied, NotPaused, SessionBusy, SessionNotFound
from gateway.sandbox.base import SandboxRequest
from gateway.sessions.requests import CreateSession, ExecuteCode, PauseSession

COMMANDS = ("execute", "interrupt", "restart", "pause", "resume", "delete")
# state -> the outcome of each command in COMMANDS: the state it leaves, or the error.
TABLE: dict[str, tuple[Any, ...]] = {
    "idle": ("idle", "idle", "idle", "paused", NotPaused, "deleted"),
    "busy": (None, "idle", "idle", SessionBusy, NotPaused, "deleted"),
    "dead": (KernelDied, KernelDied, "idle", KernelDied, NotPaused, "deleted"),
    "paused": ("idle", Conflict, "idle", "paused", "idle", "deleted"),
    "deleted": (SessionNotFound,) * 6,
}
ROWS = [
    (state, command, outcome)
    for state, outcomes in TABLE.items()
    for command, outcome in zip(COMMANDS, outcomes, strict=True)
    if outcome is not None  # busy + execute: it waits its turn, a queue and no transition
]


class PausingProvisioner(LocalKernelProvisioner):
    async def let_go(self) -> None:
        """Nothing relays this kernel's sockets: nothing to close before it stops."""


class PausingSpec(LocalSpec):
    provisioner_class = PausingProvisioner


class PausingPlacement(LocalPlacement):
    """Local kernels whose run directory the gateway reads: they can pause (by replay)."""

    def sandbox(self, request: SandboxRequest, gateway_id: str) -> PausingSpec:
        return PausingSpec(request, self.sessions_dir / request.session_id / "run")

    def kernel_exchange(self, session_id: str) -> tuple[str, Path]:
        run = self.session_dir(session_id) / "run"
        return str(run), run


def test_each_command_in_each_state(tmp_path, kernels_dir, monkeypatch):  # noqa: F811
    """All rows at once, each in a session (and a tenant) of its own, on one manager."""
    monkeypatch.setattr("test_manager.LocalPlacement", PausingPlacement)

    async def scenario() -> list[str]:
        manager, placement, store = build(tmp_path, kernels_dir)
        domain = build_domain(manager.settings, manager)
        await store.open()
        await manager.start(domain.upkeep.on_death, domain.upkeep.resync)
        try:
            rows = [row(i, *r, manager, domain, placement) for i, r in enumerate(ROWS)]
            return [wrong for wrong in await asyncio.gather(*rows) if wrong]
        finally:
            await manager.stop(end_sessions=True)
            await store.close()

    wrong = asyncio.run(scenario())
    assert not wrong, "rows of the state machine that do not hold:\n" + "\n".join(wrong)


async def row(index, state, command, outcome, manager, domain, placement) -> str | None:
    """One row: what went differently from the table, or None."""
    who = Principal(tenant=f"row-{index}", token_id="test")
    session = await manager.create(CreateSession(), who)
    running = await into(state, session, who, manager, domain, placement)
    call = {
        "execute": lambda: domain.executions.execute(session.id, who, ExecuteCode("1")),
        "interrupt": lambda: manager.interrupt(session.id, who),
        "restart": lambda: manager.restart(session.id, who),
        "pause": lambda: manager.pause(session.id, who, PauseSession()),
        "resume": lambda: manager.resume(session.id, who),
        "delete": lambda: manager.delete(session.id, who),
    }[command]
    name = getattr(outcome, "__name__", outcome)
    try:
        await call()
        if running is not None:
            await asyncio.wait_for(running, 30)  # an interrupted or cut cell returns
    except Exception as e:
        if isinstance(outcome, str) or not isinstance(e, outcome):
            return f"{state} + {command}: {type(e).__name__} ({e}), not {name}"
        if session.state != state:
            return f"{state} + {command}: refused, yet the state became {session.state}"
        return None
    finally:
        if running is not None and not running.done():
            running.cancel()
    if session.state != outcome:
        return f"{state} + {command}: {session.state}, not {name}"
    return None


async def into(state, session, who, manager, domain, placement) -> asyncio.Task | None:
    """Put an idle session into ``state``; the task of a cell left running, if any."""
    if state == "busy":
        cell = ExecuteCode("import time\ntime.sleep(60)")
        task = asyncio.create_task(domain.executions.execute(session.id, who, cell))
        while not session.running:  # noqa: ASYNC110 (no event says so)
            await asyncio.sleep(0.05)
        assert session.state == "busy"
        return task
    if state == "dead":
        kernel = session.kernel
        os.kill(kernel.manager.provisioner.pid, signal.SIGKILL)
        placement.deaths(session.id, kernel.container_id, -9)
        while session.state != "dead":  # noqa: ASYNC110 (no event says so)
            await asyncio.sleep(0.05)
    elif state == "paused":
        await manager.pause(session.id, who, PauseSession())
    elif state == "deleted":
        await manager.delete(session.id, who)
    assert session.state == state
    return None
