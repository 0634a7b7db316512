"""The message guard between the gateway's ZeroMQ sockets and a kernel's, without an engine."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio
from hypothesis import given
from hypothesis import strategies as st

from gateway.execution.transport import guard as guard_module
from gateway.execution.transport.drops import DropWatch
from gateway.execution.transport.guard import MessageGuard
from gateway.execution.transport.wire import HEADERS_PER_TURN, MAX_FRAMES, FrameCounter

LIMIT = 1000
GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x01" + b"NULL" + b"\0" * 16 + b"\0" * 32


def frame(size: int, more: bool = False, command: bool = False) -> bytes:
    flags = (1 if more else 0) | (4 if command else 0)
    if size > 255:
        return bytes([flags | 2]) + size.to_bytes(8, "big") + b"x" * size
    return bytes([flags, size]) + b"x" * size


messages = st.lists(
    st.one_of(
        st.tuples(st.just("command"), st.integers(0, 300)),
        st.tuples(st.just("message"), st.lists(st.integers(0, 700), min_size=1, max_size=4)),
    ),
    max_size=8,
)


@given(messages, st.lists(st.integers(1, 400), max_size=30), st.integers(1, 5))
def test_the_counter_passes_exactly_what_comes_before_the_first_message_over_the_limit(
    sequence, cuts, budget
):
    stream, allowed, over = bytearray(GREETING), None, False
    for kind, sizes in sequence:
        if kind == "command":
            allowed = allowed if over else len(stream)
            stream += frame(sizes, command=True)
            continue
        total = 0
        for n, size in enumerate(sizes):
            total += size
            if total > LIMIT and not over:
                allowed, over = len(stream), True
            stream += frame(size, more=n < len(sizes) - 1)
    counter, passed, cut = FrameCounter(LIMIT), bytearray(), False
    position = 0
    for size in [*cuts, len(stream)]:
        chunk, position = memoryview(bytes(stream[position : position + size])), position + size
        while chunk and not cut:  # a few headers a turn: the rest of the read in later ones
            parts, cut, used = counter.feed(chunk, budget)
            passed += b"".join(parts)
            chunk = chunk[used:]
        if cut or position >= len(stream):
            break
    expected = bytes(stream[:allowed]) if over else bytes(stream)
    assert cut == over
    assert bytes(passed) == expected


def test_a_message_of_too_many_frames_is_cut_however_small_they_are():
    """Empty frames add no bytes, but each is a libzmq message and a read in the gateway."""
    counter = FrameCounter(LIMIT)
    many = frame(0, more=True) * (MAX_FRAMES - 1) + frame(0)
    parts, cut, _ = counter.feed(GREETING + many + many)
    assert not cut and b"".join(parts) == GREETING + many + many
    parts, cut, _ = counter.feed(frame(0, more=True) * MAX_FRAMES + frame(0))
    assert cut and b"".join(parts) == frame(0, more=True) * MAX_FRAMES


def test_a_flood_of_empty_commands_is_read_a_turn_s_worth_at_a_time():
    """Each header is Python work in the loop, however few bytes: 128K in one read held
    every session ~50 ms."""
    flood = GREETING + frame(0, command=True) * 100_000
    parts, cut, used = FrameCounter(LIMIT).feed(flood, HEADERS_PER_TURN)
    assert not cut and used == len(GREETING) + 2 * HEADERS_PER_TURN
    assert b"".join(parts) == flood[:used]


def test_a_frame_header_cut_over_three_reads_passes_once():
    """Its middle bytes were passed on and held both: the gateway's libzmq read other frames
    than the guard counted, so a kernel choosing its writes could slip a message past it."""
    stream = GREETING + frame(256, command=True) + frame(300, more=True) + frame(1)
    counter, passed = FrameCounter(LIMIT), b""
    for chunk in (stream[:65], stream[65:66], stream[66:68], stream[68:]):
        parts, cut, _ = counter.feed(chunk)
        passed += b"".join(parts)
        assert not cut
    assert passed == stream


def test_a_greeting_that_is_not_zmtp_3_is_cut():
    _, cut, _ = FrameCounter(LIMIT).feed(b"\x01\x00" + b"x" * 70)
    assert cut


async def _through_the_guard(tmp_path) -> tuple[list[list[bytes]], int]:
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"ipc://{tmp_path / 'kernel'}")
    guard = MessageGuard(tmp_path / "guard", tmp_path / "kernel", LIMIT)
    await guard.start()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.MAXMSGSIZE, LIMIT)
    sub.subscribe(b"")
    sub.connect(f"ipc://{tmp_path / 'guard'}")
    watch = DropWatch([sub])
    got: list[list[bytes]] = []
    try:
        while not await sub.poll(20):  # the subscription reaches the kernel
            await pub.send(b"hello")
        got.append(await sub.recv_multipart())
        # Each frame under the limit, the message over it.
        await pub.send_multipart([b"a" * 600, b"b" * 600, b"c" * 600])
        for _ in range(200):
            await pub.send(b"after")
            if await sub.poll(50):
                got.append(await sub.recv_multipart())
                break
        return got, watch.drops
    finally:
        watch.close()
        await asyncio.sleep(0)  # its monitor sockets close
        await guard.close()
        for sock in (sub, pub):
            sock.close(linger=0)
        ctx.term()


def test_a_message_of_frames_each_under_the_limit_is_refused_and_the_connection_made_again(
    tmp_path,
):
    got, drops = asyncio.run(_through_the_guard(tmp_path))
    assert got[0] == [b"hello"]
    assert got[1:] == [[b"after"]], "the message over the limit got through, or nothing after it"
    assert drops == 1


def test_a_connection_made_before_the_kernel_listens_is_closed_at_once(tmp_path):
    """libzmq connects before the kernel binds: the guard must hang up, so libzmq retries.

    Left open, libzmq waited out its 30 s handshake timeout: every cold start took 31 s.
    """

    assert asyncio.run(_greet_through_the_guard(tmp_path)) == b""


async def _greet_through_the_guard(tmp_path) -> bytes:
    """What a greeting to a guard of ``tmp_path/kernel`` gets back before the guard hangs up."""
    guard = MessageGuard(tmp_path / "guard", tmp_path / "kernel", LIMIT)
    await guard.start()
    try:
        reader, writer = await asyncio.open_unix_connection(str(tmp_path / "guard"))
        writer.write(GREETING)
        try:
            return await asyncio.wait_for(reader.read(), 2)
        except ConnectionResetError:  # hung up with the greeting unread
            return b""
        finally:
            writer.close()
    finally:
        await guard.close()


def test_the_guard_never_follows_a_symbolic_link_in_the_kernels_place(tmp_path):
    """The kernel's socket directory is the sandbox's: a link there must lead nowhere."""

    async def scenario() -> list[bool]:
        accepted = []
        elsewhere = await asyncio.start_unix_server(
            lambda r, w: accepted.append(True) or w.close(), str(tmp_path / "elsewhere")
        )
        (tmp_path / "kernel").symlink_to(tmp_path / "elsewhere")
        try:
            await _greet_through_the_guard(tmp_path)
        finally:
            elsewhere.close()
        return accepted

    assert asyncio.run(scenario()) == [], "the guard connected through a symbolic link"


def test_reads_passed_on_over_several_turns_arrive_whole_and_in_order(tmp_path, monkeypatch):
    """Messages of many empty frames: each read is relayed a turn's worth at a time."""
    monkeypatch.setattr(guard_module, "HEADERS_PER_TURN", 50)  # every read takes turns

    async def scenario() -> list[list[bytes]]:
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        pub.bind(f"ipc://{tmp_path / 'kernel'}")
        guard = MessageGuard(tmp_path / "guard", tmp_path / "kernel", 1 << 20)
        await guard.start()
        sub = ctx.socket(zmq.SUB)
        sub.subscribe(b"")
        sub.connect(f"ipc://{tmp_path / 'guard'}")
        try:
            while not await sub.poll(20):  # the subscription reaches the kernel
                await pub.send(b"hello")
            await sub.recv_multipart()
            for n in range(50):
                await pub.send_multipart([b""] * 999 + [str(n).encode()])
            await pub.send(b"end")
            got = []
            while (msg := await asyncio.wait_for(sub.recv_multipart(), 10)) != [b"end"]:
                if msg != [b"hello"]:
                    got.append(msg)
            return got
        finally:
            await guard.close()
            for sock in (sub, pub):
                sock.close(linger=0)
            ctx.term()

    got = asyncio.run(scenario())
    assert got == [[b""] * 999 + [str(n).encode()] for n in range(50)]
