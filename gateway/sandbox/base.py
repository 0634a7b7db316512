"""The sandbox interface: what the sessions layer asks of wherever kernels run.

A ``Placement`` receives plain values (a ``SandboxRequest``: image, limits,
env, isolation) and answers with a provisioner spec, a workspace and facts; it
knows no session and no kernel client. ``DockerPlacement``
(``sandbox.docker``) runs each kernel in a container on this host's engine;
``SwarmPlacement`` (``sandbox.swarm``) runs each as a one-task service on any
node of a Docker Swarm. Like jupyter_client's provisioner hooks, each method
says who calls it.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import os
import shutil
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

import docker.errors
import requests.exceptions

from ..errors import ConfigError, NotSupported
from ..limits import Limits, format_size
from ..nofollow import DIR_FLAGS, write_file
from ..workspace.rules import Workspace
from . import volume

# Host tmpfs under which sandboxes' secret files live (never on disk), one directory each.
SECRETS_TMPFS = Path("/dev/shm/sbx-secrets")
SECRETS_MOUNT = "/run/secrets"  # where a sandbox sees them, read-only
# Sandbox processes run as batch work (SCHED_BATCH; a shell runs this, then execs
# the program, which passes the class on to every process and thread it starts):
# a sandbox thread that wakes waits for the running task's turn to end instead of
# taking the CPU from it at once, so sandboxes stop preempting the one gateway
# process that serves every session (at 20 busy sessions, from 1.2 preemptions of
# the gateway per execute to 0.8, and less CPU per execute on every side:
# docs/PERFORMANCE.md). Where the class cannot be set (gVisor answers EINVAL, an
# image without chrt) the program runs as before; images need /bin/sh.
AS_BATCH = "chrt --batch --pid 0 $$ 2>/dev/null"

# Called on the loop when a sandbox stops: (session id, sandbox id, exit code).
DeathCallback = Callable[[str, str, int], None]


class KernelGuard(Protocol):
    """A relay in front of one kernel socket that no oversized message gets past.

    The kernel transport's (``execution.transport.guard.MessageGuard``);
    ``app`` hands the class to the placement that needs one.
    """

    async def start(self) -> None: ...

    async def close(self) -> None: ...


# Where the gateway connects, the kernel's socket, the largest message: a guard.
GuardFactory = Callable[[Path, Path, int], KernelGuard]

# What the Docker SDK raises when the engine does not answer, or breaks off: its
# own errors, and the connection errors of the HTTP library under it.
ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


@dataclasses.dataclass(frozen=True)
class Isolation:
    """The engine runtime and network a kernel's sandbox gets (``isolation.manager`` picks)."""

    runtime: str = "runc"  # the engine's name: runc, runsc, runsc-net
    network: str = "none"  # "none", or the egress network's name
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # proxy settings
    resolv_conf: Path | None = None  # replaces the engine's resolver config
    ca_bundle: Path | None = None  # the authorities it trusts, its session's among them
    seccomp: str | None = None  # a profile's JSON instead of the engine's default


@dataclasses.dataclass(frozen=True)
class SandboxState:
    """One sandbox of this gateway as the engine lists it, for recovery."""

    id: str
    session_id: str
    running: bool
    frozen: bool = False  # running, its processes stopped where they are (``freeze``)


@dataclasses.dataclass(frozen=True)
class VolumeMount:
    """A named volume's mounted filesystem on the host, bound at a directory of the workspace."""

    volume_id: str
    name: str
    source: str  # the host directory its filesystem is mounted at
    target: str  # relative to the workspace, already checked: no '..', not absolute
    read_only: bool = False


@dataclasses.dataclass(frozen=True)
class SandboxRequest:
    """What one session's sandbox is made of, as the sessions layer asks for it."""

    session_id: str
    image: str
    limits: Limits
    env: dict[str, str]
    isolation: Isolation
    user: str  # uid:gid the kernel runs as (the kernelspec's sandbox.user)
    start_timeout: float  # seconds the kernel may take to answer
    # Sealed secrets given as files in SECRETS_MOUNT, by name (not in env).
    secret_files: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    volumes: tuple[VolumeMount, ...] = ()  # named volumes bound under the workspace


