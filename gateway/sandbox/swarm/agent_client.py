"""The gateway's side of the sandbox agent (``agent.py``): signed requests over CurveZMQ.

One DEALER socket per sandbox carries any number of requests at once, each
answered by id. The agent lives in the sandbox, so its answers are not
trusted: their size is capped by the socket, their errors are mapped only to
the gateway's own error classes, and a silent agent times out.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from typing import Any

import zmq
import zmq.asyncio

from ... import errors
from ...errors import GatewayError, SandboxUnavailable
from ..inside.agent import sign

# Far above one chunk (256 KiB) or a workspace listing; a flood past it drops the connection.
MAX_MESSAGE = 16 * 2**20


class AgentClient:
    """Requests to one sandbox's agent, signed with the session's HMAC key."""

    def __init__(self, context: zmq.asyncio.Context, url: str, connection: dict[str, Any]) -> None:
        self.url = url
        self._context = context
        self._key = connection["key"].encode()
        self._curve = (
            connection["curve_publickey"].encode(),
            connection["curve_secretkey"].encode(),
        )
        self._ids = (str(i) for i in itertools.count(1))
        self._pending: dict[str, asyncio.Future] = {}
        self._socket: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _connect(self) -> zmq.asyncio.Socket:
        if self._socket is None:
            self._loop = asyncio.get_running_loop()
            socket = self._context.socket(zmq.DEALER)
            public, secret = self._curve
            # The kernel's jupyter_client convention: the client holds the server's keypair.
            socket.curve_publickey, socket.curve_secretkey, socket.curve_serverkey = (
                public,
                secret,
                public,
            )
            socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(self.url)
            self._socket = socket
            self._reader = asyncio.create_task(self._read(socket), name=f"sbx-agent {self.url}")
        return self._socket

    async def _read(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            try:
                reply = json.loads(frames[0])
                future = self._pending.pop(str(reply.get("id")), None)
            except (ValueError, AttributeError, IndexError):
                continue
            if future is not None and not future.done():
                future.set_result((reply, frames[1] if len(frames) > 1 else b""))

    async def call(
        self, op: str, args: dict[str, Any] | None = None, data: bytes = b"", timeout: float = 30.0
    ) -> tuple[Any, bytes]:
        """Send one request; return its result and binary payload, or raise its error."""
        socket = self._connect()
        request_id = next(self._ids)
        message = [json.dumps({"id": request_id, "op": op, "args": args or {}}).encode(), data]
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await socket.send_multipart([sign(self._key, message), *message])
            async with asyncio.timeout(timeout):
                reply, payload = await future
        except TimeoutError:
            raise SandboxUnavailable(
                f"the session's sandbox did not answer {op!r} within {timeout:g} s; its node may "
                "be down or overloaded"
            ) from None
        finally:
            self._pending.pop(request_id, None)
        if "error" in reply:
            raise _error(reply["error"])
        return reply.get("result"), payload

    def call_sync(
        self, op: str, args: dict[str, Any] | None = None, data: bytes = b"", timeout: float = 30.0
    ) -> tuple[Any, bytes]:
        """``call`` from a worker thread (file handlers run there), on the agent's loop."""
        if self._loop is None:
            raise SandboxUnavailable("the session's sandbox is not connected yet; retry")
        if _running_loop() is self._loop:
            raise RuntimeError("call_sync on the event loop would deadlock it; use a thread")
        future = asyncio.run_coroutine_threadsafe(self.call(op, args, data, timeout), self._loop)
        return future.result(timeout + 5)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._socket is not None:
            self._socket.close(linger=0)
        for future in self._pending.values():
            if not future.done():
                future.cancel()
        self._socket = self._reader = None


_plain = GatewayError.__init__


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _error(error: Any) -> Exception:
    """The gateway's own error class an agent's answer names; never anything else."""
    with contextlib.suppress(AttributeError, TypeError):
        kind, message = str(error.get("type")), str(error.get("message"))[:2000]
        if kind == "OSError":
            return OSError(message)
        cls = getattr(errors, kind, None)
        if isinstance(cls, type) and issubclass(cls, GatewayError) and cls.__init__ is _plain:
            return cls(message)
        return GatewayError(f"the sandbox agent failed: {message}")
    return GatewayError("the sandbox agent sent a malformed answer")
