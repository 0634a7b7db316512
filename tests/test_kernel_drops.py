"""DropWatch: kernel connections dropped under the gateway, without a gateway or an engine.

A kernel can make libzmq drop a connection (a frame over ``max_kernel_message``)
and a restarting kernel drops them all; the first is connected again by hand,
the second is ZeroMQ's own business. Getting these apart matters: a hand-made
reconnect while ZeroMQ already reconnects aborted the whole gateway process
(``Assertion failed: !_more (src/fq.cpp)``) once in a few kernel restarts.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import zmq
import zmq.asyncio

from gateway.execution.kernel import DropWatch

# A reader under DropWatch while its publisher restarts again and again with
# multipart messages in flight: what a kernel restart does to the iopub socket.
_RESTARTS = textwrap.dedent(
    """
    import asyncio, sys, threading, time
    import zmq, zmq.asyncio
    from gateway.execution.kernel import DropWatch

    addr = "ipc://" + sys.argv[1]
    restarts = int(sys.argv[2])

    def publish(stop):
        ctx = zmq.Context()
        for _ in range(restarts):
            pub = ctx.socket(zmq.PUB)
            pub.bind(addr)
            end = time.monotonic() + 0.15
            while time.monotonic() < end:
                pub.send_multipart([b"topic", b"header", b"x" * 2000, b"end"])
            pub.close(linger=0)
        stop.set()
        ctx.term()

    async def main():
        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.subscribe(b"")
        sub.connect(addr)
        watch = DropWatch([sub])
        stop = threading.Event()
        threading.Thread(target=publish, args=(stop,), daemon=True).start()
        received = 0
        while not stop.is_set():
            if await sub.poll(50):
                assert len(await sub.recv_multipart()) == 4
                received += 1
        watch.close()
        await asyncio.sleep(0.1)
        sub.close(linger=0)
        print(received, watch.drops)

    asyncio.run(main())
    """
)


def test_a_restarting_kernel_is_left_to_zeromq_and_the_reader_survives(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _RESTARTS, str(tmp_path / "iopub"), "25"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"the reader died ({proc.returncode}): {proc.stderr[-2000:]}"
    received, drops = map(int, proc.stdout.split())
    assert received > 0
    assert drops == 0, "ZeroMQ reconnects a lost connection itself; DropWatch must not"


async def _oversized_frame_then_more(tmp_path) -> tuple[list[bytes], int]:
    addr = f"ipc://{tmp_path / 'iopub'}"
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(addr)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.MAXMSGSIZE, 1000)
    sub.subscribe(b"")
    sub.connect(addr)
    watch = DropWatch([sub])
    try:
        # Wait until the subscription has reached the publisher.
        while not await sub.poll(20):
            await pub.send(b"hello")
        await sub.recv()
        await pub.send(b"x" * 5000)
        got: list[bytes] = []
        for _ in range(200):  # connected again within a few reconnect intervals
            await pub.send(b"after")
            if await sub.poll(50):
                got.append(await sub.recv())
                break
        return got, watch.drops
    finally:
        watch.close()
        await asyncio.sleep(0)
        for sock in (sub, pub):
            sock.close(linger=0)
        ctx.term()


def test_an_oversized_frame_drops_the_connection_and_dropwatch_makes_it_again(tmp_path):
    got, drops = asyncio.run(_oversized_frame_then_more(tmp_path))
    assert got == [b"after"], "after the oversized frame nothing arrived any more"
    assert drops == 1
