"""Run a kernel in a locked-down Docker container (jupyter_client provisioner).

The container has no network (with an egress allowlist, only the gateway's
egress network: see gateway.egress), and runs under runc or gVisor
(gateway.sandbox.isolation.runtimes). The kernel binds ZeroMQ ``ipc`` sockets in the session's
run directory, which is bind-mounted into the container, so the gateway
connects to the same Unix sockets and no port is opened. Inside, the directory
is at a short fixed path: some kernels (xeus-based ones) read socket names back
into 32-byte buffers, and the host path is long. The gateway's sockets connect
to the kernel's through a guard each (gateway.execution.transport.guard),
listening in a directory of the gateway's own, so no message over
``max_kernel_message`` reaches libzmq whole; the gateway's own shell and
iopub speak ZMTP to the kernel's sockets themselves, bounded the same way
(``direct_sockets``).
The kernel can write its run directory (it binds sockets there), so nothing
the gateway reads or writes lives in it: jupyter_client's connection file is
beside it, out of the sandbox's reach, and the kernel's copy (naming the
sockets by their path inside) is in a directory mounted read-only. A FIFO, a
link or a huge file planted in the run directory is never opened (issue 18).
The jupyter_client kernel manager drives this class through the standard
provisioner hooks; per-session parameters arrive as ``sandbox=`` keyword
argument of ``start_kernel`` (kept by the manager for restarts).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import Mount
from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import KernelProvisionerBase
from jupyter_core.paths import secure_write

from ...egress.credentials import CA_PATH
from ...errors import EngineUnavailable, ImageNotBuilt
from ...limits import Limits
from .. import volume
from ..base import (
    AS_BATCH,
    SECRETS_MOUNT,
    SECRETS_TMPFS,
    GuardFactory,
    Isolation,
    KernelGuard,
    VolumeMount,
)

LABEL_GATEWAY = "sbx.gateway"
LABEL_SESSION = "sbx.session"
# Where the session's run directory appears in the container, and the
# read-only directory with the connection file that names the sockets by that path.
CONTAINER_RUN_DIR = "/run/sbx"
CONTAINER_KERNEL_DIR = "/run/sbx-kernel"
KERNEL_CONNECTION_FILE = "kernel-connection.json"
BATCH_CLASS = ["/bin/sh", "-c", f'{AS_BATCH}; exec "$@"', "sbx-kernel"]  # then the kernel's argv


def sandbox_name(session_id: str) -> str:
    """The name of a session's sandbox (a container, or a cluster service)."""
    return f"sbx-{session_id}"


