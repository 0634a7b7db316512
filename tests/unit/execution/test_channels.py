"""The gateway's own channels to a kernel, against a stand-in kernel made of real ZeroMQ sockets.

Each scenario runs over both kinds of link: the gateway's own ZMTP (a kernel
on this host) and libzmq sockets (a kernel elsewhere). The kernel side signs
with jupyter_client's Session, as kernels do; the integration tests
(test_execute, test_kernel_drops, ...) run the same code against real kernels.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time

import pytest
import zmq
import zmq.asyncio
from hypothesis import given
from hypothesis import strategies as st
from jupyter_client.session import Session

from gateway.execution import channels
from gateway.execution.channels import KernelChannels
from gateway.execution.transport import zmtp
from gateway.execution.transport.libzmq import ZmqLink, sent_only_when_connected

KEY = b"k" * 32
FLOOD = 900  # under ZeroMQ's high-water mark (1000), which a PUB socket drops past


class StandIn:
    """A kernel's shell (ROUTER) and iopub (PUB), and the gateway's sockets connected to them."""

    def __init__(self, tmp_path, transport: str) -> None:
        self.ctx = zmq.asyncio.Context()
        self.session = Session(key=KEY)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.pub = self.ctx.socket(zmq.PUB)
        self.shell_url = f"ipc://{tmp_path}/shell"
        self.router.bind(self.shell_url)
        self.pub.bind(f"ipc://{tmp_path}/iopub")
        self.iopub: zmq.asyncio.Socket | None = None  # the gateway's, over libzmq
        if transport == "zmtp":
            self.links = (
                zmtp.ZmtpLink(f"{tmp_path}/shell", b"DEALER", 1 << 20),
                zmtp.ZmtpLink(f"{tmp_path}/iopub", b"SUB", 1 << 20),
            )
            return
        self.shell = shell = sent_only_when_connected(self.ctx, self._connect_shell)
        self.iopub = self.ctx.socket(zmq.SUB)
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(f"ipc://{tmp_path}/iopub")
        self.links = (ZmqLink(shell), ZmqLink(self.iopub))

    def _connect_shell(self) -> zmq.asyncio.Socket:
        """As jupyter_client connects a client's shell."""
        shell = self.ctx.socket(zmq.DEALER)
        shell.connect(self.shell_url)
        return shell

    async def go_away(self) -> None:
        """The kernel restarts: its shell socket goes (``come_back`` makes it again)."""
        self.router.close(linger=0)
        for _ in range(100):
            if not self.shell_connected():
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the link never saw the kernel go")

    def come_back(self) -> None:
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(self.shell_url)

    def shell_connected(self) -> bool:
        """Whether the gateway's shell link is connected to the kernel's socket."""
        link = self.links[0]
        if isinstance(link, zmtp.ZmtpLink):
            return link.up.is_set()
        return bool(self.shell.getsockopt(zmq.EVENTS) & zmq.POLLOUT)

    async def next_request(self) -> tuple[list[bytes], dict]:
        frames = await asyncio.wait_for(self.router.recv_multipart(), 5)
        idents, rest = self.session.feed_identities(frames)
        return idents, self.session.deserialize(rest)

    def reply(self, idents: list[bytes], parent: dict, session: Session | None = None) -> None:
        (session or self.session).send(
            self.router, "execute_reply", {"status": "ok"}, parent=parent, ident=idents
        )

    def publish(self, msg_type: str, content: dict, parent: dict | None) -> None:
        self.session.send(self.pub, msg_type, content, parent=parent or {})

    async def subscribed(self, channels: KernelChannels) -> None:
        """Publish until the SUB socket hears (a slow joiner misses the first messages)."""
        request = channels.request("kernel_info_request", {})
        idents, msg = await self.next_request()
        self.reply(idents, msg)
        for _ in range(100):
            self.publish("status", {"execution_state": "idle"}, msg)
            if await request.iopub.get(0.05) is not None:
                request.close()
                return
        raise AssertionError("iopub never connected")

    def close(self) -> None:
        for sock in (self.router, self.pub):
            sock.close(linger=0)
        self.ctx.term()


