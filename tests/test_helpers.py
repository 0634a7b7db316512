"""The test helpers themselves: one that stalls turns every test using it into a timing flake."""

from __future__ import annotations

import asyncio
import os
import time

import tornado.web
import tornado.websocket
from helpers import closed, remove_leftovers
from tornado.websocket import websocket_connect

from gateway.sandbox import volume


class _ClosesAtOnce(tornado.websocket.WebSocketHandler):
    def open(self) -> None:
        self.close(1000, "bye")


def test_closing_a_websocket_the_server_already_closed_returns_at_once():
    """Ten seconds lost here took test_jupyter_lifetime past its margin in CI."""

    async def scenario() -> tuple[float, str | None]:
        server = tornado.web.Application([("/", _ClosesAtOnce)]).listen(0, "127.0.0.1")
        port = next(iter(server._sockets.values())).getsockname()[1]
        try:
            ws = await websocket_connect(f"ws://127.0.0.1:{port}/")
            while await ws.read_message() is not None:
                pass
            started = time.monotonic()
            await closed(ws)
            return time.monotonic() - started, ws.close_reason
        finally:
            server.stop()

    took, reason = asyncio.run(scenario())
    assert reason == "bye"
    assert took < 2, f"closed() waited {took:.1f} s for a connection that was already gone"


def test_leftovers_of_a_gateway_include_its_named_volumes_mounted(tmp_path):
    """A gateway under test leaves its volumes mounted (they outlive it by design): removing
    its data dir must unmount them, or each run leaks loop devices."""
    if not volume.loop_mounts_available():
        return
    where = tmp_path / "data" / "volumes" / "v1"
    volume.create(where, 16 * 2**20, 1000, 1000)
    volume.read_only_view(where)
    remove_leftovers(None, tmp_path / "data")
    assert not os.path.ismount(where / "workspace") and not os.path.ismount(where / "read-only")
    assert not (tmp_path / "data").exists()
