"""ZMTP 3.0 spoken by the gateway itself: its own shell and iopub to a kernel on this host.

Through libzmq, each message a kernel sends crossed the gateway three times:
the message guard read it from the kernel's socket and wrote it to a socket
of its own, libzmq's I/O thread read it there and queued it, and the loop
took it from the queue frame by frame. Here the gateway connects to the
kernel's Unix socket itself (NULL mechanism, as on any ipc socket), reads the
frames as they come and bounds them as the guard does: a frame that takes a
message over ``limit`` bytes or ``MAX_FRAMES`` frames cuts the connection
before its body is read, and the connection is made again (``drops`` counts
the cuts; the execution's outputs say so). The guard stays in front of every
other socket (the Jupyter relays', control, stdin, heartbeat).

A kernel chooses every byte here: whatever it sends, the worst is a cut
connection. Nothing is held beyond the message being read and one read.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar, cast

from ...nofollow import NotASocket, connect_socket_file
from .wire import COMMAND, HEADERS_PER_TURN, LONG, MAX_FRAMES, MORE

log = logging.getLogger(__name__)

# signature, version 3.0, mechanism NULL, as-server 0, filler
GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)
_MAX_COMMAND = 4096  # READY, PING, ERROR: a few properties at most
# Requests (and their bytes) waiting for a connection or in one before a send is refused:
# a kernel that reads no requests is told so, as libzmq's high-water mark would.
MAX_PENDING = 1000
MAX_UNSENT = 64 << 20
# Seconds from connecting to the peer's READY (libzmq's handshake interval is 30 s):
# a socket planted in the kernel's place that never answers is left, and tried again.
HANDSHAKE_TIMEOUT = 10.0

Deliver = Callable[[list[bytes]], None]
T = TypeVar("T")


class ProtocolError(Exception):
    """What the kernel sent is not ZMTP 3, or is over a bound: the connection is cut."""


def frame(flags: int, body: bytes) -> bytes:
    """One frame: its header (short, or long past 255 bytes) and its body."""
    n = len(body)
    head = bytes((flags, n)) if n < 256 else bytes((flags | LONG,)) + n.to_bytes(8, "big")
    return head + body


def encode(frames: list[bytes]) -> bytes:
    """A message: every frame but the last says more follow."""
    last = len(frames) - 1
    return b"".join(frame(MORE if i < last else 0, f) for i, f in enumerate(frames))


def command(name: bytes, body: bytes = b"") -> bytes:
    return frame(COMMAND, bytes((len(name),)) + name + body)


def ready(socket_type: bytes) -> bytes:
    """The NULL mechanism's handshake: a READY naming this side's socket type."""
    return command(b"READY", b"\x0bSocket-Type" + len(socket_type).to_bytes(4, "big") + socket_type)


class Backlog(Generic[T]):
    """Requests waiting for a kernel to listen: in order, bounded in count and bytes, and
    each one taken back if its caller gives up (sent when the kernel came back, it would
    run code whose caller was told it failed)."""

    def __init__(self) -> None:
        self._items: deque[tuple[T, int]] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: T, size: int) -> None:
        """Queue ``item`` (``size`` bytes); RuntimeError past the bounds, as libzmq's
        high-water mark would refuse it."""
        if len(self._items) >= MAX_PENDING or self._bytes > MAX_UNSENT:
            raise RuntimeError(f"the kernel has not read its last {len(self._items)} requests")
        self._items.append((item, size))
        self._bytes += size

    def withdraw(self, item: object) -> None:
        for i, (queued, size) in enumerate(self._items):
            if queued is item:
                del self._items[i]
                self._bytes -= size
                return

    def first(self) -> T:
        return self._items[0][0]

    def drop_first(self) -> None:
        self._bytes -= self._items.popleft()[1]

    def take_all(self) -> list[T]:
        items = [item for item, _ in self._items]
        self.clear()
        return items

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0


class ZmtpLink:
    """A DEALER or a SUB connected to one kernel socket, connected again whenever the
    connection is lost or cut; each whole message goes to ``deliver``.

    Sends made while there is no connection wait for the next one, as on a
    libzmq socket made with ``connect``.
    """

    RECONNECT = 0.1  # seconds between attempts: libzmq's reconnect interval
    # Seconds between attempts at most while connections are cut before their handshake
    # is done (not ZMTP, or silent: a socket the sandbox put in the kernel's place): each
    # costs a connect and a read, and tried every 100 ms they would cost the gateway for good.
    RECONNECT_MAX = 5.0
    BATCH = 32  # messages delivered in one turn of the loop before the other sessions'

    def __init__(self, path: str, socket_type: bytes, limit: int) -> None:
        self.path, self.socket_type, self.limit = path, socket_type, limit
        self.drops = 0  # connections cut for a message over the bounds
        self.up = asyncio.Event()  # the handshake is done: what is sent goes out
        self._deliver: Deliver = _nowhere
        self._conn: _Connection | None = None
        self._pending: Backlog[bytes] = Backlog()  # sends made while there is no connection
        self._task: asyncio.Task | None = None
        self._failed = 0  # connections in a row that never finished their handshake

    def start(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._task = asyncio.get_running_loop().create_task(self._connect())

    def send(self, frames: list[bytes]) -> bytes:
        data, conn = encode(frames), self._conn
        if conn is not None and conn.ready:
            if conn.transport.get_write_buffer_size() > MAX_UNSENT:
                raise RuntimeError("the kernel is not reading its requests")
            conn.transport.write(data)
        else:
            self._pending.add(data, len(data))
        return data

    def withdraw(self, sent: object) -> None:
        """Drop ``sent`` (what ``send`` returned) if it still waits for the kernel to listen."""
        self._pending.withdraw(sent)

    def poke(self) -> None:
        """Nothing waits unread here: what comes is read as it comes."""

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._conn is not None:
            self._conn.transport.abort()
        self._pending.clear()

    async def _connect(self) -> None:
        while True:
            try:
                conn = await connect_socket_file(self.path, functools.partial(_Connection, self))
            except NotASocket:  # planted by the sandbox: tried ever less often, as below
                self._log_failure(True, "not a socket where a kernel's is (%s): trying again")
                self._failed += 1
            except OSError:  # the kernel is not up yet, or is restarting
                await asyncio.sleep(self.RECONNECT)
                continue
            else:
                await conn.lost
                self._failed = self._failed + 1 if conn.refused else 0
            await asyncio.sleep(
                min(self.RECONNECT * 2 ** min(self._failed, 16), self.RECONNECT_MAX)
            )

    def _log_failure(self, refused: bool, message: str, *args: object) -> None:
        """A warning, but once for a run of refusals: what answers there is the sandbox's
        choice, and it must not fill the gateway's log."""
        quiet = refused and self._failed > 0
        log.log(logging.DEBUG if quiet else logging.WARNING, message, self.path, *args)

    def _ready(self, conn: _Connection) -> None:
        if self.socket_type == b"SUB":
            conn.transport.write(frame(0, b"\x01"))  # subscribe to everything (ZMTP 3.0)
        conn.transport.writelines(self._pending.take_all())
        self.up.set()

    def _down(self, conn: _Connection) -> None:
        """``conn`` is closing: from now on sends wait for the next connection."""
        if self._conn is conn:
            self._conn = None
            self.up.clear()


