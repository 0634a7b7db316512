"""Take over what a previous gateway process left, so a restart loses nothing.

At start the gateway reattaches to every open session whose container still
runs (the kernel, and so its state, carried on without it), marks dead those
whose container stopped or vanished meanwhile, ends those that expired or
never finished starting, closes the executions the restart cut short, and
removes every container and session directory of its own that no open
session accounts for: nothing it started leaks across restarts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..errors import GatewayError
from ..execution.recorder import close_cut_executions
from ..sandbox.docker import volume
from ..sandbox.docker.placement import SandboxState
from .manager import Session, SessionManager

log = logging.getLogger(__name__)

_WHILE_DOWN = "while the gateway was down"


async def recover(manager: SessionManager) -> None:
    """Reattach, mark dead or end each open session; remove whatever is left over."""
    cut = await close_cut_executions(manager.store)
    containers = await manager.placement.sandboxes(manager.gateway_id)
    claimed: set[str] = set()
    outcomes = await asyncio.gather(
        *(
            _take_over(manager, doc, runtime, containers, claimed, doc["id"] in cut)
            for doc, runtime in await manager.store.open_sessions()
        ),
        return_exceptions=True,
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            log.error("recovering a session failed: %r", outcome)
    for container in containers:
        if container.id not in claimed:
            log.info("removing leftover container of session %s", container.session_id)
            await manager.placement.remove_sandbox(container.id)
    if manager.sessions_dir.exists():
        for leftover in manager.sessions_dir.iterdir():
            if leftover.name not in manager.sessions:
                await asyncio.to_thread(volume.destroy, leftover)
    states = [s.state for s in manager.sessions.values()]
    if states:
        log.info(
            "took over %d session(s) from the previous run: %d idle, %d dead",
            len(states),
            states.count("idle"),
            states.count("dead"),
        )


async def _take_over(
    manager: SessionManager,
    doc: dict[str, Any],
    runtime: dict[str, Any] | None,
    containers: list[SandboxState],
    claimed: set[str],
    was_cut: bool,
) -> None:
    session = Session.from_record(doc)
    if session.state == "starting" or not runtime or not runtime.get("container_id"):
        await manager.end(session, "the gateway restarted while the session was starting")
        return
    if time.time() >= session.expires_at:
        await manager.end(session, f"ttl expired after {session.ttl:g} s ({_WHILE_DOWN})")
        return
    try:
        # The egress proxy lives in this process: let the session's kernel back in.
        session.isolation = await manager.isolation.prepare(
            session.id, session.runtime, session.network, session.limits.pids
        )
    except GatewayError as e:
        await manager.end(session, f"its sandbox cannot be restored here: {e.message}")
        return
    manager.sandboxes.equip(session)
    assert session.kernel is not None
    await session.kernel.adopt(runtime)
    manager.sessions[session.id] = session
    await manager.placement.reattach(session)
    container = next((c for c in containers if c.id == runtime["container_id"]), None)
    if container is not None:
        claimed.add(container.id)
    if session.state == "dead":
        await manager.save(session)  # died before the restart: keep its reason
    elif container is None:
        await manager.mark_dead(session, f"its container was removed {_WHILE_DOWN}")
    elif not container.running:
        reason = await manager.placement.stopped_reason(session, container.id)
        await manager.mark_dead(session, f"{reason} ({_WHILE_DOWN})")
    else:
        await _reattach(manager, session, was_cut)


async def _reattach(manager: SessionManager, session: Session, was_cut: bool) -> None:
    kernel = session.kernel
    assert kernel is not None
    if was_cut:
        # The cut cell may still run; nobody waits for it any more, and a busy
        # kernel would not answer the readiness check.
        await kernel.interrupt()
    try:
        await kernel.connect()
    except GatewayError as e:
        await manager.mark_dead(
            session, f"the kernel did not answer after the gateway restarted ({e.message})"
        )
        return
    session.state = "idle"
    await manager.save(session)
    log.info("session %s reattached", session.id)
