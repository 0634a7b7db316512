"""The gateway's side of the preview relay, against a forwarder played in-process.

The socket is bound in a temporary run directory; the "forwarder" is this
test speaking the protocol, the "sandbox server" a loopback echo server.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import tornado.iostream

from gateway.errors import PortNotListening, PreviewLimit, SandboxUnavailable
from gateway.sandbox.preview import (
    SOCKET_NAME,
    Budget,
    PreviewCaps,
    PreviewRelay,
    parse_announce,
    parse_reply,
)

ID = "0123456789abcdef0123456789abcdef"


def test_lines_from_the_sandbox_are_parsed_strictly():
    assert parse_announce(b"control\n") == "control"
    assert parse_announce(f"data {ID}\n".encode()) == ID
    for bad in (b"data 123\n", b"data " + ID.upper().encode(), b"control x\n", b"", b"\xff\n",
                f"data {ID} \n".encode(), f"data  {ID}\n".encode()):  # fmt: skip
        assert parse_announce(bad) is None, bad
    assert parse_reply(f"refused {ID}\n".encode()) == ("refused", ID)
    assert parse_reply(b"ports 80,8000\n") == ("ports", [80, 8000])
    assert parse_reply(b"ports \n") == ("ports", [])
    for bad in (b"ports 0\n", b"ports 70000\n", b"ports 1,,2\n", b"ports -1\n", b"refused x\n",
                b"open 1 2\n", b"ports " + b",".join([b"1"] * 513) + b"\n"):  # fmt: skip
        assert parse_reply(bad) is None, bad


def test_the_budget_refuses_past_a_minutes_bytes_then_refills():
    now = [0.0]
    budget = Budget(100, clock=lambda: now[0])
    asyncio.run(budget.take(100))
    assert budget.spent() == 61
    now[0] = 60.0
    assert budget.spent() is None


class Forwarder:
    """What ``inside/preview.py`` does, run here; ``refuse`` ports answer ``refused``."""

    def __init__(self, path: Path, port: int) -> None:
        self.path, self.port = path, port
        self.started = 0
        self.tasks: list[asyncio.Future] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.started += 1
        self.tasks.append(asyncio.ensure_future(self.run()))

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def run(self) -> None:
        reader, writer = await asyncio.open_unix_connection(str(self.path))
        self.writers.append(writer)
        writer.write(b"control\n")
        while line := await reader.readline():
            words = line.decode().split()
            if words[0] == "ports":
                writer.write(f"ports {self.port}\n".encode())
            elif int(words[2]) != self.port:
                writer.write(f"refused {words[1]}\n".encode())
            else:
                self.tasks.append(asyncio.ensure_future(self.open(words[1])))

    async def open(self, ident: str) -> None:
        local_r, local_w = await asyncio.open_connection("127.0.0.1", self.port)
        up_r, up_w = await asyncio.open_unix_connection(str(self.path))
        self.writers += [local_w, up_w]
        up_w.write(f"data {ident}\n".encode())

        async def copy(r, w):
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.close()

        await asyncio.gather(copy(local_r, up_w), copy(up_r, local_w))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    return run


class Echo:
    """The sandbox's server: a loopback echo."""

    async def __aenter__(self) -> int:
        self.writers: list[asyncio.StreamWriter] = []

        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.writers.append(w)
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.close()

        self.server = await asyncio.start_server(echo, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc: object) -> None:
        for w in self.writers:
            w.close()
        self.server.close()
        await self.server.wait_closed()


def test_a_connection_reaches_the_port_and_the_caps_hold(run_dir: Path):
    async def main() -> None:
        async with Echo() as port:
            forwarder = Forwarder(run_dir / SOCKET_NAME, port)
            relay = PreviewRelay(
                "s", PreviewCaps(max_connections=2, connect_timeout=2), forwarder.start
            )
            await relay.serve(run_dir)
            async with relay.connection(port) as stream, relay.connection(port) as second:
                await stream.write(b"hello")
                assert await stream.read_bytes(5) == b"hello"
                await second.write(b"again")
                assert await second.read_bytes(5) == b"again"
                with pytest.raises(PreviewLimit, match="2 connections"):
                    async with relay.connection(port):
                        pass
            assert relay.open_count == 0
            assert await relay.ports() == [port]
            with pytest.raises(PortNotListening):
                async with relay.connection(port + 1):
                    pass
            assert forwarder.started == 1  # one forwarder served it all
            relay.budget.used = relay.budget.per_minute
            with pytest.raises(PreviewLimit, match="this minute") as refused:
                async with relay.connection(port):
                    pass
            assert refused.value.retry_after and refused.value.retry_after > 1
            relay.close()
            await forwarder.close()

    asyncio.run(main())


