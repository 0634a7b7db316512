"""Kernels across a Docker Swarm: the ``swarm`` placement.

Each session's kernel is a one-task service (``swarm.provisioner``) that the
Swarm scheduler puts on the node with the fewest tasks, so sessions (and the
warm pool) spread over the nodes. The gateway talks to one manager's engine
API only; it never reaches a worker's engine. What it learns about
sandboxes it cannot reach comes from the manager: one poll of nodes and tasks
every ``swarm_poll_interval`` seconds finds a node lost (its tasks' sessions
die with that reason) and a task that ended without its kernel reporting it
(the agent's container killed or removed). Kernel deaths inside a running
sandbox (out of memory, a crash) the agent reports at once.

Any gateway of a deployment (the service's replicas, on one shared store)
can take over another's sessions: kernels are reached over TCP on the
overlay, sandboxes admit every replica (``tasks.<service>``), and the
workspace is the agent's, so nothing of a session lives on the gateway's
host. An adopted service keeps its first gateway's label; the adopter
follows it by session.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import ipaddress
import logging
import socket
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import docker
import docker.errors
import psutil
import zmq.asyncio

from ...errors import ConfigError
from ...limits import Limits
from ...tasks import end_task
from ..base import (
    DeathCallback,
    Placement,
    ProvisionerRef,
    SandboxRequest,
    SandboxState,
    exit_reason,
)
from ..docker.provisioner import LABEL_GATEWAY, LABEL_SESSION, sandbox_name
from ..images import ImageBuilder
from .provisioner import AGENT_DIR, SwarmSpec
from .workspace import RemoteWorkspace

log = logging.getLogger(__name__)

_PACKAGE = Path(__file__).resolve().parent.parent.parent
# The agent and the gateway code it runs, shipped to every sandbox as Swarm configs.
AGENT_FILES = {
    "agent.py": _PACKAGE / "sandbox" / "inside" / "agent.py",
    "gateway/__init__.py": None,
    "gateway/workspace/__init__.py": None,
    "gateway/errors.py": _PACKAGE / "errors.py",
    "gateway/timestamps.py": _PACKAGE / "timestamps.py",
    "gateway/workspace/rules.py": _PACKAGE / "workspace" / "rules.py",
}
_ENDED = ("complete", "failed", "shutdown", "rejected", "orphaned", "remove")
_NODE_LOST = ("down", "unknown", "disconnected")


@dataclasses.dataclass(frozen=True)
class SwarmOptions:
    """The swarm placement's settings, as values."""

    network: str  # the attachable internal overlay kernels listen on
    registry: str = ""  # where the nodes pull images from; empty: already on every node
    constraints: tuple[str, ...] = ()
    poll_interval: float = 1.0


