"""Requests for a session another gateway owns, passed on to that gateway.

Gateways sharing a store record where each answers (``Store.announce``); a
request for a session this gateway does not hold goes to the gateway whose
lease holds it, and the owner's answer comes back unchanged: status,
headers, body, or every WebSocket message both ways. The owner checks the
caller's token again (the gateways of a deployment share their tokens) and
audits the request. A passed-on request carries ``FORWARDED``, so it is
never passed on again: if the owner changed meanwhile, the client gets the
owner's 404 and asks again, and any gateway then finds the new owner.

Uploads stream their body and are not passed on: send them to the owner.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import tornado.httpclient
import tornado.web
import tornado.websocket

from ..errors import OwnerUnavailable

log = logging.getLogger(__name__)

FORWARDED = "X-Sbx-Forwarded"
# Seconds a connect to the owner may take. Gateways share a network: one that has
# not accepted by then is gone (a killed Swarm task's address answers nothing at
# all, so the default 20 s would hold every request until then).
CONNECT_TIMEOUT = 2.0
_BODIES = ("POST", "PUT", "PATCH")
# Headers of one hop only, and those Tornado sets itself.
_HOP = frozenset(
    ("connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host", "content-length",
     "date", "server", "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
     "sec-websocket-accept")
)  # fmt: skip


def passed_on(request: Any) -> bool:
    """Whether another gateway passed this request on (so it is answered here, or 404)."""
    return FORWARDED in request.headers


def _headers(request: Any) -> dict[str, str]:
    headers = {k: v for k, v in request.headers.get_all() if k.lower() not in _HOP}
    headers[FORWARDED] = "1"
    return headers


class Forwarder:
    """Passes HTTP requests on to their owners.

    Tornado's own client: a connection per request, but it costs the
    forwarding gateway less CPU than a pooled httpx client does (bench_gateways).
    """

    def __init__(self) -> None:
        self.client = tornado.httpclient.AsyncHTTPClient()

    async def forward(
        self, handler: tornado.web.RequestHandler, owner: str, timeout: float
    ) -> bool:
        """Answer with the reply of ``owner`` (a gateway's base URL); whether it had the session.

        A 404 from the owner (it lost the session meanwhile) is not answered:
        the caller asks where the session is again.
        """
        request = handler.request
        upstream = tornado.httpclient.HTTPRequest(
            owner + request.uri,
            method=request.method,
            headers=_headers(request),
            body=request.body if request.body or request.method in _BODIES else None,
            allow_nonstandard_methods=True,
            follow_redirects=False,
            decompress_response=False,
            connect_timeout=CONNECT_TIMEOUT,
            request_timeout=timeout,
        )
        try:
            reply = await self.client.fetch(upstream, raise_error=False)
        except OSError as e:
            raise _unreachable(owner, e) from e
        if reply.code == 599:  # no answer at all: refused, reset, or timed out
            raise _unreachable(owner, reply.error)
        if reply.code == 404 and b"session_not_found" in (reply.body or b""):
            return False
        handler.clear()
        handler.set_status(reply.code, reply.reason)
        for name, value in reply.headers.get_all():
            if name.lower() not in _HOP:
                handler.set_header(name, value)
        handler.finish(reply.body or None)
        return True

    def close(self) -> None:
        self.client.close()


def _unreachable(owner: str, error: Any) -> OwnerUnavailable:
    return OwnerUnavailable(
        f"the gateway that owns this session ({owner}) does not answer ({error}); "
        "if it is gone, another gateway takes the session over within seconds: try again"
    )


async def connect_upstream(
    handler: tornado.websocket.WebSocketHandler, owner: str
) -> tornado.websocket.WebSocketClientConnection | None:
    """Open the same WebSocket on the owner, before the client's upgrade is accepted.

    None if the owner refused it (the session moved or ended meanwhile): the
    request is then answered here.
    """
    url = "ws" + owner.removeprefix("http") + handler.request.uri
    request = tornado.httpclient.HTTPRequest(
        url, headers=_headers(handler.request), connect_timeout=CONNECT_TIMEOUT
    )
    try:
        return await tornado.websocket.websocket_connect(request)
    except tornado.httpclient.HTTPClientError as e:
        if e.code == 599:  # no answer at all: timed out
            raise _unreachable(owner, e) from e
        return None
    except OSError as e:
        raise _unreachable(owner, e) from e


def relay_socket(
    handler: tornado.websocket.WebSocketHandler,
    upstream: tornado.websocket.WebSocketClientConnection,
) -> None:
    """Make the handler a pipe to ``upstream``: its own open/message/close are bypassed."""

    async def pump() -> None:
        while (message := await upstream.read_message()) is not None:
            if handler.ws_connection is None or handler.ws_connection.is_closing():
                break
            handler.write_message(message, binary=isinstance(message, bytes))
        handler.close(upstream.close_code, upstream.close_reason)

    def open(*args: Any, **kwargs: Any) -> None:
        handler.set_nodelay(True)
        handler.pump = asyncio.get_running_loop().create_task(pump())  # type: ignore[attr-defined]

    def on_message(message: str | bytes) -> Any:
        return upstream.write_message(message, binary=isinstance(message, bytes))

    def on_close() -> None:
        upstream.close(handler.close_code, handler.close_reason)

    # Instance attributes shadow the handler's methods: Tornado calls these instead.
    handler.open = open  # type: ignore[method-assign]
    handler.on_message = on_message  # type: ignore[method-assign]
    handler.on_close = on_close  # type: ignore[method-assign]
