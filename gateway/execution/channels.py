"""The gateway's own shell and iopub traffic with a kernel: signed, read once, routed by parent.

jupyter_client's channels cost the gateway most of its CPU per execute: for
every message a poll future and a timer, then a full deserialize that parses
each header's dates with dateutil. Here each socket is read as messages come,
the signature checked and only what is needed parsed: a message nobody waits
for (another client's, or anything between executions) is dropped after its
parent header, unverified and unparsed, so a chatty kernel costs little and
libzmq never holds a backlog for it. jupyter_client's kernel manager still
starts the kernel and makes the sockets (with CurveZMQ where the placement
asks for it).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import itertools
import json
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import zmq.asyncio
from jupyter_client.adapter import adapt
from jupyter_client.session import Session

_DELIMITER = b"<IDS|MSG>"
_EMPTY = b"{}"
PROTOCOL_VERSION = "5.3"
# pyzmq's flags as plain ints: its enums cost a Python call at every use.
_EVENTS, _POLLIN, _RCVMORE, _SNDMORE, _NOBLOCK = (
    int(f) for f in (zmq.EVENTS, zmq.POLLIN, zmq.RCVMORE, zmq.SNDMORE, zmq.NOBLOCK)
)

Message = dict[str, Any]


# Seconds a wait goes without reading the sockets again, whatever their edges said.
_LOOK_AGAIN = 0.25


class Inbox:
    """The iopub messages of one request, in order, awaited with a timeout.

    Cheaper than an ``asyncio.Queue``: a message already in is taken without
    a future or a timer. A wait that comes up empty reads the sockets again
    (``poke``): any call on a ZeroMQ socket can take the edge of a message
    that came meanwhile, and that message would wait for the next edge.
    """

    def __init__(self, poke: Callable[[], None]) -> None:
        self._messages: deque[Message] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._poke = poke

    def put(self, msg: Message) -> None:
        self._messages.append(msg)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self, timeout: float) -> Message | None:
        """The next message, or None if none came within ``timeout`` seconds."""
        if not self._messages:
            loop = asyncio.get_running_loop()
            self._waiter = loop.create_future()
            timer = loop.call_later(max(timeout, 0.0), _settle, self._waiter)
            try:
                await self._waiter
            finally:
                timer.cancel()
                self._waiter = None
            if not self._messages:
                self._poke()
                return None
        return self._messages.popleft()


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Request:
    """One request on shell: its iopub messages as they come, and its reply."""

    def __init__(
        self,
        msg_id: str,
        reply: asyncio.Future[Message],
        close: Callable[[], None],
        poke: Callable[[], None],
    ) -> None:
        self.msg_id = msg_id
        self.reply = reply
        self.iopub = Inbox(poke)  # empty for good if the request was made without iopub
        self.close = close  # nothing more is routed to it: what comes later is dropped
        self._poke = poke

    async def wait_reply(self, timeout: float) -> Message | None:
        """The reply's content, or None if it did not come within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.reply.done():
            left = deadline - loop.time()
            if left <= 0:
                return None
            await asyncio.wait([self.reply], timeout=min(left, _LOOK_AGAIN))
            if not self.reply.done():
                self._poke()
        if self.reply.cancelled():  # its channels closed (the kernel restarted or let go)
            return None
        return self.reply.result()["content"]


