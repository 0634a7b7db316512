"""A code context's kernel: a second kernel in a session's running container.

It is started with ``docker exec`` (``exec.DockerProcess``) in the session's
container, so it runs as the same non-root user, in the same cgroup (memory,
CPU, pids), with the same capabilities, seccomp profile, read-only root and
network as the session's own kernel; nothing runs on the host. Its ZeroMQ
``ipc`` sockets are in the same run directory under a prefix of its own
(``c-<context id>``), its connection files are beside the session's (the
gateway's out of the sandbox's reach, the kernel's copy in the read-only
kernel directory), and the gateway reaches them through guards of their own,
as it reaches the session's kernel. The exec's output is drained as it comes
(a kernel that writes to a full pipe would hang) and its end is reported.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import re
import signal
from collections.abc import Callable
from typing import Any

import docker.errors
from jupyter_client.connect import KernelConnectionInfo

from ...errors import Conflict, EngineUnavailable
from ..base import ENGINE_ERRORS
from .exec import DockerProcess
from .provisioner import DockerProvisioner, SandboxSpec

log = logging.getLogger(__name__)

_TAIL_LINES = 20  # of a context kernel's output, kept to say why it did not start
_LINE_MAX = 500


@dataclasses.dataclass
class ContextSpec(SandboxSpec):
    """A session's sandbox spec, for one more kernel beside its own."""

    context_id: str = ""
    container_id: str = ""  # the session's running container
    cwd: str = ""  # relative to the workspace
    on_exit: Callable[[int], None] | None = None  # hears the kernel stop on its own
    leftover: bool = False  # a previous gateway's kernel of this context may still run

    @classmethod
    def beside(
        cls,
        spec: SandboxSpec,
        container_id: str,
        context_id: str,
        cwd: str,
        on_exit: Callable[[int], None],
        leftover: bool,
    ) -> ContextSpec:
        fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(SandboxSpec)}
        return cls(
            **fields,
            context_id=context_id,
            container_id=container_id,
            cwd=cwd,
            on_exit=on_exit,
            leftover=leftover,
        )

    @property
    def prefix(self) -> str:  # type: ignore[override]
        return f"c-{self.context_id}"

    @property
    def kernel_connection_name(self) -> str:  # type: ignore[override]
        return f"context-{self.context_id}.json"

    @property
    def connection_file(self):  # type: ignore[override]
        return self.run_dir.parent / f"context-{self.context_id}.json"

    @property
    def provisioner_class(self) -> type[ContextProvisioner]:  # type: ignore[override]
        return ContextProvisioner


class ContextProvisioner(DockerProvisioner):
    """Kernel lifecycle hooks mapped onto one process exec'd in a running container."""

    process: DockerProcess | None = None
    exit_code: int | None = None
    _drain: asyncio.Task | None = None
    _ending = False  # stopped by the gateway: not news for ``on_exit``
    _tail: collections.deque[str] = collections.deque()  # its last output lines

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        spec: ContextSpec = kwargs["sandbox"]
        self.exit_code, self._ending = None, False
        self._tail = collections.deque(maxlen=_TAIL_LINES)
        try:
            if spec.leftover:
                await _end_leftover(spec)
            process = await DockerProcess.start(
                spec.docker, spec.container_id, cmd, kwargs["env"], spec.cwd, None
            )
        except docker.errors.NotFound as e:
            raise Conflict("the session's sandbox is gone; restart the session") from e
        except ENGINE_ERRORS as e:
            if "is not running" in str(getattr(e, "explanation", "") or ""):  # ended, or killed
                raise Conflict(
                    "the session's sandbox is not running (it ended, or its processes were "
                    "killed); restart the session, or create another"
                ) from e
            raise EngineUnavailable(f"the container engine refused the kernel: {e}") from e
        self.process, self.container_id = process, spec.container_id
        self._drain = asyncio.get_running_loop().create_task(self._follow(process, spec))
        return self.connection_info

    async def _follow(self, process: DockerProcess, spec: ContextSpec) -> None:
        """Read the kernel's output until it ends (kept: its last lines), then say so."""
        while (chunk := await process.read()) is not None:
            text = chunk[1].decode(errors="replace")
            self._tail.extend(line[:_LINE_MAX] for line in text.splitlines())
        try:
            code = await process.wait()
        except ENGINE_ERRORS:  # the container went with it
            code = -1
        process.close()
        if self.process is process:
            self.exit_code = code
            if not self._ending and spec.on_exit is not None:
                spec.on_exit(code)

    async def poll(self) -> int | None:
        if self.process is None:
            return 0
        return self.exit_code

    async def send_signal(self, signum: int) -> None:
        """Signal the kernel and what it started, as the sandbox's user (``DockerProcess``)."""
        if self.process is None or self.exit_code is not None or signum == 0:
            return
        with contextlib.suppress(*ENGINE_ERRORS):  # the container is gone: nothing to signal
            await self.process.signal(signum)

    async def kill(self, restart: bool = False) -> None:
        self._ending = True
        await self.send_signal(signal.SIGKILL)

    async def terminate(self, restart: bool = False) -> None:
        self._ending = True
        await self.send_signal(signal.SIGTERM)

    async def cleanup(self, restart: bool = False) -> None:
        """Stop the kernel if it runs; its guards and the kernel's copy of its connection file
        go too. The container is the session's: it stays."""
        await self.kill()
        if self._drain is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await asyncio.shield(self._drain)
        await self._unguard()
        spec = self._spec
        if spec is not None:
            with contextlib.suppress(FileNotFoundError):
                (spec.kernel_dir / spec.kernel_connection_name).unlink()
        self.process = self.container_id = None

    async def let_go(self) -> None:
        """The gateway stops; the kernel is left to the container's end (or its next start)."""
        self._ending = True
        if self.process is not None:
            self.process.close()
        await super().let_go()

    async def output_tail(self, lines: int = 20) -> str:
        return "\n".join(list(self._tail)[-lines:])


async def _end_leftover(spec: ContextSpec) -> None:
    """End the kernel a previous gateway process ran for this context, if it still runs: the
    processes naming its connection file, as the sandbox's user (its own processes only)."""
    if not re.fullmatch(r"[0-9a-f]{1,32}", spec.context_id):
        return
    name = spec.kernel_connection_name
    script = (
        'for d in /proc/[0-9]*; do [ "${d#/proc/}" = "$$" ] && continue; '
        "case \"$(tr '\\0' ' ' < \"$d/cmdline\" 2>/dev/null)\" in "
        f'*{name}*) kill -9 "${{d#/proc/}}" 2>/dev/null;; esac; done; true'
    )
    process = await DockerProcess.start(
        spec.docker, spec.container_id, ["/bin/sh", "-c", script], {}, "", None
    )
    try:
        while await process.read() is not None:
            pass
    finally:
        process.close()
