"""The agent stream: execute over a WebSocket and get events as they happen.

Client -> server: ``{"type": "execute", "id", "code", "timeout"?, "description"?}``
and ``{"type": "interrupt"}``. Server -> client, tagged with the request id
and numbered with an ``event_id``: ``status`` (busy/idle), one event per
output (``stream``, ``display_data``, ``execute_result``, ``error``,
``clear_output``), then ``done`` with the HTTP execute reply; ``rejected``
with ``{"error": {code, message}}`` when a request cannot run; ``gap`` when
a resuming client asked for events no longer buffered. Queueing, resuming
and abandoning live in ``gateway.streams``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import tornado.websocket

from ..errors import BadRequest, GatewayError
from ..sessions import SessionManager
from ..streams import StreamHub, rejection


class JSONWebSocketHandler(tornado.websocket.WebSocketHandler):
    """A WebSocket whose pre-upgrade failures are the API's JSON errors."""

    @property
    def manager(self) -> SessionManager:
        return self.settings["sbx_manager"]

    def check_origin(self, origin: str) -> bool:
        # API clients, not pages: requests are authorised by token, not by origin.
        return True

    async def get(self, *args: Any, **kwargs: Any) -> None:
        try:
            self.prepare_socket(**kwargs)
        except GatewayError as e:
            self.set_status(e.status)
            self.set_header("Content-Type", "application/json; charset=UTF-8")
            self.finish(json.dumps({"error": {"code": e.code, "message": e.message}}))
            return
        await super().get(*args, **kwargs)

    def prepare_socket(self, **kwargs: Any) -> None:
        """Check the request before the upgrade; raise a GatewayError to refuse it."""

    def send(self, event: dict[str, Any]) -> None:
        """Send one JSON event, unless the client has already gone."""
        self.send_text(json.dumps(event, default=str))

    def send_text(self, text: str) -> None:
        if self.ws_connection is None or self.ws_connection.is_closing():
            return  # the client has gone; what it misses waits in a replay buffer, if any
        self.write_message(text)


class StreamHandler(JSONWebSocketHandler):
    """Thin WebSocket face of the session's ``StreamHub``.

    ``?last_event_id=`` resumes after the last event a client saw.
    """

    hub: StreamHub

    def prepare_socket(self, session_id: str) -> None:
        self.hub = self.manager.stream_hub(session_id)

    def open(self, session_id: str) -> None:
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
            self.hub.submit(request_id, request)
        elif kind == "interrupt":
            self.hub.interrupt(request_id)
        else:
            error = BadRequest(f"unknown message type {kind!r}; use 'execute' or 'interrupt'")
            self.send(rejection(request_id, error))

    def on_close(self) -> None:
        self.hub.unsubscribe(self.send_text)


routes = [(r"/v1/sessions/(?P<session_id>[^/]+)/stream", StreamHandler)]
