"""Preview connections into a sandbox that has no inbound network: the gateway's side of the relay.

The gateway listens on ``preview.sock`` in the session's run directory
(bound out of the sandbox's reach, ``nofollow.bind_socket``) and never
connects to anything there. The forwarder (``inside/preview.py``), started
in the sandbox as its own user, keeps one control connection; to reach port
P the gateway says ``open <id> P`` on it and waits for a connection that
announces ``data <id>``. Everything the sandbox sends before the piping is
bounded and parsed strictly: an unknown or repeated id, an unsolicited or
malformed control line closes what sent it. A session holds at most
``max_connections`` previews at once and moves ``max_bytes_per_minute``
(past that new ones are refused with 429 and open ones wait for the next
minute), so a sandbox can neither flood the gateway nor starve other
sessions' previews.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import tornado.iostream
import tornado.netutil
import tornado.tcpserver

from ..errors import PortNotListening, PreviewLimit, SandboxUnavailable
from ..limits import format_size
from ..nofollow import bind_socket

SOCKET_NAME = "preview.sock"  # in the session's run directory (/run/sbx inside)
FORWARDERS = (
    Path(__file__).parent / "inside" / "preview.py",
    Path(__file__).parent / "inside" / "preview.js",
)
# Run in the sandbox: the forwarder in python3 if the image has it, else in node.
START = (
    'if command -v python3 >/dev/null 2>&1; then exec python3 -c "$1"; fi; '
    'if command -v node >/dev/null 2>&1; then exec node -e "$2"; fi; '
    'echo "previews need python3 or node in the image" >&2; exit 127'
)
MAX_LINE = 4096  # a control line: "ports" and up to 512 port numbers
ACCEPTS_PER_SECOND = 200  # past it the socket is not listened on for the rest of the second
ANNOUNCE_TIMEOUT = 5.0  # seconds a connection to the socket has to say what it is
CHUNK = 64 * 1024

_ID = re.compile(rb"[0-9a-f]{32}")
_PORTS = re.compile(rb"ports (\d{1,5}(,\d{1,5}){0,511})?")


@dataclasses.dataclass(frozen=True)
class PreviewCaps:
    """What one session's previews may hold and move."""

    max_connections: int = 32
    max_bytes_per_minute: int = 512 * 2**20
    connect_timeout: float = 10.0  # the forwarder's start and each open, each


def parse_announce(line: bytes) -> str | None:
    """``control``, or the id of ``data <id>``; None for anything else."""
    line = line.rstrip(b"\n")
    if line == b"control":
        return "control"
    kind, _, ident = line.partition(b" ")
    return ident.decode() if kind == b"data" and _ID.fullmatch(ident) else None


def parse_reply(line: bytes) -> tuple[str, str | list[int]] | None:
    """A control line from the forwarder: ``("refused", id)``, ``("ports", [...])``, else None."""
    line = line.rstrip(b"\n")
    kind, _, rest = line.partition(b" ")
    if kind == b"refused" and _ID.fullmatch(rest):
        return "refused", rest.decode()
    if _PORTS.fullmatch(line):
        ports = [int(p) for p in rest.split(b",") if p]
        if all(0 < p < 65536 for p in ports):
            return "ports", ports
    return None


