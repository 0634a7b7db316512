"""Times as the API writes them: UTC ISO 8601 with milliseconds, and back.

A bottom module (standard library only) so every room, the store and the
Swarm sandbox agent (which ships it beside ``sandbox/workspace.py``) share
one form.
"""

from __future__ import annotations

from datetime import UTC, datetime


def iso(ts: float | None) -> str | None:
    """Render an epoch time as the API's UTC ISO 8601 form."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    """The epoch time of an ``iso()`` string."""
    return datetime.fromisoformat(text).timestamp()
