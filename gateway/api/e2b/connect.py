"""Connect RPC in Tornado: the ASGI bridge, the codecs, and the gateway's errors as Connect's.

The SDK's own ``filesystem_connect`` / ``process_connect`` modules hold both
the clients it uses and the server applications; the ``connectrpc`` library
behind them reads envelopes, negotiates codecs and compression, and writes
errors. This module runs one such app per request inside Tornado (a small
ASGI bridge), so no envelope or protobuf is parsed by hand here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError

from ...errors import (
    BadRequest,
    Conflict,
    FileNotFound,
    GatewayError,
    NotFound,
    NotSupported,
    PathForbidden,
    PayloadTooLarge,
    SessionNotFound,
    TooManyWatchers,
    Unauthorized,
)
from ...tasks import end_task

log = logging.getLogger(__name__)

# How the gateway's errors read as Connect codes (the SDK maps these to its exceptions).
CODES: list[tuple[type[GatewayError], Code]] = [
    (SessionNotFound, Code.UNAVAILABLE),
    (FileNotFound, Code.NOT_FOUND),
    (NotFound, Code.NOT_FOUND),
    (PathForbidden, Code.PERMISSION_DENIED),
    (Unauthorized, Code.UNAUTHENTICATED),
    (PayloadTooLarge, Code.RESOURCE_EXHAUSTED),
    (TooManyWatchers, Code.RESOURCE_EXHAUSTED),  # the SDK's RateLimitException
    (NotSupported, Code.UNIMPLEMENTED),
    (Conflict, Code.FAILED_PRECONDITION),
    (BadRequest, Code.INVALID_ARGUMENT),
]


def connect_error(error: GatewayError) -> ConnectError:
    code = next((c for kind, c in CODES if isinstance(error, kind)), Code.INTERNAL)
    message = error.message
    if isinstance(error, SessionNotFound):
        message = "The sandbox was not found"  # the SDK's words for a sandbox gone
    return ConnectError(code, message)


@contextlib.contextmanager
def as_connect_errors() -> Iterator[None]:
    """Raise the gateway's errors as Connect errors, which the library answers with."""
    try:
        yield
    except GatewayError as e:
        raise connect_error(e) from e


class StrictCodec:
    """A library codec whose undecodable message is the caller's error (INVALID_ARGUMENT).

    The library leaves a decoder's own exception to surface as an internal error.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec

    def name(self) -> str:
        return self.codec.name()

    def encode(self, message: Any) -> bytes:
        return self.codec.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type) -> Any:
        try:
            return self.codec.decode(data, message_class)
        except ConnectError:
            raise
        except Exception as e:
            raise ConnectError(
                Code.INVALID_ARGUMENT, f"the request is not a valid {self.name()} message: {e}"
            ) from None


CODECS = [StrictCodec(proto_binary_codec()), StrictCodec(proto_json_codec())]


async def serve_asgi(
    handler: Any,
    app: Any,
    body: Callable[[], Awaitable[bytes | None]] | None = None,
    answer: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run an ASGI app for the handler's request: its body in, its answer streamed out.

    ``body`` hands a streamed request's body on a piece at a time (``None``
    once it is all in); without it, the body is the request's, read already.
    ``answer`` is awaited before the answer begins (a streamed body must be in
    first: Tornado cannot answer a request it is still reading).
    """
    request = handler.request
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.protocol,
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.query.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in request.headers.get_all()],
        "client": (request.remote_ip, 0),
        "extensions": {},
    }
    body_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent and body is not None:
            piece = await body()
            body_sent = piece is None
            return {"type": "http.request", "body": piece or b"", "more_body": not body_sent}
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await handler.closed.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            if answer is not None:
                await answer()
            handler.set_status(message["status"])
            handler.clear_header("Content-Type")
            for name, value in message.get("headers", ()):
                handler.add_header(name.decode("latin-1"), value.decode("latin-1"))
        elif message["type"] == "http.response.body":
            if message.get("body"):
                handler.write(message["body"])
            if message.get("more_body"):
                await handler.flush()

    call = asyncio.ensure_future(app(scope, receive, send))
    gone = asyncio.ensure_future(handler.closed.wait())
    try:
        # A client gone mid-stream ends the call: a streaming method waiting for
        # something to send (a watch, a quiet command) would not notice otherwise.
        await asyncio.wait([call, gone], return_when=asyncio.FIRST_COMPLETED)
        if not call.done():
            await end_task(call)
            return
        call.result()
    except Exception:
        if not handler._headers_written:
            raise
        log.exception("a Connect call failed after its answer began")
    finally:
        gone.cancel()
    if not handler._finished:
        handler.finish()
