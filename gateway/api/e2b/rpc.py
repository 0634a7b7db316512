"""envd's Connect RPC endpoints (``POST /<package.Service>/<Method>``): one handler, the services.

Each call is served by the generated ASGI app of its service (the ``e2b``
package's own), run inside Tornado by ``connect.serve_asgi``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import tornado.web
from e2b.envd.filesystem import filesystem_connect as fs_rpc
from e2b.envd.process import process_connect as proc_rpc

from ...errors import GatewayError, NotFound, UnsupportedMediaType
from .base import SandboxHandler
from .connect import CODECS, serve_asgi
from .filesystem import FilesystemService
from .process import ProcessService

MAX_MESSAGE = 1 * 2**20  # an RPC request is a path, a command line or a piece of stdin
STREAM_QUEUE = 8  # body chunks of a client stream waiting for its service
CONTENT_TYPES = ("application/proto", "application/json", "application/connect+")


def _filesystem(handler: RPCHandler) -> Any:
    service = FilesystemService(handler.workspaces, handler.sandbox_id, handler.principal)
    return fs_rpc.FilesystemASGIApplication(service, codecs=CODECS, read_max_bytes=MAX_MESSAGE)


def _process(handler: RPCHandler) -> Any:
    service = ProcessService(
        handler.executions, handler.sandbox_id, handler.principal, handler.credentials.mcp_tokens
    )
    return proc_rpc.ProcessASGIApplication(service, codecs=CODECS, read_max_bytes=MAX_MESSAGE)


# Each service: its generated protocol (for its method names) and its app for one call.
SERVICES: dict[str, tuple[type, Callable[[RPCHandler], Any]]] = {
    "filesystem.Filesystem": (fs_rpc.Filesystem, _filesystem),
    "process.Process": (proc_rpc.Process, _process),
}


class RPCHandler(SandboxHandler):
    """One Connect RPC call, answered by the service's app."""

    actions = {"POST": "sandbox.rpc"}
    closed: asyncio.Event

    def body_limit(self) -> int:
        return MAX_MESSAGE

    def app_for(self, service: str, method: str) -> Any:
        """The service's app for this call (checked: content type, service, method)."""
        kind = self.request.headers.get("Content-Type", "")
        if not kind.startswith(CONTENT_TYPES):
            raise UnsupportedMediaType(
                f"Connect RPC bodies are application/proto or application/json, not {kind!r}"
            )
        protocol, make = SERVICES.get(service, (None, None))
        if protocol is None or make is None:
            raise NotFound(f"no such service: {service}; envd offers {', '.join(SERVICES)}")
        if method not in {m.name for m in protocol.desc().methods}:
            raise NotFound(f"{service} has no method {method}")
        self.audit_detail["rpc"] = f"{service}/{method}"
        return make(self)

    async def post(self, service: str, method: str) -> None:
        app = self.app_for(service, method)
        self.closed = asyncio.Event()
        await serve_asgi(self, app)

    def on_connection_close(self) -> None:
        if hasattr(self, "closed"):
            self.closed.set()


@tornado.web.stream_request_body
class StreamedRPCHandler(RPCHandler):
    """A client-streaming call (``process.Process/StreamInput``): messages served as they come.

    The body goes to the service a chunk at a time through a queue of
    ``STREAM_QUEUE`` chunks, so a command slow to read its stdin holds the
    client back, not the gateway's memory; the stream may run as long as the
    client keeps it open. The answer waits for the body's end (Tornado cannot
    answer earlier); a call that ends early drops the rest of the body.
    """

    forwards = False  # the body streams in after prepare
    call: asyncio.Future | None = None
    refusal: GatewayError | None = None
    chunks: asyncio.Queue[bytes | None]
    ended: asyncio.Event
    draining = False

    async def prepare(self) -> None:
        self.chunks = asyncio.Queue(STREAM_QUEUE)
        self.ended = asyncio.Event()
        self.closed = asyncio.Event()
        try:
            super().prepare()  # the body is not in yet
            service, method = self.path_kwargs["service"], self.path_kwargs["method"]
            app = self.app_for(service, method)
        except GatewayError as e:
            self.refusal = e
            return
        self.request.connection.set_max_body_size(sys.maxsize)
        self.call = asyncio.ensure_future(serve_asgi(self, app, self.chunks.get, self._answer))

    def _drain(self) -> None:
        """The call reads no more: drop what waits (freeing a chunk blocked on a full queue)."""
        self.draining = True
        while not self.chunks.empty():
            self.chunks.get_nowait()

    async def _answer(self) -> None:
        self._drain()
        await self.ended.wait()

    def on_connection_close(self) -> None:
        super().on_connection_close()
        if hasattr(self, "chunks"):
            self._drain()

    async def data_received(self, chunk: bytes) -> None:
        if self.call is not None and not self.draining:
            await self.chunks.put(chunk)

    async def post(self, service: str, method: str) -> None:
        self.ended.set()
        if self.refusal is not None:
            raise self.refusal
        assert self.call is not None
        if not self.draining:
            await self.chunks.put(None)
        await self.call


routes = [
    (r"/(?P<service>process\.Process)/(?P<method>StreamInput)", StreamedRPCHandler),
    (r"/(?P<service>[a-z]+\.[A-Za-z]+)/(?P<method>[A-Za-z]+)", RPCHandler),
]
