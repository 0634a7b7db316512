"""Kernel iopub messages -> nbformat v4 outputs, under a per-execution byte cap.

Outputs are kept in notebook shape from the start so an export is a copy.
Every message that carries a payload counts against the cap, whether it is
kept (streams, displays, display updates, errors) or not (comm messages,
input requests), and a clear does not give its bytes back: what an
execution can make the gateway handle and store is bounded, not only what
it shows last. Whatever exceeds the cap is counted and dropped as it
arrives, never held, and a visible marker says how much was cut; errors
are always kept, cut to a small budget, because they are what a caller
most needs to see.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..limits import format_size
from ..masking import NO_SECRETS, Masker, MaskingStream

_JSON_MIME = re.compile(r"^application/(.*\+)?json$")
_MIME = re.compile(r"^[a-zA-Z0-9]+/[a-zA-Z0-9\-+.]+$")  # what nbformat takes as a MIME key
OUTPUT_MSG_TYPES = {"stream", "display_data", "execute_result", "error", "update_display_data"}
# Messages with a payload the notebook has no place for: counted, never kept.
COUNTED_MSG_TYPES = {"comm_open", "comm_msg", "comm_close", "input_request"}

# An error's traceback is kept even past the cap, but not without bound.
_ERROR_BUDGET = 64 * 1024


def output_size(output: dict[str, Any]) -> int:
    """Characters an output costs against the cap; cheap even for huge streams."""
    if output["output_type"] == "stream":
        return len(output["text"])
    return len(json.dumps(output, ensure_ascii=False))


def payload_size(content: Any) -> int:
    """Characters of text in a message's content, counted without serialising it again."""
    size, pending = 0, [content]
    while pending:  # not recursive: a hostile kernel chooses the nesting
        value = pending.pop()
        if isinstance(value, str):
            size += len(value)
        elif isinstance(value, dict):
            size += sum(len(str(key)) for key in value)
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        else:
            size += 8
    return size


# Told of every output kept (a copy, safe to hold) and, as None, of every clear.
OutputListener = Callable[[dict[str, Any] | None], None]


@dataclass(frozen=True)
class OutputCap:
    """What one execution may keep: the smaller of its own cap and its session's rest."""

    bytes: int
    limit: str | None = None  # the truncation note's words for it; None: the execution's cap


