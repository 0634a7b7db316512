"""A Jupyter kernel start (``POST /api/kernels``) read into a ``CreateSession``.

Jupyter clients send Enterprise Gateway's ``KERNEL_*`` variables in the
body's ``env`` (jupyter_server's ``--gateway-url`` client sends every one of
its own environment, and always ``KERNEL_LAUNCH_TIMEOUT`` and
``KERNEL_WORKING_DIR``). Those that mean something here become session
options; those that cannot be honoured are refused by name, saying what to
do; any other ``KERNEL_*`` reaches the kernel's environment, as Enterprise
Gateway passes them on. docs/streaming-and-jupyter.md has the table.
"""

from __future__ import annotations

import dataclasses
import math
import re
import uuid
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from ..errors import BadRequest
from ..validation import image_ref
from .requests import CreateSession

# Where the workspace is mounted in every sandbox (the kernel's first directory).
WORKSPACE = PurePosixPath("/workspace")

# Enterprise Gateway's resource requests and limits; a sandbox has one cap each,
# so the limit wins over the request when both come.
RESOURCES = {
    "KERNEL_MEMORY": "memory",
    "KERNEL_MEMORY_LIMIT": "memory",
    "KERNEL_CPUS": "cpus",
    "KERNEL_CPUS_LIMIT": "cpus",
}

_UNSET = "unset it in the environment of the Jupyter server (or client) that sends it"
REFUSED = {
    "KERNEL_GPUS": f"this gateway's sandboxes have no GPUs; {_UNSET}",
    "KERNEL_GPUS_LIMIT": f"this gateway's sandboxes have no GPUs; {_UNSET}",
    "KERNEL_UID": f"a kernel runs as the user its kernelspec names; {_UNSET}",
    "KERNEL_GID": f"a kernel runs as the group its kernelspec names; {_UNSET}",
    "KERNEL_NAMESPACE": f"each kernel gets its own sandbox, placed by the gateway; {_UNSET}",
    "KERNEL_POD_NAME": f"each kernel gets its own sandbox, named by the gateway; {_UNSET}",
    "KERNEL_SERVICE_ACCOUNT_NAME": f"sandboxes hold no cluster credentials; {_UNSET}",
    "KERNEL_REMOTE_HOST": f"the gateway places kernels itself; {_UNSET}",
    "KERNEL_EXECUTOR_IMAGE": f"there are no Spark executors here; {_UNSET}",
    "KERNEL_EXTRA_SPARK_OPTS": f"there is no Spark here; {_UNSET}",
    "KERNEL_SPARKAPP_CONFIG_MAP": f"there is no Spark here; {_UNSET}",
}
# Read into options (not passed to the kernel's environment).
CONSUMED = {
    "KERNEL_USERNAME",
    "KERNEL_ID",
    "KERNEL_LAUNCH_TIMEOUT",
    "KERNEL_WORKING_DIR",
    "KERNEL_IMAGE",
    *RESOURCES,
}