@dataclasses.dataclass
class SandboxSpec:
    """Everything that makes one session's container what it is."""

    docker: docker.DockerClient
    image: str
    session_id: str
    gateway_id: str
    limits: Limits
    env: dict[str, str]
    run_dir: Path
    workspace: Path  # host directory mounted at /workspace
    tmp_bytes: int
    max_message: int  # largest kernel message the guards let through (0: no guards)
    guard: GuardFactory | None = None  # the guard put before each kernel socket
    user: str = "1000:1000"
    volumes: tuple[VolumeMount, ...] = ()  # named volumes bound under the workspace
    workdir: str = "/workspace"
    isolation: Isolation = dataclasses.field(default_factory=Isolation)
    secret_files: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    # The kernel's socket names (prefix-port) and its copy of the connection file; a code
    # context's kernel beside it has its own (``contexts.ContextSpec``).
    prefix = "k"
    kernel_connection_name = KERNEL_CONNECTION_FILE

    @property
    def secrets_dir(self) -> Path | None:
        """The host tmpfs directory of the secret files, mounted read-only; None without."""
        return SECRETS_TMPFS / self.session_id if self.secret_files else None

    @property
    def provisioner_class(self) -> type[DockerProvisioner]:
        return DockerProvisioner

    @property
    def connection_file(self) -> Path:
        """jupyter_client's connection file: out of the sandbox's reach, beside the run dir."""
        return self.run_dir.parent / "connection.json"

    @property
    def guard_dir(self) -> Path:
        """Where the guards listen for the gateway's sockets: out of the sandbox's reach."""
        return self.run_dir.parent / "guard"

    @property
    def kernel_dir(self) -> Path:
        """The kernel's copy of the connection file lives here, mounted read-only."""
        return self.run_dir.parent / "kernel"

    @property
    def sockets(self) -> Path:
        """The prefix of the ipc sockets the gateway connects to: the guards', or the kernel's."""
        return (self.guard_dir if self.max_message else self.run_dir) / self.prefix

    def direct_sockets(self, shell_port: int, iopub_port: int) -> tuple[str, str, int] | None:
        """The kernel's own shell and iopub sockets, and the bound on a message, for the
        gateway's channels: they speak ZMTP themselves and bound messages as the guards
        do (gateway.execution.transport.zmtp). None with the guards off: libzmq's sockets then."""
        if not self.max_message:
            return None
        shell, iopub = (
            str(self.run_dir / f"{self.prefix}-{port}") for port in (shell_port, iopub_port)
        )
        return shell, iopub, self.max_message

    def manager_options(self) -> dict[str, Any]:
        """How jupyter_client reaches the kernel: ipc sockets, through guards unless off."""
        return {
            "transport": "ipc",
            "ip": str(self.sockets),
            "connection_file": str(self.connection_file),
        }

    @property
    def uid_gid(self) -> tuple[int, int]:
        uid, _, gid = self.user.partition(":")
        return int(uid), int(gid or uid)

    def run_kwargs(self, cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
        """Arguments for ``containers.run``: the hardening lives here, in one place."""
        limits = self.limits
        isolation = self.isolation
        mounts = [
            Mount(CONTAINER_RUN_DIR, str(self.run_dir), type="bind"),
            Mount(CONTAINER_KERNEL_DIR, str(self.kernel_dir), type="bind", read_only=True),
            Mount(self.workdir, str(self.workspace), type="bind"),
        ]
        # Named volumes after the workspace they sit in, bound as they are on the host:
        # nosuid,nodev, and a read-only one through its read-only view (a read-only bind
        # here would be remounted by the runtime without nosuid and nodev). Without loop
        # mounts that view is the writable directory: the runtime's read-only bind alone.
        by_runtime = not volume.loop_mounts_available()
        mounts += [
            Mount(f"{self.workdir}/{v.target}", v.source, type="bind",
                  read_only=v.read_only and by_runtime)
            for v in self.volumes
        ]  # fmt: skip
        if self.secrets_dir is not None:
            mounts.append(Mount(SECRETS_MOUNT, str(self.secrets_dir), type="bind", read_only=True))
        if isolation.resolv_conf is not None:
            mounts.append(
                Mount("/etc/resolv.conf", str(isolation.resolv_conf), type="bind", read_only=True)
            )
        if isolation.ca_bundle is not None:
            mounts.append(Mount(CA_PATH, str(isolation.ca_bundle), type="bind", read_only=True))
        return {
            "image": self.image,
            "command": [*BATCH_CLASS, *cmd],
            "name": sandbox_name(self.session_id),
            "detach": True,
            "user": self.user,
            "working_dir": self.workdir,
            "environment": {**env, **isolation.env},
            "runtime": isolation.runtime,
            "network_mode": isolation.network,
            "read_only": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"]
            + ([f"seccomp={isolation.seccomp}"] if isolation.seccomp else []),
            "init": True,
            "mem_limit": limits.memory,
            "memswap_limit": limits.memory,
            "nano_cpus": int(limits.cpus * 1e9),
            "pids_limit": limits.pids,
            "ipc_mode": "private",
            "mounts": mounts,
            "tmpfs": {"/tmp": f"size={self.tmp_bytes},mode=1777,nosuid,nodev"},
            "labels": {LABEL_GATEWAY: self.gateway_id, LABEL_SESSION: self.session_id},
        }


def update_limits(client: docker.DockerClient, container_id: str, limits: Limits) -> None:
    """Apply new limits to a running container (a claimed warm-pool sandbox).

    The Engine API updates memory, swap, CPU and pids in place; docker-py's
    ``update_container`` knows no NanoCpus or PidsLimit, so this posts the
    documented body itself.
    """
    body = {
        "Memory": limits.memory,
        "MemorySwap": limits.memory,
        "NanoCpus": int(limits.cpus * 1e9),
        "PidsLimit": limits.pids,
    }
    try:
        engine_post(client.api, f"/containers/{container_id}/update", body)
    except docker.errors.APIError as e:
        raise EngineUnavailable(f"the engine refused new limits: {e.explanation}") from e


def engine_post(api: docker.APIClient, path: str, body: dict[str, Any]) -> Any:
    """POST a raw Engine API body, for fields docker-py's types do not know (pids, caps).

    A refusal raises ``APIError`` whose explanation is the engine's own words.
    """
    response = api.post(f"{api.base_url}/v{api.api_version}{path}", json=body)
    if response.status_code >= 400:
        text = response.text.strip()
        raise docker.errors.APIError(text, response=response, explanation=text)
    return response.json()


class SandboxProvisioner(KernelProvisionerBase):
    """What every placement's provisioner shares: a sandbox id, and how it is kept."""

    container_id: str | None = None  # the sandbox: a container, or a cluster service

    @property
    def has_process(self) -> bool:
        return self.container_id is not None

    def reattach_info(self) -> dict[str, Any]:
        """What a restarted gateway needs besides the connection info (``Kernel.runtime_info``)."""
        return {"container_id": self.container_id}

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        """Take over the sandbox a previous gateway started (``Kernel.adopt`` calls it)."""
        await super().load_provisioner_info(provisioner_info)
        self.container_id = provisioner_info.get("container_id")

    async def let_go(self) -> None:
        """Close what this gateway holds open for the sandbox; the sandbox runs on."""

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return min(recommended, 2.0)


class DockerProvisioner(SandboxProvisioner):
    """Kernel lifecycle hooks mapped onto one Docker container."""

    _client: docker.DockerClient | None = None
    _spec: SandboxSpec | None = None
    _guards: tuple[KernelGuard, ...] = ()

    def use_sandbox(self, spec: SandboxSpec) -> None:
        """Bind to a session's sandbox: on every launch, and when reattaching."""
        self._client = spec.docker
        self._spec = spec

    def reattach_info(self) -> dict[str, Any]:
        """Also where the session's directory is: another gateway on this host may adopt it."""
        assert self._spec is not None
        return {**super().reattach_info(), "session_dir": str(self._spec.run_dir.parent)}

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        await super().load_provisioner_info(provisioner_info)
        # The record may come from a gateway run with the guards the other way.
        assert self._spec is not None
        self.parent.ip = str(self._spec.sockets)
        await self._guard()

    async def _guard(self) -> None:
        """(Re)open a guard per kernel socket: jupyter_client removes their files on shutdown."""
        await self._unguard()
        spec, km = self._spec, self.parent
        assert spec is not None
        if not spec.max_message or spec.guard is None:
            return
        spec.guard_dir.mkdir(mode=0o700, exist_ok=True)
        guards = tuple(
            spec.guard(spec.guard_dir / name, spec.run_dir / name, spec.max_message)
            for name in (f"{spec.prefix}-{port}" for port in km.ports)
        )
        for guard in guards:
            await guard.start()
        self._guards = guards

    async def let_go(self) -> None:
        await self._unguard()

    async def _unguard(self) -> None:
        for guard in self._guards:
            await guard.close()
        self._guards = ()

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Write the connection files (the kernel's read-only); build cmd and env.

        Called by the kernel manager before every (re)start. The gateway's own
        environment is deliberately not passed on: only the kernelspec's env and
        the session's env reach the kernel.
        """
        spec: SandboxSpec = kwargs.pop("sandbox")
        self.use_sandbox(spec)
        km = self.parent
        km.write_connection_file()  # in the session directory: the sandbox cannot reach it
        self.connection_info = km.get_connection_info()
        _write_kernel_connection_file({**self.connection_info, "kernel_name": km.kernel_name}, spec)
        os.chown(spec.run_dir, *spec.uid_gid)  # the kernel binds its sockets there
        await self._guard()
        cmd = [
            arg.replace(km.connection_file, f"{CONTAINER_KERNEL_DIR}/{spec.kernel_connection_name}")
            for arg in km.format_kernel_cmd(extra_arguments=kwargs.pop("extra_arguments", []))
        ]
        env = {**self.kernel_spec.env, **spec.env}
        return {"cmd": cmd, "env": env, "sandbox": spec}

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start the container; the kernel inside binds the ipc sockets."""
        spec: SandboxSpec = kwargs["sandbox"]
        run_kwargs = spec.run_kwargs(cmd, kwargs["env"])
        try:
            container = await asyncio.to_thread(_create_and_start, spec.docker, run_kwargs)
        except docker.errors.ImageNotFound as e:
            name = spec.image.removeprefix("sbx/").split(":")[0]
            raise ImageNotBuilt(
                f"kernel image {spec.image} is not built; run `sbx images build {name}`"
            ) from e
        except docker.errors.DockerException as e:
            raise EngineUnavailable(f"the container engine refused the kernel: {e}") from e
        self.container_id = container.id
        return self.connection_info

    async def _inspect(self) -> dict[str, Any] | None:
        assert self._client is not None and self.container_id is not None
        try:
            return await asyncio.to_thread(self._client.api.inspect_container, self.container_id)
        except docker.errors.NotFound:
            return None

    async def poll(self) -> int | None:
        """Return None while the container runs, else its exit code."""
        if self.container_id is None:
            return 0
        info = await self._inspect()
        if info is None:
            return -1
        return None if info["State"]["Running"] else int(info["State"]["ExitCode"])

    async def wait(self) -> int | None:
        while (status := await self.poll()) is None:  # noqa: ASYNC110 (engine is the truth)
            await asyncio.sleep(0.1)
        return status

    async def send_signal(self, signum: int) -> None:
        """Signal the kernel; the container's init forwards it to the kernel process."""
        if self.container_id is None or signum == 0:
            return
        assert self._client is not None
        try:
            await asyncio.to_thread(self._client.api.kill, self.container_id, signum)
        except docker.errors.APIError:
            pass  # already stopped: nothing left to signal

    async def kill(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGKILL)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)

    async def cleanup(self, restart: bool = False) -> None:
        """Remove the container, so a stopped kernel leaves nothing behind."""
        if not restart:
            await self._unguard()
        if self.container_id is None:
            return
        assert self._client is not None
        try:
            await asyncio.to_thread(
                self._client.api.remove_container, self.container_id, force=True
            )
        except docker.errors.NotFound:
            pass
        self.container_id = None

    async def output_tail(self, lines: int = 20) -> str:
        """The container's last output lines, to say why a start failed."""
        if self.container_id is None or self._client is None:
            return ""
        try:
            raw = await asyncio.to_thread(self._client.api.logs, self.container_id, tail=lines)
        except docker.errors.DockerException:
            return ""
        return raw.decode(errors="replace").strip()


def _create_and_start(client: docker.DockerClient, kwargs: dict[str, Any]) -> Container:
    """Start a container without pulling: an image that is not here was never built.

    A container of this gateway's under the name (a restart racing its old kernel's
    removal; schemathesis found the restart failing) is removed first, once; anyone
    else's keeps the name, and the create's conflict is the answer.
    """
    try:
        container = client.containers.create(**kwargs)
    except docker.errors.APIError as e:
        if e.status_code != 409 or not _remove_own(client, kwargs["name"], kwargs["labels"]):
            raise
        container = client.containers.create(**kwargs)
    try:
        container.start()
    except docker.errors.DockerException:
        container.remove(force=True)
        raise
    return container


def _remove_own(client: docker.DockerClient, name: str, labels: dict[str, str]) -> bool:
    """Remove the container called ``name`` if it carries ``labels`` (the same session of the
    same gateway); whether it did."""
    try:
        found = client.containers.get(name)
    except docker.errors.NotFound:
        return True  # gone meanwhile: the name is free
    if any(found.labels.get(k) != v for k, v in labels.items()):
        return False
    found.remove(force=True)
    return True


def _write_kernel_connection_file(info: dict[str, Any], spec: SandboxSpec) -> None:
    """Write the kernel's copy of the connection info: the same sockets, seen from inside.

    Made from the manager's own values, never read back from a file; its
    directory is root's and mounted read-only, so the kernel can neither plant
    a link there nor change what it is given.
    """
    info = {
        **info,
        "key": info["key"].decode(),
        "ip": f"{CONTAINER_RUN_DIR}/{Path(info['ip']).name}",
    }
    spec.kernel_dir.mkdir(mode=0o755, exist_ok=True)
    path = spec.kernel_dir / spec.kernel_connection_name
    with secure_write(str(path)) as f:  # it holds the session's key
        json.dump(info, f)
    os.chown(path, *spec.uid_gid)