class OutputCollector:
    """Accumulates one execution's outputs as notebook outputs."""

    def __init__(
        self,
        cap_bytes: int,
        listener: OutputListener | None = None,
        limit: str | None = None,
        mask: Masker = NO_SECRETS,
    ) -> None:
        self.cap = cap_bytes
        # The limit the cut is over, and what to do about it, for the truncation note.
        self.limit = limit or (
            f"this execution's limit of {format_size(cap_bytes)} (raise limits.output_bytes, "
            "or write large results to a file)"
        )
        self.listener = listener
        self.mask = mask  # a session's secrets, masked before anyone hears of an output
        # A stream's text is masked as one: the end of a message that may begin a
        # secret is held back until that stream's next message, or until another output.
        self._stream = MaskingStream(mask)
        self._stream_name = "stdout"
        self.outputs: list[dict[str, Any]] = []
        # Text that continues the last output's stream; joined once, not per chunk
        # (appending chunk by chunk copies a long stream over and over).
        self._tail: list[str] = []
        self.used = 0
        self.dropped = 0
        self.lost = 0  # connections dropped on an oversized message (see execution.kernel)
        self.execution_count: int | None = None
        self.error: dict[str, Any] | None = None
        self._clear_pending = False
        # The outputs kept of each display id: an update need not scan every output.
        self._displays: dict[str, list[dict[str, Any]]] = {}

    @property
    def truncated(self) -> bool:
        return self.dropped > 0 or self.lost > 0

    def add_message(self, msg: dict[str, Any]) -> None:
        """Fold one iopub message in; the listener hears of what it changed."""
        kind = msg["header"]["msg_type"]
        if self.mask:
            msg = {**msg, "content": self._masked(kind, msg["content"])}
        content = msg["content"]
        if kind == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
            else:
                self._clear()
            return
        if kind == "execute_input":
            self.execution_count = execution_count(content)
            return
        if kind in COUNTED_MSG_TYPES:
            self._count(payload_size(content))
            return
        if kind not in OUTPUT_MSG_TYPES:
            return
        if kind == "update_display_data":
            self._update_display(content)
            return
        if self._clear_pending:
            self._clear()
        output = _output(msg)
        if output.get("text") == "":  # charged nothing: stored, a flood of them would be free
            return
        display_id = _display_id(content) if "metadata" in output else None  # not a note
        if display_id:
            output["metadata"]["sbx_display_id"] = display_id
        if output["output_type"] == "error":  # not a note saying an odd error was dropped
            output = self._append(output, budget=self.used + _ERROR_BUDGET)
            assert output is not None  # an error is always kept
            self.error = {k: output[k] for k in ("ename", "evalue", "traceback")}
        elif self._append(output, budget=self.cap) is not None and display_id:
            self._displays.setdefault(display_id, []).append(output)

    def _masked(self, kind: str, content: dict[str, Any]) -> dict[str, Any]:
        """The content masked; a stream's text as one text with its earlier messages."""
        name, text = content.get("name"), content.get("text")
        if kind != "stream" or name not in ("stdout", "stderr") or not isinstance(text, str):
            self._let_out()
            return self.mask.tree(content)
        if name != self._stream_name:
            self._let_out()
            self._stream_name = name
        return {"name": name, "text": self._stream.feed(text)}

    def _let_out(self) -> None:
        """Keep what a stream held back: another output, or the end, came after it."""
        if self._stream.held:
            if self._clear_pending:
                self._clear()
            output = {"output_type": "stream", "name": self._stream_name}
            self._append({**output, "text": self._stream.flush()}, budget=self.cap)

    def _count(self, size: int) -> bool:
        """Charge a payload nothing keeps; False, and counted as dropped, past the cap."""
        if size > self.cap - self.used:
            self.dropped += size
            return False
        self.used += size
        return True

    def _append(self, output: dict[str, Any], budget: int) -> dict[str, Any] | None:
        """Keep what fits of ``output`` within ``budget``; return what was kept."""
        size = output_size(output)
        room = budget - self.used
        if size > room:
            if output["output_type"] == "stream" and room > 0:
                # Keep what fits of a stream so the cut lands at a visible spot.
                kept = {**output, "text": output["text"][:room]}
            elif output["output_type"] == "error":
                kept = _cut_error(output, room)
            else:
                self.dropped += size
                return None
            self.dropped += size - output_size(kept)
            output, size = kept, output_size(kept)
        if self.listener is not None:
            self.listener(dict(output))  # a copy: the stored one may grow by merging
        self._store(output, size)
        return output

    def _store(self, output: dict[str, Any], size: int) -> None:
        last = self.outputs[-1] if self.outputs else None
        if (
            output["output_type"] == "stream"
            and last is not None
            and last["output_type"] == "stream"
            and last["name"] == output["name"]
        ):
            self._tail.append(output["text"])
        else:
            self._join_tail()
            self.outputs.append(output)
        self.used += size

    def _join_tail(self) -> None:
        if self._tail:
            last = self.outputs[-1]
            last["text"] += "".join(self._tail)
            self._tail.clear()

    def _clear(self) -> None:
        if not self.outputs:  # nothing since the last clear: a flood of them writes nothing
            self._clear_pending = False
            return
        self._tail.clear()
        self.outputs.clear()
        self._displays.clear()
        self._clear_pending = False
        if self.listener is not None:
            self.listener(None)

    def _update_display(self, content: dict[str, Any]) -> None:
        """Replace a display's data in place; the new data is charged like a new output."""
        if not self._count(payload_size(content)):
            return
        display_id, data = _display_id(content), content.get("data", {})
        metadata = content.get("metadata", {})
        if not display_id or not isinstance(data, dict):
            return  # nothing to update, or nothing to update it with
        for output in self._displays.get(display_id, ()):
            output["data"] = {k: _as_text(k, v) for k, v in data.items()}
            output["metadata"] = {
                **(metadata if isinstance(metadata, dict) else {}),
                "sbx_display_id": display_id,
            }

    def finish(self) -> list[dict[str, Any]]:
        """Return the final outputs, with the truncation marker when anything was cut."""
        self._let_out()
        self._join_tail()
        notes = []
        if self.dropped:
            notes.append(f"{format_size(self.dropped)} dropped, over {self.limit}")
        if self.lost:
            notes.append(
                "the kernel sent a message larger than the gateway's max_kernel_message "
                "(or of more than 10000 frames), "
                "which was refused unread; outputs sent while the connection was made "
                "again may be missing (write large results to a file)"
            )
        if notes:
            self.outputs.append(
                {
                    "output_type": "stream",
                    "name": "stderr",
                    "text": f"\n[sbx: output truncated: {'; '.join(notes)}]\n",
                }
            )
        return self.outputs


