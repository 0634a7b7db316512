"""One session: a sandboxed kernel, what it may use, and how it is doing.

A plain model. ``SessionManager`` (``gateway.sessions.manager``) changes its state;
``Sandboxes`` (``gateway.sandbox.factory``) gives it its kernel and workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from ..access.auth import Principal
from ..egress.credentials import Credential, parse_credentials
from ..errors import Conflict, KernelDied, SessionEnded
from ..execution.kernel import Kernel
from ..execution.recorder import ExecutionRecorder
from ..limits import Limits
from ..masking import NO_SECRETS, Masker
from ..policy.model import Policy, session_policy
from ..sandbox.base import VolumeMount
from ..sandbox.isolation.manager import NetworkPolicy, baseline_isolation
from ..timestamps import iso, parse_iso
from ..workspace.files import AsyncWorkspace
from .requests import FREEZE

LIVE_STATES = ("starting", "idle", "busy", "dead", "paused")  # a session not ended


class Relay(Protocol):
    """A live relay of the session's kernel to clients; ending the session closes it."""

    def close(self) -> None: ...


class ToolServers(Protocol):
    """Its tools (``Toolbox``, sessions/tools.py), shown in its view; their servers'
    sandboxes are paused with its own."""

    def to_json(self) -> dict[str, Any]: ...

    async def freeze(self, freeze: Callable[[str], Awaitable[None]]) -> None:
        """Freeze each running server's sandbox with ``freeze`` (the placement's)."""
        ...

    async def thaw(self, thaw: Callable[[str], Awaitable[None]]) -> None: ...

    async def rest(self) -> None:
        """End each server and its sandbox till the next call starts it again (a deep pause:
        its kernel went too)."""
        ...


