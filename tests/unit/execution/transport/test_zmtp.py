"""The gateway's own ZMTP links against libzmq's sockets (as a kernel binds them), and its
reader against any cut of a byte stream. Real kernels: test_execute, test_kernel_drops."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import zmq
import zmq.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.execution.transport import zmtp
from gateway.execution.transport.wire import MAX_FRAMES

LIMIT = 1000


class Kernel:
    """A kernel's PUB and ROUTER, bound on ipc sockets in ``tmp_path``."""

    def __init__(self, tmp_path) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.iopub, self.shell = str(tmp_path / "iopub"), str(tmp_path / "shell")
        self.pub.bind(f"ipc://{self.iopub}")
        self.router.bind(f"ipc://{self.shell}")

    def close(self) -> None:
        for sock in (self.pub, self.router):
            sock.close(linger=0)
        self.ctx.term()


async def subscribed(kernel: Kernel, got: asyncio.Queue) -> None:
    """Publish until the link hears (a subscription takes a moment to reach PUB)."""
    for _ in range(200):
        await kernel.pub.send(b"hello")
        try:
            assert await asyncio.wait_for(got.get(), 0.02) == [b"hello"]
            return
        except TimeoutError:
            continue
    raise AssertionError("the SUB link never heard")


def run(tmp_path, scenario) -> None:
    async def go() -> None:
        kernel = Kernel(tmp_path)
        try:
            await scenario(kernel)
        finally:
            kernel.close()

    asyncio.run(go())


def with_link(tmp_path, socket_type: bytes, scenario, path: str | None = None, around=None) -> None:
    """Run ``scenario(kernel, link, got)``: a started link to the kernel's iopub (SUB) or
    shell (DEALER), or to ``path``, and the queue its messages go to; inside ``around``
    (an async context manager) if given."""

    async def go(kernel: Kernel) -> None:
        default = kernel.iopub if socket_type == b"SUB" else kernel.shell
        async with around or contextlib.nullcontext():
            link = zmtp.ZmtpLink(path or default, socket_type, LIMIT)
            got: asyncio.Queue = asyncio.Queue()
            link.start(got.put_nowait)
            try:
                await scenario(kernel, link, got)
            finally:
                link.close()

    run(tmp_path, go)


def test_a_message_over_the_limit_is_cut_before_it_is_read_and_the_link_goes_on(tmp_path):
    async def scenario(kernel: Kernel, link: zmtp.ZmtpLink, got: asyncio.Queue) -> None:
        await subscribed(kernel, got)
        # Each frame under the limit, the message over it; then a message of many
        # empty frames (no bytes, but each one a read and an object).
        await kernel.pub.send_multipart([b"a" * 600, b"b" * 600, b"c" * 600])
        await subscribed(kernel, got)
        await kernel.pub.send_multipart([b""] * (MAX_FRAMES + 1))
        await subscribed(kernel, got)
        assert got.empty(), "a message over the bounds got through"
        assert link.drops == 2

    with_link(tmp_path, b"SUB", scenario)


def test_requests_sent_before_the_kernel_listens_go_when_it_does(tmp_path):
    async def scenario(kernel: Kernel, link: zmtp.ZmtpLink, replies: asyncio.Queue) -> None:
        link.send([b"first", b"request"])
        await asyncio.sleep(0.3)  # nothing listens: the link tries again meanwhile
        kernel.router.bind(f"ipc://{tmp_path / 'later'}")
        ident, *frames = await asyncio.wait_for(kernel.router.recv_multipart(), 5)
        assert frames == [b"first", b"request"]
        await kernel.router.send_multipart([ident, b"reply", b"x" * 300])  # a long frame
        assert await asyncio.wait_for(replies.get(), 5) == [b"reply", b"x" * 300]
        assert link.drops == 0

    with_link(tmp_path, b"DEALER", scenario, str(tmp_path / "later"))


def test_a_kernel_that_restarts_is_connected_to_again(tmp_path):
    async def scenario(kernel: Kernel, link: zmtp.ZmtpLink, replies: asyncio.Queue) -> None:
        for _ in range(2):
            link.send([b"ping"])
            ident, _ = await asyncio.wait_for(kernel.router.recv_multipart(), 5)
            await kernel.router.send_multipart([ident, b"pong"])
            assert await asyncio.wait_for(replies.get(), 5) == [b"pong"]
            conn = link._conn
            assert conn is not None
            kernel.router.close(linger=0)  # the kernel restarts: a new socket, same path
            kernel.router = kernel.ctx.socket(zmq.ROUTER)
            kernel.router.bind(f"ipc://{kernel.shell}")
            await asyncio.wait_for(conn.lost, 5)
            await asyncio.wait_for(link.up.wait(), 5)

    with_link(tmp_path, b"DEALER", scenario)


