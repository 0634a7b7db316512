"""The test helpers themselves: one that stalls turns every test using it into a timing flake."""

from __future__ import annotations

import asyncio
import time

import tornado.web
import tornado.websocket
from helpers import closed
from tornado.websocket import websocket_connect


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
