"""envd's Connect RPC endpoints (``POST /<package.Service>/<Method>``): one handler, the services.

Each call is served by the generated ASGI app of its service (the ``e2b``
package's own), run inside Tornado by ``connect.serve_asgi``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from e2b.envd.filesystem import filesystem_connect as fs_rpc
from e2b.envd.process import process_connect as proc_rpc

from ...errors import NotFound, UnsupportedMediaType
from .base import SandboxHandler
from .connect import CODECS, serve_asgi
from .filesystem import FilesystemService
from .process import ProcessService

MAX_MESSAGE = 1 * 2**20  # an RPC request is a path, a command line or a piece of stdin
CONTENT_TYPES = ("application/proto", "application/json", "application/connect+")


def _filesystem(handler: RPCHandler) -> Any:
    service = FilesystemService(handler.manager, handler.sandbox_id, handler.principal)
    return fs_rpc.FilesystemASGIApplication(service, codecs=CODECS, read_max_bytes=MAX_MESSAGE)


def _process(handler: RPCHandler) -> Any:
    service = ProcessService(handler.manager, handler.sandbox_id, handler.principal)
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

    async def post(self, service: str, method: str) -> None:
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
        self.closed = asyncio.Event()
        await serve_asgi(self, make(self))

    def on_connection_close(self) -> None:
        if hasattr(self, "closed"):
            self.closed.set()


routes = [(r"/(?P<service>[a-z]+\.[A-Za-z]+)/(?P<method>[A-Za-z]+)", RPCHandler)]
