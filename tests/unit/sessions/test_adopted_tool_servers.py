"""A session adopted from a dead gateway leaves none of that gateway's stdio server
containers running: nothing reaches them, and the adopter starts its own on the next call.

Real recovery (``take_back``) and a real ``SandboxLifecycle``; the store, the leases and the
registry are stand-ins, and the placement (``Engine``) is a local one that keeps tool-server
sandboxes labelled, as the engine does, with their session and the gateway that made them.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker.errors
from test_manager import Images, LocalPlacement, local_kernels

from gateway.limits import Limits
from gateway.sandbox.base import Isolation
from gateway.sandbox.kernelspecs import KernelSpecs
from gateway.sessions.lifecycle import SandboxLifecycle
from gateway.sessions.model import Session
from gateway.sessions.recovery import take_back

HERE, DEAD = "gateway-b", "gateway-a"


class Engine(LocalPlacement):
    """Adopts others' sessions; its tool-server sandboxes by id: (session, gateway)."""

    adopts_others = True

    def __init__(self, sessions_dir: Path, failing: bool = False) -> None:
        super().__init__(sessions_dir)
        self.failing = failing
        self.servers = {
            "dead-s1": ("s1", DEAD),  # the dead gateway's server of the adopted session
            "ours-s1": ("s1", HERE),  # one this gateway made for it before (never removed)
            "dead-s2": ("s2", DEAD),  # another session's, still the dead gateway's
        }

    def adoptable(self, runtime: dict[str, Any] | None) -> bool:
        return True

    async def remove_tool_servers(self, gateway_id: str, sessions) -> None:
        if self.failing:
            raise docker.errors.APIError("the engine is busy")
        for sandbox_id, (session, made_by) in list(self.servers.items()):
            if session in sessions and made_by != gateway_id:
                del self.servers[sandbox_id]


class Isolating:
    egress = None

    async def prepare(self, session_id, runtime, policy, pids, brokering=None) -> Isolation:
        return Isolation()


class Store:
    """A dead gateway's paused session s1, whose lease ran out."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    async def orphans(self, owner: str) -> list:
        return [(self.doc, {"session_dir": "/elsewhere/s1"})]

    async def open_sessions(self, owner: str) -> list:
        return []

    async def running_executions(self) -> list:
        return []


class Registry:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.ending: set[str] = set()

    async def end(self, session: Session, reason: str) -> None:
        raise AssertionError(f"the adoption failed: {reason}")

    async def mark_dead(self, session: Session, reason: str) -> None:
        raise AssertionError(f"the adoption failed: {reason}")

    async def save(self, session: Session) -> None:
        pass

    async def taken_over(self, session_ids: set[str]) -> None:
        pass


class Leases:
    async def claim(self, session_id: str) -> bool:
        return True


def adopted(tmp_path: Path, failing: bool = False) -> tuple[Engine, Registry]:
    limits = Limits(2**30, 1.0, 256, 2**30, 30.0, 2**20)
    paused = Session("python3", "img", limits, 3600, 3600, {}, {}, session_id="s1")
    paused.state, paused.paused = "paused", {"strategy": "save"}
    engine = Engine(tmp_path / "sessions", failing)
    settings = SimpleNamespace(kernel_start_timeout=5.0)
    kernels = KernelSpecs(local_kernels(tmp_path))
    lifecycle = SandboxLifecycle(settings, kernels, Images(), Isolating(), engine)  # type: ignore[arg-type]
    lifecycle.gateway_id = HERE
    registry = Registry()
    store = Store(paused.record())
    asyncio.run(take_back(registry, store, lifecycle, Leases()))  # type: ignore[arg-type]
    return engine, registry


def test_adopting_a_session_removes_the_dead_gateways_tool_server_containers_of_it(tmp_path):
    engine, registry = adopted(tmp_path)
    assert list(registry.sessions) == ["s1"]
    assert set(engine.servers) == {"ours-s1", "dead-s2"}


def test_a_failure_to_remove_them_is_logged_and_the_session_is_adopted_all_the_same(
    tmp_path, caplog
):
    with caplog.at_level(logging.WARNING, "gateway.sessions.recovery"):
        engine, registry = adopted(tmp_path, failing=True)
    assert list(registry.sessions) == ["s1"] and len(engine.servers) == 3
    assert "the engine is busy" in caplog.text