class SwarmPlacement(Placement):
    """Sessions' kernels as Swarm services on any node, reached over the kernel overlay."""

    name = "swarm"
    resizes_in_place = False  # a service update replaces the task, and so the kernel
    adopts_others = True  # kernels over the overlay, files through the agent

    def __init__(
        self,
        client: docker.DockerClient,
        images: ImageBuilder,
        sessions_dir: Path,
        options: SwarmOptions,
        tmp_size: int,
        context: zmq.asyncio.Context,
    ) -> None:
        super().__init__(sessions_dir, tmp_size)
        self.docker = client
        self.images = images
        self.options = options
        self.context = context
        self._configs: list[dict[str, Any]] = []
        self._subnets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self._gateway_name = ""
        self._reasons: dict[str, str] = {}  # by service id: why it died, once known
        self._reported: set[str] = set()  # task ids whose end was reported
        self._gateway_id = ""
        self._on_death: DeathCallback | None = None
        self._poller: asyncio.Task | None = None
        self._addresses: dict[str, str] = {}  # the gateway's own, by network name
        self._followed: set[str] = set()  # sessions taken over: their services are another's

    # -- watching ----------------------------------------------------------------------

    async def start(
        self, gateway_id: str, on_death: DeathCallback, on_resync: Callable[[], None]
    ) -> None:
        """Check the manager and the network, ship the agent, and watch nodes and tasks.

        Its poll reads the tasks' state each round, so nothing needs a resync.
        """
        self._gateway_id, self._on_death = gateway_id, on_death
        try:
            info = await asyncio.to_thread(self.docker.info)
            network = await asyncio.to_thread(self.docker.api.inspect_network, self.options.network)
        except docker.errors.NotFound:
            raise ConfigError(
                f"there is no network {self.options.network!r}: create it on a manager "
                "with `docker network create --driver overlay --attachable --internal "
                f"{self.options.network}` (docs/SCALING.md)"
            ) from None
        if not info.get("Swarm", {}).get("ControlAvailable"):
            raise ConfigError(
                "placement swarm needs a swarm manager's engine API; this engine is not one"
            )
        if network.get("Driver") != "overlay" or not network.get("Internal"):
            log.warning(
                "network %s is not an internal overlay: kernels could reach beyond the cluster",
                self.options.network,
            )
        self._subnets = [
            ipaddress.ip_network(c["Subnet"])
            for c in network.get("IPAM", {}).get("Config") or []
            if c.get("Subnet")
        ]
        self._gateway_name = await asyncio.to_thread(self._own_service)
        self._configs = await asyncio.to_thread(self._agent_configs)
        self._poller = asyncio.create_task(self._poll_forever(), name="sbx-swarm-watch")

    async def stop(self) -> None:
        await end_task(self._poller)

    def _own_service(self) -> str:
        """The name that resolves to this gateway's tasks on the kernel network.

        Sandboxes admit connections from those addresses only; a restarted
        gateway is a new task with a new address, under the same name.
        """
        try:
            container = self.docker.api.inspect_container(socket.gethostname())
            service = container["Config"]["Labels"]["com.docker.swarm.service.name"]
            networks = container["NetworkSettings"]["Networks"] or {}
        except (docker.errors.DockerException, KeyError):
            raise ConfigError(
                "placement swarm needs the gateway to run as a Swarm service on the kernel "
                "network (deploy/swarm-stack.yml), so sandboxes know whom to admit"
            ) from None
        self._addresses = {
            name: n["IPAddress"] for name, n in networks.items() if n.get("IPAddress")
        }
        return f"tasks.{service}"

    def address_on(self, network: str) -> str:
        """This gateway task's address on ``network``: what its replicas reach it at."""
        if network not in self._addresses:
            raise ConfigError(
                f"advertise_network {network!r}: the gateway's container is not on it "
                f"(it is on {', '.join(sorted(self._addresses)) or 'no network'}); "
                "attach the service to it (deploy/swarm-stack.yml)"
            )
        return self._addresses[network]

    def adoptable(self, runtime: dict[str, Any] | None) -> bool:
        """Always: nothing of a session is on the gateway's host (its kernel is a service)."""
        return True

    def api_hosts(self, host: str) -> list[str]:
        """For a wildcard ``host``, every address of the gateway's but its kernel-network ones.

        Kernels share that network: an API listening there would be theirs to call.
        """
        if host not in ("", "0.0.0.0"):
            return [host]
        # psutil comes with ipykernel, which the gateway depends on.
        return [
            address.address
            for addresses in psutil.net_if_addrs().values()
            for address in addresses
            if address.family == socket.AF_INET
            and not any(ipaddress.ip_address(address.address) in n for n in self._subnets)
        ]

    def _agent_configs(self) -> list[dict[str, Any]]:
        """Config references of the agent's files, made once per content (named by its hash)."""
        contents = {
            target: path.read_bytes() if path else b'"""Shipped to sandboxes."""\n'
            for target, path in AGENT_FILES.items()
        }
        digest = hashlib.sha256(b"".join(contents.values())).hexdigest()[:12]
        configs = self.docker.api.configs(filters={"label": "sbx.agent"})
        for old in configs:  # an earlier version's, once no sandbox uses it
            if old["Spec"]["Labels"]["sbx.agent"] != digest:
                with contextlib.suppress(docker.errors.APIError):
                    self.docker.api.remove_config(old["ID"])
        existing = {c["Spec"]["Name"]: c["ID"] for c in configs}
        references = []
        for index, (target, content) in enumerate(contents.items()):
            name = f"sbx-agent-{digest}-{index}"
            if name not in existing:
                existing[name] = self.docker.api.create_config(
                    name, content, labels={"sbx.agent": digest}
                )["ID"]
            references.append(
                {
                    "ConfigID": existing[name],
                    "ConfigName": name,
                    "File": {
                        "Name": f"{AGENT_DIR}/{target}",
                        "UID": "0",
                        "GID": "0",
                        "Mode": 0o444,
                    },
                }
            )
        return references

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self.poll()
            except docker.errors.DockerException as e:
                log.warning("could not ask the swarm manager about tasks (%s); will retry", e)
            await asyncio.sleep(self.options.poll_interval)

    async def poll(self) -> None:
        """Report every task of ours (or adopted) that ended, or whose node was lost, once."""
        api = self.docker.api
        label = LABEL_SESSION if self._followed else f"{LABEL_GATEWAY}={self._gateway_id}"
        nodes, services, tasks = await asyncio.gather(
            asyncio.to_thread(api.nodes),
            asyncio.to_thread(api.services, filters={"label": label}),
            asyncio.to_thread(api.tasks, filters={"label": label}),
        )
        services = [s for s in services if self._ours(s["Spec"]["Labels"])]
        lost = {
            n["ID"]: n.get("Description", {}).get("Hostname", n["ID"][:12])
            for n in nodes
            if n.get("Status", {}).get("State") in _NODE_LOST
        }
        sessions = {s["ID"]: s["Spec"]["Labels"].get(LABEL_SESSION) for s in services}
        for task in _latest(tasks):
            service_id, task_id = task["ServiceID"], task["ID"]
            session_id = sessions.get(service_id)
            if session_id is None or task_id in self._reported:
                continue
            status = task.get("Status", {})
            if task.get("NodeID") in lost and status.get("State") not in _ENDED:
                host = lost[task["NodeID"]]
                reason = f"node {host} was lost: its engine stopped answering the swarm"
                exit_code = -1
            elif status.get("State") in _ENDED and task.get("DesiredState") == "running":
                exit_code = int(status.get("ContainerStatus", {}).get("ExitCode", -1))
                reason = f"its sandbox stopped: {status.get('Err') or exit_reason(exit_code)}"
            else:
                continue
            self._reported.add(task_id)
            self._reasons[service_id] = reason
            assert self._on_death is not None
            self._on_death(session_id, service_id, exit_code)

    def _ours(self, labels: dict[str, str]) -> bool:
        return (
            labels.get(LABEL_GATEWAY) == self._gateway_id
            or labels.get(LABEL_SESSION) in self._followed
        )

    def report(self, session_id: str, service_id: str, exit_code: int, reason: str) -> None:
        """A kernel death the agent reported (out of memory, a crash)."""
        self._reasons[service_id] = reason
        if self._on_death is not None:
            self._on_death(session_id, service_id, exit_code)

    # -- sandboxes ---------------------------------------------------------------------

    def sandbox(self, request: SandboxRequest, gateway_id: str) -> SwarmSpec:
        o = self.options
        return SwarmSpec(
            docker=self.docker,
            context=self.context,
            image=f"{o.registry}/{request.image}" if o.registry else request.image,
            session_id=request.session_id,
            gateway_id=gateway_id,
            limits=request.limits,
            env=request.env,
            network=o.network,
            gateway=self._gateway_name,
            constraints=list(o.constraints),
            agent_configs=self._configs,
            tmp_bytes=self.tmp_bytes(request.limits),
            on_death=self.report,
            connection_file=str(self.session_dir(request.session_id) / "connection.json"),
            # Pulling the image onto a new node takes a while.
            start_timeout=max(request.start_timeout, 120.0),
            user=request.user,
        )

    def workspace(self, spec: SwarmSpec, provisioner: ProvisionerRef) -> RemoteWorkspace:
        return RemoteWorkspace("/workspace", agent=lambda: provisioner().agent)

    async def prepare(self, spec: SwarmSpec) -> None:
        """The session's directory here: jupyter_client keeps the connection file in it."""
        Path(spec.connection_file).parent.mkdir(mode=0o700, parents=True, exist_ok=True)

    async def reattach(self, session_id: str) -> None:
        """Follow the session's service whoever started it; give it a directory here.

        A kernel restart writes the connection file again, and an adopted
        session's directory was on the gateway that started it.
        """
        self._followed.add(session_id)
        self.session_dir(session_id).mkdir(mode=0o700, parents=True, exist_ok=True)

    async def image_facts(self, image: str, provisioner: ProvisionerRef) -> dict[str, Any]:
        """The image digest Swarm pinned the service to, and the packages the agent reads."""
        running = provisioner()
        packages, _ = await running.agent.call("facts")
        service = await asyncio.to_thread(self.docker.api.inspect_service, running.container_id)
        pinned = service["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"]
        return {"digest": pinned.partition("@")[2] or pinned, "packages": packages}

    async def death_reason(self, limits: Limits, sandbox_id: str, exit_code: int) -> str:
        return self._reasons.pop(sandbox_id, None) or exit_reason(exit_code)

    async def stopped_reason(self, limits: Limits, sandbox_id: str) -> str:
        tasks = await asyncio.to_thread(self.docker.api.tasks, filters={"service": sandbox_id})
        latest = _latest(tasks)
        if not latest:
            return "its task is gone"
        status = latest[0].get("Status", {})
        return f"its sandbox stopped: {status.get('Err') or status.get('State')}"

    async def sandboxes(
        self, gateway_id: str, sessions: Collection[str] = ()
    ) -> list[SandboxState]:
        """This gateway's services, and those of ``sessions`` whoever started them."""
        wanted = set(sessions)
        label = LABEL_SESSION if wanted else f"{LABEL_GATEWAY}={gateway_id}"
        api = self.docker.api
        services, tasks, nodes = await asyncio.gather(
            asyncio.to_thread(api.services, filters={"label": label}),
            asyncio.to_thread(api.tasks, filters={"label": label}),
            asyncio.to_thread(api.nodes),
        )
        up = {n["ID"] for n in nodes if n.get("Status", {}).get("State") == "ready"}
        running = {
            t["ServiceID"]
            for t in _latest(tasks)
            if t.get("Status", {}).get("State") == "running" and t.get("NodeID") in up
        }
        return [
            SandboxState(s["ID"], s["Spec"]["Labels"].get(LABEL_SESSION, "?"), s["ID"] in running)
            for s in services
            if s["Spec"]["Labels"].get(LABEL_GATEWAY) == gateway_id
            or s["Spec"]["Labels"].get(LABEL_SESSION) in wanted
        ]

    async def remove(self, session_id: str) -> None:
        self._followed.discard(session_id)
        with contextlib.suppress(docker.errors.NotFound):
            await self.remove_sandbox(sandbox_name(session_id))

    async def remove_sandbox(self, sandbox_id: str) -> None:
        api = self.docker.api
        with contextlib.suppress(docker.errors.NotFound):
            service = await asyncio.to_thread(api.inspect_service, sandbox_id)
            await asyncio.to_thread(api.remove_service, service["ID"])
            session_id = service["Spec"]["Labels"].get(LABEL_SESSION)
            for secret in await asyncio.to_thread(
                api.secrets, filters={"label": f"{LABEL_SESSION}={session_id}"}
            ):
                with contextlib.suppress(docker.errors.APIError):
                    await asyncio.to_thread(api.remove_secret, secret["ID"])


def _latest(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each service's newest task (one-task services keep their ended ones for a while)."""
    newest: dict[str, dict[str, Any]] = {}
    for task in tasks:
        seen = newest.get(task["ServiceID"])
        if seen is None or task["CreatedAt"] > seen["CreatedAt"]:
            newest[task["ServiceID"]] = task
    return list(newest.values())
