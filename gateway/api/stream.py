"""The agent stream: execute over a WebSocket and get events as they happen.

Client -> server: ``{"type": "execute", "id", "code", "timeout"?, "description"?}``
and ``{"type": "interrupt"}``. Server -> client, tagged with the request id:
``status`` (busy/idle), one event per output (``stream``, ``display_data``,
``execute_result``, ``error``), then ``done`` with the HTTP execute reply;
``rejected`` with ``{"error": {code, message}}`` when a request cannot run.
Executions queue per session. A client that goes away interrupts the cell it
started, so abandoned work does not keep burning the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import tornado.websocket

from ..errors import BadRequest, GatewayError
from ..sessions import Session, SessionManager

log = logging.getLogger(__name__)


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
        try:
            self.write_message(json.dumps(event, default=str))
        except tornado.websocket.WebSocketClosedError:
            pass


class StreamHandler(JSONWebSocketHandler):
    session: Session

    def prepare_socket(self, session_id: str) -> None:
        self.session = self.manager.get(session_id)

    def open(self, session_id: str) -> None:
        self.session.connections += 1
        self.session.touch()
        self.tasks: dict[str, asyncio.Task] = {}
        self.running: str | None = None

    def on_message(self, message: str | bytes) -> None:
        self.session.touch()
        try:
            request = json.loads(message)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError as e:
            self.send(_rejected(None, BadRequest(f"message is not a JSON object: {e}")))
            return
        kind = request.get("type")
        request_id = str(request.get("id") or uuid.uuid4())
        if kind == "execute":
            task = self.manager.spawn(self._run(request_id, request))
            self.tasks[request_id] = task
            task.add_done_callback(lambda _: self.tasks.pop(request_id, None))
        elif kind == "interrupt":
            self.manager.spawn(self._interrupt(request_id))
        else:
            error = BadRequest(f"unknown message type {kind!r}; use 'execute' or 'interrupt'")
            self.send(_rejected(request_id, error))

    async def _run(self, request_id: str, request: dict[str, Any]) -> None:
        def started() -> None:
            self.running = request_id
            self.send({"type": "status", "state": "busy", "id": request_id})

        def output(out: dict[str, Any]) -> None:
            event = {k: v for k, v in out.items() if k != "output_type"}
            self.send({"type": out["output_type"], **event, "id": request_id})

        try:
            result = await self.manager.execute(
                self.session.id,
                request.get("code"),
                request.get("timeout"),
                on_output=output,
                description=request.get("description"),
                on_start=started,
            )
        except GatewayError as e:
            self.send(_rejected(request_id, e))
            return
        finally:
            if self.running == request_id:
                self.running = None
        self.send({"type": "status", "state": "idle", "id": request_id})
        self.send({"type": "done", "id": request_id, **result.to_json()})

    async def _interrupt(self, request_id: str) -> None:
        try:
            await self.manager.interrupt(self.session.id)
        except GatewayError as e:
            self.send(_rejected(request_id, e))

    def on_close(self) -> None:
        self.session.connections -= 1
        self.session.touch()
        for request_id, task in list(self.tasks.items()):
            if request_id != self.running:
                task.cancel()  # still queued: never runs
        if self.running is not None:
            log.info("stream client left during %s; interrupting it", self.running)
            self.manager.spawn(self._interrupt(self.running))


def _rejected(request_id: str | None, error: GatewayError) -> dict[str, Any]:
    return {
        "type": "rejected",
        "id": request_id,
        "error": {"code": error.code, "message": error.message},
    }


routes = [(r"/v1/sessions/(?P<session_id>[^/]+)/stream", StreamHandler)]