def test_a_hostile_sandbox_cannot_answer_for_ids_it_was_not_given(run_dir: Path):
    """Junk, unknown ids and unsolicited replies are dropped; the real forwarder still works."""

    async def main() -> None:
        async with Echo() as port:
            path = run_dir / SOCKET_NAME
            forwarder = Forwarder(path, port)
            relay = PreviewRelay(
                "s", PreviewCaps(max_connections=4, connect_timeout=2), forwarder.start
            )
            await relay.serve(run_dir)
            async with relay.connection(port):
                pass
            junk = []
            for line in (b"x" * 5000, f"data {ID}\n".encode(), b"data zz\n", b"\n"):
                r, w = await asyncio.open_unix_connection(str(path))
                w.write(line)
                junk.append((r, w))
            # A second "forwarder" that sends a reply nobody asked for loses its control connection.
            r, w = await asyncio.open_unix_connection(str(path))
            w.write(b"control\n" + f"refused {ID}\n".encode())
            junk.append((r, w))
            for r, w in junk:  # each is closed by the gateway
                assert await asyncio.wait_for(r.read(), 6) == b""
                w.close()
            # The next preview starts a forwarder again and works.
            async with relay.connection(port) as stream:
                await stream.write(b"ok")
                assert await stream.read_bytes(2) == b"ok"
            assert forwarder.started == 2
            relay.close()
            await forwarder.close()

    asyncio.run(main())


def test_a_forwarder_that_never_comes_is_a_503_in_time(run_dir: Path):
    async def main() -> None:
        async def nothing() -> None:
            pass

        relay = PreviewRelay("s", PreviewCaps(connect_timeout=0.3), nothing)
        await relay.serve(run_dir)
        with pytest.raises(SandboxUnavailable, match="did not start"):
            async with relay.connection(80):
                pass
        assert relay.open_count == 0
        relay.close()

    asyncio.run(main())


def test_the_socket_replaces_a_link_the_sandbox_left_in_its_place(run_dir: Path, tmp_path: Path):
    target = tmp_path / "victim"
    target.write_text("x")
    (run_dir / SOCKET_NAME).symlink_to(target)

    async def main() -> None:
        async def nothing() -> None:
            pass

        relay = PreviewRelay("s", PreviewCaps(), nothing)
        await relay.serve(run_dir)
        relay.close()

    asyncio.run(main())
    assert target.read_text() == "x"
    assert not (run_dir / SOCKET_NAME).is_symlink()
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(1)
        with pytest.raises(OSError):  # closed: nobody listens any more
            s.connect(str(run_dir / SOCKET_NAME))
    assert tornado.iostream  # imported for the relay's streams


def test_serving_again_listens_in_the_new_run_directory_only(tmp_path: Path):
    """A resumed sandbox may have a new run directory: the socket follows it."""
    old, new = tmp_path / "a" / "run", tmp_path / "b" / "run"
    old.mkdir(parents=True)
    new.mkdir(parents=True)

    async def main() -> None:
        async def nothing() -> None:
            pass

        relay = PreviewRelay("s", PreviewCaps(), nothing)
        await relay.serve(old)
        await relay.serve(new)
        _, writer = await asyncio.open_unix_connection(str(new / SOCKET_NAME))
        writer.close()
        with pytest.raises(OSError):
            await asyncio.open_unix_connection(str(old / SOCKET_NAME))
        relay.close()

    asyncio.run(main())


def test_a_forwarder_that_exits_is_a_503_at_once_saying_why(run_dir: Path):
    async def main() -> None:
        async def cannot() -> None:
            relay.forwarder_ended("exited (code 127): previews need python3 or node")

        relay = PreviewRelay("s", PreviewCaps(connect_timeout=30), cannot)
        await relay.serve(run_dir)
        with pytest.raises(SandboxUnavailable, match="python3 or node"):
            async with asyncio.timeout(2), relay.connection(80):
                pass
        relay.close()

    asyncio.run(main())


def test_a_sandbox_connecting_in_a_loop_is_not_accepted_past_the_rate(run_dir: Path):
    """An attacker's review: 21,000 connects a second, each accepted and closed on the
    gateway's loop, slowed another tenant's calls tenfold. Past the rate the socket is not
    listened on for the rest of the second: the connects wait in the kernel's backlog."""

    async def main() -> None:
        async def nothing() -> None:
            pass

        relay = PreviewRelay("s", PreviewCaps(), nothing)
        await relay.serve(run_dir)
        accepted = 0
        original = relay.handle_stream

        async def counting(stream, address):
            nonlocal accepted
            accepted += 1
            await original(stream, address)

        relay.handle_stream = counting  # type: ignore[method-assign]
        started = asyncio.get_running_loop().time()
        while asyncio.get_running_loop().time() - started < 0.5:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(str(run_dir / SOCKET_NAME)), 0.05
                )
            except (TimeoutError, OSError):
                continue
            writer.close()
        assert accepted <= 200 + 16, accepted
        relay.close()

    asyncio.run(main())
