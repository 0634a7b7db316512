"""A relay between the gateway's ZeroMQ sockets and a kernel's: no message over the limit gets by.

libzmq's ``MAXMSGSIZE`` bounds one frame, but libzmq holds a multipart
message until its last frame is in, so one message of many frames each under
the limit (forty 30 MB buffers of one Jupyter message, sent by a kernel
holding 30 MB once) grew the gateway by more than a gigabyte. The guard
listens where the gateway connects, opens a connection to the kernel's socket
for each connection it accepts, and passes the bytes on as they come. From
the kernel's side it reads only ZMTP frame headers; at the first frame that
takes a message past the limit it sends the gateway a frame header over
libzmq's own limit instead, so libzmq drops the connection as after an
oversized frame (``DropWatch`` connects again; the execution's outputs say
so), and closes both connections. Nothing is buffered beyond one read per
direction: a side that does not read stops the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from pathlib import Path
from typing import cast

from ...nofollow import connect_socket_file
from .wire import HEADERS_PER_TURN, FrameCounter

log = logging.getLogger(__name__)


class _Side(asyncio.Protocol):
    """One end of a relayed connection; what it receives is written to the other end."""

    def __init__(self, counter: FrameCounter | None = None) -> None:
        self.counter = counter  # only the kernel's side is read for frames
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.early: list[bytes] = []  # what came before the other end was connected
        self.registry: set[_Side] | None = None  # the guard's open connections
        self.made = asyncio.get_running_loop().create_future()
        self.throttled = False  # the other end's transport holds too much: not read
        self._held: deque[bytes | memoryview] = deque()  # read, for a later turn of the loop
        self._holding = False  # reading paused until what is held is passed on

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        peer = self.peer.transport if self.peer is not None else None
        if peer is None:
            self.early.append(data)
            return
        if self.counter is None:
            peer.write(data)
            return
        self._held.append(data)
        if len(self._held) == 1:
            self._relay()

    def _relay(self) -> None:
        """Pass on what was read, a chunk and ``HEADERS_PER_TURN`` headers a turn at most."""
        peer = self.peer.transport if self.peer is not None else None
        if not self._held or peer is None or self.transport is None or self.counter is None:
            return
        data = self._held[0]
        parts, cut, used = self.counter.feed(data, HEADERS_PER_TURN)
        peer.writelines(parts)
        if cut:
            self._held.clear()
            if self.counter.greeted:
                peer.write(self.counter.oversized_header())
                log.warning("a kernel message over max_kernel_message was cut")
            peer.close()  # after what is buffered is sent
            self.close()
            return
        if used < len(data):
            self._held[0] = memoryview(data)[used:]
        else:
            self._held.popleft()
        if self._held:
            self._holding = True
            self.transport.pause_reading()
            asyncio.get_running_loop().call_soon(self._relay)
        elif self._holding:
            self._holding = False
            if not self.throttled:
                self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.registry is not None:
            self.registry.discard(self)
        if self.peer is not None:
            self.peer.close()

    # A side whose transport holds too much stops the other from reading.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.throttled = True
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.throttled = False
            if not self.peer._held:  # else it resumes once they are passed on
                self.peer.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class MessageGuard:
    """Relays each connection made to ``listen`` (a Unix socket) to ``target``.

    ``listen`` may outlive the kernel behind ``target``: a connection made
    while nothing listens there is closed at once, and libzmq tries again.
    """

    def __init__(self, listen: Path, target: Path, limit: int) -> None:
        self.listen, self.target, self.limit = listen, target, limit
        self._server: asyncio.AbstractServer | None = None
        self._pending: set[asyncio.Task] = set()  # connections to the kernel being made
        self._open: set[_Side] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.listen)  # left by a gateway that stopped
        self._server = await asyncio.get_running_loop().create_unix_server(
            self._accepted, str(self.listen)
        )

    def _accepted(self) -> _Side:
        gateway_side = _Side()
        task = asyncio.get_running_loop().create_task(self._connect(gateway_side))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return gateway_side

    async def _connect(self, gateway_side: _Side) -> None:
        # Its transport comes after this task starts; a refusal must be able to close it.
        await gateway_side.made
        kernel_side = _Side(FrameCounter(self.limit))
        try:
            await connect_socket_file(str(self.target), lambda: kernel_side)
        except OSError:
            gateway_side.close()  # the kernel is not up (yet, or any more), or not a socket
            return
        kernel_side.peer, gateway_side.peer = gateway_side, kernel_side
        if gateway_side.transport is None or gateway_side.transport.is_closing():
            kernel_side.close()
            return
        for side in (gateway_side, kernel_side):
            if side.transport is not None and not side.transport.is_closing():
                side.registry = self._open
                self._open.add(side)
            early, side.early = side.early, []
            for data in early:
                side.data_received(data)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._pending):
            task.cancel()
        for side in list(self._open):
            side.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.listen)