_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
# Kubernetes quantities (and docker's sizes): binary and decimal suffixes.
_BYTES = {
    "": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
    "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4,
    "kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class KernelStart:
    """A Jupyter kernel start as a create request, and which variables shaped it."""

    request: CreateSession
    sources: dict[str, str]  # option ("image", "limits", ...) -> the variables that set it

    def blame(self, message: str) -> str:
        """`` (asked for by KERNEL_MEMORY=...)`` when an error's ``message`` is about an option
        that came from the env, to end it with; else ``""``."""
        for option, words in _ABOUT.items():
            if option in self.sources and any(word in message for word in words):
                return f" (asked for by {self.sources[option]} in the kernel start's env)"
        return ""


# Which words an error about each option has in its message.
_ABOUT = {
    "start_timeout": ("start_timeout",),
    "limits": ("memory", "cpus"),
    "image": ("image",),
}


def kernel_start(body: Any, ttl_from: str) -> KernelStart:
    """Read ``{name, env}``; ``ttl_from`` is the server's lifetime policy for Jupyter kernels."""
    if not isinstance(body, Mapping):
        raise BadRequest("the request body must be a JSON object")
    env = body.get("env") or {}
    if not isinstance(env, Mapping):
        raise BadRequest("env must be an object of variable names to values")
    env = {str(k): str(v) for k, v in env.items() if v is not None}  # null: not sent
    for name, why in REFUSED.items():
        if env.get(name):
            raise BadRequest(f"{name} is not supported: {why}")
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise BadRequest("name must be a kernelspec name such as 'python3' (GET /api/kernelspecs)")
    metadata: dict[str, Any] = {"client": "jupyter"}
    request: dict[str, Any] = {
        "kernel": name or None,
        "env": {k: v for k, v in env.items() if k not in CONSUMED},
        "metadata": metadata,
    }
    sources: dict[str, str] = {}
    if env.get("KERNEL_USERNAME"):
        metadata["username"] = env["KERNEL_USERNAME"]
    if env.get("KERNEL_ID"):
        try:
            request["id"] = str(uuid.UUID(env["KERNEL_ID"]))
        except ValueError:
            raise BadRequest(
                f"KERNEL_ID must be a UUID, not {env['KERNEL_ID']!r}; or leave it out and the "
                "gateway chooses one"
            ) from None
    if env.get("KERNEL_LAUNCH_TIMEOUT"):
        request["start_timeout"] = _number(env, "KERNEL_LAUNCH_TIMEOUT", "a number of seconds")
        sources["start_timeout"] = f"KERNEL_LAUNCH_TIMEOUT={env['KERNEL_LAUNCH_TIMEOUT']}"
    if env.get("KERNEL_IMAGE"):
        try:
            request["image"] = image_ref(env["KERNEL_IMAGE"])
        except BadRequest:
            raise BadRequest(
                f"KERNEL_IMAGE {env['KERNEL_IMAGE']!r} is not an image this gateway runs: name "
                "one it built, like 'sbx/python:<tag>' (GET /v1/kernels lists them), or unset "
                "it and choose the kernel by name"
            ) from None
        sources["image"] = f"KERNEL_IMAGE={env['KERNEL_IMAGE']}"
    limits = _limits(env, sources)
    if limits:
        request["limits"] = limits
    create = CreateSession.from_json(request)
    working_dir = working_dir_of(env.get("KERNEL_WORKING_DIR"))
    return KernelStart(
        dataclasses.replace(create, ttl_from=ttl_from, working_dir=working_dir), sources
    )


def working_dir_of(value: str | None) -> str | None:
    """``KERNEL_WORKING_DIR`` as a path relative to the workspace; None for the workspace.

    A relative path, or an absolute one under /workspace, is honoured. Another
    absolute path is the client's own directory (jupyter_server sends where
    its notebook lives, on its machine): it does not exist in the sandbox and
    is not mirrored, as with Enterprise Gateway's default; the kernel starts
    in /workspace.
    """
    if not value:
        return None
    path = PurePosixPath(value)
    if path.is_absolute():
        if path != WORKSPACE and WORKSPACE not in path.parents:
            return None
        path = path.relative_to(WORKSPACE)
    if ".." in path.parts:
        raise BadRequest(
            f"KERNEL_WORKING_DIR {value!r} leaves the workspace; give a directory inside "
            "/workspace (or relative to it)"
        )
    return None if str(path) == "." else str(path)


def _limits(env: dict[str, str], sources: dict[str, str]) -> dict[str, int | float]:
    limits: dict[str, int | float] = {}
    for name, limit in RESOURCES.items():  # requests first: a *_LIMIT overrides
        if env.get(name):
            value = env[name]
            limits[limit] = _bytes(name, value) if limit == "memory" else _cpus(name, value)
    named = [f"{name}={env[name]}" for name in RESOURCES if env.get(name)]
    if named:
        sources["limits"] = ", ".join(named)
    return limits


def _bytes(name: str, value: str) -> int:
    match = _QUANTITY.match(value)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _BYTES:
        raise BadRequest(
            f"{name} {value!r} is not a memory size; use e.g. '512Mi', '2Gi', '1g' or bytes"
        )
    return int(float(match.group(1)) * _BYTES[unit])


def _cpus(name: str, value: str) -> float:
    """Cores, or Kubernetes millicores (``500m``)."""
    match = _QUANTITY.match(value)
    if not match or match.group(2) not in ("", "m"):
        raise BadRequest(f"{name} {value!r} is not a CPU amount; use e.g. '2', '0.5' or '500m'")
    number = float(match.group(1))
    return number / 1000 if match.group(2) == "m" else number


def _number(env: dict[str, str], name: str, what: str) -> float:
    try:
        number = float(env[name])
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise BadRequest(f"{name} must be {what}, not {env[name]!r}")
    return number
