"""One execute over the agent stream, without I/O: the request to send, events folded in.

Both halves of the SDK drive a ``Run``: they send its request on the
session's ``/stream`` WebSocket and hand every frame to ``run.feed`` until
``run.execution`` is set. Parsing is tolerant by design: frames for other
requests, unknown event types and unknown fields are ignored, so a newer
gateway never breaks an older SDK. The last ``event_id`` seen lets a half
resume a dropped stream where it left off; a ``gap`` (events lost meanwhile,
e.g. the gateway restarted) ends the run with an error, since its outcome
may be among them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypedDict, Unpack

from .errors import GatewayUnreachable, error_from_event
from .models import Approval, Execution, ExecutionError, Result
from .tools import ClientTools

Callback = Callable[[Any], Any]


class RunCallbacks(TypedDict, total=False):
    """Called as a streamed execution's outputs arrive (coroutine functions too, when async)."""

    on_stdout: Callback  # text written to stdout
    on_stderr: Callback  # text written to stderr
    on_result: Callback  # a Result: display() output or the cell's value
    on_error: Callback  # an ExecutionError: what the code raised
    on_pending: Callback  # an Approval: the policy held the code for an approver


class Run:
    """The request and the state of one streamed execution."""

    def __init__(
        self,
        code: str,
        timeout: float | None = None,
        description: str | None = None,
        env: Mapping[str, str] | None = None,
        context: str | None = None,
        tools: ClientTools | None = None,
        **callbacks: Unpack[RunCallbacks],
    ) -> None:
        """``tools``: the session's client tools, answered while this run's code calls them."""
        unknown = set(callbacks) - set(RunCallbacks.__annotations__)
        if unknown:
            raise TypeError(f"unknown callback(s) {sorted(unknown)}")
        self.id = uuid.uuid4().hex
        message: dict[str, Any] = {"type": "execute", "id": self.id, "code": code}
        if timeout is not None:
            message["timeout"] = timeout
        if description is not None:
            message["description"] = description
        if env:
            message["env"] = dict(env)
        if context is not None:
            message["context"] = context
        self.tools = tools
        if tools is not None and tools.specs():
            message["tools"] = tools.specs()
        self._request: str | None = json.dumps(message)
        self.callbacks = callbacks
        self.execution: Execution | None = None
        self.started = False  # the gateway said this cell is running (not just queued)
        self.last_event_id: str | None = None  # where to resume a dropped stream
        self.resumes = 0

    def take_request(self) -> str | None:
        """The execute request, the first time only: a resumed stream must not send it again."""
        request, self._request = self._request, None
        return request

    @property
    def interrupt_request(self) -> str | None:
        """What to send to stop this cell when leaving early, if it is the one running."""
        if not self.started or self.execution is not None:
            return None
        return json.dumps({"type": "interrupt", "id": self.id})

    def feed(self, frame: str | bytes) -> list[Any]:
        """Fold one server frame in; return what the callbacks it fired returned.

        The async half awaits the returned values that are awaitable, so its
        callbacks may be coroutine functions. A ``rejected`` event raises the
        gateway error it carries.
        """
        try:
            event = json.loads(frame)
        except ValueError:
            return []
        if not isinstance(event, dict):
            return []
        if event.get("event_id") is not None:
            self.last_event_id = str(event["event_id"])
        if event.get("type") == "gap":
            raise GatewayUnreachable(
                f"the stream lost events while reconnecting: {event.get('message', '')}"
            )
        if event.get("id") != self.id:
            return []
        kind = event.get("type")
        if kind == "status":
            self.started = event.get("state") == "busy"
        elif kind == "stream":
            name = "on_stdout" if event.get("name") == "stdout" else "on_stderr"
            return self._fire(name, str(event.get("text", "")))
        elif kind in ("display_data", "execute_result"):
            return self._fire("on_result", Result.from_output(event))
        elif kind == "error":
            return self._fire("on_error", ExecutionError.from_json(event))
        elif kind == "pending_approval":  # the run goes on waiting: done, or rejected (denied)
            return self._fire("on_pending", Approval.from_json(event))
        elif kind == "done":
            self.execution = Execution.from_json(
                {k: v for k, v in event.items() if k not in ("type", "id")}
            )
        elif kind == "rejected":
            raise error_from_event(event.get("error"))
        elif kind == "tool_call" and self.tools is not None:  # a ToolReply to send back
            return [self.tools.answer(event)]
        return []

    def _fire(self, name: str, value: Any) -> list[Any]:
        callback = self.callbacks.get(name)
        return [] if callback is None else [callback(value)]