class Session:
    """One sandboxed kernel and what the gateway knows about it."""

    def __init__(
        self,
        kernel_name: str,
        image: str,
        limits: Limits,
        ttl: float,
        idle_timeout: float,
        env: dict[str, str],
        metadata: dict[str, Any],
        session_id: str | None = None,
        start_timeout: float | None = None,
        runtime: str = "runc",
        network: NetworkPolicy | None = None,
        tenant: str = "default",
        secret_names: tuple[str, ...] = (),
        secrets_as: str = "env",
        policy: Policy | None = None,
        idle_action: str = "end",
        ttl_from: str = "created",
        max_lifetime: float | None = None,
        working_dir: str | None = None,
        credentials: tuple[Credential, ...] = (),
        survive_crashes: bool = False,
    ) -> None:
        self.id = session_id or str(uuid.uuid4())
        # Secrets the egress proxy adds to requests to their hosts; the sandbox holds placeholders.
        self.credentials = credentials
        self.brokered: dict[str, str] = {}
        self.policy = policy  # the session's own, tightening its tenant's
        self.tenant = tenant
        self.start_timeout = start_timeout
        self.runtime = runtime
        self.network = network or NetworkPolicy()
        self.isolation = baseline_isolation(runtime)  # until the manager prepares it
        self.kernel_name = kernel_name
        self.image = image
        self.limits = limits
        self.ttl = ttl
        self.idle_timeout = idle_timeout
        self.idle_action = idle_action  # "end" or "pause" once the idle timeout passes
        # "created": the ttl runs from creation. "activity" (Jupyter kernels): from
        # the last activity, held while a client is connected or a cell runs, and
        # never past ``max_lifetime`` from creation (the operator's cap).
        self.ttl_from = ttl_from
        self.max_lifetime = ttl if max_lifetime is None else max_lifetime
        self.working_dir = working_dir  # the kernel's directory, relative to the workspace
        self.survive_crashes = survive_crashes  # checkpointed, and brought back if it dies
        # Named volumes bound under its workspace (``volumes.Volumes.mount``), kept through
        # pauses and restarts; their claim is held while the session is open.
        self.volumes: tuple[VolumeMount, ...] = ()
        self.checkpoint: dict[str, Any] | None = None  # the last one's SavedState JSON
        self.recovered: dict[str, Any] | None = None  # what its last comeback lost
        self.env = env
        self.secret_names = secret_names
        self.secrets_as = secrets_as  # env variables, or files in /run/secrets
        # Their values, for the sandbox alone: never in a view or a record.
        self.secrets: dict[str, str] = {}
        self.masker: Masker = NO_SECRETS
        self.metadata = metadata
        self.created_at = time.time()
        self.last_activity = self.created_at
        self.ended_at: float | None = None
        self.state = "starting"
        self.reason: str | None = None
        self.paused: dict[str, Any] | None = None  # a SavedState's JSON while paused
        self.forked_from: dict[str, Any] | None = None  # the snapshot a fork started from
        # What a notebook export records so a replay can check its environment.
        self.image_digest: str | None = None
        self.packages: list[str] = []
        self.language_info: dict[str, Any] = {}
        self.display_name = kernel_name
        self.kernel: Kernel | None = None
        self.workspace: AsyncWorkspace | None = None
        self.lock = asyncio.Lock()
        self.connections = 0  # open streams; while any is open the session is not idle
        self.executions = 0
        self.output_bytes = 0  # kept over its life, against session_output_bytes
        self.running: set[ExecutionRecorder] = set()  # executions in flight, any client
        self.held_for: str | None = None  # the approval its turn waits on, if any
        self.egress_recorded = 0  # connections through the egress proxy recorded so far
        self.egress_bytes = [0, 0]  # sent, received through it since this gateway started
        self.stream: Relay | None = None  # the agent stream, made on first use
        self.tools: ToolServers | None = None  # shown in its view, paused with it
        # What it was given as tools, as sent (header values too): in its record, never in
        # its view, so a restarted gateway gives them again.
        self.tool_config: dict[str, Any] | None = None
        # Its stdio servers' tools as they listed them, by server (bounded, in its record):
        # a restarted gateway gives a paused session its tools without starting a server.
        self.tool_listing: dict[str, list[dict[str, Any]]] | None = None
        # Its E2B MCP token's registration (access/mcp_tokens.py: an HMAC, never the token):
        # in its record, never in its view, so any gateway taking it over checks the token.
        self.mcp_token: dict[str, str] | None = None
        # Jupyter clients gone for a moment, by client session id: their relays
        # keep buffering so a reconnect replays what it missed.
        self.parked: dict[str, Relay] = {}
        # The msg_ids of its Jupyter clients' executes not yet ended, all connections': iopub
        # shows each to every connection, and each relay follows its own by it.
        self.relayed: set[str] = set()
        # Connected Jupyter clients, each told (its WebSocket closed) when the session ends.
        self.on_end: set[Callable[[str], None]] = set()
        # Code contexts besides its own kernel (``contexts.Contexts``), by id.
        self.contexts: dict[str, CodeContext] = {}

    @classmethod
    def from_record(cls, doc: dict[str, Any]) -> Session:
        """A session as the store last saw it, for a restarted gateway to take over."""
        session = cls(
            kernel_name=doc["kernel"],
            image=doc["image"],
            limits=Limits.from_json(doc["limits"]),
            ttl=doc["ttl"],
            idle_timeout=doc["idle_timeout"],
            env=doc["env"],
            metadata=doc["metadata"],
            session_id=doc["id"],
            runtime=doc.get("runtime", "runc"),
            network=NetworkPolicy.parse(doc.get("network", "none")),
            tenant=doc.get("tenant", "default"),
            secret_names=tuple(doc.get("secrets", ())),
            secrets_as=doc.get("secrets_as", "env"),
            policy=session_policy(doc.get("policy")),
            idle_action=doc.get("idle_action", "end"),
            ttl_from=doc.get("ttl_from", "created"),
            max_lifetime=doc.get("max_lifetime"),
            working_dir=doc.get("working_dir"),
            credentials=parse_credentials(doc.get("credentials")),
            survive_crashes=doc.get("survive_crashes", False),
        )
        session.paused = doc.get("paused")
        session.checkpoint = doc.get("checkpoint")
        session.recovered = doc.get("recovered")
        session.forked_from = doc.get("forked_from")
        session.volumes = tuple(VolumeMount(**m) for m in doc.get("volume_mounts", ()))
        session.created_at = parse_iso(doc["created_at"])
        session.last_activity = parse_iso(doc["last_activity"])
        session.state = doc["state"]
        session.reason = doc.get("reason")
        session.image_digest = doc.get("image_digest")
        session.packages = doc.get("packages", [])
        session.language_info = doc.get("language_info") or {}
        session.display_name = doc.get("display_name") or session.kernel_name
        session.executions = doc.get("executions", 0)
        session.output_bytes = doc.get("output_bytes", 0)
        session.tool_config = doc.get("tool_config")
        session.tool_listing = doc.get("tool_listing")
        session.mcp_token = doc.get("mcp_token")
        session.contexts = {c["id"]: CodeContext.from_record(c) for c in doc.get("contexts", ())}
        return session

    def take_sandbox(self, pooled: Session) -> None:
        """Become the one owner of a pooled sandbox: its id, kernel, workspace and facts."""
        self.id = pooled.id
        self.kernel, self.workspace, self.isolation = (
            pooled.kernel,
            pooled.workspace,
            pooled.isolation,
        )
        self.image_digest, self.packages = pooled.image_digest, pooled.packages
        self.language_info, self.display_name = pooled.language_info, pooled.display_name

    def give_secrets(self, values: dict[str, str]) -> None:
        """Hold the values the sandbox gets (those of brokered secrets stay with the egress
        proxy), and mask them all out of what it produces."""
        bound = {c.secret for c in self.credentials}
        self.secrets = {k: v for k, v in values.items() if k not in bound}
        self.brokered = {k: v for k, v in values.items() if k in bound}
        self.masker = Masker(values)

    @property
    def owner(self) -> Principal:
        """The gateway acting for the session's tenant, when no caller is there to ask."""
        return Principal(tenant=self.tenant, token_id="gateway")

    @property
    def expires_at(self) -> float:
        """When the ttl runs out, if nothing happens meanwhile."""
        if self.ttl_from == "activity":
            return min(self.last_activity + self.ttl, self.created_at + self.max_lifetime)
        return self.created_at + self.ttl

    def expiry(self, now: float) -> str | None:
        """Why the session's lifetime is over at ``now``; None while it is not."""
        if self.ttl_from != "activity":
            return f"ttl expired after {self.ttl:g} s" if now >= self.expires_at else None
        if now >= self.created_at + self.max_lifetime:
            return f"max lifetime of {self.max_lifetime:g} s reached"
        active = self.connections > 0 or bool(self.running)  # a client, or a cell running
        if not active and now >= self.last_activity + self.ttl:
            return f"ttl expired: no activity for {self.ttl:g} s"
        return None

    @property
    def idle_deadline(self) -> float:
        return self.last_activity + self.idle_timeout

    @property
    def language(self) -> str:
        """The kernel's language (``python``, ``R``...): how its code is scanned."""
        return self.language_info.get("name") or self.kernel_name

    @property
    def frozen(self) -> bool:
        """Paused in the first tier: its sandbox is still there, frozen, its memory kept."""
        return (
            self.state == "paused"
            and self.paused is not None
            and self.paused.get("strategy") == FREEZE
        )

    def touch(self) -> None:
        self.last_activity = time.time()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "kernel": self.kernel_name,
            "image": self.image,
            "image_digest": self.image_digest,
            "display_name": self.display_name,
            "language_info": self.language_info,
            "state": self.state,
            "reason": self.reason,
            "limits": self.limits.to_json(),
            "ttl": self.ttl,
            "idle_timeout": self.idle_timeout,
            "idle_action": self.idle_action,
            "ttl_from": self.ttl_from,
            "max_lifetime": self.max_lifetime,
            "working_dir": self.working_dir,
            "paused": self.paused,
            "survive_crashes": self.survive_crashes,
            "checkpoint": self.checkpoint,
            "recovered": self.recovered,
            "forked_from": self.forked_from,
            "runtime": self.runtime,
            "network": self.network.to_json(),
            "env": sorted(self.env),  # names only: values may be credentials
            "secrets": list(self.secret_names),
            "secrets_as": self.secrets_as,
            "credentials": [c.to_json() for c in self.credentials],
            "metadata": self.metadata,
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "last_activity": iso(self.last_activity),
            "idle_expires_at": iso(self.idle_deadline),
            "ended_at": iso(self.ended_at),
            "executions": self.executions,
            "output_bytes": self.output_bytes,
            "volumes": [
                {"name": v.name, "path": v.target, "read_only": v.read_only} for v in self.volumes
            ],
            "container_id": self.kernel.container_id if self.kernel else None,
            "tools": self.tools.to_json() if self.tools is not None else None,
            "contexts": [c.to_json() for c in self.contexts.values()],
        }

    def record(self) -> dict[str, Any]:
        """What the store keeps: the API view plus env values, the image's package list
        and the session's own policy."""
        policy = self.policy.to_json() if self.policy is not None else None
        mounts = [dataclasses.asdict(v) for v in self.volumes]
        return {**self.to_json(), "env": self.env, "packages": self.packages, "policy": policy,
                "volume_mounts": mounts, "tool_config": self.tool_config,
                "tool_listing": self.tool_listing, "mcp_token": self.mcp_token}  # fmt: skip