MAX_EXECUTION_COUNT = 2**31  # PostgreSQL's INTEGER; SQLite's holds 2**63


def execution_count(content: dict[str, Any]) -> int | None:
    """The message's execution count if it is one (a kernel may send any JSON there,
    and any integer: one no store column holds would cost the execution its record)."""
    count = content.get("execution_count")
    return count if type(count) is int and 0 <= count < MAX_EXECUTION_COUNT else None


def _display_id(content: dict[str, Any]) -> str | None:
    transient = content.get("transient")
    display_id = transient.get("display_id") if isinstance(transient, dict) else None
    return display_id if isinstance(display_id, str) else None


def _cut_error(output: dict[str, Any], room: int) -> dict[str, Any]:
    """An error that fits ``room``: its value and its last traceback lines, each cut short."""
    line = max(room // 40, 80)
    return {
        **output,
        "ename": output["ename"][:line],
        "evalue": _shorten(output["evalue"], room // 4),
        "traceback": [_shorten(text, line) for text in output["traceback"][-20:]],
    }


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} cut]"


def _output(msg: dict[str, Any]) -> dict[str, Any]:
    """The message as a notebook output, even when the kernel sent what nbformat refuses.

    Messages of the usual, evidently valid shapes are converted directly:
    validating each against nbformat's schema costs more than the rest of
    an execute's handling together.

    Kernels may publish a MIME bundle with a non-text value (``display({'x': 1},
    raw=True)``); such values are kept as JSON text, and an output that still
    does not fit the notebook format becomes a visible note, never an error of
    the whole execution.
    """
    plain = _plain_output(msg["header"]["msg_type"], msg["content"])
    if plain is not None:
        return plain
    # Here, not at the top: nbformat's schema validator takes 0.9 s to import, which every
    # ``sbx`` client command paid through the settings (the gateway has it from its start).
    from nbformat import ValidationError
    from nbformat.v4 import new_output, output_from_msg

    try:
        return output_from_msg(msg)
    except (ValidationError, KeyError):  # KeyError: a field the message type needs is missing
        pass
    content = dict(msg["content"])
    if isinstance(content.get("data"), dict):
        content["data"] = {k: _as_text(k, v) for k, v in content["data"].items()}
    if not isinstance(content.get("metadata"), dict):
        content["metadata"] = {}
    try:
        return output_from_msg({**msg, "content": content})
    except (ValidationError, KeyError) as e:
        kind = msg["header"]["msg_type"]
        reason = str(e).splitlines()[0] if isinstance(e, ValidationError) else f"no {e}"
        return new_output(
            "stream",
            name="stderr",
            text=f"[sbx: dropped a {kind} output the notebook format cannot hold: {reason}]\n",
        )


def _plain_output(kind: str, content: dict[str, Any]) -> dict[str, Any] | None:
    """The output of a message whose shape the notebook format accepts as it is, else None."""
    if kind == "stream":
        if content.get("name") in ("stdout", "stderr") and isinstance(content.get("text"), str):
            return {"output_type": "stream", "name": content["name"], "text": content["text"]}
        return None
    if kind == "error":
        traceback = content.get("traceback")
        if (
            isinstance(content.get("ename"), str)
            and isinstance(content.get("evalue"), str)
            and isinstance(traceback, list)
            and all(isinstance(line, str) for line in traceback)
        ):
            return {
                "output_type": "error",
                "ename": content["ename"],
                "evalue": content["evalue"],
                "traceback": list(traceback),
            }
        return None
    data, metadata = content.get("data"), content.get("metadata", {})
    if not (isinstance(data, dict) and isinstance(metadata, dict)):
        return None
    for mime, value in data.items():
        if not _MIME.match(mime) or not (isinstance(value, str) or _JSON_MIME.match(mime)):
            return None
    output = {"output_type": kind, "data": dict(data), "metadata": dict(metadata)}
    if kind == "execute_result":
        count = content.get("execution_count")
        if not isinstance(count, int):
            return None
        output["execution_count"] = count
    return output


def _as_text(mime: str, value: Any) -> Any:
    """A MIME bundle value nbformat accepts: text, or any JSON under a JSON type."""
    if _JSON_MIME.match(mime) or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return value
    return json.dumps(value, default=str)
