"""Where sessions' kernels run, chosen by the ``placement`` setting: one seam, two answers.

``DockerPlacement`` (the default) runs each kernel in a container on this
host's engine, its workspace a host directory. ``SwarmPlacement``
(``gateway.sandbox.swarm.placement``) runs each as a one-task service on any node of a Docker
Swarm, its workspace reached through the agent in the sandbox. The session
manager, the sandbox factory, recovery and the warm pool call only this
interface, so none of them knows which it has.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors

from ...config import Settings
from ...limits import Limits, format_size
from ..images import ImageBuilder
from ..workspace import Workspace
from . import volume
from .events import ContainerWatcher, DeathCallback
from .provisioner import (
    LABEL_GATEWAY,
    LABEL_SESSION,
    SandboxSpec,
    sandbox_name,
    update_limits,
)

if TYPE_CHECKING:
    from ...sessions.model import Session

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SandboxState:
    """One sandbox of this gateway as the engine lists it, for recovery."""

    id: str
    session_id: str
    running: bool


class Placement(abc.ABC):
    """The interface: what the gateway asks of wherever kernels run."""

    name = ""
    # Whether a running sandbox's limits can change in place (a warm-pool claim needs it).
    resizes_in_place = False

    @abc.abstractmethod
    async def start(self, gateway_id: str, on_death: DeathCallback) -> None:
        """Begin reporting sandbox deaths as ``on_death(session, sandbox, exit_code)``."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop watching."""

    @abc.abstractmethod
    def sandbox(self, session: Session, sandbox_cfg: dict[str, Any], gateway_id: str) -> Any:
        """The session's sandbox spec (what its kernel's provisioner runs)."""

    @abc.abstractmethod
    def workspace(self, session: Session, spec: Any) -> Workspace:
        """How the gateway reaches the session's files."""

    @abc.abstractmethod
    async def prepare(self, session: Session, spec: Any) -> None:
        """Make what must exist before the kernel starts."""

    async def reattach(self, session: Session) -> None:  # noqa: B027 (optional: most keep nothing)
        """Restore what a gateway restart undid on this host; recovery calls it per session."""

    @abc.abstractmethod
    async def image_facts(self, session: Session) -> dict[str, Any]:
        """The digest and package list of the session's image, for notebooks."""

    @abc.abstractmethod
    async def death_reason(self, session: Session, sandbox_id: str, exit_code: int) -> str:
        """Why a sandbox stopped, in words a user understands."""

    @abc.abstractmethod
    async def stopped_reason(self, session: Session, sandbox_id: str) -> str:
        """Why a sandbox found stopped at start-up stopped."""

    @abc.abstractmethod
    async def sandboxes(self, gateway_id: str) -> list[SandboxState]:
        """Every sandbox labelled with this gateway's id, running or not."""

    @abc.abstractmethod
    async def remove(self, session_id: str) -> None:
        """Remove the session's sandbox, if any is left."""

    @abc.abstractmethod
    async def remove_sandbox(self, sandbox_id: str) -> None:
        """Remove a sandbox no session accounts for."""

    async def update_limits(self, sandbox_id: str, limits: Limits) -> None:
        """Apply new limits to a running sandbox; callers check ``resizes_in_place`` first."""
        raise TypeError(f"the {self.name} placement cannot change a running sandbox's limits")