def scenario(test=None, *, transports=("zmtp", "zmq")):
    """Run ``test(kernel, channels)`` on a fresh loop, connected channels and stand-in,
    once over each of ``transports``."""
    if test is None:
        return lambda test: scenario(test, transports=transports)

    @pytest.mark.parametrize("transport", transports)
    def run(tmp_path, transport) -> None:
        async def go() -> None:
            kernel = StandIn(tmp_path, transport)
            channels = KernelChannels(Session(key=KEY), *kernel.links)
            try:
                await kernel.subscribed(channels)
                await test(kernel, channels)
            finally:
                channels.close()
                kernel.close()

        asyncio.run(go())

    run.__name__ = test.__name__
    return run


@scenario
async def test_a_request_gets_its_own_iopub_messages_in_order_and_its_reply(kernel, channels):
    request = channels.request("execute_request", {"code": "1 + 1"})
    idents, msg = await kernel.next_request()
    assert msg["content"]["code"] == "1 + 1"
    other = kernel.session.msg("execute_request", {})
    kernel.publish("stream", {"name": "stdout", "text": "not yours"}, other["header"])
    for n in range(3):
        kernel.publish("stream", {"name": "stdout", "text": f"{n}"}, msg["header"])
    kernel.reply(idents, msg["header"])
    texts = [(await request.iopub.get(2))["content"]["text"] for _ in range(3)]
    assert texts == ["0", "1", "2"]
    assert await request.iopub.get(0.2) is None  # the other request's message went nowhere
    assert (await request.wait_reply(2))["status"] == "ok"


@scenario
async def test_a_message_with_a_wrong_signature_is_dropped(kernel, channels):
    request = channels.request("execute_request", {"code": "x"})
    idents, msg = await kernel.next_request()
    kernel.reply(idents, msg["header"], session=Session(key=b"not the key"))
    assert await request.wait_reply(0.5) is None
    kernel.reply(idents, msg["header"])
    assert await request.wait_reply(2) is not None


@scenario
async def test_what_comes_after_a_request_is_closed_is_dropped(kernel, channels):
    request = channels.request("execute_request", {"code": "x"})
    _, msg = await kernel.next_request()
    request.close()
    kernel.publish("stream", {"name": "stdout", "text": "late"}, msg["header"])
    assert await request.iopub.get(0.3) is None


@scenario
async def test_a_flood_of_messages_leaves_the_loop_to_others(kernel, channels):
    request = channels.request("execute_request", {"code": "flood"})
    _, msg = await kernel.next_request()
    for n in range(FLOOD):
        kernel.publish("stream", {"name": "stdout", "text": str(n)}, msg["header"])
    ticks = 0

    async def other_session() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_session())
    received = 0
    while received < FLOOD and await request.iopub.get(2) is not None:
        received += 1
    other.cancel()
    assert received == FLOOD
    # Read BATCH messages a turn: the other task ran between the batches.
    assert ZmqLink.BATCH == zmtp.ZmtpLink.BATCH
    assert ticks >= FLOOD // ZmqLink.BATCH


@scenario
async def test_closing_the_channels_ends_a_wait_for_a_reply(kernel, channels):
    request = channels.request("execute_request", {"code": "x"})
    await kernel.next_request()
    waiting = asyncio.create_task(request.wait_reply(5))
    await asyncio.sleep(0.05)
    channels.close()
    assert await asyncio.wait_for(waiting, 1) is None


@scenario(transports=("zmq",))
async def test_a_message_whose_edge_another_call_took_is_still_read(kernel, channels):
    request = channels.request("execute_request", {"code": "x"})
    _, msg = await kernel.next_request()
    kernel.publish("stream", {"name": "stdout", "text": "stranded"}, msg["header"])
    # The loop is held while the message arrives, its edge unseen; any call on
    # the socket (this one) handles ZeroMQ's pending commands: the edge is gone.
    deadline = time.monotonic() + 5
    while not kernel.iopub.getsockopt(zmq.EVENTS) & zmq.POLLIN and time.monotonic() < deadline:
        time.sleep(0.01)  # noqa: ASYNC251  (holding the loop is the point)
    got = [await request.iopub.get(0.3) for _ in range(2)]
    assert got[0] is None and got[1]["content"]["text"] == "stranded"


