"""The session manager and the warm pool built directly, as a unit, without Docker.

The one fake sits at the engine boundary: a ``Placement`` whose sandboxes are
local kernel processes (jupyter_client's ``LocalProvisioner``) and an engine
client that only answers ``info``. Everything above it is the real code: the
sandbox lifecycle, real ipykernel kernels, the SQLite store, the pool and the
manager. The engine itself is covered by the integration tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import short_tmpdir
from jupyter_client.provisioning import LocalProvisioner

from gateway.access.auth import Principal, Quota
from gateway.app import build_domain
from gateway.config import Settings
from gateway.egress import EgressOptions
from gateway.errors import StrategyUnavailable
from gateway.masking import Masker
from gateway.notebooks.compare import diff_outputs
from gateway.policy.approvals import ApprovalDesk
from gateway.policy.book import PolicyBook
from gateway.policy.gate import Gate
from gateway.policy.scan import Scanner
from gateway.sandbox.base import Placement, SandboxRequest, SandboxState
from gateway.sandbox.isolation.manager import IsolationManager, IsolationOptions
from gateway.sandbox.kernelspecs import KernelSpecs
from gateway.sessions.lifecycle import SandboxLifecycle
from gateway.sessions.manager import SessionManager
from gateway.sessions.pool import WarmPool
from gateway.sessions.requests import CreateSession, ExecuteCode, PauseSession, TakeSnapshot
from gateway.sessions.snapshots import Snapshots
from gateway.sessions.state import KernelState
from gateway.store.sqlite import SQLiteStore as Store
from gateway.workspace.rules import Workspace

WHO = Principal(tenant="default", token_id="test")


class LocalKernelProvisioner(LocalProvisioner):
    """A kernel as a plain local process: what a sandbox is, minus the walls."""

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs.pop("sandbox", None)
        return await super().pre_launch(**kwargs)

    @property
    def container_id(self) -> str | None:
        return f"local-{self.pid}" if self.pid else None

    def reattach_info(self) -> dict[str, Any]:
        return {"container_id": self.container_id}

    async def output_tail(self) -> str:
        return ""


class LocalSpec:
    """What ``Kernel`` needs of a placement's spec."""

    provisioner_class = LocalKernelProvisioner

    def __init__(self, request: SandboxRequest, run_dir: Path) -> None:
        self.session_id = request.session_id
        self.run_dir = run_dir

    def manager_options(self) -> dict[str, Any]:
        return {
            "transport": "ipc",
            "ip": str(self.run_dir / "k"),
            "connection_file": str(self.run_dir / "connection.json"),
        }


class LocalPlacement(Placement):
    """Sandboxes as local directories and processes; it records what the lifecycle asks."""

    name = "local"

    def __init__(self, sessions_dir: Path) -> None:
        super().__init__(sessions_dir, tmp_size=64 * 2**20)
        self.removed: list[str] = []
        self.deaths: Any = None

    async def start(self, gateway_id: str, on_death: Any, on_resync: Any) -> None:
        self.deaths = on_death

    async def stop(self) -> None:
        pass

    def sandbox(self, request: SandboxRequest, gateway_id: str) -> LocalSpec:
        return LocalSpec(request, self.sessions_dir / request.session_id / "run")

    def workspace(self, spec: LocalSpec, provisioner: Any) -> Workspace:
        return Workspace(str(spec.run_dir.parent / "workspace"), os.getuid(), os.getgid())

    async def prepare(self, spec: LocalSpec) -> None:
        spec.run_dir.mkdir(parents=True)
        (spec.run_dir.parent / "workspace").mkdir()

    async def image_facts(self, image: str, provisioner: Any) -> dict[str, Any]:
        return {"digest": "sha256:local", "packages": []}

    async def death_reason(self, limits: Any, sandbox_id: str, exit_code: int) -> str:
        return f"exited {exit_code}"

    async def stopped_reason(self, limits: Any, sandbox_id: str) -> str:
        return "stopped"

    async def sandboxes(self, gateway_id: str, sessions: Any = ()) -> list[SandboxState]:
        return []

    async def remove(self, session_id: str) -> None:
        self.removed.append(session_id)

    async def remove_sandbox(self, sandbox_id: str) -> None:
        pass


