"""Relay a Jupyter client's messages to a session's kernel and back.

Each connected client gets its own ZeroMQ sockets (as Jupyter Server does),
so its traffic never mixes with the gateway's own execute path. Messages are
re-signed with the session's key on the way in and verified on the way out.
Executions a Jupyter client runs pass the session's execute pipeline
(``Executions.admit``: the policy's gate and holds, silent executes and user
expressions too) and are recorded like any other, outputs stored as they
arrive. A held execute waits in the relay, the client's later shell requests
queued behind it (bounded: past the bound they are refused); a refused one
gets Jupyter's own error reply. A cell's code may call the session's tools
from when the kernel begins it until its reply (``Executions.cell_started``,
``cell_ended``), its msg_id its own among the session's clients' running ones
(iopub shows each to all). Executes go on the shell channel only, and the
kernel's debugger, which evaluates code no scan reads, only where the policy
gates nothing. When a
client's WebSocket drops, its relay is parked under the client's session id
and keeps buffering (bounded) for the reconnect grace; a reconnect with the
same session id gets the missed messages first, as with Jupyter Server.
"""

from __future__ import annotations

import asyncio
import collections
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

from ..access.auth import Principal
from ..errors import Conflict, GatewayError, SessionBusy
from ..execution.kernel import ExecutionResult, outcome
from ..execution.outputs import OutputCollector, execution_count
from ..execution.transport.drops import DropWatch
from ..limits import format_size
from ..sessions.executions import Admitted, Executions
from ..sessions.manager import Session, SessionManager
from .agent_stream import ReplayBuffer

log = logging.getLogger(__name__)

# The parts of a kernel message the relay reads as objects; anything else is dropped.
_OBJECTS = ("header", "parent_header", "metadata", "content")

CHANNELS = ("shell", "control", "stdin", "iopub")
# A client's shell requests waiting behind an execute (held for an approver, say).
QUEUE_MESSAGES = 1000
QUEUE_BYTES = 32 * 2**20
# A client's requests the kernel has not read yet, per channel, that libzmq may hold.
KERNEL_BACKLOG = 16
MESSAGE_SLACK = 64 * 1024  # one message's headers and fields beyond its code
Deliver = Callable[[str], None]  # gets each kernel message as JSON text
_REUSED = (
    "an execute with msg_id {} of this session has not ended yet; give each "
    "execute_request a msg_id of its own"
)


class _Pending:
    """An execute_request from a client, recorded from the moment it is relayed."""

    def __init__(self, admitted: Admitted, session: Session) -> None:
        self.admitted = admitted
        cap = admitted.cap
        self.collector = OutputCollector(
            cap.bytes, admitted.recorder.listener(), cap.limit, session.masker
        )
        self.reply: dict[str, Any] = {}
        self.replied = False  # its window closes at its reply: a late-seen busy opens none