class Budget:
    """Bytes per minute: ``take`` waits for the next minute once this one's are spent."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self.window = clock()
        self.used = 0

    def _roll(self) -> None:
        now = self.clock()
        if now - self.window >= 60:
            self.window, self.used = now, 0

    def spent(self) -> int | None:
        """Seconds until bytes are available again, or None while some are."""
        self._roll()
        if self.used < self.per_minute:
            return None
        return max(1, int(60 - (self.clock() - self.window)) + 1)

    async def take(self, size: int) -> None:
        wait = self.spent()
        if wait is not None:
            await asyncio.sleep(wait)  # into the next minute
            self._roll()
        self.used += size


class PreviewRelay(tornado.tcpserver.TCPServer):
    """One session's preview socket: its forwarder's control connection and the pipes it opens.

    ``start_forwarder`` serves the socket (``serve``) and runs the forwarder
    in the sandbox, whenever no control connection is there; it returns once
    the forwarder is started.
    """

    def __init__(
        self,
        session_id: str,
        caps: PreviewCaps,
        start_forwarder: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(max_buffer_size=CHUNK * 4)
        self.session_id = session_id
        self.caps = caps
        self.start_forwarder = start_forwarder
        self.budget = Budget(caps.max_bytes_per_minute)
        self.open_count = 0
        self._control: tornado.iostream.IOStream | None = None
        self._controlled = asyncio.Event()
        self._ended = asyncio.Event()  # the forwarder's process exited
        self._end_reason = ""
        self._pending: dict[str, asyncio.Future[tornado.iostream.IOStream]] = {}
        self._ports: asyncio.Future[list[int]] | None = None
        self._asking = asyncio.Lock()  # one "ports" question at a time
        self._starting = asyncio.Lock()
        self._unannounced = 0
        self._window, self._accepted = 0.0, 0  # the current second, and its accepts
        self._paused: set[int] = set()  # sockets not listened on for now

    async def serve(self, run_dir: Path) -> None:
        """Listen on ``preview.sock`` in the sandbox's run directory, and there only.

        Called before each start of the forwarder: a resumed or moved session's
        sandbox may have a new run directory, or the sandbox removed the socket.
        """
        sock = await asyncio.to_thread(bind_socket, run_dir, SOCKET_NAME, 0o777)
        sock.setblocking(False)
        self._unlisten()
        self.add_socket(sock)

    def _unlisten(self) -> None:
        for fd, sock in list(self._sockets.items()):
            self._handlers.pop(fd)()
            sock.close()
        self._sockets.clear()
        self._paused = set()

    def close(self) -> None:
        self._unlisten()
        if self._control is not None:
            self._control.close()
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(_unavailable("was closed with the session"))

    # -- what the gateway asks ---------------------------------------------------------

    @contextlib.asynccontextmanager
    async def connection(self, port: int) -> AsyncIterator[tornado.iostream.IOStream]:
        """A stream to ``port`` in the sandbox, counted against the caps while it is open."""
        if self.open_count >= self.caps.max_connections:
            raise PreviewLimit(
                f"this session's previews hold {self.caps.max_connections} connections, its "
                "most; close some (or wait for them to end) and retry"
            )
        wait = self.budget.spent()
        if wait is not None:
            most = format_size(self.caps.max_bytes_per_minute)
            error = PreviewLimit(
                f"this session's previews moved {most} this minute, their most "
                f"(preview_max_bytes); retry in {wait} s"
            )
            error.retry_after = wait
            raise error
        self.open_count += 1
        stream = None
        try:
            stream = await self._open(port)
            yield stream
        finally:
            self.open_count -= 1
            if stream is not None:
                stream.close()

    async def ports(self) -> list[int]:
        """The TCP ports listening in the sandbox, as its forwarder reads them."""
        async with self._asking:
            control = await self._controller()
            self._ports = asyncio.get_running_loop().create_future()
            try:
                await control.write(b"ports\n")
                async with asyncio.timeout(self.caps.connect_timeout):
                    return await self._ports
            except (TimeoutError, tornado.iostream.StreamClosedError):
                raise _unavailable("did not list its ports") from None
            finally:
                self._ports = None

    async def _open(self, port: int) -> tornado.iostream.IOStream:
        control = await self._controller()
        ident = secrets.token_hex(16)
        waiter = self._pending[ident] = asyncio.get_running_loop().create_future()
        try:
            await control.write(f"open {ident} {port}\n".encode())
            async with asyncio.timeout(self.caps.connect_timeout):
                return await waiter
        except (TimeoutError, tornado.iostream.StreamClosedError):
            raise _unavailable(f"did not open port {port}") from None
        finally:
            self._pending.pop(ident, None)

    def forwarder_ended(self, reason: str) -> None:
        """The forwarder's process exited: a wait for it to start ends, saying ``reason``."""
        self._end_reason = reason
        self._ended.set()

    async def _controller(self) -> tornado.iostream.IOStream:
        """The control connection; the forwarder is started if there is none."""
        async with self._starting:
            if self._control is None or self._control.closed():
                self._controlled.clear()
                self._ended.clear()
                await self.start_forwarder()
                waits = [asyncio.ensure_future(e.wait()) for e in (self._controlled, self._ended)]
                await asyncio.wait(
                    waits, timeout=self.caps.connect_timeout, return_when="FIRST_COMPLETED"
                )
                for waiting in waits:
                    waiting.cancel()
                if not self._controlled.is_set():
                    if self._ended.is_set():
                        raise SandboxUnavailable(
                            f"the sandbox's preview forwarder {self._end_reason}"
                        )
                    raise _unavailable("did not start")
            assert self._control is not None
            return self._control

    # -- what the sandbox sends --------------------------------------------------------

    def _count_accept(self) -> None:
        """Stop accepting for the rest of the second past ``ACCEPTS_PER_SECOND``: a sandbox
        connecting in a loop then waits in the kernel's backlog, not on the gateway's loop."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self._window >= 1.0:
            self._window, self._accepted = now, 0
        self._accepted += 1
        if self._accepted <= ACCEPTS_PER_SECOND or self._paused:
            return
        self._paused = set(self._handlers)
        for fd in self._paused:
            self._handlers[fd]()  # removes the accept handler; the socket stays bound
        loop.call_later(self._window + 1.0 - now, self._resume_accepting)

    def _resume_accepting(self) -> None:
        for fd in self._paused & set(self._sockets):
            sock = self._sockets[fd]
            self._handlers[fd] = tornado.netutil.add_accept_handler(sock, self._handle_connection)
        self._paused = set()

    async def handle_stream(self, stream: tornado.iostream.IOStream, address: object) -> None:
        self._count_accept()
        if self._unannounced >= self.caps.max_connections + 8:
            stream.close()  # a sandbox opening connections nobody asked for
            return
        self._unannounced += 1
        try:
            async with asyncio.timeout(ANNOUNCE_TIMEOUT):
                line = await stream.read_until(b"\n", max_bytes=64)
        except (
            TimeoutError,
            tornado.iostream.StreamClosedError,
            tornado.iostream.UnsatisfiableReadError,
        ):
            stream.close()
            return
        finally:
            self._unannounced -= 1
        said = parse_announce(line)
        waiter = self._pending.get(said or "")
        if said == "control":
            await self._take_control(stream)
        elif waiter is not None and not waiter.done():
            stream.set_nodelay(True)
            waiter.set_result(stream)
        else:
            stream.close()  # unknown, repeated or malformed

    async def _take_control(self, stream: tornado.iostream.IOStream) -> None:
        if self._control is not None:
            self._control.close()  # a newer forwarder replaces the older
        self._control = stream
        self._controlled.set()
        try:
            while True:
                reply = parse_reply(await stream.read_until(b"\n", max_bytes=MAX_LINE))
                if reply is None or not self._expected(*reply):
                    break
        except (tornado.iostream.StreamClosedError, tornado.iostream.UnsatisfiableReadError):
            pass
        stream.close()

    def _expected(self, kind: str, value: str | list[int]) -> bool:
        """Settle what a reply answers; False for one nobody asked for."""
        if kind == "ports":
            if self._ports is None or self._ports.done():
                return False
            self._ports.set_result(value)  # type: ignore[arg-type]
            return True
        waiter = self._pending.get(value)  # type: ignore[arg-type]
        if waiter is None or waiter.done():
            return False
        waiter.set_exception(PortNotListening("nothing listens on that port in the sandbox"))
        return True


async def pipe(
    source: tornado.iostream.IOStream, sink: tornado.iostream.IOStream, budget: Budget
) -> None:
    """Copy ``source`` to ``sink`` until either ends, each piece paid for from ``budget``."""
    try:
        while True:
            data = await source.read_bytes(CHUNK, partial=True)
            await budget.take(len(data))
            await sink.write(data)
    except tornado.iostream.StreamClosedError:
        pass
    finally:
        sink.close()
        source.close()


def _unavailable(what: str) -> SandboxUnavailable:
    return SandboxUnavailable(
        f"the sandbox's preview forwarder {what} in time; the sandbox may be overloaded, or "
        "its image has neither python3 nor node (previews need one): retry, or check the session"
    )