class Engine:
    """The engine client, as far as the isolation layer asks it anything here."""

    def info(self) -> dict[str, Any]:
        return {"Runtimes": {"runc": {}}}


class Images:
    def tag_for(self, name: str) -> str:
        return f"sbx/{name}:local"

    def exists(self, ref: str) -> bool:
        return True


@pytest.fixture
def kernels_dir(tmp_path: Path) -> Path:
    return local_kernels(tmp_path)


def local_kernels(tmp_path: Path) -> Path:
    """A kernelspec directory whose python3 is ipykernel as a local process."""
    spec = tmp_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": argv,
                "display_name": "Python 3 (local)",
                "language": "python",
                "metadata": {"sandbox": {"image": "python"}},
            }
        )
    )
    return spec.parent


def build(tmp_path: Path, kernels_dir: Path, clock: Any = time.time, **settings: Any):
    """A manager over a local placement, in the three lines STYLE.md asks for (plus wiring)."""
    short = short_tmpdir()  # kernel socket paths must stay short
    s = Settings.from_mapping({"data_dir": str(short), "pool": "", **settings})
    placement = LocalPlacement(short / "sessions")
    isolation = IsolationManager(
        IsolationOptions(seccomp=None, egress=EgressOptions(state_dir=tmp_path / "egress")),
        Engine(),
    )
    lifecycle = SandboxLifecycle(s, KernelSpecs(kernels_dir), Images(), isolation, placement)
    store = Store(tmp_path / "gateway.sqlite3")
    sessions: dict = {}
    pool = WarmPool(lifecycle, s.pool, 1, s.max_sessions, live=sessions)
    quota = lambda tenant: Quota(4, 8 * 2**30, 8 * 2**30)  # noqa: E731
    desk = ApprovalDesk(store, s.approval_timeout, live=sessions.__contains__)
    gate = Gate(PolicyBook(tmp_path / "policies"), Scanner(), desk)
    state = KernelState(lifecycle, store, diff_outputs, s.interrupt_grace)
    snapshots = Snapshots(short / "snapshots", store, state, quota, s.max_archive_size)
    manager = SessionManager(
        s, lifecycle, store, pool, quota, sessions, state, snapshots, clock, gate=gate
    )
    return manager, placement, store


async def started(manager: SessionManager, store: Store) -> SessionManager:
    await store.open()
    upkeep = build_domain(manager.settings, manager).upkeep
    await manager.start(upkeep.on_death, upkeep.resync)
    return manager


async def stopped(manager: SessionManager, store: Store) -> None:
    await manager.stop(end_sessions=True)
    await store.close()


def test_manager_runs_a_session_and_tears_its_sandbox_down_once(tmp_path, kernels_dir):
    async def scenario() -> None:
        manager, placement, store = build(tmp_path, kernels_dir)
        await started(manager, store)
        try:
            session = await manager.create(CreateSession(), WHO)
            assert session.state == "idle" and session.image == "sbx/python:local"
            executions = build_domain(manager.settings, manager).executions
            await executions.execute(session.id, WHO, ExecuteCode("x = 41"))
            result = await executions.execute(session.id, WHO, ExecuteCode("x + 1"))
            assert result.status == "ok", result
            assert result.outputs[0]["data"]["text/plain"] == "42"
            await manager.delete(session.id, WHO)
            assert placement.removed == [session.id], "one teardown, through the placement"
            assert not (placement.sessions_dir / session.id).exists()
            assert (await manager.describe(session.id, WHO))["reason"] == "deleted by client"
        finally:
            await stopped(manager, store)

    asyncio.run(scenario())