@scenario
async def test_malformed_messages_from_a_kernel_are_dropped_and_reading_goes_on(kernel, channels):
    """Every frame a kernel sends is hostile: none of these may reach the loop as an error."""
    errors: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
    request = channels.request("execute_request", {"code": "x"})
    _, msg = await kernel.next_request()
    mine = json.dumps({"msg_id": msg["header"]["msg_id"]}).encode()
    bad_parents = [
        b"[" * 200_000,  # nested past the interpreter's recursion limit
        b"[1, 2]",  # not an object
        json.dumps({"msg_id": ["unhashable"]}).encode(),
        b"\xff\xfe not json",
    ]
    for parent in bad_parents:
        kernel.pub.send_multipart([b"<IDS|MSG>", b"sig", b"{}", parent, b"{}", b"{}"])
    kernel.pub.send_multipart([b"no delimiter at all"])
    kernel.pub.send_multipart([b"<IDS|MSG>", b"too few frames"])
    for header, content in ((b"[" * 200_000, b"{}"), (b"{}", b"{" * 200_000), (b"{}", b"[]")):
        parts = [header, mine, b"{}", content]  # signed: parsed past the signature
        signature = hmac.new(KEY, b"".join(parts), hashlib.sha256).hexdigest().encode()
        kernel.pub.send_multipart([b"<IDS|MSG>", signature, *parts])
    kernel.publish("stream", {"name": "stdout", "text": "after"}, msg["header"])
    got = await request.iopub.get(2)
    assert got is not None and got["content"]["text"] == "after"
    assert errors == [], f"a kernel's message raised in the gateway's loop: {errors}"


@scenario
async def test_a_request_that_reads_no_iopub_holds_none_of_it(kernel, channels):
    """A silent setup or a state save waits for its reply only: a kernel can flood its iopub."""
    import tracemalloc

    request = channels.request("execute_request", {"code": "x"}, iopub=False)
    idents, msg = await kernel.next_request()
    tracemalloc.start()
    try:
        for _ in range(200):
            kernel.publish("stream", {"name": "stdout", "text": "x" * 100_000}, msg["header"])
        kernel.reply(idents, msg["header"])
        assert await request.wait_reply(5) is not None
        await asyncio.sleep(0.5)  # the flood is read meanwhile
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 5_000_000, f"{held / 1e6:.0f} MB of iopub held for a request that reads none"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _outcome(parse, frame: bytes):
    try:
        return "value", parse(frame)
    except (ValueError, RecursionError) as e:
        return "error", type(e)


@given(
    st.one_of(
        _JSON.map(lambda v: json.dumps(v).encode()),  # NaN, lone surrogates, big ints
        _JSON.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")),
        st.dictionaries(st.text(), _JSON).map(lambda v: json.dumps(v).encode("utf-16")),
        st.binary(max_size=40).map(lambda b: b"{" + b),
        st.binary(max_size=40),
    )
)
def test_frames_parse_as_the_standard_json_module_parses_them(frame):
    """The channels' own parse of a kernel's frames is a shortcut, never a different answer."""
    # As written: 1 and 1.0, 0.0 and -0.0 are equal, NaN is not even equal to itself.
    assert repr(_outcome(channels.loads, frame)) == repr(_outcome(json.loads, frame))