class Impostor:
    """A socket the sandbox put in the kernel's place: ``answer(n)`` is what it writes to
    its ``n``-th connection; ``again`` is set once a second connection comes."""

    def __init__(self, path: str, answer) -> None:
        self.path, self.answer = path, answer
        self.accepted: list[asyncio.StreamWriter] = []
        self.again = asyncio.Event()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted.append(writer)
        writer.write(self.answer(len(self.accepted)))
        if len(self.accepted) >= 2:
            self.again.set()

    async def __aenter__(self) -> Impostor:
        self.server = await asyncio.start_unix_server(self._accept, self.path)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for writer in self.accepted:
            writer.close()
        await asyncio.sleep(0)


def test_a_sandbox_that_answers_garbage_or_never_finishes_a_message_holds_nothing(tmp_path):
    def answer(n: int) -> bytes:
        if n == 1:
            return b"HTTP/1.1 200 OK\r\n\r\n"
        # A frame announcing the limit, then a trickle of it.
        frame = bytes((zmtp.LONG | zmtp.MORE,)) + LIMIT.to_bytes(8, "big") + b"x"
        return zmtp.GREETING + zmtp.ready(b"PUB") + frame

    async def scenario(kernel: Kernel, link: zmtp.ZmtpLink, got: asyncio.Queue) -> None:
        await asyncio.wait_for(impostor.again.wait(), 5)
        await asyncio.sleep(0.2)
        assert got.empty()
        assert link.drops == 0  # not ZMTP at all is no kernel message to cut
        conn = link._conn
        assert conn is not None and len(conn._buffer) < 16  # the frame's one byte waits

    impostor = Impostor(str(tmp_path / "impostor"), answer)
    with_link(tmp_path, b"SUB", scenario, impostor.path, around=impostor)


def test_a_planted_socket_that_is_not_zmtp_is_tried_ever_less_often_and_logged_once(
    tmp_path, caplog
):
    """Tried every 100 ms, each try a connect, a read and a warning: for good, per link."""

    async def scenario(kernel: Kernel, link: zmtp.ZmtpLink, got: asyncio.Queue) -> None:
        await asyncio.sleep(1.6)

    garbage = Impostor(str(tmp_path / "garbage"), lambda n: b"HTTP/1.1 400 Bad Request\r\n\r\n")
    with caplog.at_level(logging.WARNING, logger="gateway.execution.transport.zmtp"):
        with_link(tmp_path, b"SUB", scenario, garbage.path, around=garbage)
    # 0.1, 0.2, 0.4, 0.8 s apart: five tries in 1.6 s, not sixteen
    assert 3 <= len(garbage.accepted) <= 6, len(garbage.accepted)
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]


def test_a_link_never_follows_a_symbolic_link_the_sandbox_put_in_the_kernels_place(tmp_path):
    """The kernel's socket directory is the sandbox's: a link there could send the
    gateway's connection (and each execute's code) to any socket the gateway can reach."""

    async def scenario(kernel: Kernel, link: zmtp.ZmtpLink, got: asyncio.Queue) -> None:
        await asyncio.sleep(0.5)

    elsewhere = Impostor(str(tmp_path / "elsewhere"), lambda n: zmtp.GREETING)
    planted = tmp_path / "planted"
    planted.symlink_to(elsewhere.path)
    with_link(tmp_path, b"DEALER", scenario, str(planted), around=elsewhere)
    assert elsewhere.accepted == [], "the link connected through a symbolic link"


