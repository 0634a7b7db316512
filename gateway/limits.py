"""Per-session resource limits: parsing, defaults and server maximums."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from .errors import BadRequest, LimitExceeded

_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(value: Any, what: str = "size") -> int:
    """Turn ``512m``/``1GiB``/``1048576`` into bytes, as docker's CLI reads sizes."""
    if isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)):
        raise LimitExceeded(f"{what} must be a size like '512m' or a number of bytes")
    if isinstance(value, int | float):
        return int(value)
    match = _SIZE.match(str(value))
    if not match:
        raise LimitExceeded(f"{what} {value!r} is not a size; use e.g. '512m', '1g' or bytes")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def format_size(n: int) -> str:
    """Render bytes the way people read limits (``256 MiB``)."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


# Below these no kernel starts (measured with python3: 32m dies at start, 8 pids
# fail it, a 64k workspace cannot be formatted) or the engine refuses the value.
_FLOORS = {"memory": 64 * 2**20, "cpus": 0.01, "pids": 16, "disk": 2**20}


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one session may consume; sizes in bytes, times in seconds."""

    memory: int
    cpus: float
    pids: int
    disk: int
    timeout: float
    output_bytes: int

    _SIZES = ("memory", "disk", "output_bytes")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Limits:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})

    @classmethod
    def requested(cls, raw: Any) -> dict[str, int | float]:
        """Read a client's ``limits`` object: known names, numbers and sizes, no ranges yet."""
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise BadRequest('limits must be an object, e.g. {"memory": "512m"}')
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise BadRequest(f"unknown limit(s) {unknown}; known limits: {sorted(known)}")
        return {name: _coerce(name, value) for name, value in raw.items() if value is not None}

    def resolve(self, requested: Mapping[str, Any] | None, maximum: Limits) -> Limits:
        """Apply requested limits over these defaults, refusing anything above ``maximum``.

        ``requested`` is what ``requested()`` read (reading it again changes nothing).
        """
        values = {**dataclasses.asdict(self), **self.requested(requested)}
        for name, value in values.items():
            ceiling = getattr(maximum, name)
            shown = format_size if name in self._SIZES else str
            if value <= 0:
                raise LimitExceeded(f"limit {name} must be positive, got {value}")
            if value < _FLOORS.get(name, 0):
                raise LimitExceeded(
                    f"limit {name} = {shown(value)} is below the {shown(_FLOORS[name])} "
                    "a kernel needs to start; ask for at least that"
                )
            if value > ceiling:
                raise LimitExceeded(
                    f"limit {name} = {shown(value)} is above the server maximum "
                    f"{shown(ceiling)}; ask for at most that"
                )
        return Limits(**values)


def _coerce(name: str, raw: Any) -> int | float:
    if name in Limits._SIZES:
        return parse_size(raw, name)
    number = raw
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        try:
            number = float(raw)
        except (TypeError, ValueError):
            number = math.nan
    if not math.isfinite(number):
        raise LimitExceeded(f"limit {name} must be a number, got {raw!r}")
    return int(number) if name == "pids" else float(number)
