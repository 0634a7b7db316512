"""A real multi-node Docker Swarm on this machine, and the gateway deployed on it.

``scripts/cluster up`` starts a manager and two workers (each a Docker engine
in its own network namespace) and the registry; the kernel and gateway images
are pushed there with ``sbx images push``; the gateway is deployed from
``deploy/swarm-stack.yml`` on the manager, kernels constrained to the workers.
Everything is removed at the end (``scripts/cluster down``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MANAGER_SOCKET = "/run/sbxc/m1/docker.sock"
MANAGER_IP = "10.213.0.10"
PORT = 18765
WORKERS = ("w1", "w2")
LOCK = "/run/sbx-cluster.lock"


def sh(*cmd: str, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    """Run a setup command; fail the tests with its output if it fails."""
    result = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    if result.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


@dataclass
class Cluster:
    """The deployed gateway and the manager's engine, as a test sees them."""

    url: str
    token: str
    manager: docker.DockerClient

    @property
    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, timeout=180, headers={"Authorization": f"Bearer {self.token}"}
        )

    def ws_url(self, path: str, **query: str) -> str:
        extra = "".join(f"&{k}={v}" for k, v in query.items())
        return self.url.replace("http://", "ws://") + f"{path}?token={self.token}{extra}"

    def node_of(self, session_id: str) -> str | None:
        """The host name of the node running the session's kernel task."""
        tasks = self.manager.api.tasks(filters={"service": f"sbx-{session_id}"})
        running = [t for t in tasks if t["Status"]["State"] == "running"]
        if not running:
            return None
        return self.manager.api.inspect_node(running[0]["NodeID"])["Description"]["Hostname"]

    def gateway_log(self, lines: int = 60) -> str:
        try:
            raw = self.manager.api.service_logs("sbx_gateway", stdout=True, stderr=True, tail=lines)
            return b"".join(raw).decode(errors="replace")
        except docker.errors.DockerException as e:
            return f"(no gateway log: {e})"

    def wait_ready(self, timeout: float = 300) -> None:
        """Until the gateway answers and its warm pool is full (the pool pulls the image)."""
        deadline = time.monotonic() + timeout
        last = ""
        with self.client as api:
            while time.monotonic() < deadline:
                try:
                    r = api.get("/healthz")
                    last = r.text
                    if r.status_code == 200 and r.json()["pool_ready"].get("python3") == 2:
                        return
                except (httpx.HTTPError, ValueError) as e:
                    last = repr(e)
                time.sleep(1)
        pytest.fail(f"the gateway was not ready in {timeout} s: {last}\n{self.gateway_log()}")


_failed: list[str] = []


@pytest.fixture(scope="module")  # torn down as soon as the cluster tests are done
def cluster() -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.fail("the cluster tests need root: they start Docker engines in namespaces")
    if _failed:  # pytest retries a failed fixture for every test: once is enough
        pytest.fail(f"the cluster could not be set up: {_failed[0]}")
    # One test cluster per machine: a second run (another engineer's) waits its turn.
    lock = open(LOCK, "w")  # held until the session ends
    fcntl.flock(lock, fcntl.LOCK_EX)
    token = secrets.token_urlsafe(16)
    try:
        sh("scripts/cluster", "up", str(len(WORKERS)), timeout=180)
        sh(
            "scripts/cluster", "deploy", timeout=1800,
            env={"SBX_TOKEN": token, "SBX_PORT": str(PORT), "SBX_LOG_LEVEL": "debug"},
        )  # fmt: skip
        cluster = Cluster(
            url=f"http://{MANAGER_IP}:{PORT}",
            token=token,
            manager=docker.DockerClient(base_url=f"unix://{MANAGER_SOCKET}"),
        )
        cluster.wait_ready()
    except BaseException as e:
        _failed.append(str(e).splitlines()[0] if str(e) else repr(e))
        subprocess.run(["scripts/cluster", "down"], cwd=ROOT, timeout=180, check=False)
        lock.close()
        raise
    try:
        yield cluster
    finally:
        subprocess.run(["scripts/cluster", "down"], cwd=ROOT, timeout=180, check=False)
        lock.close()


