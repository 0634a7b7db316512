"""Which container runtime runs a session's kernel: runc, or gVisor.

gVisor (``runsc``) puts a user-space kernel between sandboxed code and the
host's: the code's system calls are served by gVisor and never reach the host
kernel directly, so a kernel exploit has far less to aim at. It costs start
time and system-call speed (docs/PERFORMANCE.md). Users name runtimes by what
they mean; the engine knows them by the names scripts/setup-gvisor registers
in /etc/docker/daemon.json: ``runsc`` without a network of its own, and
``runsc-net`` (gVisor passing sockets to the container's network namespace)
for kernels on the egress network.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import docker
import docker.errors

from ...errors import BadRequest, EngineUnavailable, LimitExceeded, NotAllowed, RuntimeUnavailable


@dataclasses.dataclass(frozen=True)
class EngineRuntimes:
    """The engine's runtime names for one runtime: without and with a network."""

    isolated: str
    networked: str


RUNTIMES = {
    "runc": EngineRuntimes("runc", "runc"),
    "gvisor": EngineRuntimes("runsc", "runsc-net"),
}
# gVisor's own host threads and ptrace stubs count against the pids limit: below
# this its kernel does not even start (measured: 64 fails, 96 starts).
GVISOR_MIN_PIDS = 128


class Runtimes:
    """Picks a session's runtime and checks the engine has it."""

    def __init__(self, allowed: Sequence[str], default: str, client: docker.DockerClient) -> None:
        self.allowed = list(allowed)
        self.default = default
        self.client = client
        self._engine: set[str] = set()
        # One question to the engine at a time: a restart adopting thousands of
        # sessions at once asked it once each.
        self._asking = asyncio.Lock()

    def choose(self, requested: Any, sandbox: dict[str, Any]) -> str:
        """The runtime for a create request; the kernelspec's ``runtimes`` narrows the server's."""
        kernel_allows = sandbox.get("runtimes") or list(RUNTIMES)
        allowed = [name for name in self.allowed if name in kernel_allows]
        if requested is None:
            if self.default in allowed:
                return self.default
            if not allowed:
                raise NotAllowed("no runtime this server offers may run this kernel")
            return allowed[0]
        if not isinstance(requested, str) or requested not in RUNTIMES:
            raise BadRequest(f"runtime must be one of {', '.join(RUNTIMES)}, not {requested!r}")
        if requested not in allowed:
            raise NotAllowed(
                f"runtime {requested!r} is not allowed for this kernel on this server; "
                f"allowed: {', '.join(allowed) or 'none'}"
            )
        return requested

    @staticmethod
    def check_limits(runtime: str, pids: int) -> None:
        """Refuse limits a runtime cannot start under, with what to ask for instead."""
        if runtime == "gvisor" and pids < GVISOR_MIN_PIDS:
            raise LimitExceeded(
                f"limit pids = {pids} is too low for runtime gvisor, whose own threads count "
                f"against it; ask for at least {GVISOR_MIN_PIDS}"
            )

    async def engine_name(self, runtime: str, networked: bool) -> str:
        """The engine's name for ``runtime``; a clear error when it is not installed."""
        names = RUNTIMES[runtime]
        name = names.networked if networked else names.isolated
        if name not in self._engine:
            async with self._asking:
                if name not in self._engine:  # it may have been added since
                    self._engine = await self._engine_runtimes()
        if name not in self._engine:
            raise RuntimeUnavailable(
                f"runtime {runtime!r} is allowed but the Docker engine has no {name!r} runtime; "
                "an operator must run scripts/setup-gvisor (as root), or ask for runtime 'runc'"
            )
        return name

    async def _engine_runtimes(self) -> set[str]:
        try:
            info = await asyncio.to_thread(self.client.info)
        except docker.errors.DockerException as e:
            raise EngineUnavailable(f"the container engine did not answer: {e}") from e
        return set(info.get("Runtimes") or {})