@scenario
async def test_a_request_its_caller_gave_up_on_never_reaches_a_kernel_that_comes_back(
    kernel, channels
):
    """Requests sent while the kernel is away wait for it, in order, unless their caller
    stops waiting.

    One went when the kernel came back: code ran whose caller had been told it
    failed (a timeout, say), changing the session's state behind its back.
    """
    await kernel.go_away()
    first = channels.request("execute_request", {"code": "x = 1"})
    abandoned = channels.request("execute_request", {"code": "x = 2"})
    abandoned.close()  # its caller gave up
    third = channels.request("execute_request", {"code": "x = 3"})
    kernel.come_back()
    arrived = [(await kernel.next_request())[1] for _ in range(2)]
    assert [m["content"]["code"] for m in arrived] == ["x = 1", "x = 3"], (
        "a request its caller gave up on ran, or the others came out of order"
    )
    assert [m["header"]["msg_id"] for m in arrived] == [first.msg_id, third.msg_id]


@scenario
async def test_requests_wait_for_a_kernel_that_is_away_up_to_a_bound(kernel, channels):
    """Past the bound a request is refused at once, as a kernel not reading them is."""
    await kernel.go_away()
    bound, zmtp.MAX_PENDING = zmtp.MAX_PENDING, 3
    try:
        for n in range(3):
            channels.request("execute_request", {"code": f"{n}"})
        with pytest.raises(RuntimeError, match="has not read its last 3 requests"):
            channels.request("execute_request", {"code": "3"})
    finally:
        zmtp.MAX_PENDING = bound


def test_only_the_shell_socket_is_made_to_send_only_on_a_connection():
    """ZMQ_IMMEDIATE is set on the one socket; the context's other sockets keep theirs."""
    ctx = zmq.Context()
    made: list[zmq.Socket] = []

    def socket() -> zmq.Socket:
        made.append(ctx.socket(zmq.DEALER))
        return made[-1]

    try:
        assert sent_only_when_connected(ctx, socket).getsockopt(zmq.IMMEDIATE) == 1
        assert socket().getsockopt(zmq.IMMEDIATE) == 0, "left on the context"
        ctx.setsockopt(zmq.IMMEDIATE, 1)  # an option the context had before is kept
        sent_only_when_connected(ctx, socket)
        assert socket().getsockopt(zmq.IMMEDIATE) == 1
    finally:
        for sock in made:
            sock.close(linger=0)
        ctx.term()


class CutSocket:
    """libzmq's DEALER as lb.cpp has it when a connection goes between two frames: the
    frames before are lost, the frame is refused (EAGAIN), and the message's frames
    sent after it are dropped up to its last one."""

    def __init__(self, refuse: int) -> None:
        self.refuse = refuse  # the index of the frame sent that is refused, once
        self.sent = 0
        self.dropping = False
        self.message: list[bytes] = []
        self.delivered: list[list[bytes]] = []

    def getsockopt(self, option: int) -> int:
        return 0  # nothing to read

    def send(self, part: bytes, flags: int) -> None:
        more = bool(flags & zmq.SNDMORE)
        if self.dropping:
            self.dropping = more
            return
        self.sent += 1
        if self.sent - 1 == self.refuse:
            self.message, self.dropping = [], more
            raise zmq.Again()
        self.message.append(part)
        if not more:
            self.delivered.append(self.message)
            self.message = []


def test_a_message_cut_between_two_frames_by_a_lost_connection_is_sent_whole_later():
    """Its remaining frames are sent for libzmq to drop; the message waits and goes whole.

    Left unsent, they were taken from the next message: libzmq dropped that
    one in their place, and its sender waited for a reply that never came.
    """

    async def go() -> list[list[bytes]]:
        ctx = zmq.asyncio.Context()
        link = ZmqLink(ctx.socket(zmq.DEALER))
        link.start(lambda frames: None)
        cut = link._sock = CutSocket(refuse=1)
        try:
            link.send([b"a", b"b", b"c"])
            link.send([b"d", b"e"])
            for _ in range(50):
                if len(cut.delivered) == 2:
                    break
                await asyncio.sleep(link.RETRY)
        finally:
            link._sock = zmq.Socket.shadow(link.socket.underlying)
            link.close()
            ctx.term()
        return cut.delivered

    assert asyncio.run(go()) == [[b"a", b"b", b"c"], [b"d", b"e"]]
