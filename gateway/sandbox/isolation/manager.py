"""How strongly a session's kernel is walled in: its runtime and its network.

The one place the session manager asks about either: validating a create
request's ``runtime`` and ``network``, preparing the container's ``Isolation``
before a (re)start, and letting go when the session ends.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import docker

from ...egress import Brokering, Egress, EgressOptions, NetworkPolicy
from ...egress.credentials import Credential
from ..base import Isolation
from .runtimes import RUNTIMES, Runtimes

__all__ = [
    "Isolation",
    "IsolationManager",
    "IsolationOptions",
    "NetworkPolicy",
    "baseline_isolation",
]


@dataclasses.dataclass(frozen=True)
class IsolationOptions:
    """The isolation settings, as values."""

    runtimes: tuple[str, ...] = ("runc", "gvisor")
    default_runtime: str = "runc"
    seccomp: str | None = None  # runc kernels' profile JSON; None: the engine's default
    egress: EgressOptions = dataclasses.field(default_factory=EgressOptions)


def baseline_isolation(runtime: str) -> Isolation:
    """The isolation of a session not yet prepared: its runtime, no network.

    A kernel restarted before ``prepare`` (say, after a gateway restart) never
    falls back to a weaker runtime, and gets no network rather than the wrong one.
    """
    return Isolation(runtime=RUNTIMES[runtime].isolated)


class IsolationManager:
    """Runtimes and egress for sessions, behind three calls."""

    def __init__(self, options: IsolationOptions, client: docker.DockerClient) -> None:
        self.runtimes = Runtimes(options.runtimes, options.default_runtime, client)
        self.egress = Egress(options.egress, client)
        self.seccomp = options.seccomp

    def choose(
        self,
        runtime: str | None,
        network: NetworkPolicy,
        sandbox: dict[str, Any],
        credentials: tuple[Credential, ...] = (),
    ) -> tuple[str, NetworkPolicy]:
        """The runtime and network policy a create request asks for, checked against offers."""
        return self.runtimes.choose(runtime, sandbox), self.egress.check(network, credentials)

    async def prepare(
        self,
        session_id: str,
        runtime: str,
        policy: NetworkPolicy,
        pids: int,
        brokering: Brokering | None = None,
    ) -> Isolation:
        """What the session's container needs; clear errors when the host cannot give it."""
        self.runtimes.check_limits(runtime, pids)
        engine_runtime = await self.runtimes.engine_name(runtime, networked=not policy.is_none)
        network = await self.egress.admit(session_id, policy, brokering)
        return Isolation(
            runtime=engine_runtime,
            network=network.mode,
            env=network.env,
            resolv_conf=network.resolv_conf,
            ca_bundle=network.ca_bundle,
            seccomp=self.seccomp if runtime == "runc" else None,
        )

    def release(self, session_id: str) -> None:
        """Called when a session ends: its egress credentials stop working."""
        self.egress.release(session_id)

    async def stop(self) -> None:
        await self.egress.stop()
