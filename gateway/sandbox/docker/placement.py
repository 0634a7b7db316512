"""The ``docker`` placement: each kernel in a container on this host's engine.

Its workspace is a host directory (a loop-mounted, size-limited filesystem
where the host allows it) under ``sessions_dir``, bind-mounted into the
container next to the kernel's socket directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ...limits import Limits
from ...workspace.rules import Workspace
from .. import volume
from ..base import (
    ENGINE_ERRORS,
    DeathCallback,
    GuardFactory,
    Placement,
    ProvisionerRef,
    SandboxRequest,
    SandboxState,
    exit_reason,
    oom_reason,
    write_secret_files,
)
from ..images import ImageBuilder
from .contexts import ContextSpec
from .events import ContainerWatcher
from .exec import DockerProcess
from .provisioner import (
    CONTAINER_RUN_DIR,
    LABEL_GATEWAY,
    LABEL_SESSION,
    SandboxSpec,
    sandbox_name,
    update_limits,
)
from .tool_servers import LABEL_TOOL_SERVER, ToolServerContainer, start_tool_server

log = logging.getLogger(__name__)

_UP = ("running", "paused")  # a frozen sandbox's processes are all still there


class DockerPlacement(Placement):
    """Kernels in containers on this host's engine, workspaces loop-mounted here."""

    name = "docker"
    resizes_in_place = True
    secret_files = True
    mounts_volumes = True
    adopts_others = True  # containers are found by session, sockets and files by path
    hands_over = True
    freezes = True  # the engine's pause: the cgroup freezer, runc's and runsc's alike

    def __init__(
        self,
        client: docker.DockerClient,
        images: ImageBuilder,
        sessions_dir: Path,
        tmp_size: int,
        max_message: int,
        guard: GuardFactory | None = None,
    ) -> None:
        super().__init__(sessions_dir, tmp_size)
        self.docker = client
        self.max_message = max_message
        self.guard = guard
        self.images = images
        self._watcher: ContainerWatcher | None = None
        self._image_facts: dict[str, dict[str, Any]] = {}

    async def start(
        self, gateway_id: str, on_death: DeathCallback, on_resync: Callable[[], None]
    ) -> None:
        if not volume.loop_mounts_available():
            log.warning(
                "not root: workspaces are plain directories and disk limits are not enforced"
            )
        self._watcher = ContainerWatcher(self.docker, on_death, on_resync)
        self._watcher.start()

    def unavailable(self) -> str | None:
        return self._watcher.lost if self._watcher is not None else None

    async def stop(self) -> None:
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.stop)

    def sandbox(self, request: SandboxRequest, gateway_id: str) -> SandboxSpec:
        session_dir = self.session_dir(request.session_id)
        return SandboxSpec(
            docker=self.docker,
            image=request.image,
            session_id=request.session_id,
            gateway_id=gateway_id,
            limits=request.limits,
            env=request.env,
            run_dir=session_dir / "run",
            workspace=session_dir / "workspace",
            tmp_bytes=self.tmp_bytes(request.limits),
            max_message=self.max_message,
            guard=self.guard,
            user=request.user,
            isolation=request.isolation,
            secret_files=request.secret_files,
            volumes=request.volumes,
        )

    def workspace(self, spec: SandboxSpec, provisioner: ProvisionerRef) -> Workspace:
        uid, gid = spec.uid_gid
        return Workspace(str(spec.workspace), uid, gid)

    async def prepare(self, spec: SandboxSpec) -> None:
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        uid, gid = spec.uid_gid
        await asyncio.to_thread(
            volume.create, self.session_dir(spec.session_id), spec.limits.disk, uid, gid
        )
        if spec.volumes:  # their mount points, made by the path rules: never through a link
            await asyncio.to_thread(_volume_mount_points, self.workspace(spec, lambda: None), spec)
        if spec.secrets_dir is not None:
            await asyncio.to_thread(
                write_secret_files, spec.secrets_dir, spec.secret_files, uid, gid
            )

    def kernel_exchange(self, session_id: str) -> tuple[str, Path]:
        return CONTAINER_RUN_DIR, self.session_dir(session_id) / "run"

    async def reattach(self, session_id: str) -> None:
        """Remount the workspace, should a host reboot have unmounted it."""
        await asyncio.to_thread(volume.mount_again, self.session_dir(session_id))

    async def fill_pooled(self, session_id: str, pooled_id: str, carry: str) -> None:
        here, pooled = self.session_dir(session_id), self.sessions_dir / pooled_id
        await asyncio.to_thread(_fill, here, pooled, carry)

    async def move_in(self, session_id: str, pooled_id: str, sandbox_id: str) -> None:
        """Swap the directories in one ``renameat2`` exchange; rename the container.

        A gateway killed at any point finds the session's directory whole (its
        own, or the filled pooled one with its files and saved state) and the
        other one a leftover. The container keeps its bind mounts across the
        rename.
        """
        here, pooled = self.session_dir(session_id), self.sessions_dir / pooled_id
        await asyncio.to_thread(volume.exchange, here, pooled)
        try:
            await self.remove_directory(pooled_id)  # the session's old one, now under that name
        except OSError as e:  # recovery removes it at the next start
            log.warning("session %s: its old directory is left for later: %s", session_id, e)
        name = sandbox_name(session_id)
        try:
            await self.remove_sandbox(name)  # a container a pause did not get to remove
            await asyncio.to_thread(self.docker.api.rename, sandbox_id, name)
        except ENGINE_ERRORS as e:  # only its name differs: metrics and `docker ps` suffer
            log.warning("session %s: its container keeps its pooled name: %s", session_id, e)

    async def start_process(
        self,
        sandbox_id: str,
        argv: list[str],
        env: Mapping[str, str],
        cwd: str,
        tty: tuple[int, int] | None,
    ) -> DockerProcess:
        return await DockerProcess.start(self.docker, sandbox_id, argv, env, cwd, tty)

    async def start_tool_server(
        self, spec: SandboxSpec, name: str, image: str, argv: list[str], env: Mapping[str, str]
    ) -> ToolServerContainer:
        return await start_tool_server(spec, name, image, argv, env)

    def context_sandbox(
        self,
        spec: SandboxSpec,
        container_id: str,
        context_id: str,
        cwd: str,
        on_exit: Callable[[int], None],
        leftover: bool = False,
    ) -> ContextSpec:
        return ContextSpec.beside(spec, container_id, context_id, cwd, on_exit, leftover)

    async def image_facts(self, image: str, provisioner: ProvisionerRef) -> dict[str, Any]:
        facts = self._image_facts.get(image)
        if facts is None:
            facts = await asyncio.to_thread(self.images.facts, image)
            self._image_facts[image] = facts
        return facts

    async def death_reason(self, limits: Limits, sandbox_id: str, exit_code: int) -> str:
        oom = False
        # The engine may flag the OOM kill a moment after it reports the death.
        for _ in range(5 if exit_code == 137 else 1):
            try:
                info = await asyncio.to_thread(self.docker.api.inspect_container, sandbox_id)
            except ENGINE_ERRORS:  # removed, or the engine went down with it: no OOM flag to read
                break
            oom = bool(info["State"].get("OOMKilled"))
            if oom:
                break
            await asyncio.sleep(0.1)
        return oom_reason(limits) if oom else exit_reason(exit_code)

    async def stopped_reason(self, limits: Limits, sandbox_id: str) -> str:
        info = await asyncio.to_thread(self.docker.api.inspect_container, sandbox_id)
        return await self.death_reason(limits, sandbox_id, int(info["State"].get("ExitCode", -1)))

    async def sandboxes(
        self, gateway_id: str, sessions: Collection[str] = ()
    ) -> list[SandboxState]:
        """This gateway's sandboxes, and those of ``sessions`` (adopted) whoever started them."""
        wanted = set(sessions)
        label = LABEL_SESSION if wanted else f"{LABEL_GATEWAY}={gateway_id}"
        containers = await asyncio.to_thread(
            self.docker.api.containers, all=True, filters={"label": label}
        )
        found = [
            SandboxState(c["Id"], _session_of(c), c["State"] in _UP, c["State"] == "paused")
            for c in containers
        ]
        return [
            s
            for s, c in zip(found, containers, strict=True)
            if c["Labels"].get(LABEL_GATEWAY) == gateway_id or s.session_id in wanted
        ]

    async def remove_tool_servers(self, gateway_id: str, sessions: Collection[str]) -> None:
        servers = await asyncio.to_thread(
            self.docker.api.containers, all=True, filters={"label": LABEL_TOOL_SERVER}
        )
        for c in servers:
            session_id = c["Labels"][LABEL_TOOL_SERVER]
            if session_id in sessions and c["Labels"].get(LABEL_GATEWAY) != gateway_id:
                log.info(
                    "removing session %s's stdio server container of another gateway", session_id
                )
                await self.remove_sandbox(c["Id"])

    async def remove(self, session_id: str) -> None:
        await self.remove_sandbox(sandbox_name(session_id))

    async def remove_sandbox(self, sandbox_id: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            await asyncio.to_thread(self.docker.api.remove_container, sandbox_id, force=True)

    async def usage(self, session_id: str) -> dict[str, float | None]:
        name = sandbox_name(session_id)
        try:
            stats = await asyncio.to_thread(
                self.docker.api.stats, name, stream=False, one_shot=True
            )
            container_id = stats.get("id") or name
        except ENGINE_ERRORS:
            return {}
        memory = stats.get("memory_stats") or {}
        cpu = (stats.get("cpu_stats") or {}).get("cpu_usage", {}).get("total_usage")
        peak = memory.get("max_usage")  # cgroup v1; v2 keeps it in memory.peak
        if peak is None:
            peak = await asyncio.to_thread(_memory_peak, container_id)
        return {
            "cpu_seconds": None if cpu is None else cpu / 1e9,
            "memory_bytes": memory.get("usage"),
            "memory_peak_bytes": peak,
        }

    async def update_limits(self, sandbox_id: str, limits: Limits) -> None:
        await asyncio.to_thread(update_limits, self.docker, sandbox_id, limits)

    # A sandbox frozen or thawed already is done: a crash came between the engine's
    # freeze or thaw and the record saying so.

    async def freeze(self, sandbox_id: str) -> None:
        try:
            await asyncio.to_thread(self.docker.api.pause, sandbox_id)
        except docker.errors.APIError as e:
            if e.status_code != 409 or "already paused" not in str(e.explanation):
                raise

    async def thaw(self, sandbox_id: str) -> None:
        try:
            await asyncio.to_thread(self.docker.api.unpause, sandbox_id)
        except docker.errors.APIError as e:  # not paused: running, or stopped meanwhile
            if e.status_code != 409 or not await self._running(sandbox_id):
                raise

    async def _running(self, sandbox_id: str) -> bool:
        info = await asyncio.to_thread(self.docker.api.inspect_container, sandbox_id)
        return bool(info["State"].get("Running")) and not info["State"].get("Paused")


def _memory_peak(container_id: str) -> int | None:
    """A container's peak memory from cgroup v2's ``memory.peak`` (either driver's layout)."""
    for scope in (f"system.slice/docker-{container_id}.scope", f"docker/{container_id}"):
        with contextlib.suppress(OSError, ValueError):
            return int((Path("/sys/fs/cgroup") / scope / "memory.peak").read_text())
    return None


def _fill(here: Path, pooled: Path, carry: str) -> None:
    """The session's workspace files and ``carry`` directory, put into a pooled directory."""
    volume.copy_tree(here / "workspace", pooled / "workspace")
    kept = here / carry
    if kept.is_dir():
        (pooled / carry).mkdir(mode=0o700)
        with os.scandir(kept) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    os.link(entry.path, pooled / carry / entry.name, follow_symlinks=False)


def _session_of(container: dict[str, Any]) -> str:
    """Its session: by name, which a resume that took it from the pool renamed (labels stay)."""
    names = [n.lstrip("/") for n in container.get("Names") or ()]
    named = next((n for n in names if n.startswith("sbx-")), None)
    return named.removeprefix("sbx-") if named else container["Labels"].get(LABEL_SESSION, "?")


def _volume_mount_points(workspace: Workspace, spec: SandboxSpec) -> None:
    """Each volume mounted on the host (a reboot unmounts them), and its mount point made."""
    for mount in spec.volumes:
        where = Path(mount.source).parent
        volume.mount_again(where)
        if mount.read_only:
            volume.read_only_view(where)
        workspace.make_dir(mount.target)
