"""Run a kernel as a one-task Docker Swarm service, on any node of a cluster (provisioner).

The Unix-socket transport of the local provisioner cannot cross hosts: a
cluster kernel is reached over TCP on an attachable, internal overlay network
that only kernels and the gateway's container join, behind CurveZMQ (the
kernel's keypair in its connection file, jupyter_client's convention) and the
session's HMAC key; the sandbox admits connections from the gateway's
addresses only (the agent's doorman). The service's main program is the sandbox agent
(``agent.py``, shipped as Swarm configs), which starts the kernel process from
the arguments the gateway sends it; the connection file reaches it as a Swarm
secret, which only the node running the task ever receives. The agent
signals and restarts the kernel in place (the workspace, an anonymous volume
removed with the task, survives a restart) and reports its death.

A task the agent cannot answer for (its node lost, its container gone) is
found by ``gateway.sandbox.swarm.placement``, which watches nodes and tasks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import signal
from collections.abc import Callable
from typing import Any

import docker
import docker.errors
import zmq
import zmq.asyncio
from jupyter_client.connect import KernelConnectionInfo

from ...errors import (
    EngineUnavailable,
    GatewayError,
    ImageNotBuilt,
    KernelStartFailed,
    NotAllowed,
    SandboxUnavailable,
)
from ...limits import Limits
from ..base import exit_reason, oom_reason
from ..docker.provisioner import (
    BATCH_CLASS,
    LABEL_GATEWAY,
    LABEL_SESSION,
    SandboxProvisioner,
    engine_post,
    sandbox_name,
)
from .agent_client import AgentClient

log = logging.getLogger(__name__)

AGENT_DIR = "/opt/sbx-agent"
SECRET_TARGET = "sbx-session"
AGENT_PORT = 50000
KERNEL_PORTS = {
    "shell_port": 50001,
    "iopub_port": 50002,
    "stdin_port": 50003,
    "control_port": 50004,
    "hb_port": 50005,
}
# Short waits where a lost node would otherwise hold up a shutdown or restart.
QUICK = 3.0

# session id, service id, exit code, reason in words
DeathReport = Callable[[str, str, int, str], None]


@dataclasses.dataclass
class SwarmSpec:
    """Everything that makes one session's service what it is."""

    docker: docker.DockerClient  # a manager's engine
    context: zmq.asyncio.Context
    image: str  # as the nodes pull it: registry/repository:tag
    session_id: str
    gateway_id: str
    limits: Limits
    env: dict[str, str]
    network: str
    gateway: str  # resolves, on the kernel network, to the gateway's addresses there
    constraints: list[str]
    agent_configs: list[dict[str, Any]]  # ConfigReferences of the agent's files
    tmp_bytes: int
    on_death: DeathReport
    connection_file: str  # jupyter_client writes it after launch; it holds the keys
    start_timeout: float = 120.0  # pulling the image onto a new node takes a while
    user: str = "1000:1000"

    @property
    def name(self) -> str:
        return sandbox_name(self.session_id)

    @property
    def provisioner_class(self) -> type[SwarmProvisioner]:
        return SwarmProvisioner

    def manager_options(self) -> dict[str, Any]:
        """How jupyter_client reaches the kernel: TCP to the service's name on the overlay."""
        return {"transport": "tcp", "ip": self.name, "connection_file": self.connection_file}

    def service_spec(self, image: str, secret_id: str, secret_name: str) -> dict[str, Any]:
        """The service: the hardening that Swarm can express lives here, in one place.

        Not expressible in a service (docs/SCALING.md says how each is made up
        for): a runtime per service, no-new-privileges, a seccomp profile other
        than the engine's, swap = memory, a size limit on the workspace volume.
        """
        limits = self.limits
        labels = {LABEL_GATEWAY: self.gateway_id, LABEL_SESSION: self.session_id}
        uid, _, gid = self.user.partition(":")
        return {
            "Name": self.name,
            "Labels": labels,
            "TaskTemplate": {
                "ContainerSpec": {
                    "Image": image,
                    "Args": [
                        *BATCH_CLASS,
                        "python",
                        f"{AGENT_DIR}/agent.py",
                        f"/run/secrets/{SECRET_TARGET}",
                    ],
                    "Labels": labels,
                    "User": self.user,
                    "Dir": "/workspace",
                    "Init": True,
                    "ReadOnly": True,
                    "CapabilityDrop": ["ALL"],
                    # No IPv6 even on an overlay made with --ipv6: the walls are IPv4's.
                    "Sysctls": {"net.ipv6.conf.all.disable_ipv6": "1"},
                    "Mounts": [
                        {"Type": "volume", "Target": "/workspace"},  # removed with the task
                        {
                            "Type": "tmpfs",
                            "Target": "/tmp",
                            "TmpfsOptions": {"SizeBytes": self.tmp_bytes, "Mode": 0o1777},
                        },
                    ],
                    "Secrets": [
                        {
                            "SecretID": secret_id,
                            "SecretName": secret_name,
                            "File": {
                                "Name": SECRET_TARGET,
                                "UID": uid,
                                "GID": gid or uid,
                                "Mode": 0o400,
                            },
                        }
                    ],
                    "Configs": self.agent_configs,
                    "StopGracePeriod": int(2e9),
                },
                "Resources": {
                    "Limits": {
                        "NanoCPUs": int(limits.cpus * 1e9),
                        "MemoryBytes": limits.memory,
                        "Pids": limits.pids,
                    },
                    # Memory is reserved, so a node never holds more sessions than it can keep.
                    "Reservations": {"MemoryBytes": limits.memory},
                },
                "RestartPolicy": {"Condition": "none"},
                "Placement": {"Constraints": self.constraints},
                "Networks": [{"Target": self.network}],
            },
            "EndpointSpec": {"Mode": "dnsrr"},  # the name resolves to the task itself
        }