class KernelChannels:
    """Sends requests on a kernel's shell socket and routes what comes back to them.

    Reads each socket from the event loop's own readiness callback, with
    non-blocking receives: no future or timer per message. ZeroMQ signals
    readiness by edge, and a send can swallow the edge of a message that came
    meanwhile, so every send and every quiet wait (``poke``) reads again.
    """

    # Messages read in one turn of the loop before the other sessions get theirs.
    BATCH = 32

    def __init__(
        self, session: Session, shell: zmq.asyncio.Socket, iopub: zmq.asyncio.Socket
    ) -> None:
        self.sockets = (shell, iopub)  # owned here: closed with the channels
        self._username = session.username
        self._session = session.session
        self._signer = hmac.HMAC(session.key, digestmod=hashlib.sha256) if session.key else None
        self._prefix = uuid.uuid4().hex[:12]
        self._count = itertools.count(1)
        self._requests: dict[str, Request] = {}  # each waits for its reply on shell
        self._listening: dict[str, Request] = {}  # those of them that read iopub too
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self.iopub_heard = asyncio.Event()  # anything at all came on iopub: it is connected
        # Plain views of the sockets: pyzmq's asyncio layer is never engaged.
        self._shell = zmq.Socket.shadow(shell.underlying)
        self._readers = [
            (self._shell, self._on_reply),
            (zmq.Socket.shadow(iopub.underlying), self._on_iopub),
        ]
        for sock, route in self._readers:
            self._loop.add_reader(sock.FD, self._readable, sock, route)
        self.poke()

    def request(self, msg_type: str, content: dict[str, Any], iopub: bool = True) -> Request:
        """Send ``msg_type`` on shell; its iopub messages and reply go to the returned Request.

        ``iopub=False``: only the reply is wanted, and iopub messages for it are
        dropped unparsed; nobody would read them, and a kernel chooses how many.
        """
        msg_id = f"{self._prefix}_{next(self._count)}"
        header = {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "username": self._username,
            "session": self._session,
            "date": datetime.now(UTC).isoformat(),
            "version": PROTOCOL_VERSION,
        }
        parts = [_dumps(header), _EMPTY, _EMPTY, _dumps(content)]
        try:
            self._shell.send(_DELIMITER, _NOBLOCK | _SNDMORE)  # never blocks: queued below the HWM
            self._shell.send(self._sign(parts), _NOBLOCK | _SNDMORE)
            for part in parts[:-1]:
                self._shell.send(part, _NOBLOCK | _SNDMORE)
            self._shell.send(parts[-1], _NOBLOCK)
        except zmq.Again:
            raise RuntimeError("the kernel has not read its last 1000 requests") from None
        reply = self._loop.create_future()
        request = Request(
            msg_id, reply, functools.partial(self._forget, msg_id), self.poke
        )
        self._requests[msg_id] = request
        if iopub:
            self._listening[msg_id] = request
        self._loop.call_soon(self._readable, *self._readers[0])  # the send may have taken its edge
        return request

    def _forget(self, msg_id: str) -> None:
        self._requests.pop(msg_id, None)
        self._listening.pop(msg_id, None)

    def poke(self) -> None:
        """Read whatever waits, whether or not its edge was seen."""
        if self._closed:
            return
        for sock, route in self._readers:
            self._loop.call_soon(self._readable, sock, route)

    def close(self) -> None:
        """Stop reading and close the sockets; requests waiting get no reply."""
        if self._closed:
            return
        self._closed = True  # reads already scheduled find it so: the sockets are gone
        for sock, _ in self._readers:
            self._loop.remove_reader(sock.FD)
        for sock in self.sockets:
            sock.close(linger=0)
        for request in self._requests.values():
            request.reply.cancel()
        self._requests.clear()
        self._listening.clear()

    def _sign(self, parts: list[bytes]) -> bytes:
        if self._signer is None:
            return b""
        signer = self._signer.copy()
        for part in parts:
            signer.update(part)
        return signer.hexdigest().encode()

    def _readable(self, sock: zmq.Socket, route: Callable[[Request, Message], None]) -> None:
        if self._closed:
            return
        for _ in range(self.BATCH):
            # Asked first: an empty read's exception costs more than the question.
            if not sock.getsockopt(_EVENTS) & _POLLIN:
                return
            frames = [sock.recv(_NOBLOCK)]
            while sock.getsockopt(_RCVMORE):  # a message's frames come together
                frames.append(sock.recv(_NOBLOCK))
            if route is self._on_iopub:
                self.iopub_heard.set()
            self._route(frames, route)
        self._loop.call_soon(self._readable, sock, route)  # more may wait: after the others

    def _route(self, frames: list[bytes], route: Callable[[Request, Message], None]) -> None:
        requests = self._listening if route is self._on_iopub else self._requests
        try:
            msg = self._parse(frames, requests)
        except (ValueError, AttributeError, TypeError, KeyError, RecursionError):
            return  # not a well-formed Jupyter message: nothing of it is used
        if msg is not None:
            route(requests[msg["parent_header"]["msg_id"]], msg)

    def _parse(self, frames: list[bytes], requests: dict[str, Request]) -> Message | None:
        """The message, if one of ``requests`` waits for it and its signature is right."""
        start = frames.index(_DELIMITER) + 1
        signature, header, parent, metadata, content = frames[start : start + 5]
        msg_id = json.loads(parent).get("msg_id")
        if msg_id not in requests:
            return None  # nobody waits for it: dropped unverified, unparsed
        if self._sign([header, parent, metadata, content]) != signature:
            return None
        msg = {
            "header": json.loads(header),
            "parent_header": {"msg_id": msg_id},
            "metadata": json.loads(metadata),
            "content": json.loads(content),
            "buffers": frames[start + 5 :],
        }
        if not isinstance(msg["content"], dict):
            return None
        if not str(msg["header"].get("version", PROTOCOL_VERSION)).startswith("5"):
            msg = adapt(msg)  # an older protocol's message, in today's shape
        msg["msg_type"] = msg["header"]["msg_type"]
        return msg if isinstance(msg["msg_type"], str) else None  # a list is unhashable

    @staticmethod
    def _on_iopub(request: Request, msg: Message) -> None:
        request.iopub.put(msg)

    @staticmethod
    def _on_reply(request: Request, msg: Message) -> None:
        if not request.reply.done():
            request.reply.set_result(msg)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