# Hands a placement the kernel's provisioner once it exists (a swarm workspace
# and its image facts are reached through the sandbox's agent).
ProvisionerRef = Callable[[], Any]


class SandboxProcess(Protocol):
    """A command running in a sandbox (``Placement.start_process``)."""

    pid: int  # inside the sandbox

    async def read(self) -> tuple[str, bytes] | None:
        """The next output as (stdout | stderr | pty, bytes); None once it has ended."""
        ...

    async def write(self, data: bytes) -> None: ...

    async def close_stdin(self) -> None: ...

    async def signal(self, signum: int) -> None: ...

    async def resize(self, rows: int, cols: int) -> None: ...

    async def wait(self) -> int:
        """Its exit code, once its output has ended."""
        ...

    def close(self) -> None: ...


class ToolServerProcess(Protocol):
    """A stdio MCP server in a sandbox of its own (``Placement.start_tool_server``)."""

    sandbox_id: str  # its session's pause freezes and thaws it (``freeze``, ``thaw``)

    async def read(self) -> tuple[str, bytes] | None:
        """The next output as (stdout | stderr, bytes); None once it has ended."""
        ...

    async def write(self, data: bytes) -> None: ...

    async def end(self) -> None:
        """Stop the server and remove its sandbox."""
        ...


class Placement(abc.ABC):
    """Where kernels run: one interface, an implementation per backend."""

    name = ""
    # Whether a running sandbox's limits can change in place (a warm-pool claim needs it).
    resizes_in_place = False
    # Whether secrets can be given as files on a tmpfs (the host's, bind-mounted).
    secret_files = False
    # Whether named volumes (this host's loop-mounted filesystems) can be bound in.
    mounts_volumes = False
    # Whether a session another gateway started can be adopted (failover; ``adoptable``).
    adopts_others = False
    # Whether a running sandbox can be handed to another session (``move_in``).
    hands_over = False
    # Whether a sandbox can be frozen in place (memory kept, no CPU): a pause's first tier.
    freezes = False

    def __init__(self, sessions_dir: Path, tmp_size: int) -> None:
        self.sessions_dir = sessions_dir  # one directory per session on this host
        self.tmp_size = tmp_size
        self._homes: dict[str, Path] = {}  # adopted sessions' directories, under another's

    def session_dir(self, session_id: str) -> Path:
        """A session's directory: here, or under the gateway that started it, if adopted."""
        return self._homes.get(session_id) or self.sessions_dir / session_id

    def adopt_directory(self, session_id: str, directory: Path) -> None:
        """Keep an adopted session's directory where its first gateway made it (same host)."""
        self._homes[session_id] = directory

    def tmp_bytes(self, limits: Limits) -> int:
        """A sandbox's /tmp size: the setting, but at most a quarter of its memory."""
        return min(self.tmp_size, limits.memory // 4)

    @abc.abstractmethod
    async def start(
        self, gateway_id: str, on_death: DeathCallback, on_resync: Callable[[], None]
    ) -> None:
        """Begin reporting sandbox deaths as ``on_death(session, sandbox, exit_code)``.

        ``on_resync()`` says deaths may have gone unreported (the engine was
        unreachable); the caller then compares ``sandboxes()`` with its own.
        The session manager calls it once, before recovery.
        """

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop watching; the session manager calls it last on shutdown."""

    def unavailable(self) -> str | None:
        """Why no sandbox can be started now (the engine is down), or None.

        Creates check it first, so they fail fast with 503; /healthz reports it.
        """
        return None

    def api_hosts(self, host: str) -> list[str]:
        """The addresses the gateway's API listens on, for the ``host`` setting.

        The gateway asks once, after ``start``: a placement whose sandboxes
        share a network with the gateway keeps the API off that network.
        """
        return [host]

    def address_on(self, network: str) -> str:
        """The gateway's own address on ``network`` (``advertise_network``), after ``start``."""
        raise ConfigError(
            f"the {self.name} placement cannot tell the gateway's address on a network"
        )

    def adoptable(self, runtime: dict[str, Any] | None) -> bool:
        """Whether this gateway can take over a dead gateway's session (its runtime info).

        Only where ``adopts_others``; by default, when the session's directory
        (and so its kernel's sockets and files) is on this host.
        """
        directory = (runtime or {}).get("session_dir")
        return bool(directory) and os.path.isdir(directory)

    @abc.abstractmethod
    def sandbox(self, request: SandboxRequest, gateway_id: str) -> Any:
        """The provisioner spec for ``request`` (what the kernel's provisioner runs)."""

    @abc.abstractmethod
    def workspace(self, spec: Any, provisioner: ProvisionerRef) -> Workspace:
        """How the gateway reaches the sandbox's files."""

    @abc.abstractmethod
    async def prepare(self, spec: Any) -> None:
        """Make what must exist before the kernel starts; called before each first start."""

    def kernel_exchange(self, session_id: str) -> tuple[str, Path] | None:
        """A directory the kernel can write and this host can read: its path inside, and here.

        Pausing passes a kernel's saved state through it; a placement without
        one (the kernel's files are on another node) cannot pause.
        """
        return None

    async def reattach(self, session_id: str) -> None:  # noqa: B027 (optional: most keep nothing)
        """Restore what a gateway restart undid on this host; recovery calls it per session."""

    async def fill_pooled(self, session_id: str, pooled_id: str, carry: str) -> None:
        """Copy a paused session's files, and link its ``carry`` directory, into a pooled one's.

        Only where ``hands_over``; ``move_in`` then swaps the directories.
        Raises ``OSError`` or ``ValueError`` when the files cannot be copied.
        """
        raise NotSupported(f"the {self.name} placement cannot hand a sandbox over")

    async def move_in(self, session_id: str, pooled_id: str, sandbox_id: str) -> None:
        """Make the filled pooled sandbox ``sandbox_id`` the session's: its directory and name."""
        raise NotSupported(f"the {self.name} placement cannot hand a sandbox over")

    async def start_process(
        self,
        sandbox_id: str,
        argv: list[str],
        env: Mapping[str, str],
        cwd: str,
        tty: tuple[int, int] | None,
    ) -> SandboxProcess:
        """Run a command in a running sandbox beside its kernel; ``Commands`` calls it.

        ``cwd`` is relative to the workspace; ``tty`` a terminal's (rows, cols), or None.
        """
        raise NotSupported(
            f"commands are not offered by the {self.name} placement yet; run them from the "
            "kernel instead (subprocess in run_code), or on a gateway with the docker placement"
        )

    async def start_tool_server(
        self, spec: Any, name: str, image: str, argv: list[str], env: Mapping[str, str]
    ) -> ToolServerProcess:
        """Start a session's stdio MCP server ``name`` in a sandbox of its own, hardened as
        ``spec`` (the session's) is but with no network, none of its mounts and ``image``;
        ``argv`` runs there with only ``env``. ``SessionTools`` calls it."""
        raise NotSupported(
            f"stdio MCP servers are not offered by the {self.name} placement; serve the "
            "server over streamable HTTP and give its url"
        )

    async def remove_tool_servers(  # noqa: B027 (a placement that starts none has none)
        self, gateway_id: str, sessions: Collection[str]
    ) -> None:
        """Remove the stdio server sandboxes of ``sessions`` that another gateway started.

        Recovery calls it for the sessions it takes over, before their tools can start
        servers here: nothing reaches a dead gateway's, which would run on for nobody.
        """

    def context_sandbox(
        self,
        spec: Any,
        container_id: str,
        context_id: str,
        cwd: str,
        on_exit: Callable[[int], None],
        leftover: bool = False,
    ) -> Any:
        """The provisioner spec of one more kernel in a session's running sandbox (a code context).

        ``spec`` is the session's own: the kernel runs beside its kernel, as the
        same user under the same limits, its sockets named by ``context_id``;
        ``cwd`` is relative to the workspace; ``on_exit(code)`` hears the kernel
        stop when the gateway did not stop it; ``leftover``: a previous gateway
        process's kernel of the context may still run there, to end first.
        ``Contexts`` calls it.
        """
        raise NotSupported(
            f"code contexts are not offered by the {self.name} placement; start another "
            "session for another kernel"
        )

    @abc.abstractmethod
    async def image_facts(self, image: str, provisioner: ProvisionerRef) -> dict[str, Any]:
        """The digest and package list of a running sandbox's image, for notebooks."""

    @abc.abstractmethod
    async def death_reason(self, limits: Limits, sandbox_id: str, exit_code: int) -> str:
        """Why a sandbox stopped, in words a user understands."""

    @abc.abstractmethod
    async def stopped_reason(self, limits: Limits, sandbox_id: str) -> str:
        """Why a sandbox found stopped at start-up stopped."""

    @abc.abstractmethod
    async def sandboxes(
        self, gateway_id: str, sessions: Collection[str] = ()
    ) -> list[SandboxState]:
        """Every sandbox labelled with this gateway's id, running or not."""

    @abc.abstractmethod
    async def remove(self, session_id: str) -> None:
        """Remove the session's sandbox, if any is left."""

    @abc.abstractmethod
    async def remove_sandbox(self, sandbox_id: str) -> None:
        """Remove a sandbox no session accounts for."""

    async def discard(self, session_id: str) -> None:
        """Remove the session's sandbox and its directory here: the one teardown.

        Sessions ending, pooled sandboxes given up and recovery's leftovers all
        end this way; every step is safe to repeat.
        """
        await self.remove(session_id)
        await self.remove_directory(session_id)
        await asyncio.to_thread(shutil.rmtree, SECRETS_TMPFS / session_id, ignore_errors=True)

    async def remove_directory(self, session_id: str) -> None:
        """Unmount and delete a session's directory (its workspace, its sockets)."""
        await asyncio.to_thread(volume.destroy, self.session_dir(session_id))
        self._homes.pop(session_id, None)

    def directories(self) -> list[str]:
        """The session ids that have a directory here, for recovery to account for."""
        if not self.sessions_dir.exists():
            return []
        return [entry.name for entry in self.sessions_dir.iterdir()]

    async def usage(self, session_id: str) -> dict[str, float | None]:
        """A running sandbox's ``cpu_seconds``, ``memory_bytes`` and ``memory_peak_bytes``.

        The session manager calls it for ``GET /v1/sessions/{id}/metrics``; a
        placement that cannot tell leaves a value out (None).
        """
        return {}

    async def update_limits(self, sandbox_id: str, limits: Limits) -> None:
        """Apply new limits to a running sandbox; callers check ``resizes_in_place`` first."""
        raise TypeError(f"the {self.name} placement cannot change a running sandbox's limits")

    async def freeze(self, sandbox_id: str) -> None:
        """Stop every process of a sandbox where it is; callers check ``freezes`` first."""
        raise TypeError(f"the {self.name} placement cannot freeze a sandbox")

    async def thaw(self, sandbox_id: str) -> None:
        """Let a frozen sandbox's processes run again (an engine error: it is gone)."""
        raise TypeError(f"the {self.name} placement cannot freeze a sandbox")


def write_secret_files(directory: Path, files: dict[str, str], uid: int, gid: int) -> None:
    """Write secrets one file each, readable by the sandbox user alone (on a tmpfs).

    Through the directory's descriptor, never following a link (``nofollow.write_file``):
    the directory ends the sandbox user's, where a link could be left for a rewrite.
    """
    directory.parent.mkdir(mode=0o711, exist_ok=True)  # others may pass, not list
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    owned = os.geteuid() == 0  # else the sandbox user can read them only if all can
    fd = os.open(directory, DIR_FLAGS)
    try:
        for name, value in files.items():
            write_file(
                fd, name, value.encode(), 0o400 if owned else 0o444, (uid, gid) if owned else None
            )
        if owned:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o500 if owned else 0o555)
    finally:
        os.close(fd)


def exit_reason(exit_code: int) -> str:
    """A kernel's exit code in words."""
    reason = f"kernel process exited with code {exit_code}"
    if exit_code > 128:
        reason += f" (killed by signal {exit_code - 128})"
    return reason


def oom_reason(limits: Limits) -> str:
    """A kernel killed for want of memory, in words."""
    return f"out of memory: limit {format_size(limits.memory)}"