class _Transport:
    """What a _Connection writes and whether it was cut, without a socket."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, parts: list[bytes]) -> None:
        for part in parts:
            self.write(part)

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return len(self.written)  # the peer reads nothing


def connected(link: zmtp.ZmtpLink, peer: bytes) -> tuple[zmtp._Connection, _Transport]:
    """A connection of ``link`` that has had the greeting and READY of a ``peer`` socket."""
    conn = zmtp._Connection(link)
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(zmtp.GREETING + zmtp.ready(peer))
    return conn, transport


def test_a_ping_flood_from_a_peer_that_reads_nothing_grows_nothing():
    async def go() -> None:
        conn, transport = connected(zmtp.ZmtpLink("unused", b"SUB", LIMIT), b"PUB")
        conn.data_received(zmtp.command(b"PING", b"\x00\x0a" + b"c" * 16) * 100_000)
        assert not transport.aborted
        assert len(transport.written) < 8192, "every PING was answered into an unread buffer"

    asyncio.run(go())


messages = st.lists(
    st.lists(st.binary(max_size=400), min_size=1, max_size=4), min_size=1, max_size=6
)


@given(messages, st.lists(st.integers(1, 300), max_size=20), st.booleans())
@settings(max_examples=200, deadline=None)
def test_the_reader_delivers_the_same_messages_however_the_stream_is_cut(sent, cuts, ping):
    """Every split of the bytes into reads gives the same messages, each once, in order."""

    async def go() -> list[list[bytes]]:
        link = zmtp.ZmtpLink("unused", b"DEALER", 10_000)
        got: list[list[bytes]] = []
        link._deliver = got.append
        conn = zmtp._Connection(link)
        transport = _Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        stream = zmtp.GREETING + zmtp.ready(b"ROUTER")  # cut into reads too
        if ping:
            stream += zmtp.command(b"PING", b"\x00\x0ahb")
        stream += b"".join(zmtp.encode(m) for m in sent)
        at = 0
        for cut in [*cuts, len(stream)]:
            conn.data_received(stream[at : at + cut])
            at += cut
            for _ in range(10):  # batches the loop would deliver in later turns
                await asyncio.sleep(0)
        conn.data_received(stream[at:])
        for _ in range(len(sent) // zmtp.ZmtpLink.BATCH + 2):
            await asyncio.sleep(0)
        assert not transport.aborted
        assert transport.written.startswith(zmtp.GREETING + zmtp.ready(b"DEALER"))
        assert (zmtp.command(b"PONG", b"hb") in transport.written) == ping
        return got

    assert asyncio.run(go()) == sent


def test_a_flood_of_empty_commands_is_read_a_turn_s_worth_at_a_time():
    """Each header is Python work, however few bytes: 128K of them held every session."""

    async def go() -> None:
        conn, transport = connected(zmtp.ZmtpLink("unused", b"SUB", LIMIT), b"PUB")
        conn.data_received(zmtp.command(b"") * 100_000)
        assert conn._paused and len(conn._buffer) > 100_000, "the whole read was taken at once"
        for _ in range(100_000 // zmtp.HEADERS_PER_TURN + 1):
            await asyncio.sleep(0)
        assert not conn._buffer and not conn._paused and not transport.aborted

    asyncio.run(go())


def test_a_request_sent_right_after_a_cut_waits_for_the_next_connection():
    """Until the connection is gone for good, a send wrote into it, and was lost."""

    async def go() -> None:
        link = zmtp.ZmtpLink("unused", b"DEALER", LIMIT)
        conn, transport = connected(link, b"ROUTER")
        link._conn = conn
        conn.data_received(zmtp.encode([b"a" * 600, b"b" * 600]))  # over LIMIT: cut
        assert transport.aborted and link.drops == 1
        sent = len(transport.written)
        link.send([b"after the cut"])
        assert len(transport.written) == sent, "written into the cut connection"
        assert link._pending.take_all() == [zmtp.encode([b"after the cut"])]

    asyncio.run(go())


def test_a_socket_that_never_answers_the_handshake_is_left_and_tried_again(tmp_path, monkeypatch):
    monkeypatch.setattr(zmtp, "HANDSHAKE_TIMEOUT", 0.2)

    async def scenario(kernel: Kernel, link: zmtp.ZmtpLink, got: asyncio.Queue) -> None:
        try:
            await asyncio.wait_for(silent.again.wait(), 3)
        except TimeoutError:
            raise AssertionError("the link waited on a silent socket for good") from None

    silent = Impostor(str(tmp_path / "silent"), lambda n: b"")
    with_link(tmp_path, b"SUB", scenario, silent.path, around=silent)


def test_a_delivery_that_raises_cuts_the_connection_and_reading_goes_on(tmp_path):
    async def scenario(kernel: Kernel) -> None:
        link = zmtp.ZmtpLink(kernel.iopub, b"SUB", LIMIT)
        got: asyncio.Queue = asyncio.Queue()
        raised = []

        def deliver(frames: list[bytes]) -> None:
            if frames == [b"raise"] and not raised:
                raised.append(frames)
                raise RuntimeError("a bug in a delivery")
            if frames != [b"filler"]:
                got.put_nowait(frames)

        link.start(deliver)
        try:
            await subscribed(kernel, got)
            for _ in range(zmtp.ZmtpLink.BATCH + 5):  # the raise comes in a later turn's batch
                await kernel.pub.send(b"filler")
            await kernel.pub.send(b"raise")
            await asyncio.sleep(0.2)
            await subscribed(kernel, got)
        finally:
            link.close()

    run(tmp_path, scenario)