class ChannelsRelay:
    """One client's connection to one session's kernel."""

    def __init__(
        self,
        manager: SessionManager,
        executions: Executions,
        session: Session,
        who: Principal,
        deliver: Deliver,
        reconnect_grace: float,
        buffer: ReplayBuffer,
    ) -> None:
        self.manager = manager
        self.executions = executions
        self.session = session
        self.who = who
        self.deliver = deliver
        self.reconnect_grace = reconnect_grace
        self.sockets: dict[str, zmq.asyncio.Socket] = {}
        self.streams: dict[str, ZMQStream] = {}
        self.drops: DropWatch | None = None
        self.pending: dict[str, _Pending] = {}
        self.nudges: set[str] = set()
        self.iopub_ready = asyncio.Event()
        self.connected = False
        self.parked_as: str | None = None
        self.buffer = buffer
        self.queued: collections.deque[tuple[dict[str, Any], int]] = collections.deque()  # shell
        self.queued_bytes = 0  # the queued requests' size as JSON
        self._admitting: asyncio.Task | None = None
        self._flushed = asyncio.Event()  # a stream handed a waiting message to libzmq
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
            if channel != "iopub":  # a kernel that reads nothing holds at most this much here
                sock.sndhwm = KERNEL_BACKLOG
            stream = ZMQStream(zmq.Socket.shadow(sock.underlying))
            stream.on_recv(functools.partial(self._on_recv, channel))
            stream.on_send(lambda *_: self._flushed.set())
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
        self._expiry = asyncio.get_running_loop().call_later(self.reconnect_grace, self.close)

    def check_resumer(self, who: Principal) -> None:
        """Only the token that parked a connection takes it back (Conflict otherwise).

        What a resumed connection sends is its first token's (its held cells
        that token's to have approved), and a client's session id is no
        secret from its tenant: iopub shows it to every connection.
        """
        if who != self.who:
            raise Conflict(
                f"the Jupyter client session {self.parked_as} is another token's; "
                "connect with a session_id of your own"
            )

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
                async with asyncio.timeout(0.5):
                    await self.iopub_ready.wait()

    def close(self) -> None:
        """Close the sockets; safe to call twice."""
        if self._expiry is not None:
            self._expiry.cancel()
        if self.parked_as is not None:
            self.session.parked.pop(self.parked_as, None)
            self.parked_as = None
        if self.drops is not None:
            self.drops.close()
        for msg_id, pending in self.pending.items():  # no idle is seen for them now
            self.executions.cell_ended(self.session, pending.admitted)
            self.session.relayed.discard(msg_id)
        for stream in self.streams.values():
            stream.on_recv(None)
            stream.on_send(None)
            stream.close(linger=0)
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.streams.clear()
        self.sockets.clear()
        self._flushed.set()  # what waits for a stream sees it gone
        if self.connected:
            self._disconnect_client()

    def send(self, msg: dict[str, Any]) -> None:
        """Sign and forward one client message to its channel.

        Executes go through the pipeline first; shell requests after one wait
        their turn behind it (a bounded queue), so a held cell is not
        overtaken. An execute is taken on the shell channel only (a kernel
        runs one sent on control too); a debugger request only if the policy
        allows the debugger.
        """
        channel = msg.pop("channel", None) or "shell"
        if channel not in self.streams or channel == "iopub":
            raise ValueError(f"cannot send on channel {channel!r}")
        for key in ("header", "parent_header", "metadata", "content"):
            msg.setdefault(key, {})
        msg.pop("buffers", None)
        self.session.touch()
        kind = msg["header"].get("msg_type")
        if kind == "execute_request" and channel != "shell":
            raise ValueError(f"an execute_request goes on the shell channel, not {channel}")
        size = len(json.dumps(msg))
        limit = self.executions.limits.max_code_size + MESSAGE_SLACK
        if size > limit:
            raise ValueError(
                f"a message of {format_size(size)} is over the limit of {format_size(limit)} "
                "for one Jupyter message; put large data in a file and read it"
            )
        if kind == "debug_request" and self._refuse_debugger(msg):
            return
        stream = self.streams[channel]
        if channel == "shell" and (self.queued or kind == "execute_request" or stream.sending()):
            self._queue(msg, size)
            return
        if stream.sending():
            raise ValueError(
                f"the kernel is not reading its {channel} channel ({KERNEL_BACKLOG} requests "
                "of this connection wait for it); send this once it answers"
            )
        if channel == "control" and kind == "interrupt_request" and self.session.kernel:
            self.session.kernel.interrupts += 1
        self.signer.send(stream, msg)

    def _queue(self, msg: dict[str, Any], size: int) -> None:
        """Queue a shell request behind the execute being admitted, within the queue's bounds."""
        if self.queued and (
            len(self.queued) >= QUEUE_MESSAGES or self.queued_bytes + size > QUEUE_BYTES
        ):
            held = self.session.held_for
            waiting = (
                f"held for approval {held}" if held else "being judged, or a kernel not reading"
            )
            refusal = SessionBusy(
                f"{len(self.queued)} requests ({format_size(self.queued_bytes)}) of this "
                f"connection are queued behind an execute {waiting} (at most "
                f"{QUEUE_MESSAGES}, {format_size(QUEUE_BYTES)}); send this once they are answered"
            )
            if msg["header"].get("msg_type") != "execute_request":
                raise ValueError(refusal.message)
            self._refuse(msg, refusal)
            return
        self.queued.append((msg, size))
        self.queued_bytes += size
        if self._admitting is None:
            self._admitting = self.manager.spawn(self._admit_queued())

    def _dequeue(self) -> None:
        _, size = self.queued.popleft()
        self.queued_bytes -= size

    async def _admit_queued(self) -> None:
        """Send the queued shell requests in order, each execute once the gate admits it."""
        try:
            while self.queued and self.streams:
                while self.streams and self.streams["shell"].sending():  # the kernel reads none
                    self._flushed.clear()
                    await self._flushed.wait()
                if not self.streams:
                    break
                msg, _ = self.queued[0]
                msg_id = str(msg["header"].get("msg_id", ""))
                if msg["header"].get("msg_type") == "execute_request":
                    if not isinstance(msg["content"], dict):
                        msg["content"] = {}
                    if msg_id in self.session.relayed:  # its window and record are found by it
                        self._dequeue()
                        self._refuse(msg, Conflict(_REUSED.format(msg_id[:64])))
                        continue
                    try:
                        admitted = await self.executions.admit(
                            self.session, self.who, msg["content"]
                        )
                    except GatewayError as e:  # refused, held and denied, or too large
                        self._dequeue()
                        self._refuse(msg, e)
                        continue
                    if not self.streams:  # closed while it was held
                        self.executions.cell_ended(self.session, admitted)
                        await self.executions.finish(self.session, admitted.recorder, _never_sent())
                        break
                    self.pending[msg_id] = _Pending(admitted, self.session)
                    self.session.relayed.add(msg_id)
                self._dequeue()
                self.signer.send(self.streams["shell"], msg)
        except Exception:
            log.exception("session %s: a client's request could not be relayed", self.session.id)
        finally:
            self._admitting = None

    def _refuse_debugger(self, request: dict[str, Any]) -> bool:
        """Answer a debugger request the policy refuses as a failed one (True), as DAP does."""
        reason = self.executions.debugger_refusal(self.session)
        if reason is None:
            return False
        dap = request["content"] if isinstance(request["content"], dict) else {}
        reply = {
            "type": "response",
            "request_seq": dap.get("seq", 0),
            "success": False,
            "command": dap.get("command", ""),
            "message": reason,
        }
        self._answer(request, [("control", "debug_reply", reply)])
        return True

    def _refuse(self, request: dict[str, Any], error: GatewayError) -> None:
        """Answer a refused execute as a kernel answers a failed one: error, then idle."""
        content = {"ename": type(error).__name__, "evalue": error.message, "traceback": []}
        reply = {"status": "error", "execution_count": None, **content}
        self._answer(request, [("iopub", "error", content), ("shell", "execute_reply", reply)])

    def _answer(self, request: dict[str, Any], replies: list[tuple[str, str, Any]]) -> None:
        """Answer a request in the kernel's place: busy, the replies, idle."""
        parent = request["header"]
        busy, idle = {"execution_state": "busy"}, {"execution_state": "idle"}
        for channel, kind, body in [("iopub", "status", busy), *replies, ("iopub", "status", idle)]:
            msg = self.signer.msg(kind, body, parent=parent)
            msg["channel"] = channel
            self._relay(json.dumps(msg, default=json_default))

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
        if msg["msg_type"] == "kernel_info_reply":
            self._hide_refused_debugger(msg["content"])
        msg["channel"] = channel
        self._observe(channel, msg)
        self._relay(json.dumps(msg, default=json_default))

    def _hide_refused_debugger(self, info: dict[str, Any]) -> None:
        """A kernel_info_reply offers no debugger the policy refuses, so clients show none."""
        if self.executions.debugger_refusal(self.session) is None:
            return
        if "debugger" in info:  # before protocol 5.5
            info["debugger"] = False
        features = info.get("supported_features")
        if isinstance(features, list):
            info["supported_features"] = [f for f in features if f != "debugger"]

    def _relay(self, text: str) -> None:
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
            self.manager.kernel_said(self.session, msg["content"].get("execution_state"))
        if pending is None:
            return
        if channel == "iopub" and kind == "status":
            if msg["content"].get("execution_state") == "busy" and not pending.replied:
                self.executions.cell_started(self.session, pending.admitted)
        if channel == "shell" and kind == "execute_reply":  # its code and expressions done
            self.executions.cell_ended(self.session, pending.admitted)
            pending.replied = True
            pending.reply = msg["content"]
            pending.collector.execution_count = execution_count(msg["content"])
        elif channel == "iopub":
            if kind == "status" and msg["content"].get("execution_state") == "idle":
                self.executions.cell_ended(self.session, pending.admitted)
                del self.pending[parent]
                self.session.relayed.discard(parent)
                self.manager.spawn(self._record(pending))
            else:
                pending.collector.add_message(msg)

    async def _record(self, pending: _Pending) -> None:
        kernel = self.session.kernel
        interrupted = kernel is not None and kernel.interrupts != pending.admitted.interrupts
        status = outcome(pending.reply, pending.collector.error, interrupted)
        result = ExecutionResult.collected(status, pending.collector, pending.admitted.started)
        try:
            await self.executions.finish(self.session, pending.admitted.recorder, result)
        except Exception:
            log.exception("session %s: could not record an execution", self.session.id)


def _never_sent() -> ExecutionResult:
    """The outcome of an admitted execute whose client went away before it was sent."""
    error = {"ename": "ClientGone", "evalue": "the client left before it ran", "traceback": []}
    return ExecutionResult("interrupted", None, [], error, 0.0)
