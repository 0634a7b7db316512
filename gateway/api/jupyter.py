"""The Jupyter kernels API, so stock Jupyter Server / JupyterLab can use the gateway.

Shapes and status codes follow Jupyter Server's own ``/api/kernels`` and
``/api/kernelspecs`` (what its ``--gateway-url`` client expects). A kernel is
a session: same sandbox, limits, TTL, history and export.
"""

from __future__ import annotations

import json
import logging
import mimetypes
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import BadRequest, NotFound, QuotaExceeded
from ..relays.agent_stream import ReplayBuffer
from ..relays.jupyter_channels import ChannelsRelay
from ..sessions.kernel_env import kernel_start
from ..sessions.listing import PAGE_MAX
from ..sessions.model import Session
from ..timestamps import parse_iso
from .base import JSONHandler, JSONWebSocketHandler

log = logging.getLogger(__name__)

# The Jupyter Server REST API version whose shapes this follows.
API_VERSION = "2.14.0"


def kernel_model(session: Session) -> dict[str, Any]:
    return kernel_of(session.to_json(), session.connections)


def kernel_of(view: dict[str, Any], connections: int = 0) -> dict[str, Any]:
    """A session's view as Jupyter's kernel model; ``connections``: this gateway's clients."""
    return {
        "id": view["id"],
        "name": view["kernel"],
        "last_activity": datetime.fromtimestamp(parse_iso(view["last_activity"]), UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"  # Jupyter's own form, to the microsecond
        ),
        "execution_state": {"deleted": "dead"}.get(view["state"], view["state"]),
        "connections": connections,
    }


class ApiHandler(JSONHandler):
    async def get(self) -> None:
        self.send({"version": API_VERSION, "gateway": f"sandbox-gateway {__version__}"})


class KernelSpecsHandler(JSONHandler):
    async def get(self) -> None:
        specs = self.kernelspecs
        kernelspecs = {name: self._spec(name) for name in specs.names()}
        self.send({"default": specs.default, "kernelspecs": kernelspecs})

    def _spec(self, name: str) -> dict[str, Any]:
        spec = self.kernelspecs.get(name)
        resources = {
            path.stem: f"/kernelspecs/{name}/{path.name}"
            for path in sorted(Path(spec.resource_dir).iterdir())
            if path.name != "kernel.json"
        }
        return {"name": name, "spec": spec.to_dict(), "resources": resources}


class KernelSpecHandler(KernelSpecsHandler):
    async def get(self, name: str) -> None:  # type: ignore[override]
        self.send(self._spec(name))


class KernelSpecResourceHandler(JSONHandler):
    """Logos and other files of a kernelspec's directory."""

    async def get(self, name: str, filename: str) -> None:
        directory = Path(self.kernelspecs.get(name).resource_dir)
        path = directory / filename
        if "/" in filename or filename == "kernel.json" or not path.is_file():
            raise NotFound(f"kernelspec {name!r} has no resource {filename!r}")
        self.set_header(
            "Content-Type", mimetypes.guess_type(filename)[0] or "application/octet-stream"
        )
        self.finish(path.read_bytes())


class KernelsHandler(JSONHandler):
    actions = {"POST": "kernel.start"}

    async def get(self) -> None:
        views, _ = await self.listing.page(self.principal, limit=PAGE_MAX)
        local = self.manager.sessions
        self.send(
            [kernel_of(v, local[v["id"]].connections if v["id"] in local else 0) for v in views]
        )

    async def post(self) -> None:
        start = kernel_start(self.json_body(), self.api_options.jupyter_ttl_from)
        try:
            session = await self.manager.create(start.request, self.principal)
        except (BadRequest, QuotaExceeded) as e:  # name the KERNEL_* variable it came from
            e.message += start.blame(e.message)
            raise
        self.audit_session = session.id
        self.set_header("Location", f"/api/kernels/{session.id}")
        self.send(kernel_model(session), status=201)


class KernelHandler(JSONHandler):
    actions = {"DELETE": "kernel.delete"}

    async def get(self, kernel_id: str) -> None:
        self.send(kernel_model(self.manager.get(kernel_id, self.principal)))

    async def delete(self, kernel_id: str) -> None:
        await self.manager.delete(kernel_id, self.principal)
        self.set_status(204)
        self.finish()