class DockerPlacement(Placement):
    """Kernels in containers on this host's engine, workspaces loop-mounted here."""

    name = "docker"
    resizes_in_place = True

    def __init__(self, settings: Settings, client: docker.DockerClient, images: ImageBuilder):
        self.settings = settings
        self.docker = client
        self.images = images
        self.sessions_dir = Path(settings.data_dir) / "sessions"
        self._watcher: ContainerWatcher | None = None
        self._image_facts: dict[str, dict[str, Any]] = {}

    async def start(self, gateway_id: str, on_death: DeathCallback) -> None:
        if not volume.loop_mounts_available():
            log.warning(
                "not root: workspaces are plain directories and disk limits are not enforced"
            )
        self._watcher = ContainerWatcher(self.docker, gateway_id, on_death)
        self._watcher.start()

    async def stop(self) -> None:
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.stop)

    def sandbox(
        self, session: Session, sandbox_cfg: dict[str, Any], gateway_id: str
    ) -> SandboxSpec:
        session_dir = self.sessions_dir / session.id
        return SandboxSpec(
            docker=self.docker,
            image=session.image,
            session_id=session.id,
            gateway_id=gateway_id,
            limits=session.limits,
            env=session.env,
            run_dir=session_dir / "run",
            workspace=session_dir / "workspace",
            tmp_bytes=self.settings.tmp_bytes_for(session.limits),
            user=sandbox_cfg.get("user", "1000:1000"),
            isolation=session.isolation,
        )

    def workspace(self, session: Session, spec: SandboxSpec) -> Workspace:
        uid, gid = spec.uid_gid
        return Workspace(str(spec.workspace), uid, gid)

    async def prepare(self, session: Session, spec: SandboxSpec) -> None:
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        uid, gid = spec.uid_gid
        await asyncio.to_thread(
            volume.create, self.sessions_dir / session.id, session.limits.disk, uid, gid
        )

    async def reattach(self, session: Session) -> None:
        """Remount the workspace, should a host reboot have unmounted it."""
        await asyncio.to_thread(volume.mount_again, self.sessions_dir / session.id)

    async def image_facts(self, session: Session) -> dict[str, Any]:
        facts = self._image_facts.get(session.image)
        if facts is None:
            facts = await asyncio.to_thread(self.images.facts, session.image)
            self._image_facts[session.image] = facts
        return facts

    async def death_reason(self, session: Session, sandbox_id: str, exit_code: int) -> str:
        oom = False
        # The engine may flag the OOM kill a moment after it reports the death.
        for _ in range(5 if exit_code == 137 else 1):
            try:
                info = await asyncio.to_thread(self.docker.api.inspect_container, sandbox_id)
            except docker.errors.NotFound:
                break
            oom = bool(info["State"].get("OOMKilled"))
            if oom:
                break
            await asyncio.sleep(0.1)
        return oom_reason(session.limits) if oom else exit_reason(exit_code)

    async def stopped_reason(self, session: Session, sandbox_id: str) -> str:
        info = await asyncio.to_thread(self.docker.api.inspect_container, sandbox_id)
        return await self.death_reason(session, sandbox_id, int(info["State"].get("ExitCode", -1)))

    async def sandboxes(self, gateway_id: str) -> list[SandboxState]:
        containers = await asyncio.to_thread(
            self.docker.api.containers, all=True, filters={"label": f"{LABEL_GATEWAY}={gateway_id}"}
        )
        return [
            SandboxState(c["Id"], c["Labels"].get(LABEL_SESSION, "?"), c["State"] == "running")
            for c in containers
        ]

    async def remove(self, session_id: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            await self.remove_sandbox(sandbox_name(session_id))

    async def remove_sandbox(self, sandbox_id: str) -> None:
        await asyncio.to_thread(self.docker.api.remove_container, sandbox_id, force=True)

    async def update_limits(self, sandbox_id: str, limits: Limits) -> None:
        await asyncio.to_thread(update_limits, self.docker, sandbox_id, limits)


def exit_reason(exit_code: int) -> str:
    """A kernel's exit code in words."""
    reason = f"kernel process exited with code {exit_code}"
    if exit_code > 128:
        reason += f" (killed by signal {exit_code - 128})"
    return reason


def oom_reason(limits: Limits) -> str:
    """A kernel killed for want of memory, in words."""
    return f"out of memory: limit {format_size(limits.memory)}"


def make_placement(
    settings: Settings, client: docker.DockerClient, images: ImageBuilder
) -> Placement:
    """The placement the settings name."""
    if settings.placement == "swarm":
        from ..swarm.placement import SwarmPlacement

        return SwarmPlacement(settings, client, images)
    return DockerPlacement(settings, client, images)
