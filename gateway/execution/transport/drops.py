"""Kernel connections libzmq dropped for good, made again (and counted)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)


class DropWatch:
    """Connects again the kernel sockets libzmq dropped for good, and counts them.

    With ``MAXMSGSIZE`` a frame over the limit is never read: libzmq closes
    the connection as a protocol error and, unlike after a lost connection,
    never makes it again, so a kernel could cut the gateway off its own
    outputs. Whatever the kernel sent until the new connection is up is lost
    (an idle status too, perhaps).

    A lost connection (a kernel restarting, a swarm agent starting its
    kernel) is ZeroMQ's to make again, and it says so at once with
    ``EVENT_CONNECT_RETRIED``; only a drop without one is answered here.
    ``disconnect`` cuts the connection's pipe with whatever is still unread;
    a SUB socket reads ahead the first frame of the next message, and a pipe
    cut under it makes libzmq abort the process (``!_more`` in fq.cpp). So
    the dead connection is cut only while the socket has nothing to read,
    and never while ZeroMQ is reconnecting it (which once in a few kernel
    restarts aborted the gateway).

    libzmq sends each monitor event from its one I/O thread, blocking until
    the monitor's reader takes it: a reader closed while its socket still
    has events to tell stops that thread, and with it every kernel socket of
    the gateway. So a socket's monitoring is switched off before the reader
    closes (``_unwatch``), and ``close`` does so at once, for the caller
    closes the sockets right after.
    """

    # Seconds ZeroMQ has to say it reconnects by itself: its I/O thread says so
    # right after the drop. Kept short, for what the kernel sends until the new
    # connection is up is lost; a reconnect by hand that was not needed is harmless.
    RETRY_WINDOW = 0.1

    def __init__(self, sockets: list[zmq.asyncio.Socket]) -> None:
        self.drops = 0
        self._down: set[str] = set()  # endpoints dropped and not connected again yet
        self._changed = asyncio.Event()
        self._sockets = sockets
        self._tasks = [asyncio.create_task(self._watch(sock)) for sock in sockets]

    async def settled(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until every dropped connection is made again.

        What a kernel publishes while its iopub connection is down is lost; the
        next execution waits for it rather than lose its outputs.
        """
        deadline = time.monotonic() + timeout
        while self._down and (left := deadline - time.monotonic()) > 0:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed.wait()

    async def _watch(self, sock: zmq.asyncio.Socket) -> None:
        monitor = sock.get_monitor_socket(
            zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED
        )
        dropped: dict[str, float] = {}  # endpoint -> when it is ours to connect again
        try:
            while True:
                now = time.monotonic()
                for endpoint in [e for e, due in dropped.items() if due <= now]:
                    del dropped[endpoint]
                    await self._connect_again(sock, endpoint)
                wait = max(0.0, min(dropped.values()) - now) if dropped else None
                if not await monitor.poll(None if wait is None else wait * 1000):
                    continue
                event = parse_monitor_message(await monitor.recv_multipart())
                endpoint = event["endpoint"].decode()
                if event["event"] == zmq.EVENT_CONNECT_RETRIED:
                    dropped.pop(endpoint, None)
                elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._down.discard(endpoint)
                    self._changed.set()
                else:
                    self._down.add(endpoint)
                    dropped.setdefault(endpoint, time.monotonic() + self.RETRY_WINDOW)
        finally:
            _unwatch(sock)
            monitor.close(linger=0)

    async def _connect_again(self, sock: zmq.asyncio.Socket, endpoint: str) -> None:
        self.drops += 1
        log.warning("a kernel connection was dropped (%s); connecting again", endpoint)
        try:
            # The readers take what the dead connection still holds (no event
            # says when); no await between the last look and the cut.
            while sock.get(zmq.EVENTS) & zmq.POLLIN:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            with contextlib.suppress(zmq.ZMQError):  # cut already
                sock.disconnect(endpoint)
            sock.connect(endpoint)
        except zmq.ZMQError:  # the socket closed meanwhile
            return

    def close(self) -> None:
        for sock in self._sockets:
            _unwatch(sock)
        for task in self._tasks:
            task.cancel()


def _unwatch(sock: zmq.Socket) -> None:
    """Stop ``sock``'s monitor: no event is sent to its reader from now on."""
    if not sock.closed:
        with contextlib.suppress(zmq.ZMQError):
            sock.disable_monitor()