class KernelActionHandler(JSONHandler):
    actions = {"POST": "kernel.action"}

    async def post(self, kernel_id: str, action: str) -> None:
        self.audit_detail["action"] = action
        if action == "interrupt":
            await self.manager.interrupt(kernel_id, self.principal)
            self.set_status(204)
            self.finish()
        else:
            session = await self.manager.restart(kernel_id, self.principal)
            self.send(kernel_model(session))


class ChannelsHandler(JSONWebSocketHandler):
    """``/api/kernels/{id}/channels``: Jupyter's JSON message protocol over text frames.

    A client that reconnects with the same ``?session_id=`` within the
    reconnect grace gets the messages it missed first, as Jupyter Server does.
    """

    relay: ChannelsRelay
    resuming = False
    transport = "jupyter"

    def prepare_socket(self, kernel_id: str) -> None:
        session = self.manager.get(kernel_id, self.principal)
        self.client_session = self.get_argument("session_id", None)
        parked = session.parked.get(self.client_session or "")
        if parked is not None:
            parked.check_resumer(self.principal)
            self.relay, self.resuming = parked, True
        else:
            self.relay = ChannelsRelay(
                self.manager,
                self.executions,
                session,
                self.principal,
                self._deliver,
                self.relay_options.reconnect_grace,
                ReplayBuffer(self.relay_options),
            )

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return None  # the legacy JSON protocol; clients fall back to it

    async def open(self, kernel_id: str) -> None:
        self.set_nodelay(True)  # see JSONWebSocketHandler
        await self.manager.wake(kernel_id, self.principal)  # a paused kernel resumes first
        if self.resuming:
            self.relay.resume(self._deliver)
        else:
            await self.relay.open()
        self.relay.session.on_end.add(self._session_ended)

    def _session_ended(self, reason: str) -> None:
        """Close the client's WebSocket: a kernel that is gone must not look merely quiet."""
        said = f"the kernel's session ended: {reason}".encode()[:123]  # a close reason's most
        self.close(1001, said.decode(errors="ignore"))

    def _deliver(self, text: str) -> None:
        log.debug("kernel -> client %s: %.200s", self.relay.session.id, text)
        self.send_text(text)
        if self.too_slow:
            # Stop reading the kernel for it now, not after the closing
            # handshake: what libzmq queued meanwhile would wait in memory.
            self.relay.close()

    def on_message(self, message: str | bytes) -> None:
        log.debug("client -> kernel %s: %.300s", self.relay.session.id, message)
        try:
            msg = json.loads(message)
            if not isinstance(msg, dict) or not isinstance(msg.get("header"), dict):
                raise ValueError("a Jupyter message needs a header")
            self._audit(msg)
            self.relay.send(msg)
        except (ValueError, TypeError) as e:
            self.send({"channel": "error", "error": f"message refused: {e}"})

    def _audit(self, msg: dict[str, Any]) -> None:
        """Executes and interrupts are state changes; the other messages are not."""
        kind = msg["header"].get("msg_type")
        if kind not in ("execute_request", "interrupt_request", "shutdown_request"):
            return
        self.audit_message(
            "kernel.execute" if kind == "execute_request" else f"kernel.{kind}",
            self.relay.session.id,
            (msg.get("content") or {}).get("code"),
            msg_type=kind,
        )

    def on_close(self) -> None:
        session = self.relay.session
        session.on_end.discard(self._session_ended)
        if self.client_session and session.state != "deleted" and self.relay.sockets:
            self.relay.park(self.client_session)
        else:
            self.relay.close()


_KERNEL = r"/api/kernels/(?P<kernel_id>[^/]+)"
routes = [
    (r"/api/?", ApiHandler),
    (r"/api/kernelspecs/?", KernelSpecsHandler),
    (r"/api/kernelspecs/(?P<name>[^/]+)/?", KernelSpecHandler),
    (r"/kernelspecs/(?P<name>[^/]+)/(?P<filename>[^/]+)", KernelSpecResourceHandler),
    (r"/api/kernels/?", KernelsHandler),
    (_KERNEL + r"/?", KernelHandler),
    (_KERNEL + r"/(?P<action>interrupt|restart)/?", KernelActionHandler),
    (_KERNEL + r"/channels", ChannelsHandler),
]
