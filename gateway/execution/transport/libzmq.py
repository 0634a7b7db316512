"""libzmq sockets to kernels: the one shared context, its message bound, and ``ZmqLink``.

Used where the gateway cannot speak ZMTP itself: CurveZMQ over TCP to a
cluster's kernels, and the Jupyter relays' per-client sockets.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

import zmq
import zmq.asyncio

from .zmtp import Backlog, ZmtpLink

# pyzmq's flags as plain ints: its enums cost a Python call at every use.
_EVENTS, _POLLIN, _RCVMORE, _SNDMORE, _NOBLOCK = (
    int(f) for f in (zmq.EVENTS, zmq.POLLIN, zmq.RCVMORE, zmq.SNDMORE, zmq.NOBLOCK)
)


@functools.cache
def shared_context() -> zmq.asyncio.Context:
    """One ZeroMQ context for every kernel's sockets.

    By default each manager and each client makes its own, with an I/O
    thread each: two per session. One context needs room for all sockets
    (libzmq's default is 1023, about 150 sessions' worth), set before its first.
    """
    context = zmq.asyncio.Context()
    context.set(zmq.MAX_SOCKETS, 65536)
    return context


def limit_kernel_messages(max_bytes: int) -> None:
    """Make every socket the gateway opens to a kernel refuse a frame over ``max_bytes``.

    A default of the shared context, so it holds for the gateway's channels
    to each kernel and each Jupyter relay's sockets alike. libzmq reads a frame's
    announced size first and, over the limit, drops the connection without
    reading the frame; ``DropWatch`` makes it again, and ``Kernel`` says so
    in the execution's outputs.
    """
    shared_context().setsockopt(zmq.MAXMSGSIZE, max_bytes)


def sent_only_when_connected(context: zmq.Context, connect: Callable[[], zmq.Socket]) -> zmq.Socket:
    """The socket ``connect`` makes on ``context``, with ``ZMQ_IMMEDIATE`` set before it
    connects: libzmq then queues a message only on a connection that is up.

    Otherwise libzmq keeps what is sent while the kernel is away and sends it
    when it is back, out of the gateway's reach: code whose caller gave up (and
    was told it failed) would run. ``ZmqLink`` keeps those requests itself.
    """
    before = context.sockopts.get(zmq.IMMEDIATE)
    context.setsockopt(zmq.IMMEDIATE, 1)  # pyzmq applies a context's options to new sockets
    try:
        return connect()
    finally:
        if before is None:
            context.sockopts.pop(zmq.IMMEDIATE, None)
        else:
            context.sockopts[zmq.IMMEDIATE] = before


class ZmqLink:
    """A libzmq socket as a ``KernelLink`` (CurveZMQ over TCP to a cluster's kernels).

    Read from the event loop's own readiness callback, with non-blocking
    receives: no future or timer per message. ZeroMQ signals readiness by
    edge, and a send can swallow the edge of a message that came meanwhile,
    so every send and every quiet wait (``poke``) reads again.

    A DEALER made by ``sent_only_when_connected`` refuses a send while the
    kernel is away; the message then waits here, in order, until it is back
    (or its caller takes it back), as a ``ZmtpLink``'s do. As there, what
    libzmq took but had not written when a connection broke is lost with it
    (its caller hears no reply).
    """

    BATCH = ZmtpLink.BATCH  # messages read in one turn of the loop before the other sessions'
    RETRY = 0.02  # seconds between tries of what waits for a kernel that is away

    def __init__(self, socket: zmq.asyncio.Socket) -> None:
        self.socket = socket  # owned here: closed with the link
        self._sock = zmq.Socket.shadow(socket.underlying)  # pyzmq's asyncio layer never engaged
        self._loop = asyncio.get_running_loop()
        self._deliver: Callable[[list[bytes]], None] | None = None
        self._pending: Backlog[list[bytes]] = Backlog()  # refused: the kernel is away
        self._retrying: asyncio.TimerHandle | None = None

    def start(self, deliver: Callable[[list[bytes]], None]) -> None:
        self._deliver = deliver
        self._loop.add_reader(self._sock.FD, self._readable)
        self.poke()

    def send(self, frames: list[bytes]) -> list[bytes]:
        if self._pending or not self._send(frames):
            self._pending.add(frames, sum(map(len, frames)))
            if self._retrying is None:
                self._retrying = self._loop.call_later(self.RETRY, self._retry)
        self.poke()  # a send may have taken the edge of a message that came
        return frames

    def withdraw(self, sent: object) -> None:
        self._pending.withdraw(sent)

    def poke(self) -> None:
        if self._deliver is not None:
            self._loop.call_soon(self._readable)

    def close(self) -> None:
        if self._deliver is not None:
            self._deliver = None  # reads already scheduled find it so: the socket is gone
            self._loop.remove_reader(self._sock.FD)
        self._pending.clear()
        if self._retrying is not None:
            self._retrying.cancel()
            self._retrying = None
        self.socket.close(linger=0)

    def _send(self, frames: list[bytes]) -> bool:
        """Send without blocking; False if the kernel takes nothing now (away, or not
        reading: queued up to the high-water mark), to be sent whole again later.

        A connection lost between two frames refuses the next one too, and
        libzmq then drops the message's remaining frames as they are sent, so
        they are sent here: otherwise the next message would go in their place.
        """
        last = len(frames) - 1
        for i, part in enumerate(frames):
            try:
                self._sock.send(part, _NOBLOCK if i == last else _NOBLOCK | _SNDMORE)
            except zmq.Again:
                if 0 < i < last:
                    for rest in frames[i + 1 : last]:
                        self._sock.send(rest, _NOBLOCK | _SNDMORE)
                    self._sock.send(frames[last], _NOBLOCK)
                return False
        return True

    def _retry(self) -> None:
        """Send what waits, if the kernel is back (no event says so); else try again soon."""
        self._retrying = None
        while self._pending and self._send(self._pending.first()):
            self._pending.drop_first()
        if self._pending:
            self._retrying = self._loop.call_later(self.RETRY, self._retry)
        self.poke()

    def _readable(self) -> None:
        sock = self._sock
        for _ in range(self.BATCH):
            # Asked first: an empty read's exception costs more than the question.
            if self._deliver is None or not sock.getsockopt(_EVENTS) & _POLLIN:
                return
            frames = [sock.recv(_NOBLOCK)]
            while sock.getsockopt(_RCVMORE):  # a message's frames come together
                frames.append(sock.recv(_NOBLOCK))
            self._deliver(frames)
        self._loop.call_soon(self._readable)  # more may wait: after the others
