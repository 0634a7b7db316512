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
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

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
        self.readers: list[asyncio.Task] = []
        self.pending: dict[str, _Pending] = {}

    def open(self) -> None:
        """Connect this client's sockets and start relaying kernel messages."""
        assert self.session.kernel is not None
        km = self.session.kernel.manager
        identity = uuid.uuid4().bytes
        for channel in CHANNELS:
            connect = getattr(km, f"connect_{channel}")
            sock = connect() if channel == "iopub" else connect(identity=identity)
            self.sockets[channel] = sock
            self.readers.append(self.manager.spawn(self._read(channel, sock)))
        self.session.connections += 1
        self.session.touch()

    def close(self) -> None:
        for task in self.readers:
            task.cancel()
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.sockets.clear()
        self.session.connections -= 1
        self.session.touch()

    def send(self, msg: dict[str, Any]) -> None:
        """Sign and forward one client message to its channel."""
        channel = msg.pop("channel", None) or "shell"
        if channel not in self.sockets or channel == "iopub":
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
        assert self.session.kernel is not None
        self.session.kernel.manager.session.send(self.sockets[channel], msg)

    async def _read(self, channel: str, sock: zmq.asyncio.Socket) -> None:
        assert self.session.kernel is not None
        km_session = self.session.kernel.manager.session
        while True:
            frames = await sock.recv_multipart()
            try:
                _, parts = km_session.feed_identities(frames)
                msg = km_session.deserialize(parts)
            except Exception:
                log.warning("dropping a kernel message that failed to verify on %s", channel)
                continue
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
