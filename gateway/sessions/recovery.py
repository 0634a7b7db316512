"""Take over what a previous gateway process left, so a restart loses nothing.

At start the gateway keeps every paused session paused (its saved state and
workspace are on disk, or its sandbox frozen), reattaches to every open
session whose container still runs (the kernel, and so its state, carried on
without it), marks dead those
whose container stopped or vanished meanwhile, ends those that expired or
never finished starting, closes the executions the restart cut short, and
removes every container and session directory of its own that no open
session accounts for: nothing it started leaks across restarts.

Recovery is handed the store, the sandbox lifecycle and a ``Registry`` (the
few session commands it needs; the session manager is one), never the
manager itself. With a shared store it takes only the sessions whose lease
it holds or claims (``Leases``): never another live gateway's. It also
adopts a dead gateway's sessions the placement can reach (on Docker, those
whose directory is on this host; on Swarm, any), leaving their kernels, and
so their state, running where they are; and it never reaps a session another
gateway holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any, Protocol

from ..errors import GatewayError
from ..execution.recorder import close_cut_executions
from ..sandbox.base import ENGINE_ERRORS, SandboxState
from ..store.base import Store
from .leases import Leases
from .lifecycle import SandboxLifecycle
from .model import Session

log = logging.getLogger(__name__)

_WHILE_DOWN = "while the gateway was down"


class Registry(Protocol):
    """Where recovered sessions go, and how they end or die."""

    sessions: dict[str, Session]
    ending: set[str]  # ids of sessions being ended: out of ``sessions``, not yet saved ended

    async def end(self, session: Session, reason: str) -> None: ...

    async def mark_dead(self, session: Session, reason: str) -> None: ...

    async def save(self, session: Session) -> None: ...

    async def taken_over(self, session_ids: set[str]) -> None:
        """Sessions just taken over: what their last holder left waiting on them is over."""


async def recover(
    registry: Registry, store: Store, lifecycle: SandboxLifecycle, leases: Leases
) -> None:
    """Reattach, mark dead or end each open session; remove whatever is left over."""
    placement = lifecycle.placement
    claimed = await take_back(registry, store, lifecycle, leases)
    others = await store.owned_elsewhere(lifecycle.gateway_id)  # adopted by another gateway
    containers = await placement.sandboxes(lifecycle.gateway_id)
    for container in containers:
        if container.id not in claimed and container.session_id not in others:
            log.info("removing leftover container of session %s", container.session_id)
            await placement.remove_sandbox(container.id)
    for session_id in placement.directories():
        if session_id not in registry.sessions and session_id not in others:
            await placement.remove_directory(session_id)
    states = [s.state for s in registry.sessions.values()]
    if states:
        log.info(
            "took over %d session(s) from the previous run: %d idle, %d dead",
            len(states),
            states.count("idle"),
            states.count("dead"),
        )


async def take_back(
    registry: Registry, store: Store, lifecycle: SandboxLifecycle, leases: Leases
) -> set[str]:
    """Take over this gateway's open sessions it does not run, whose lease it can claim.

    At start, that is all of them. Later (the session manager asks each third
    of a lease), those it let go of when its leases ran out while the database
    did not answer, and nobody else took: their kernels ran on meanwhile.
    Always, a dead gateway's sessions the placement can adopt (``Placement.adoptable``),
    and those it was still starting, which end (their quota claims go back with them).
    Another gateway's stdio server containers of them go first (nothing reaches them).
    Returns the containers the sessions taken over run in.
    """
    gateway_id, placement = lifecycle.gateway_id, lifecycle.placement
    orphans = await store.orphans(gateway_id) if placement.adopts_others else []
    left = [
        (doc, runtime)
        for doc, runtime in [
            *await store.open_sessions(gateway_id),
            *(
                (doc, runtime)
                for doc, runtime in orphans
                # One still starting has no kernel to take over, wherever it was: it ends here.
                if (doc["state"] == "starting" and not runtime) or placement.adoptable(runtime)
            ),
        ]
        if doc["id"] not in registry.sessions and doc["id"] not in registry.ending
    ]
    owned = await asyncio.gather(*(leases.claim(doc["id"]) for doc, _ in left))
    left = [session for session, ours in zip(left, owned, strict=True) if ours]
    if not left:
        return set()
    taken = {doc["id"] for doc, _ in left}
    cut = await close_cut_executions(store, taken)
    await registry.taken_over(taken)
    try:  # before any is registered, so its tools start their servers only after
        await placement.remove_tool_servers(gateway_id, taken)
    except ENGINE_ERRORS as e:
        log.warning("stdio server containers of sessions taken over are left running: %s", e)
    # Sandboxes are labelled with the gateway that started them: a session this
    # gateway adopted once (its own now) still runs in the first one's.
    containers = await placement.sandboxes(gateway_id, taken)
    claimed: set[str] = set()
    outcomes = await asyncio.gather(
        *(
            _take_over(registry, lifecycle, doc, runtime, containers, claimed, doc["id"] in cut)
            for doc, runtime in left
        ),
        return_exceptions=True,
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            log.error("recovering a session failed: %r", outcome, exc_info=outcome)
    return claimed


async def _take_over(
    registry: Registry,
    lifecycle: SandboxLifecycle,
    doc: dict[str, Any],
    runtime: dict[str, Any] | None,
    containers: list[SandboxState],
    claimed: set[str],
    was_cut: bool,
) -> None:
    session = Session.from_record(doc)
    directory = (runtime or {}).get("session_dir")
    if directory and Path(directory).parent != lifecycle.placement.sessions_dir:
        log.info("adopting session %s from a gateway that stopped answering", session.id)
        lifecycle.placement.adopt_directory(session.id, Path(directory))
    # Deep paused: no sandbox, its state and workspace on disk. Frozen: its sandbox is
    # taken back as a live one's, and stays frozen.
    paused = session.state == "paused" and not session.frozen
    if not paused and (
        session.state == "starting" or not runtime or not runtime.get("container_id")
    ):
        await registry.end(session, "the gateway restarted while the session was starting")
        return
    expired = session.expiry(time.time())
    if expired is not None:
        await registry.end(session, f"{expired} ({_WHILE_DOWN})")
        return
    try:
        if paused:
            await lifecycle.adopt_paused(session)
        else:
            assert runtime is not None
            await lifecycle.adopt(session, runtime)
    except Exception as e:  # never left open in the store and out of the registry
        if not isinstance(e, GatewayError | OSError):
            log.exception("session %s: adopting its sandbox failed", session.id)
        await registry.end(session, f"its sandbox cannot be restored here: {_why(e)}")
        return
    # Taken back while serving, requests for it wait until its kernel answers.
    async with session.lock:
        registry.sessions[session.id] = session
        if paused:  # a container a pause did not get to remove is left over, and goes
            await registry.save(session)
            return
        container = next((c for c in containers if c.id == runtime["container_id"]), None)
        if container is not None:
            claimed.add(container.id)
        if session.state == "dead":
            await registry.save(session)  # died before the restart: keep its reason
        elif container is None:
            await registry.mark_dead(session, f"its container was removed {_WHILE_DOWN}")
        elif not container.running:
            reason = await lifecycle.placement.stopped_reason(session.limits, container.id)
            await registry.mark_dead(session, f"{reason} ({_WHILE_DOWN})")
        elif session.frozen:
            await _keep_frozen(registry, lifecycle, session, container)
        else:
            if container.frozen:  # killed after a freeze, before its record said so
                with contextlib.suppress(*ENGINE_ERRORS):  # else its kernel does not answer
                    await lifecycle.placement.thaw(container.id)
            await _reattach(registry, session, was_cut)


async def _keep_frozen(
    registry: Registry, lifecycle: SandboxLifecycle, session: Session, container: SandboxState
) -> None:
    """Keep a frozen session frozen: one a thaw left running (killed after the thaw, before
    its record said so) is frozen again; a resume thaws it either way."""
    if not container.frozen:
        try:
            await lifecycle.placement.freeze(container.id)
        except ENGINE_ERRORS as e:
            log.warning("session %s: its sandbox runs, paused: %s", session.id, e)
    await registry.save(session)


def _why(error: Exception) -> str:
    """An adoption failure in a record's words (a delete the crash cut short took the files)."""
    if isinstance(error, GatewayError):
        return error.message
    if isinstance(error, FileNotFoundError):
        return f"its files are gone ({error.filename})"
    return str(error) or type(error).__name__


async def _reattach(registry: Registry, session: Session, was_cut: bool) -> None:
    kernel = session.kernel
    assert kernel is not None
    if was_cut:
        # The cut cell may still run; nobody waits for it any more, and a busy
        # kernel would not answer the readiness check.
        await kernel.interrupt()
    try:
        await kernel.connect()
    except GatewayError as e:
        await registry.mark_dead(
            session, f"the kernel did not answer after the gateway restarted ({e.message})"
        )
        return
    session.state = "idle"
    await registry.save(session)
    log.info("session %s reattached", session.id)