@pytest.fixture
def api(cluster: Cluster) -> Iterator[httpx.Client]:
    with cluster.client as client:
        yield client


REPLICATED_STACK = "sbxr"
MESH_PORT = 18766  # the routing mesh's stand-in (mesh_relay.py), published on the manager
MESH = "sbx-mesh"


@dataclass
class Replicated(Cluster):
    """A second deployment: the gateway as two replicas on the cluster's PostgreSQL."""

    database_url: str = ""

    def tasks(self) -> list[dict]:
        tasks = self.manager.api.tasks(filters={"service": f"{REPLICATED_STACK}_gateway"})
        return [t for t in tasks if t["Status"]["State"] == "running"]

    def owner(self, session_id: str) -> tuple[str, str]:
        """The gateway holding the session's lease, and where it answers its peers."""
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as db:
            row = db.execute(
                "SELECT owner, address FROM leases JOIN gateways ON gateways.id = owner"
                " WHERE session_id = %s",
                (session_id,),
            ).fetchone()
        assert row is not None, f"no lease on session {session_id}"
        return row[0], row[1]

    def container_at(self, address: str) -> str:
        """The gateway task container answering at ``address`` (http://ip:port)."""
        ip = address.split("//")[1].rpartition(":")[0]
        for task in self.tasks():
            for attachment in task.get("NetworksAttachments") or []:
                if any(a.partition("/")[0] == ip for a in attachment["Addresses"]):
                    return task["Status"]["ContainerStatus"]["ContainerID"]
        raise AssertionError(f"no running gateway task at {address}")

    def wait_ready(self, timeout: float = 300) -> None:
        """Until both replicas run, and the mesh reaches one that answers."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                if len(self.tasks()) == 2:
                    with self.client as api:
                        r = api.get("/healthz")
                        last = r.text
                        if r.status_code == 200:
                            return
            except (httpx.HTTPError, docker.errors.DockerException) as e:
                last = repr(e)
            time.sleep(1)
        pytest.fail(f"the replicated gateway was not ready in {timeout} s: {last}")


@pytest.fixture(scope="module")
def replicated(cluster: Cluster) -> Iterator[Replicated]:
    """Two gateway replicas (deploy/swarm-stack.yml, stack sbxr) behind the mesh's stand-in.

    This machine's kernel has no IPVS, so Swarm's routing mesh (ingress) cannot
    balance here: the stack is published in ingress mode all the same, and
    clients reach it through ``mesh_relay.py``, which spreads connections over
    the service's live tasks as the mesh would.
    """
    sh(
        "scripts/cluster", "deploy", REPLICATED_STACK, timeout=1800,
        env={"SBX_TOKEN": cluster.token, "SBX_PORT": str(MESH_PORT + 1), "SBX_POOL": "",
             "SBX_GATEWAY_REPLICAS": "2", "SBX_PUBLISH_MODE": "ingress",
             "SBX_LOG_LEVEL": "debug"},
    )  # fmt: skip
    env = dict(
        line.split("=", 1) for line in sh("scripts/cluster", "env").splitlines() if "=" in line
    )
    image = cluster.manager.api.inspect_service(f"{REPLICATED_STACK}_gateway")["Spec"][
        "TaskTemplate"
    ]["ContainerSpec"]["Image"]
    with contextlib.suppress(docker.errors.NotFound):
        cluster.manager.api.remove_container(MESH, force=True)
    cluster.manager.containers.run(
        image,
        ["-c", (ROOT / "tests/cluster/mesh_relay.py").read_text(),
         f"tasks.{REPLICATED_STACK}_gateway", "8765"],
        entrypoint="python3", name=MESH, network="sbx-front", detach=True,
        ports={"8765/tcp": MESH_PORT},
    )  # fmt: skip
    deployment = Replicated(
        url=f"http://{MANAGER_IP}:{MESH_PORT}",
        token=cluster.token,
        manager=cluster.manager,
        database_url=env["SBXC_DATABASE_URL"],
    )
    deployment.wait_ready()
    yield deployment
    with contextlib.suppress(docker.errors.DockerException):
        cluster.manager.api.remove_container(MESH, force=True)
        cluster.manager.api.remove_service(f"{REPLICATED_STACK}_gateway")