def public_view(record: dict[str, Any]) -> dict[str, Any]:
    """A stored session record as the API shows it: no package list, policy, env values,
    volumes' host paths, tool config (header values) or MCP token registration."""
    hidden = ("packages", "policy", "volume_mounts", "tool_config", "tool_listing", "mcp_token")
    view = {k: v for k, v in record.items() if k not in hidden}
    view["env"] = sorted(view.get("env", ()))
    view.setdefault("secrets", [])
    return view


def check_usable(session: Session) -> None:
    """Refuse work for a dead, ended or paused session, saying what to do."""
    if session.state == "dead":
        raise KernelDied(
            f"the session's kernel died ({session.reason}); "
            f"POST /v1/sessions/{session.id}/restart to get a fresh kernel"
        )
    if session.state == "deleted":
        raise SessionEnded(f"session {session.id} has ended ({session.reason})")
    if session.state == "paused":
        raise Conflict(
            f"session {session.id} is paused and runs nothing; POST "
            f"/v1/sessions/{session.id}/resume (or execute: it resumes first)"
        )


@contextlib.asynccontextmanager
async def ended_meanwhile(session: Session, doing: str) -> AsyncIterator[None]:
    """Turn a (re)start cut short by the session's end (its ttl, a delete) into a 409."""

    def ended() -> SessionEnded:
        return SessionEnded(f"session {session.id} ended while it {doing}: {session.reason}")

    try:
        yield
    except BaseException as e:
        # Ending it cancels its kernel client's waits; this task itself goes on.
        task = asyncio.current_task()
        if session.state == "deleted" and not (task and task.cancelling()):
            raise ended() from e
        raise
    if session.state == "deleted":
        raise ended()


