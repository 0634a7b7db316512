"""What clients ask of sessions, read once at the edge into typed values.

Handlers (the v1 API, the Jupyter API, the agent stream) and notebook replay
turn a JSON body into one of these with ``from_json``; shapes and types are
checked there, with the error a client sees. The session manager only checks
values against the server's defaults, maxima and quotas.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import math
import re
import uuid
from collections.abc import Mapping
from typing import Any

from ..access.secrets import secret_names
from ..egress import NetworkPolicy
from ..egress.credentials import Credential, parse_credentials
from ..errors import BadRequest
from ..limits import Limits, parse_size
from ..policy.model import Policy, session_policy
from ..sandbox.isolation.runtimes import RUNTIMES
from ..tools.specs import ToolsConfig, parse_client_tools, parse_tools
from ..validation import env_vars, image_ref, metadata_dict
from ..workspace.rules import clean_path


def _body(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BadRequest("the request body must be a JSON object")
    return value


def seconds_of(value: Any, name: str) -> float | None:
    """A number of seconds as sent; its range is checked against the server's settings."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise BadRequest(f"{name} must be a number of seconds")
    return float(value)


IDLE_ACTIONS = ("end", "pause")


def idle_action(value: Any) -> str | None:
    """What the idle timeout does to a session: end it, or pause it."""
    if value is not None and value not in IDLE_ACTIONS:
        raise BadRequest(f"idle_action must be 'end' or 'pause', not {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class BuildTemplate:
    """``POST /v1/templates``: a Dockerfile, and its build context as a base64 tar."""

    name: str
    dockerfile: str
    context: bytes | None = None
    kernel: str | None = None  # None: the base's kernel
    tags: tuple[Any, ...] = ()  # the version's once ready (checked by sessions/templates.py)

    @classmethod
    def from_json(cls, body: Any) -> BuildTemplate:
        body = _body(body)
        name, dockerfile = body.get("name"), body.get("dockerfile")
        if not isinstance(name, str) or not isinstance(dockerfile, str):
            raise BadRequest(
                'a template build needs {"name": "geo-stack", "dockerfile": "FROM sbx/python ..."}'
            )
        context, kernel = body.get("context"), body.get("kernel")
        if context is not None:
            try:
                context = base64.b64decode(context, validate=True) if context else None
            except (TypeError, ValueError):
                raise BadRequest("context must be a tar archive, base64-encoded") from None
        if kernel is not None and not isinstance(kernel, str):
            raise BadRequest("kernel must be a kernelspec name such as 'python3'")
        tags = body.get("tags")
        tags = [] if tags is None else tags
        if not isinstance(tags, list):
            raise BadRequest('tags must be a list, like ["v1.2", "production"]')
        return cls(name, dockerfile, context, kernel, tuple(tags))


def template_of(value: Any) -> str | None:
    """A template's reference, read in full when it is resolved (``sessions/templates.py``)."""
    if value is not None and (not isinstance(value, str) or not value):
        raise BadRequest(
            "template must name one of your templates, like 'geo-stack', 'geo-stack:2' or "
            "'geo-stack:prod' (a tag)"
        )
    return value


@dataclasses.dataclass(frozen=True)
class CreateSession:
    """``POST /v1/sessions`` (and a Jupyter client's kernel start)."""

    kernel: str = "python3"
    image: str | None = None  # an image the gateway built; None: the kernel's own
    session_id: str | None = None  # a client-chosen id (Jupyter clients choose theirs)
    limits: Mapping[str, int | float] = dataclasses.field(default_factory=dict)
    ttl: float | None = None
    idle_timeout: float | None = None
    idle_action: str | None = None  # None: the server's idle_action
    start_timeout: float | None = None
    runtime: str | None = None
    network: NetworkPolicy = dataclasses.field(default_factory=NetworkPolicy)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # names of the tenant's sealed secrets
    secrets_as: str = "env"  # or "files": one file each in /run/secrets, on a tmpfs
    # Secrets the egress proxy puts in requests to their hosts; the sandbox gets placeholders.
    credentials: tuple[Credential, ...] = ()
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    policy: Policy | None = None  # tightens the tenant's policy, never loosens it
    from_snapshot: str | None = None  # a fork: the kernel and image are the snapshot's
    template: str | None = None  # a tenant's template: its kernel and image (templates.py)
    ttl_from: str = "created"  # or "activity" (Jupyter kernels: Settings.jupyter_ttl_from)
    working_dir: str | None = None  # the kernel's directory in the workspace (relative)
    survive_crashes: bool = False  # checkpoint the kernel's state; bring it back if it dies
    tools: ToolsConfig | None = None  # MCP servers its code calls (sessions/tools.py)
    # The tenant's named volumes under the workspace; None: none (a fork: its source's).
    volumes: tuple[MountVolume, ...] | None = None

    @classmethod
    def from_json(cls, body: Any) -> CreateSession:
        body = _body(body)
        from_snapshot = body.get("from_snapshot")
        if from_snapshot is not None and not isinstance(from_snapshot, str):
            raise BadRequest("from_snapshot must be a snapshot id (POST .../snapshots made one)")
        kernel = body.get("kernel")
        if kernel is None or kernel == "":  # not `or`: a falsy 0 or false is a mistake
            kernel = "" if from_snapshot else "python3"
        if not isinstance(kernel, str):
            raise BadRequest("kernel must be a kernelspec name such as 'python3'")
        session_id = body.get("id")
        if session_id is not None:
            try:
                session_id = str(uuid.UUID(str(session_id)))
            except ValueError:
                raise BadRequest("id must be a UUID") from None
        runtime = body.get("runtime")
        if runtime is not None and not isinstance(runtime, str):
            raise BadRequest(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
        env, secrets = env_vars(body.get("env")), secret_names(body.get("secrets"))
        secrets_as = body.get("secrets_as")
        secrets_as = "env" if secrets_as is None else secrets_as
        if secrets_as not in ("env", "files"):
            raise BadRequest(f"secrets_as must be 'env' or 'files', not {secrets_as!r}")
        credentials = parse_credentials(body.get("credentials"))
        survive = body.get("survive_crashes", False)
        if not isinstance(survive, bool):
            raise BadRequest("survive_crashes must be true or false")
        both = sorted(set(env) & (set(secrets) | {c.secret for c in credentials}))
        if both:
            raise BadRequest(f"{', '.join(both)} named in both env and secrets; name each once")
        return cls(
            kernel=kernel,
            image=image_ref(body.get("image")),
            session_id=session_id,
            limits=Limits.requested(body.get("limits")),
            ttl=seconds_of(body.get("ttl"), "ttl"),
            idle_timeout=seconds_of(body.get("idle_timeout"), "idle_timeout"),
            idle_action=idle_action(body.get("idle_action")),
            start_timeout=seconds_of(body.get("start_timeout"), "start_timeout"),
            runtime=runtime,
            network=NetworkPolicy.parse(body.get("network")),
            env=env,
            secrets=secrets,
            secrets_as=secrets_as,
            credentials=credentials,
            metadata=metadata_dict(body.get("metadata")),
            policy=session_policy(body.get("policy")),
            from_snapshot=from_snapshot,
            template=template_of(body.get("template")),
            survive_crashes=survive,
            tools=None if body.get("tools") is None else parse_tools(body["tools"]),
            volumes=MountVolume.parse_all(body.get("volumes")),
        )


@dataclasses.dataclass(frozen=True)
class UpdateSession:
    """``PATCH /v1/sessions/{id}``: a new ttl (or one ending ``expires_in`` seconds from now)
    and/or idle timeout."""

    ttl: float | None = None
    idle_timeout: float | None = None
    expires_in: float | None = None

    @classmethod
    def from_json(cls, body: Any) -> UpdateSession:
        body = _body(body)
        unknown = set(body) - {"ttl", "idle_timeout", "expires_in"}
        if unknown:
            raise BadRequest(
                f"only ttl, expires_in and idle_timeout can be changed, not {sorted(unknown)}"
            )
        if body.get("ttl") is not None and body.get("expires_in") is not None:
            raise BadRequest("give ttl (from creation) or expires_in (from now), not both")
        return cls(
            ttl=seconds_of(body.get("ttl"), "ttl"),
            idle_timeout=seconds_of(body.get("idle_timeout"), "idle_timeout"),
            expires_in=seconds_of(body.get("expires_in"), "expires_in"),
        )


@dataclasses.dataclass(frozen=True)
class SetTools:
    """``PUT /v1/sessions/{id}/tools``: the session's tools from now on (``{}``: none)."""

    tools: ToolsConfig

    @classmethod
    def from_json(cls, body: Any) -> SetTools:
        return cls(parse_tools(_body(body)))


@dataclasses.dataclass(frozen=True)
class CreateContext:
    """A code context: a kernel (by name, or a language) the session's image holds, and
    its directory in the workspace; none of them: another kernel like the session's."""

    kernel: str | None = None
    language: str | None = None
    cwd: str | None = None

    @classmethod
    def from_json(cls, body: Any) -> CreateContext:
        body = _body(body)
        unknown = set(body) - {"kernel", "language", "cwd"}
        if unknown:
            raise BadRequest(f"a context takes kernel, language and cwd, not {sorted(unknown)}")
        for name in ("kernel", "language", "cwd"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise BadRequest(f"{name} must be a string")
        return cls(body.get("kernel"), body.get("language"), body.get("cwd"))


@dataclasses.dataclass(frozen=True)
class ExecuteCode:
    """An execute: over HTTP, on the agent stream, or a replayed notebook's cell."""

    code: str
    timeout: float | None = None
    description: str | None = None  # the caller's markdown narrative for this step
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # for this run only
    context: str | None = None  # the code context it runs in; None: the session's own kernel
    # Client tools its code may call, answered by the agent's process (the agent stream only).
    tools: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_json(cls, body: Any) -> ExecuteCode:
        body = _body(body)
        code = body.get("code")
        if not isinstance(code, str):
            raise BadRequest("code must be a string of source code")
        description = body.get("description")
        if description is not None and not isinstance(description, str):
            raise BadRequest("description must be a markdown string")
        timeout = seconds_of(body.get("timeout"), "timeout")
        context = body.get("context")
        if context is not None and not isinstance(context, str):
            raise BadRequest("context must be a code context's id (GET .../contexts lists them)")
        tools = parse_client_tools(body.get("tools"))
        return cls(code, timeout, description, env_vars(body.get("env")), context, tools)


# How a paused or snapshotted kernel's state is saved to disk, best first.
STRATEGIES = ("checkpoint", "namespace", "replay")
# A pause's first tier: the sandbox frozen where it is, its memory kept; saved later.
FREEZE = "freeze"


@dataclasses.dataclass(frozen=True)
class PauseSession:
    """``POST /v1/sessions/{id}/pause``: how to keep the kernel's state (None: the best).

    None freezes first where the placement can; a strategy named saves at once.
    """

    strategy: str | None = None

    @classmethod
    def from_json(cls, body: Any) -> PauseSession:
        return cls(_strategy(_body(body), (FREEZE, *STRATEGIES)))


@dataclasses.dataclass(frozen=True)
class TakeSnapshot:
    """``POST /v1/sessions/{id}/snapshots``: an optional name, and a strategy like a pause's."""

    name: str | None = None
    strategy: str | None = None

    @classmethod
    def from_json(cls, body: Any) -> TakeSnapshot:
        body = _body(body)
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > 200):
            raise BadRequest("name must be a string of at most 200 characters")
        return cls(name, _strategy(body, STRATEGIES))


def _strategy(body: Mapping[str, Any], allowed: tuple[str, ...]) -> str | None:
    strategy = body.get("strategy")
    if strategy is not None and strategy not in allowed:
        raise BadRequest(f"strategy must be one of {', '.join(allowed)}, not {strategy!r}")
    return strategy


@dataclasses.dataclass(frozen=True)
class StartCommand:
    """A command to run in the session's sandbox, beside its kernel."""

    argv: list[str]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cwd: str = ""  # relative to the workspace
    tty: tuple[int, int] | None = None  # a terminal's rows and columns
    timeout: float | None = None  # for a run waited on (``POST .../commands``)
    tag: str = ""

    @classmethod
    def from_json(cls, body: Any) -> StartCommand:
        """``{"command": "ls -l", "env", "cwd", "timeout"}``: a shell line, run by ``/bin/sh``."""
        body = _body(body)
        command = body.get("command")
        if not isinstance(command, str) or not command.strip():
            raise BadRequest("command must be a shell command line, such as 'ls -l'")
        cwd = body.get("cwd")
        cwd = "" if cwd is None else cwd
        if not isinstance(cwd, str):
            raise BadRequest("cwd must be a directory path relative to the workspace")
        clean_path(cwd, allow_root=True)
        return cls(
            argv=["/bin/sh", "-c", command],
            env=env_vars(body.get("env")),
            cwd=cwd,
            timeout=seconds_of(body.get("timeout"), "timeout"),
        )


VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
MAX_MOUNTS = 8  # volumes one session mounts


def volume_name(value: Any) -> str:
    """A volume's name: 1 to 63 letters, digits, ``_ . -``, starting with a letter or digit."""
    if not isinstance(value, str) or not VOLUME_NAME.fullmatch(value) or ".." in value:
        shown = (
            repr(value[:40]) + ("..." if len(value) > 40 else "")
            if isinstance(value, str)
            else type(value).__name__
        )
        raise BadRequest(
            f"volume name {shown} is not valid: use 1 to 63 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit, without '..' (e.g. 'datasets-2026')"
        )
    return value


@dataclasses.dataclass(frozen=True)
class CreateVolume:
    """``POST /v1/volumes``: a name and a size (None: the server's default)."""

    name: str
    size: int | None = None

    @classmethod
    def from_json(cls, body: Any) -> CreateVolume:
        body = _body(body)
        unknown = sorted(set(body) - {"name", "size"})
        if unknown:
            raise BadRequest(f"unknown field(s) {unknown}; a volume takes name and size")
        size = body.get("size")
        return cls(
            volume_name(body.get("name")), None if size is None else parse_size(size, "size")
        )


@dataclasses.dataclass(frozen=True)
class MountVolume:
    """One volume a session mounts: its name, a directory under the workspace, read-only."""

    name: str
    path: str
    read_only: bool = False

    @classmethod
    def parse_all(cls, value: Any) -> tuple[MountVolume, ...] | None:
        """``[{"name", "path", "read_only"}]``; each volume and path once, none inside another."""
        if value is None:
            return None
        if not isinstance(value, list) or len(value) > MAX_MOUNTS:
            raise BadRequest(
                f'volumes must be a list of at most {MAX_MOUNTS} {{"name": ..., "path": ...}}'
            )
        mounts = tuple(cls.from_json(item) for item in value)
        names = [m.name for m in mounts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # its one holder record must say whether the session writes
            raise BadRequest(f"volume {twice[0]!r} named twice; mount each volume once")
        paths = sorted(m.path for m in mounts)
        for a, b in itertools.pairwise(paths):
            if b == a or b.startswith(a + "/"):
                raise BadRequest(f"volume paths {a!r} and {b!r} overlap; mount each elsewhere")
        return mounts

    @classmethod
    def from_json(cls, item: Any) -> MountVolume:
        item = _body(item)
        unknown = sorted(set(item) - {"name", "path", "read_only"})
        if unknown:
            raise BadRequest(f"unknown field(s) {unknown} in a volume mount")
        path = item.get("path")
        if not isinstance(path, str):
            raise BadRequest('a volume mount needs a path under the workspace, e.g. "data"')
        parts = clean_path(path, allow_root=True)  # no '..', not absolute, no NUL
        if not parts:
            raise BadRequest(
                "a volume mounts at a directory under the workspace, not over the workspace "
                'itself: name one, e.g. "data"'
            )
        if max(len(p.encode()) for p in parts) > 255 or len("/".join(parts).encode()) > 1024:
            raise BadRequest(  # the host (ENAMETOOLONG) or the runtime would refuse it late
                f"volume mount path {path[:40]!r}... is too long: at most 255 bytes a "
                "directory name and 1024 in all"
            )
        read_only = item.get("read_only", False)
        if not isinstance(read_only, bool):
            raise BadRequest("a volume mount's read_only must be true or false")
        return cls(volume_name(item.get("name")), "/".join(parts), read_only)