def test_the_clock_decides_when_a_session_has_lived_its_ttl(tmp_path, kernels_dir):
    now = [time.time()]

    async def scenario() -> None:
        manager, placement, store = build(tmp_path, kernels_dir, clock=lambda: now[0])
        await started(manager, store)
        try:
            session = await manager.create(CreateSession(ttl=60), WHO)
            await build_domain(manager.settings, manager).upkeep.cull()
            assert session.state == "idle"
            now[0] += 61
            await build_domain(manager.settings, manager).upkeep.cull()
            assert session.state == "deleted" and session.reason == "ttl expired after 60 s"
            assert placement.removed == [session.id]
        finally:
            await stopped(manager, store)

    asyncio.run(scenario())


def test_a_placement_sharing_no_directory_with_its_kernels_cannot_pause(tmp_path, kernels_dir):
    """The Swarm's limit: kernels on other nodes pass no saved state to this host."""
    now = [time.time()]

    async def scenario() -> None:
        manager, _, store = build(tmp_path, kernels_dir, clock=lambda: now[0])
        await started(manager, store)
        try:
            session = await manager.create(CreateSession(idle_timeout=10, idle_action="pause"), WHO)
            for refused in (
                manager.pause(session.id, WHO, PauseSession()),
                manager.snapshot(session.id, WHO, TakeSnapshot()),
            ):
                with pytest.raises(StrategyUnavailable, match="local placement keeps no"):
                    await refused
            assert session.state == "idle", "a refused pause leaves the session running"
            session.last_activity = now[0] - 11
            await build_domain(manager.settings, manager).upkeep.cull()
            assert session.state == "deleted", "an idle session that cannot pause ends"
            assert session.reason.startswith("idle for 10 s (the local placement"), session.reason
        finally:
            await stopped(manager, store)

    asyncio.run(scenario())


def test_the_pool_serves_a_create_and_its_sandbox_is_never_reused(tmp_path, kernels_dir):
    async def scenario() -> None:
        manager, placement, store = build(tmp_path, kernels_dir, pool="python3=1")
        await started(manager, store)
        try:
            pool = manager.pool
            for _ in range(300):
                if pool.ready["python3"]:
                    break
                await asyncio.sleep(0.1)
            pooled_id = pool.ready["python3"][0].id
            session = await manager.create(CreateSession(env={"MODE": "warm"}), WHO)
            assert session.id == pooled_id and pool.claims[("python3", "hit")] == 1
            code = ExecuteCode("import os; os.environ['MODE']")
            executions = build_domain(manager.settings, manager).executions
            result = await executions.execute(session.id, WHO, code)
            assert result.outputs[0]["data"]["text/plain"] == "'warm'"
            # A client-chosen id never gets a pooled sandbox.
            chosen = "5f0c3f9e-8c5c-4f6e-9a51-0d6a4c1c2b7e"
            await manager.create(CreateSession(session_id=chosen), WHO)
            assert pool.claims[("python3", "miss")] == 1
        finally:
            await stopped(manager, store)
        assert placement.removed.count(pooled_id) == 1

    asyncio.run(scenario())


def test_each_transition_is_told_once_with_its_reason_masked(tmp_path, kernels_dir):
    """The lifecycle events webhooks deliver (sessions/events.py): created, died, killed."""
    told: list[dict] = []

    async def scenario() -> None:
        manager, _, store = build(tmp_path, kernels_dir)
        manager.events.sinks.append(told.append)
        await started(manager, store)
        try:
            session = await manager.create(CreateSession(env={"TOKEN": "s3cr3t-value"}), WHO)
            session.masker = Masker({"TOKEN": "s3cr3t-value"})
            await manager.mark_dead(session, "out of memory near s3cr3t-value")
            await manager.delete(session.id, WHO)
        finally:
            await stopped(manager, store)

    asyncio.run(scenario())
    assert [e["type"] for e in told] == [
        "sandbox.lifecycle.created", "sandbox.lifecycle.died", "sandbox.lifecycle.killed"
    ]  # fmt: skip
    assert told[1]["eventData"]["reason"] == "out of memory near ***TOKEN***"
    assert told[2]["eventData"]["reason"] == "deleted by client"
    assert isinstance(told[2]["eventData"]["execution"]["vcpu_count"], int)
    assert "s3cr3t-value" not in json.dumps(told) and told[0]["tenant"] == "default"
