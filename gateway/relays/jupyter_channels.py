"""Relay a Jupyter client's messages to a session's kernel and back.

Each connected client gets its own ZeroMQ sockets (as Jupyter Server does),
so its traffic never mixes with the gateway's own execute path. Messages are
re-signed with the session's key on the way in and verified on the way out.
Executions a Jupyter client runs are recorded like any other, outputs stored
as they arrive. When a client's WebSocket drops, its relay is parked under
the client's session id and keeps buffering (bounded) for the reconnect
grace; a reconnect with the same session id gets the missed messages first,
as with Jupyter Server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.jsonutil import json_default
from zmq.eventloop.zmqstream import ZMQStream

from ..errors import Denied
from ..execution.kernel import DropWatch, ExecutionResult
from ..execution.outputs import OutputCollector, execution_count
from ..sessions.manager import Session, SessionManager
from .agent_stream import ReplayBuffer

log = logging.getLogger(__name__)

# The parts of a kernel message the relay reads as objects; anything else is dropped.
_OBJECTS = ("header", "parent_header", "metadata", "content")

CHANNELS = ("shell", "control", "stdin", "iopub")
Deliver = Callable[[str], None]  # gets each kernel message as JSON text


class _Pending:
    """An execute_request from a client, recorded from the moment it is relayed."""

    def __init__(
        self, manager: SessionManager, session: Session, code: str, review: dict[str, Any]
    ) -> None:
        self.started = time.monotonic()
        self.recorder = manager.begin_execution(session, code, review=review)
        cap = manager.output_cap(session)
        self.collector = OutputCollector(
            cap.bytes, self.recorder.listener(), cap.limit, session.masker
        )


class KernelChannels:
    """One client's connection to one session's kernel."""

    def __init__(self, manager: SessionManager, session: Session, deliver: Deliver) -> None:
        self.manager = manager
        self.session = session
        self.deliver = deliver
        self.sockets: dict[str, zmq.asyncio.Socket] = {}
        self.streams: dict[str, ZMQStream] = {}
        self.drops: DropWatch | None = None
        self.pending: dict[str, _Pending] = {}
        self.nudges: set[str] = set()
        self.iopub_ready = asyncio.Event()
        self.connected = False
        self.parked_as: str | None = None
        self.buffer = ReplayBuffer(manager.settings)
        self._expiry: asyncio.TimerHandle | None = None
        self.dropped = 0  # kernel messages not relayed: unverified or the wrong shape

    async def open(self, timeout: float = 10.0) -> None:
        """Connect this client's sockets and relay kernel messages once iopub flows."""
        assert self.session.kernel is not None
        km = self.session.kernel.manager
        # Our own signer: a Session remembers every signature it has verified and
        # refuses repeats, and each connection receives its own copy of iopub.
        self.signer = km.session.clone()
        identity = uuid.uuid4().bytes
        for channel in CHANNELS:
            connect = getattr(km, f"connect_{channel}")
            sock = connect() if channel == "iopub" else connect(identity=identity)
            # A ZMQStream, not an awaited recv: with a recv pending on an asyncio
            # socket, a send on it can swallow the edge-triggered wake-up and
            # the reply then sits unread (seen here as lost execute_replies).
            stream = ZMQStream(zmq.Socket.shadow(sock.underlying))
            stream.on_recv(functools.partial(self._on_recv, channel))
            self.sockets[channel] = sock
            self.streams[channel] = stream
        self.drops = DropWatch(list(self.sockets.values()))  # an oversized message cuts one
        self._connect_client()
        await self._nudge(timeout)

    def _connect_client(self) -> None:
        self.connected = True
        self.session.connections += 1
        self.session.touch()

    def _disconnect_client(self) -> None:
        self.connected = False
        self.session.connections -= 1
        self.session.touch()

    def park(self, client_session: str) -> None:
        """The client's WebSocket dropped: buffer for it until it comes back or the grace ends."""
        self._disconnect_client()
        self.parked_as = client_session
        self.session.parked[client_session] = self
        grace = self.manager.settings.reconnect_grace
        self._expiry = asyncio.get_running_loop().call_later(grace, self.close)

    def resume(self, deliver: Deliver) -> None:
        """A parked client came back: replay what it missed, then relay live."""
        if self._expiry is not None:
            self._expiry.cancel()
        self.session.parked.pop(self.parked_as or "", None)
        self.parked_as = None
        self._connect_client()
        for text in self.buffer.drain():
            deliver(text)
        self.deliver = deliver

    async def _nudge(self, timeout: float) -> None:
        """Ask for kernel_info until iopub answers, as Jupyter Server does.

        A new SUB socket misses whatever the kernel publishes before its
        subscription arrives; without this a client's first outputs can vanish.
        """
        deadline = time.monotonic() + timeout
        while not self.iopub_ready.is_set() and time.monotonic() < deadline:
            msg = self.signer.msg("kernel_info_request")
            self.nudges.add(msg["header"]["msg_id"])
            self.signer.send(self.streams["shell"], msg)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.iopub_ready.wait(), 0.5)

    def close(self) -> None:
        """Close the sockets; safe to call twice."""
        if self._expiry is not None:
            self._expiry.cancel()
        if self.parked_as is not None:
            self.session.parked.pop(self.parked_as, None)
            self.parked_as = None
        if self.drops is not None:
            self.drops.close()
        for stream in self.streams.values():
            stream.on_recv(None)
            stream.close(linger=0)
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.streams.clear()
        self.sockets.clear()
        if self.connected:
            self._disconnect_client()

    def send(self, msg: dict[str, Any]) -> None:
        """Sign and forward one client message to its channel."""
        channel = msg.pop("channel", None) or "shell"
        if channel not in self.streams or channel == "iopub":
            raise ValueError(f"cannot send on channel {channel!r}")
        for key in ("header", "parent_header", "metadata", "content"):
            msg.setdefault(key, {})
        msg.pop("buffers", None)
        header = msg["header"]
        if header.get("msg_type") == "execute_request" and not msg["content"].get("silent"):
            code = str(msg["content"].get("code", ""))
            session = self.session
            decision = self.manager.gate.judge(
                session.tenant, session.policy, session.language, code
            )
            if decision.action != "allow":
                # Jupyter's protocol has no "wait for a person": held code is refused here.
                verb = "refuses" if decision.action == "deny" else "holds"
                raise Denied(
                    f"the policy {verb} this code: {'; '.join(decision.reasons)}"
                    + ("; held code runs through the v1 API or the agent stream, where an "
                       "approver can approve it" if decision.action == "hold" else "")
                )  # fmt: skip
            review = {"decision": decision.to_json()}
            self.pending[header.get("msg_id", "")] = _Pending(self.manager, session, code, review)
        self.session.touch()
        self.signer.send(self.streams[channel], msg)

    def _on_recv(self, channel: str, frames: list[bytes]) -> None:
        try:
            _, parts = self.signer.feed_identities(frames)
            msg = self.signer.deserialize(parts)
            if not all(isinstance(msg[part], dict) for part in _OBJECTS):
                raise TypeError("a part of it is not a JSON object")
            if not isinstance(msg["msg_type"], str) or not isinstance(
                msg["parent_header"].get("msg_id", ""), str
            ):
                raise TypeError("its type or its parent's id is not a string")
        except Exception as e:  # a kernel has its key: signed is not well-formed
            self.dropped += 1
            if self.dropped == 1:  # once: a kernel may send a million
                log.warning("session %s: dropping kernel messages on %s (first: %s)",
                            self.session.id, channel, e)  # fmt: skip
            return
        if channel == "iopub":
            self.iopub_ready.set()
        if msg.get("parent_header", {}).get("msg_id") in self.nudges:
            return  # answers to our own nudges are not the client's
        msg.pop("buffers", None)
        if self.session.masker:
            msg["content"] = self.session.masker.tree(msg["content"])
        msg["channel"] = channel
        self._observe(channel, msg)
        text = json.dumps(msg, default=json_default)
        if self.connected:
            self.deliver(text)
        else:
            self.buffer.append(text)  # for the parked client

    def _observe(self, channel: str, msg: dict[str, Any]) -> None:
        """Follow executions this client started, and the kernel's busy/idle state."""
        parent = msg.get("parent_header", {}).get("msg_id")
        pending = self.pending.get(parent)
        kind = msg["msg_type"]
        if channel == "iopub" and kind == "status":
            state = msg["content"].get("execution_state")
            if state in ("busy", "idle") and self.session.state in ("idle", "busy"):
                self.session.state = state
        if pending is None:
            return
        if channel == "shell" and kind == "execute_reply":
            pending.collector.execution_count = execution_count(msg["content"])
        elif channel == "iopub":
            if kind == "status" and msg["content"].get("execution_state") == "idle":
                del self.pending[parent]
                self.manager.spawn(self._record(pending))
            else:
                pending.collector.add_message(msg)

    async def _record(self, pending: _Pending) -> None:
        error = pending.collector.error
        status = "ok" if error is None else "error"
        if error is not None and error.get("ename") == "KeyboardInterrupt":
            status = "interrupted"
        result = ExecutionResult.collected(status, pending.collector, pending.started)
        try:
            await self.manager.finish_execution(self.session, pending.recorder, result)
        except Exception:
            log.exception("session %s: could not record an execution", self.session.id)
