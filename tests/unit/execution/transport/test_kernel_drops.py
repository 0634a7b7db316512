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

from gateway.execution.transport.drops import DropWatch

# A reader under DropWatch while its publisher restarts again and again with
# multipart messages in flight: what a kernel restart does to the iopub socket.
_RESTARTS = textwrap.dedent(
    """
    import asyncio, sys, threading, time
    import zmq, zmq.asyncio
    from gateway.execution.transport.drops import DropWatch

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


# A watch closed while its socket lives on, then the socket's connection drops.
_WATCH_CLOSED_FIRST = textwrap.dedent(
    """
    import asyncio, os
    import zmq, zmq.asyncio
    from gateway.execution.transport.drops import DropWatch

    async def pair(ctx):
        server = ctx.socket(zmq.ROUTER)
        port = server.bind_to_random_port("tcp://127.0.0.1")
        client = ctx.socket(zmq.DEALER)
        client.connect(f"tcp://127.0.0.1:{port}")
        await client.send(b"hello")
        return server, client, await server.poll(3000)

    async def main():
        ctx = zmq.asyncio.Context()
        server, client, _ = await pair(ctx)
        watch = DropWatch([client])
        await asyncio.sleep(0.1)
        watch.close()
        await asyncio.sleep(0.1)  # its task has closed its end of the monitor by now
        server.close(linger=0)  # events for the client's monitor: dropped, retried
        await asyncio.sleep(0.3)
        *_, answered = await pair(ctx)  # anyone else on the context
        print("answered" if answered else "silent", flush=True)
        os._exit(0)  # a stuck I/O thread would hold the context's end for good

    asyncio.run(main())
    """
)


def test_a_closed_watch_never_blocks_zeromq_for_the_other_sockets():
    """libzmq sends a monitor's events blocking, from its one I/O thread.

    A monitor whose reading end was closed while its socket lived on stopped
    that thread at the socket's next event: from then on no kernel socket in
    the gateway connected (a resumed session's kernel "did not answer in 60 s").
    """
    proc = subprocess.run(
        [sys.executable, "-c", _WATCH_CLOSED_FIRST], capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.strip() == "answered", f"ZeroMQ's I/O thread is stuck: {proc.stderr[-2000:]}"
