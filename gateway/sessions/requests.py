"""What clients ask of sessions, read once at the edge into typed values.

Handlers (the v1 API, the Jupyter API, the agent stream) and notebook replay
turn a JSON body into one of these with ``from_json``; shapes and types are
checked there, with the error a client sees. The session manager only checks
values against the server's defaults, maxima and quotas.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Mapping
from typing import Any

from ..errors import BadRequest
from ..limits import Limits
from ..sandbox.egress import NetworkPolicy
from ..sandbox.isolation.runtimes import RUNTIMES
from ..sandbox.workspace import clean_path
from ..validation import env_vars, image_ref, metadata_dict


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


@dataclasses.dataclass(frozen=True)
class CreateSession:
    """``POST /v1/sessions`` (and a Jupyter client's kernel start)."""

    kernel: str = "python3"
    image: str | None = None  # an image the gateway built; None: the kernel's own
    session_id: str | None = None  # a client-chosen id (Jupyter clients choose theirs)
    limits: Mapping[str, int | float] = dataclasses.field(default_factory=dict)
    ttl: float | None = None
    idle_timeout: float | None = None
    start_timeout: float | None = None
    runtime: str | None = None
    network: NetworkPolicy = dataclasses.field(default_factory=NetworkPolicy)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, body: Any) -> CreateSession:
        body = _body(body)
        kernel = body.get("kernel") or "python3"
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
        return cls(
            kernel=kernel,
            image=image_ref(body.get("image")),
            session_id=session_id,
            limits=Limits.requested(body.get("limits")),
            ttl=seconds_of(body.get("ttl"), "ttl"),
            idle_timeout=seconds_of(body.get("idle_timeout"), "idle_timeout"),
            start_timeout=seconds_of(body.get("start_timeout"), "start_timeout"),
            runtime=runtime,
            network=NetworkPolicy.parse(body.get("network")),
            env=env_vars(body.get("env")),
            metadata=metadata_dict(body.get("metadata")),
        )


@dataclasses.dataclass(frozen=True)
class UpdateSession:
    """``PATCH /v1/sessions/{id}``: a new ttl and/or idle timeout."""

    ttl: float | None = None
    idle_timeout: float | None = None

    @classmethod
    def from_json(cls, body: Any) -> UpdateSession:
        body = _body(body)
        unknown = set(body) - {"ttl", "idle_timeout"}
        if unknown:
            raise BadRequest(f"only ttl and idle_timeout can be changed, not {sorted(unknown)}")
        return cls(
            ttl=seconds_of(body.get("ttl"), "ttl"),
            idle_timeout=seconds_of(body.get("idle_timeout"), "idle_timeout"),
        )


@dataclasses.dataclass(frozen=True)
class ExecuteCode:
    """An execute: over HTTP, on the agent stream, or a replayed notebook's cell."""

    code: str
    timeout: float | None = None
    description: str | None = None  # the caller's markdown narrative for this step
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # for this run only

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
        return cls(code, timeout, description, env_vars(body.get("env")))


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
