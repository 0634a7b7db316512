"""The gateway's own shell and iopub traffic with a kernel: signed, read once, routed by parent.

jupyter_client's channels cost the gateway most of its CPU per execute: for
every message a poll future and a timer, then a full deserialize that parses
each header's dates with dateutil. Here each socket is read as messages come,
the signature checked and only what is needed parsed: a message nobody waits
for (another client's, or anything between executions) is dropped after its
parent header, unverified and unparsed, so a chatty kernel costs little and
nothing holds a backlog for it. jupyter_client's kernel manager still
starts the kernel; the messages travel over ``KernelLink``s: the gateway's own
ZMTP to a kernel on this host, libzmq sockets (with CurveZMQ) to one across
a cluster.
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

from jupyter_client.adapter import adapt
from jupyter_client.session import Session

from .transport.links import KernelLink

_DELIMITER = b"<IDS|MSG>"
_EMPTY = b"{}"
_DECODER = json.JSONDecoder()
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)  # one, not one per message
PROTOCOL_VERSION = "5.3"
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
    """Sends requests on a kernel's shell and routes what comes back to them.

    Over two ``KernelLink``s: the gateway's own ZMTP (``execution.transport.zmtp``) to a
    kernel on this host, libzmq sockets (``ZmqLink``) to one elsewhere.
    """

    def __init__(self, session: Session, shell: KernelLink, iopub: KernelLink) -> None:
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
        self._shell, self._iopub = shell, iopub
        shell.start(self._on_shell)
        iopub.start(self._on_iopub)

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
        sent = self._shell.send([_DELIMITER, self._sign(parts), *parts])
        reply = self._loop.create_future()
        request = Request(msg_id, reply, functools.partial(self._forget, msg_id, sent), self.poke)
        self._requests[msg_id] = request
        if iopub:
            self._listening[msg_id] = request
        return request

    def _forget(self, msg_id: str, sent: object) -> None:
        self._requests.pop(msg_id, None)
        self._listening.pop(msg_id, None)
        if not self._closed:
            self._shell.withdraw(sent)

    def poke(self) -> None:
        """Read whatever waits, whether or not its edge was seen."""
        if not self._closed:
            self._shell.poke()
            self._iopub.poke()

    def close(self) -> None:
        """Stop reading and close the links; requests waiting get no reply."""
        if self._closed:
            return
        self._closed = True
        self._shell.close()
        self._iopub.close()
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

    def _on_shell(self, frames: list[bytes]) -> None:
        msg = self._parse(frames, self._requests)
        if msg is not None:
            reply = self._requests[msg["parent_header"]["msg_id"]].reply
            if not reply.done():
                reply.set_result(msg)

    def _on_iopub(self, frames: list[bytes]) -> None:
        self.iopub_heard.set()
        msg = self._parse(frames, self._listening)
        if msg is not None:
            self._listening[msg["parent_header"]["msg_id"]].iopub.put(msg)

    def _parse(self, frames: list[bytes], requests: dict[str, Request]) -> Message | None:
        """The message, if one of ``requests`` waits for it, it is well formed and its
        signature is right; None otherwise: nothing of it is used."""
        try:
            start = frames.index(_DELIMITER) + 1
            signature, header, parent, metadata, content = frames[start : start + 5]
            msg_id = loads(parent).get("msg_id")
            if msg_id not in requests:
                return None  # nobody waits for it: dropped unverified, unparsed
            if self._sign([header, parent, metadata, content]) != signature:
                return None
            msg = {
                "header": loads(header),
                "parent_header": {"msg_id": msg_id},
                "metadata": loads(metadata),
                "content": loads(content),
                "buffers": frames[start + 5 :],
            }
            if not isinstance(msg["content"], dict):
                return None
            if not str(msg["header"].get("version", PROTOCOL_VERSION)).startswith("5"):
                msg = adapt(msg)  # an older protocol's message, in today's shape
            msg["msg_type"] = msg["header"]["msg_type"]
        except (ValueError, AttributeError, TypeError, KeyError, RecursionError):
            return None
        return msg if isinstance(msg["msg_type"], str) else None  # a list is unhashable


def loads(frame: bytes) -> Any:
    """``json.loads(frame)``, in half the time for the objects kernels send.

    Four of a message's frames are parsed, some twenty per execute: the
    standard function's checks (its encoding sniffed from the bytes, spaces
    skipped) cost as much as the parse. Whatever the direct route does not
    take whole (another encoding, spaces, bad JSON) gets the standard
    function's own answer or error.
    """
    if frame[:1] == b"{":
        try:  # not contextlib.suppress: three calls a frame, some sixty an execute
            text = frame.decode("utf-8", "surrogatepass")
            value, end = _DECODER.raw_decode(text)
        except ValueError:
            pass
        else:
            if end == len(text):
                return value
    return json.loads(frame)


def _dumps(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()