class SwarmProvisioner(SandboxProvisioner):
    """Kernel lifecycle hooks mapped onto one Swarm service and the agent in its task."""

    secret_id: str | None = None
    generation = 0
    exit_code: int | None = None
    _spec: SwarmSpec | None = None
    _agent: AgentClient | None = None
    _watch: asyncio.Task | None = None
    _stopping = False

    def use_sandbox(self, spec: SwarmSpec) -> None:
        """Bind to a session's sandbox: on every launch, and when reattaching."""
        self._spec = spec

    @property
    def agent(self) -> AgentClient:
        if self._agent is None:
            assert self._spec is not None
            info = self.connection_info
            key = info["key"]
            self._agent = AgentClient(
                self._spec.context,
                f"tcp://{info['ip']}:{AGENT_PORT}",
                {**info, "key": key.decode() if isinstance(key, bytes) else key},
            )
        return self._agent

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Fix the kernel's address, ports and keys; build its command and env.

        Called by the kernel manager before every (re)start. Only the
        kernelspec's env and the session's env reach the kernel.
        """
        spec: SwarmSpec = kwargs.pop("sandbox")
        self.use_sandbox(spec)
        if "curve" not in self.kernel_spec.metadata.get("supported_encryption", []):
            raise NotAllowed(
                f"kernel {self.kernel_spec.display_name!r} cannot run in the cluster: it does "
                "not support CurveZMQ transport encryption; choose another kernel"
            )
        km = self.parent
        for name, port in KERNEL_PORTS.items():
            setattr(km, name, port)
        if km.curve_publickey is None:
            km.curve_publickey, km.curve_secretkey = zmq.curve_keypair()
        self.connection_info = km.get_connection_info()
        cmd = [
            arg.replace(km.connection_file, "{connection_file}")
            for arg in km.format_kernel_cmd(extra_arguments=kwargs.pop("extra_arguments", []))
        ]
        env = {**self.kernel_spec.env, **spec.env}
        return {"cmd": cmd, "env": env, "sandbox": spec}

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start the kernel: in its running sandbox if it answers, else in a new service."""
        spec: SwarmSpec = kwargs["sandbox"]
        env = kwargs["env"]
        if self.container_id is None or not await self._answers():
            await self._replace_service(spec)
            await self._locate(spec)
        result = await self._start(cmd, env, spec)
        self.generation, self.exit_code, self._stopping = result["generation"], None, False
        self._watch = asyncio.create_task(self._watch_exit(self.generation))
        return self.connection_info

    async def _answers(self) -> bool:
        try:
            status, _ = await self.agent.call("status", timeout=QUICK)
        except GatewayError:
            return False
        return isinstance(status, dict)

    async def _replace_service(self, spec: SwarmSpec) -> None:
        """A new service (and secret) for the session; an old one's workspace goes with it."""
        if self.container_id is not None:
            await self._remove_service()
        secret = {
            "agent_port": AGENT_PORT,
            "disk": spec.limits.disk,
            "gateway": spec.gateway,  # the only peer the sandbox's ports admit
            "connection": {**self.connection_info, "key": self.connection_info["key"].decode()},
        }
        secret_name = f"{spec.name}-{self.generation + 1}"
        api = spec.docker.api
        image = await self._pinned(spec)
        try:
            created = await asyncio.to_thread(
                engine_post, api, "/secrets/create",
                {"Name": secret_name,
                 "Labels": {LABEL_GATEWAY: spec.gateway_id, LABEL_SESSION: spec.session_id},
                 "Data": base64.b64encode(json.dumps(secret).encode()).decode()},
            )  # fmt: skip
            self.secret_id = created["ID"]
            service = await asyncio.to_thread(
                engine_post,
                api,
                "/services/create",
                spec.service_spec(image, self.secret_id, secret_name),
            )
        except docker.errors.DockerException as e:
            raise EngineUnavailable(f"the swarm manager refused the kernel's service: {e}") from e
        self.container_id = service["ID"]

    @staticmethod
    async def _pinned(spec: SwarmSpec) -> str:
        """The image by its registry digest, so every node runs exactly the same one."""
        try:
            found = await asyncio.to_thread(spec.docker.api.inspect_distribution, spec.image)
        except docker.errors.DockerException as e:
            name = spec.image.rpartition("/")[2].partition(":")[0]
            raise ImageNotBuilt(
                f"the cluster's nodes cannot pull kernel image {spec.image} ({e}); build and "
                f"push it: `sbx images build {name} && sbx images push {name}`"
            ) from e
        return f"{spec.image}@{found['Descriptor']['digest']}"

    async def _locate(self, spec: SwarmSpec) -> None:
        """Wait for the task to run, and talk to it by its address on the kernel network.

        Names would do, but ZeroMQ resolves them on every reconnect in its one
        I/O thread: a vanished task's name, left to time out in the resolver,
        would stall every session's traffic.
        """
        address = await self._until(spec, lambda: self._task_address(spec), "not placed in time")
        self.parent.ip = self.connection_info["ip"] = address
        if self._agent is not None:
            self._agent.close()
            self._agent = None

    async def _start(self, cmd: list[str], env: dict[str, str], spec: SwarmSpec) -> dict[str, Any]:
        """Start the kernel once the agent answers (its task may still be pulling the image).

        Only idempotent probes are repeated: requests sent before the task runs
        queue up and all arrive once it does.
        """
        await self._until(spec, self._answers, "no answer in time")
        result, _ = await self.agent.call("start", {"argv": cmd, "env": env})
        return result

    async def _until(self, spec: SwarmSpec, probe: Callable[[], Any], late: str) -> Any:
        """``probe()``'s first true answer, unless Swarm says the task failed, or time is up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spec.start_timeout
        while not (found := await probe()):
            failure = _task_failure(await self._tasks(spec))
            if failure or loop.time() > deadline:
                raise KernelStartFailed(f"the kernel's task did not start: {failure or late}")
            await asyncio.sleep(0.25)
        return found

    async def _tasks(self, spec: SwarmSpec) -> list[dict[str, Any]]:
        try:
            return await asyncio.to_thread(
                spec.docker.api.tasks, filters={"service": self.container_id}
            )
        except docker.errors.DockerException:
            return []

    async def _task_address(self, spec: SwarmSpec) -> str | None:
        for task in await self._tasks(spec):
            if task.get("Status", {}).get("State") != "running":
                continue
            for attachment in task.get("NetworksAttachments") or []:
                if attachment["Network"]["Spec"]["Name"] == spec.network:
                    return attachment["Addresses"][0].partition("/")[0]
        return None

    async def _watch_exit(self, generation: int) -> None:
        """Wait for this generation's kernel to exit; report it unless we stopped it."""
        spec = self._spec
        assert spec is not None and self.container_id is not None
        while True:
            try:
                result, _ = await self.agent.call("wait", {"generation": generation}, timeout=3600)
                break
            except SandboxUnavailable:
                continue  # a long wait times out; a lost node is the watcher's to find
            except GatewayError:
                return
        self.exit_code = int(result["exit_code"])
        if self._stopping or generation != self.generation:
            return
        spec.on_death(
            spec.session_id, self.container_id, self.exit_code, self._reason(result, spec.limits)
        )

    @staticmethod
    def _reason(result: dict[str, Any], limits: Limits) -> str:
        if result.get("oom"):
            return oom_reason(limits)
        return exit_reason(int(result["exit_code"]))

    async def poll(self) -> int | None:
        """None while the kernel runs (as the agent last said), else its exit code."""
        if self.container_id is None:
            return 0
        return self.exit_code

    async def wait(self) -> int | None:
        """The exit code: jupyter_client asks only once it found the kernel stopped."""
        return await self.poll()

    async def send_signal(self, signum: int) -> None:
        """Signal the kernel process through the agent (no engine of that node is reachable)."""
        if self.container_id is None or signum == 0:
            return
        with contextlib.suppress(GatewayError):
            await self.agent.call("signal", {"signum": signum}, timeout=QUICK)

    async def kill(self, restart: bool = False) -> None:
        """Stop the kernel process; its sandbox stays for a restart or for cleanup."""
        self._stopping = True
        if self.container_id is None:
            return
        try:
            await self.agent.call("stop", timeout=QUICK)
        except GatewayError:
            pass  # a lost sandbox: nothing left to stop
        self.exit_code = -int(signal.SIGKILL) if self.exit_code is None else self.exit_code

    async def terminate(self, restart: bool = False) -> None:
        await self.kill(restart)

    async def cleanup(self, restart: bool = False) -> None:
        """Remove the service (and with it the container and workspace) unless restarting."""
        if self._watch is not None:
            self._watch.cancel()
        if restart or self.container_id is None:
            return
        await self._remove_service()
        if self._agent is not None:
            self._agent.close()
            self._agent = None

    async def _remove_service(self) -> None:
        assert self._spec is not None
        api = self._spec.docker.api
        with contextlib.suppress(docker.errors.NotFound):
            await asyncio.to_thread(api.remove_service, self.container_id)
        if self.secret_id is not None:
            with contextlib.suppress(docker.errors.APIError):
                await asyncio.to_thread(api.remove_secret, self.secret_id)
        self.container_id = self.secret_id = None

    async def output_tail(self, lines: int = 20) -> str:
        """The service's last output lines (from whichever node ran it), to say why it failed."""
        if self.container_id is None or self._spec is None:
            return ""
        api = self._spec.docker.api
        try:
            raw = await asyncio.to_thread(
                api.service_logs, self.container_id, stdout=True, stderr=True, tail=lines
            )
            text = b"".join(raw) if not isinstance(raw, bytes) else raw
        except docker.errors.DockerException:
            return ""
        return text.decode(errors="replace").strip()

    def reattach_info(self) -> dict[str, Any]:
        return {**super().reattach_info(), "secret_id": self.secret_id}

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        """Take over a kernel a previous gateway started; watch its current generation."""
        await super().load_provisioner_info(provisioner_info)
        self.secret_id = provisioner_info.get("secret_id")
        if isinstance(self.connection_info.get("key"), str):
            self.connection_info["key"] = self.connection_info["key"].encode()
        if self.container_id is not None:
            with contextlib.suppress(GatewayError):
                status, _ = await self.agent.call("status", timeout=QUICK)
                self.generation = int(status["generation"])
                if not status["running"]:
                    self.exit_code = -1
            self._watch = asyncio.create_task(self._watch_exit(self.generation))


def _task_failure(tasks: list[dict[str, Any]]) -> str | None:
    """Why a service's task cannot run, when Swarm says so (its image, its container)."""
    for task in tasks:
        status = task.get("Status", {})
        if status.get("State") in ("failed", "rejected", "shutdown", "orphaned"):
            return status.get("Err") or status.get("State")
    return None  # pending ("no suitable node") may still fit once a session ends
