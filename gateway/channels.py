"""Relay a Jupyter client's messages to a session's kernel and back.

Each connected client gets its own ZeroMQ sockets (as Jupyter Server does),
so its traffic never mixes with the gateway's own execute path. Messages are
re-signed with the session's key on the way in and verified on the way out.
Executions a Jupyter client runs are recorded like any other: the relay
folds their iopub outputs into notebook outputs and stores them when the
kernel goes idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio
from zmq.eventloop.zmqstream import ZMQStream

from .kernel import ExecutionResult
from .outputs import OutputCollector
from .sessions import Session, SessionManager

log = logging.getLogger(__name__)

CHANNELS = ("shell", "control", "stdin", "iopub")
Deliver = Callable[[dict[str, Any]], None]


class _Pending:
    """An execute_request from a client, until its kernel goes idle."""

    def __init__(self, code: str, cap: int) -> None:
        self.code = code
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.collector = OutputCollector(cap)


class KernelChannels:
    """One client's connection to one session's kernel."""

    def __init__(self, manager: SessionManager, session: Session, deliver: Deliver) -> None:
        self.manager = manager
        self.session = session
        self.deliver = deliver
        self.sockets: dict[str, zmq.asyncio.Socket] = {}
        self.streams: dict[str, ZMQStream] = {}
        self.pending: dict[str, _Pending] = {}
        self.nudges: set[str] = set()
        self.iopub_ready = asyncio.Event()

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
        self.session.connections += 1
        self.session.touch()
        await self._nudge(timeout)

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
        for stream in self.streams.values():
            stream.on_recv(None)
            stream.close(linger=0)
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.streams.clear()
        self.sockets.clear()
        self.session.connections -= 1
        self.session.touch()

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
            code = msg["content"].get("code", "")
            self.pending[header.get("msg_id", "")] = _Pending(
                code, self.session.limits.output_bytes
            )
        self.session.touch()
        self.signer.send(self.streams[channel], msg)

    def _on_recv(self, channel: str, frames: list[bytes]) -> None:
        try:
            _, parts = self.signer.feed_identities(frames)
            msg = self.signer.deserialize(parts)
        except Exception:
            log.warning("dropping a kernel message that failed to verify on %s", channel)
            return
        if channel == "iopub":
            self.iopub_ready.set()
        if msg.get("parent_header", {}).get("msg_id") in self.nudges:
            return  # answers to our own nudges are not the client's
        msg.pop("buffers", None)
        msg["channel"] = channel
        self._observe(channel, msg)
        self.deliver(msg)

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
            pending.collector.execution_count = msg["content"].get("execution_count")
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
            await self.manager.record_execution(
                self.session, pending.code, result, pending.started_wall
            )
        except Exception:
            log.exception("session %s: could not record an execution", self.session.id)