class CodeContext:
    """One more kernel in a session's sandbox: a namespace of its own over the same files.

    Its kernel lives as long as the sandbox it was started in; ``stopped`` says
    why it is not running, and the next execute in it starts it empty.
    """

    def __init__(
        self, context_id: str, kernel_name: str, language: str, cwd: str, created_at: float
    ) -> None:
        self.id = context_id
        self.kernel_name = kernel_name
        self.language = language
        self.cwd = cwd  # relative to the workspace; "" is the workspace
        self.created_at = created_at
        self.kernel: Kernel | None = None
        self.executions = 0
        self.stopped: str | None = None  # why its kernel is not running (it starts when used)
        self.restarted: str | None = None  # why its last start was empty, its variables gone
        self.leftover = False  # a previous gateway's kernel of it may still run in the sandbox

    @classmethod
    def from_record(cls, doc: dict[str, Any]) -> CodeContext:
        """A context a previous gateway process ran: defined, its kernel not this one's."""
        cwd = doc["cwd"].removeprefix("/workspace").lstrip("/")  # its view's, as recorded
        context = cls(doc["id"], doc["kernel"], doc["language"], cwd, parse_iso(doc["created_at"]))
        context.executions = doc.get("executions", 0)
        context.stopped = "the gateway restarted; the next execute starts it empty"
        context.leftover = True
        return context

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kernel": self.kernel_name,
            "language": self.language,
            "cwd": "/workspace" + (f"/{self.cwd}" if self.cwd else ""),
            "state": "stopped" if self.kernel is None else "running",
            "stopped": self.stopped,
            "restarted": self.restarted,
            "created_at": iso(self.created_at),
            "executions": self.executions,
        }
