"""Checks for the plain values a client sends when creating or changing a session."""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import BadRequest, LimitExceeded

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What `sbx images build` tags: sbx/<name>:<content hash> (Docker's reference grammar, narrowed).
_IMAGE = re.compile(
    r"sbx/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
)


def seconds(value: Any, name: str, default: float, maximum: float) -> float:
    """A positive number of seconds at most ``maximum``; ``default`` when absent."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise BadRequest(f"{name} must be a number of seconds")
    if value <= 0:
        raise LimitExceeded(f"{name} must be positive, got {value}")
    if value > maximum:
        raise LimitExceeded(f"{name} = {value:g} s is above the server maximum {maximum:g} s")
    return float(value)


def env_vars(value: Any) -> dict[str, str]:
    """Environment variables for the kernel: valid names, string values."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise BadRequest('env must be an object of string values, e.g. {"MODE": "fast"}')
    bad = [k for k in value if not _ENV_NAME.fullmatch(k)]
    if bad:
        raise BadRequest(f"invalid environment variable name(s): {bad}")
    if any("\x00" in v for v in value.values()):
        raise BadRequest("environment variable values cannot contain NUL bytes")
    return dict(value)


def metadata_dict(value: Any) -> dict[str, Any]:
    """Caller-owned labels: scalar values only, so they can be filtered on."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(v, str | int | float | bool) for v in value.values()
    ):
        raise BadRequest("metadata must be an object of strings, numbers or booleans")
    return dict(value)


def image_ref(value: Any) -> str | None:
    """A client's image: one the gateway builds (``sbx/...``), or None for the kernel's own."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _IMAGE.fullmatch(value):
        raise BadRequest(
            "image must name an image the gateway built, like 'sbx/python:1aba6cef39a8' "
            "(GET /v1/kernels lists them), or be null for the kernel's own"
        )
    return value
