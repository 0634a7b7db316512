"""How strongly a session's kernel is walled in: its runtime and its network.

The one place the session manager asks about either: validating a create
request's ``runtime`` and ``network``, preparing the container's ``Isolation``
before a (re)start, and letting go when the session ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import docker

from ..docker.provisioner import Isolation
from ..egress import Egress, NetworkPolicy
from .runtimes import RUNTIMES, Runtimes

if TYPE_CHECKING:
    from ...config import Settings

__all__ = ["Isolation", "IsolationManager", "NetworkPolicy", "baseline_isolation"]


def baseline_isolation(runtime: str) -> Isolation:
    """The isolation of a session not yet prepared: its runtime, no network.

    A kernel restarted before ``prepare`` (say, after a gateway restart) never
    falls back to a weaker runtime, and gets no network rather than the wrong one.
    """
    return Isolation(runtime=RUNTIMES[runtime].isolated)


class IsolationManager:
    """Runtimes and egress for sessions, behind three calls."""

    def __init__(self, settings: Settings, client: docker.DockerClient) -> None:
        self.runtimes = Runtimes(settings, client)
        self.egress = Egress(settings, client)
        self.seccomp = settings.seccomp_profile.json

    def choose(self, request: dict[str, Any], sandbox: dict[str, Any]) -> tuple[str, NetworkPolicy]:
        """The runtime and network policy a create request asks for, validated."""
        return (
            self.runtimes.choose(request.get("runtime"), sandbox),
            self.egress.policy(request.get("network")),
        )

    async def prepare(
        self, session_id: str, runtime: str, policy: NetworkPolicy, pids: int
    ) -> Isolation:
        """What the session's container needs; clear errors when the host cannot give it."""
        self.runtimes.check_limits(runtime, pids)
        engine_runtime = await self.runtimes.engine_name(runtime, networked=not policy.is_none)
        network = await self.egress.admit(session_id, policy)
        return Isolation(
            runtime=engine_runtime,
            network=network.mode,
            env=network.env,
            resolv_conf=network.resolv_conf,
            seccomp=self.seccomp if runtime == "runc" else None,
        )

    def release(self, session_id: str) -> None:
        """Called when a session ends: its egress credentials stop working."""
        self.egress.release(session_id)

    async def stop(self) -> None:
        await self.egress.stop()
