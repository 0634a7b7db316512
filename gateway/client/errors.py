"""The gateway's error codes as the exceptions of ``gateway.errors``, raised client-side.

The SDK reuses the server's tree rather than mirroring it in a second table:
an ``{"error": {"code", "message"}}`` answer becomes the class with that
``code`` (found by walking ``GatewayError``'s subclasses, so codes added to the
tree later map without touching this module); an unknown code falls back to the
most general class with the same HTTP status, then to ``GatewayError``. The
instance keeps the server's own ``code``, ``status`` and ``message``.

One class is the client's own: ``GatewayUnreachable`` (a ``Unavailable``), for
a gateway that cannot be reached or that dropped the connection.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from ..errors import GatewayError, Unavailable


class GatewayUnreachable(Unavailable):
    """The gateway did not answer: not running, wrong URL, or the connection broke."""

    code = "gateway_unreachable"


def _tree(root: type[GatewayError] = GatewayError) -> Iterator[type[GatewayError]]:
    """Every class of the tree, breadth first, so general classes come before specific ones."""
    level = [root]
    while level:
        yield from level
        level = [sub for cls in level for sub in cls.__subclasses__()]


def error_class(code: str | None, status: int) -> type[GatewayError]:
    """The exception class for an error code, else for the status, else ``GatewayError``."""
    classes = list(_tree())
    for cls in classes:
        if code is not None and cls.__dict__.get("code") == code:
            return cls
    for cls in classes:
        if cls.status == status:
            return cls
    return GatewayError


def make_error(
    code: str | None, message: str, status: int, cls: type[GatewayError] | None = None
) -> GatewayError:
    """An instance carrying the server's words; bypasses subclasses' own constructors."""
    cls = cls or error_class(code, status)
    error = cls.__new__(cls)
    GatewayError.__init__(error, message)
    error.status = status
    error.code = code or cls.code
    return error


def error_from_body(status: int, body: bytes | str, reason: str = "") -> GatewayError:
    """Turn an HTTP error answer into the matching exception."""
    try:
        detail = json.loads(body)["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        text = body if isinstance(body, str) else bytes(body).decode(errors="replace")
        code, message = None, f"HTTP {status} {reason}: {text.strip()[:500]}".strip(": ")
    return make_error(code, message, status)


def error_from_event(error: object) -> GatewayError:
    """Turn a stream ``rejected`` event's ``{"code", "message"}`` into the matching exception."""
    detail = error if isinstance(error, dict) else {}
    code = str(detail.get("code") or "internal_error")
    cls = error_class(code, 500)
    return make_error(code, str(detail.get("message") or "request rejected"), cls.status, cls)
