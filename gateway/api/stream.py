"""The agent stream: execute over a WebSocket and get events as they happen.

Client -> server: ``{"type": "execute", "id", "code", "timeout"?, "description"?}``
and ``{"type": "interrupt"}``. Server -> client, tagged with the request id
and numbered with an ``event_id``: ``status`` (busy/idle), one event per
output (``stream``, ``display_data``, ``execute_result``, ``error``,
``clear_output``), ``tool_call`` (``call_id``, ``tool``, ``arguments``: the
cell called one of the execute's client tools, ``"tools": [...]`` in its
request; the client answers ``{"type": "tool_result", "call_id", "result"}``
or ``"error"``), then ``done`` with the HTTP execute reply; ``rejected``
with ``{"error": {code, message}}`` when a request cannot run; ``gap`` when
a resuming client asked for events no longer buffered. Queueing, resuming
and abandoning live in ``gateway.relays.agent_stream``.
"""

from __future__ import annotations

import json
import uuid

from ..errors import BadRequest
from ..relays.agent_stream import StreamHub, hub_for, rejection
from .base import JSONWebSocketHandler


class StreamHandler(JSONWebSocketHandler):
    """Thin WebSocket face of the session's ``StreamHub``.

    ``?last_event_id=`` resumes after the last event a client saw.
    """

    hub: StreamHub
    transport = "stream"

    def prepare_socket(self, session_id: str) -> None:
        self.hub = hub_for(
            self.manager, self.executions, self.relay_options, session_id, self.principal
        )

    def open(self, session_id: str) -> None:
        self.set_nodelay(True)  # see JSONWebSocketHandler
        self.hub.subscribe(self.send_text, self.get_argument("last_event_id", None))

    def on_message(self, message: str | bytes) -> None:
        self.hub.session.touch()
        try:
            request = json.loads(message)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError as e:
            self.send(rejection(None, BadRequest(f"message is not a JSON object: {e}")))
            return
        kind = request.get("type")
        request_id = str(request.get("id") or uuid.uuid4())
        if kind == "execute":
            queued = self.hub.submit(request_id, request, self.principal)
            outcome = "ok" if queued else "failed"  # as a 400 is, over HTTP
            self.audit_message("session.execute", self.hub.session.id, request.get("code"), outcome)
        elif kind == "interrupt":
            self.hub.interrupt(request_id, self.principal)
        elif kind == "tool_result":
            self.hub.answer(request)
        else:
            error = BadRequest(
                f"unknown message type {kind!r}; use 'execute', 'interrupt' or 'tool_result'"
            )
            self.send(rejection(request_id, error))

    def on_close(self) -> None:
        self.hub.unsubscribe(self.send_text)


routes = [(r"/v1/sessions/(?P<session_id>[^/]+)/stream", StreamHandler)]
