"""Decide whether a replayed cell reproduced its recorded outputs.

The rules (also in docs/notebooks.md):
- Compared: each output's type, stream name, text, MIME data, and error
  name/value/traceback, in order. Not compared: output and cell metadata
  (timings, display ids), execution counts.
- Volatile text is normalised first: ANSI colour codes are removed, memory
  addresses (``0x7f3a...``) become ``0x…``, IPython's cell labels
  (``In[7]``, ``Cell In[7]``) and ipykernel's temporary file names lose their
  numbers.
- Images compare by exact bytes, or, with a tolerance, as pixels: equal size
  and a mean absolute difference of at most ``tolerance`` (0 to 1 of full scale).
- With a float tolerance (a cell tagged ``sbx-float-tolerance=1e-6``), lines
  that differ only in numbers match when each pair is close (``math.isclose``
  with that relative and absolute tolerance).
- Tags in nbval's spirit: ``nbval-skip`` / ``sbx-skip`` (not run),
  ``nbval-ignore-output`` / ``sbx-ignore-output`` (run, its status compared,
  not its outputs).
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import io
import math
import re
from collections.abc import Iterable
from typing import Any

from PIL import Image, ImageChops, ImageStat

from ..client.models import IMAGE_TYPES, join_text, strip_ansi

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_CELL_LABEL = re.compile(r"\b(In|Out|Cell In) ?\[\d+\]")
_TMP_CELL_FILE = re.compile(r"/tmp/ipykernel_\d+/\d+\.py")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")

SKIP_TAGS = frozenset({"nbval-skip", "sbx-skip"})
IGNORE_OUTPUT_TAGS = frozenset({"nbval-ignore-output", "sbx-ignore-output"})
TOLERANCE_TAG = "sbx-float-tolerance="


def float_tolerance(tags: Iterable[str]) -> float | None:
    """The tolerance a cell's ``sbx-float-tolerance=X`` tag asks for, if any."""
    for tag in tags:
        if tag.startswith(TOLERANCE_TAG):
            value = tag.removeprefix(TOLERANCE_TAG)
            try:
                tolerance = float(value)
            except ValueError:
                tolerance = -1.0
            if not 0 <= tolerance < math.inf:
                raise ValueError(f"{tag!r}: {TOLERANCE_TAG}X needs a number X >= 0")
            return tolerance
    return None


def _lines_close(a: str, b: str, tolerance: float) -> bool:
    """Whether two lines differ in nothing but numbers within ``tolerance``."""
    if _NUMBER.split(a) != _NUMBER.split(b):
        return False
    return all(
        math.isclose(float(x), float(y), rel_tol=tolerance, abs_tol=tolerance)
        for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b), strict=True)
    )


def normalize_text(text: str) -> str:
    """Strip what legitimately differs between two runs of the same code."""
    text = strip_ansi(text)
    text = _ADDRESS.sub("0x…", text)
    text = _CELL_LABEL.sub(lambda m: f"{m.group(1)}[N]", text)
    return _TMP_CELL_FILE.sub("<cell>", text)


def render(outputs: list[dict[str, Any]]) -> list[str]:
    """Outputs as comparable lines; images become a digest line."""
    lines: list[str] = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            lines.append(f"[{out.get('name')}]")
            lines += normalize_text(join_text(out.get("text", ""))).splitlines()
        elif kind == "error":
            lines.append(f"[error] {out.get('ename')}: {normalize_text(str(out.get('evalue')))}")
            for frame in out.get("traceback", []):
                lines += normalize_text(frame).splitlines()
        else:
            for mime, value in sorted(out.get("data", {}).items()):
                if mime in IMAGE_TYPES:
                    digest = hashlib.sha256(join_text(value).encode()).hexdigest()[:16]
                    lines.append(f"[{kind} {mime}] sha256:{digest}")
                else:
                    lines.append(f"[{kind} {mime}]")
                    text = value if isinstance(value, str | list) else repr(value)
                    lines += normalize_text(join_text(text)).splitlines()
    return lines


def _images(outputs: list[dict[str, Any]]) -> list[str]:
    return [
        join_text(value)
        for out in outputs
        for mime, value in sorted(out.get("data", {}).items())
        if mime in IMAGE_TYPES
    ]


def images_close(a: str, b: str, tolerance: float) -> bool:
    """Whether two base64 images have equal size and pixels within tolerance."""
    with (
        Image.open(io.BytesIO(base64.b64decode(a))) as one,
        Image.open(io.BytesIO(base64.b64decode(b))) as two,
    ):
        if one.size != two.size:
            return False
        diff = ImageChops.difference(one.convert("RGBA"), two.convert("RGBA"))
        mean = sum(ImageStat.Stat(diff).mean) / 4
    return mean / 255 <= tolerance


def diff_outputs(
    recorded: list[dict[str, Any]],
    replayed: list[dict[str, Any]],
    image_tolerance: float | None = None,
    float_tolerance: float | None = None,
) -> str:
    """A unified diff of the normalised outputs; empty when they match."""
    before, after = render(recorded), render(replayed)
    if before != after and float_tolerance is not None and len(before) == len(after):
        # Lines that differ only in close numbers read as the recorded ones.
        after = [
            old if _lines_close(old, new, float_tolerance) else new
            for old, new in zip(before, after, strict=True)
        ]
    if before != after and image_tolerance is not None:
        old, new = _images(recorded), _images(replayed)
        if len(old) == len(new) and all(
            images_close(a, b, image_tolerance) for a, b in zip(old, new, strict=True)
        ):
            # Close enough: let the recorded digests stand in for the replayed ones.
            digests = iter([line for line in before if " sha256:" in line])
            after = [next(digests) if " sha256:" in line else line for line in after]
    if before == after:
        return ""
    return "\n".join(difflib.unified_diff(before, after, "recorded", "replayed", lineterm="", n=2))
