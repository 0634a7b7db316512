"""A session's stdio MCP server in a container of its own, hardened as the session's is.

The container is made from the session's sandbox spec (``SandboxSpec.run_kwargs``:
non-root, every capability dropped, no-new-privileges, read-only root, the
session's runtime and seccomp profile, its memory, CPU and pids limits) with
none of its mounts, only small tmpfs for ``/tmp`` and ``/workspace``, no network
whatever the session's, and only the server's own environment. It idles under
the engine's init; the server is exec'd in it (``DockerProcess``: an argv,
never a shell string), so the gateway holds its stdin and stdout. It carries
the gateway's label, so a restarted gateway removes it as a leftover like any
of its sandboxes, and ``sbx.tool-server`` naming its session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from collections.abc import Mapping

import docker
import docker.errors

from ..base import ENGINE_ERRORS
from .exec import WORKDIR, DockerProcess
from .provisioner import LABEL_GATEWAY, SandboxSpec, _create_and_start

log = logging.getLogger(__name__)

LABEL_TOOL_SERVER = "sbx.tool-server"
# Its session's run directory (``<data dir>/sessions/<id>/run``): it mounts nothing that
# says whose data directory it is, and ``sbx gc`` judges it as its session's leftovers.
LABEL_RUN_DIR = "sbx.run-dir"
NAME_PREFIX = "sbxtool-"  # then the session's id: an image's labels may lie, a name does not
IDLE = ["sleep", "infinity"]
# Each server's bounds, below its session's: a session may have four, uncounted by quotas.
MAX_MEMORY = 512 << 20
MAX_CPUS = 1.0
MAX_PIDS = 128


class ToolServerContainer:
    """The server's process and the container it alone runs in."""

    def __init__(self, client: docker.DockerClient, container_id: str) -> None:
        self.client, self.sandbox_id = client, container_id
        self.process: DockerProcess | None = None

    async def read(self) -> tuple[str, bytes] | None:
        assert self.process is not None
        return await self.process.read()

    async def write(self, data: bytes) -> None:
        assert self.process is not None
        await self.process.write(data)

    async def end(self) -> None:
        if self.process is not None:
            self.process.close()
        try:
            await asyncio.to_thread(self.client.api.remove_container, self.sandbox_id, force=True)
        except docker.errors.NotFound:
            pass
        except ENGINE_ERRORS as e:  # the gateway's next start removes it as a leftover
            log.warning("stdio server container %s is left for later: %s", self.sandbox_id, e)


async def start_tool_server(
    spec: SandboxSpec, name: str, image: str, argv: list[str], env: Mapping[str, str]
) -> ToolServerContainer:
    """Start ``argv`` in a new hardened container of ``image`` for ``spec``'s session."""
    limits = dataclasses.replace(
        spec.limits,
        memory=min(spec.limits.memory, MAX_MEMORY),
        cpus=min(spec.limits.cpus, MAX_CPUS),
        pids=min(spec.limits.pids, MAX_PIDS),
    )
    own = dataclasses.replace(spec, image=image, env={}, secret_files={}, volumes=(), limits=limits)
    kwargs = own.run_kwargs(IDLE, {})
    scratch = f"size={min(spec.tmp_bytes, 64 << 20)},mode=1777,nosuid,nodev"
    kwargs.update(
        name=f"{NAME_PREFIX}{spec.session_id}-{name}-{secrets.token_hex(4)}",
        network_mode="none",
        environment={},
        mounts=[],
        working_dir=str(WORKDIR),
        tmpfs={"/tmp": scratch, str(WORKDIR): scratch},
        labels={
            LABEL_GATEWAY: spec.gateway_id,
            LABEL_TOOL_SERVER: spec.session_id,
            LABEL_RUN_DIR: str(spec.run_dir),
        },
    )
    container = await asyncio.to_thread(_create_and_start, spec.docker, kwargs)
    server = ToolServerContainer(spec.docker, container.id)
    try:
        server.process = await DockerProcess.start(spec.docker, container.id, argv, env, "", None)
    except BaseException:
        await server.end()
        raise
    return server