def _nowhere(frames: list[bytes]) -> None:
    pass


class _Connection(asyncio.Protocol):
    """One connection of a ``ZmtpLink``: the greeting, the handshake, then frames."""

    def __init__(self, link: ZmtpLink) -> None:
        self.link = link
        self.transport = cast(asyncio.Transport, None)
        self.ready = False
        self.handshaken = False  # READY came, whatever happened after
        self.refused = False  # cut before its handshake was done: no kernel's socket, it seems
        self.lost = asyncio.get_running_loop().create_future()
        self._buffer = bytearray()  # what came and is not read yet
        self._greeted = False
        self._frames: list[bytes] = []  # of the message being read
        self._size = 0  # their bytes
        self._paused = False  # reading stopped until the buffer's messages are delivered
        self._handshake: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.link._conn = self  # before anything it reads: sends wait for its handshake
        self.transport.write(GREETING + ready(self.link.socket_type))
        self._handshake = asyncio.get_running_loop().call_later(
            HANDSHAKE_TIMEOUT, self._cut, "no handshake in time", False
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.ready = False
        self.link._down(self)
        if self._handshake is not None:
            self._handshake.cancel()
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._read()

    def _cut(self, why: str, counted: bool) -> None:
        """Close at once (what was sent on it is lost) and connect again."""
        if counted:
            self.link.drops += 1
        self.refused = not self.handshaken
        self.link._log_failure(
            self.refused, "a kernel connection was cut (%s): %s; connecting again", why
        )
        self.ready = False
        self.link._down(self)
        self.transport.abort()

    def _read(self) -> None:
        """Deliver the buffer's whole messages, a turn's worth at a time."""
        if self.transport.is_closing():
            return
        try:
            more = self._parse()
        except ProtocolError as e:
            self._cut(str(e), counted=self._greeted)
            return
        except Exception:  # a delivery that raised: the connection goes, not the reading
            log.exception("a kernel message could not be delivered (%s)", self.link.path)
            self._cut("a message could not be delivered", counted=False)
            return
        if not more:
            if self._paused:
                self._paused = False
                self.transport.resume_reading()
            return
        if not self._paused:
            self._paused = True
            self.transport.pause_reading()
        asyncio.get_running_loop().call_soon(self._read)

    def _parse(self) -> bool:
        """Take whole frames off the buffer; whether a turn's worth was taken (more may wait)."""
        buf, pos, delivered, headers = self._buffer, 0, 0, 0
        n, limit = len(buf), self.link.limit
        view = memoryview(buf)
        try:
            if not self._greeted:
                _check_greeting(buf[: len(GREETING)])  # as far as it has come
                if n < len(GREETING):
                    return False
                self._greeted, pos = True, len(GREETING)
            while n - pos >= 2:
                if delivered >= ZmtpLink.BATCH or headers >= HEADERS_PER_TURN:
                    return True
                headers += 1
                flags = buf[pos]
                if flags & LONG:
                    if n - pos < 9:
                        break
                    size, start = int.from_bytes(view[pos + 1 : pos + 9], "big"), pos + 9
                else:
                    size, start = buf[pos + 1], pos + 2
                # Bounded as its header comes: over a bound, its body is never read.
                # (In line: some thirty frames an execute.)
                if flags & COMMAND:
                    if size > _MAX_COMMAND:
                        raise ProtocolError(f"a command of {size} bytes")
                elif self._size + size > limit or len(self._frames) >= MAX_FRAMES:
                    raise ProtocolError("a message over max_kernel_message")
                end = start + size
                if end > n:
                    break
                pos = end
                if flags & COMMAND:
                    self._command(bytes(view[start:end]))
                    continue
                if not self.ready:
                    raise ProtocolError("a message before the handshake")
                self._frames.append(bytes(view[start:end]))
                self._size += size
                if not flags & MORE:
                    frames, self._frames, self._size = self._frames, [], 0
                    delivered += 1
                    self.link._deliver(frames)
        finally:
            view.release()
            del buf[:pos]
        return False

    def _command(self, body: bytes) -> None:
        name = body[1 : 1 + body[0]] if body else b""
        if name == b"READY" and not self.ready:
            self.ready = self.handshaken = True
            if self._handshake is not None:
                self._handshake.cancel()
            self.link._ready(self)
        elif name == b"PING":  # ZMTP 3.1 heartbeats, should the kernel's side ask
            # Unanswered while the kernel leaves earlier answers unread: a PING flood
            # must not grow the gateway's write buffer.
            if self.transport.get_write_buffer_size() < _MAX_COMMAND:
                self.transport.write(command(b"PONG", body[1 + body[0] + 2 :][:16]))
        elif name == b"ERROR":
            raise ProtocolError("the kernel's side refused the handshake")


def _check_greeting(greeting: bytes | bytearray) -> None:
    """A ZMTP 3 greeting with the NULL mechanism, as far as it has come."""
    expected = (
        (0, b"\xff"),
        (9, b"\x7f"),
        (12, b"NULL".ljust(20, b"\0")),
    )
    for at, value in expected:
        part = greeting[at : at + len(value)]
        if part != value[: len(part)]:
            raise ProtocolError("not a ZMTP 3 greeting with the NULL mechanism")
    if len(greeting) > 10 and greeting[10] < 3:
        raise ProtocolError("not a ZMTP 3 greeting")


class Links:
    """The gateway's links to one kernel: their cuts, and waiting until all are up."""

    def __init__(self, links: Iterable[ZmtpLink]) -> None:
        self.links = tuple(links)

    @property
    def drops(self) -> int:
        return sum(link.drops for link in self.links)

    async def settled(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until every link is connected: what a kernel
        publishes while its iopub connection is down is lost."""
        if all(link.up.is_set() for link in self.links):
            return  # every execute asks: no timer when nothing is down
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                for link in self.links:
                    await link.up.wait()

    def close(self) -> None:
        for link in self.links:
            link.close()
