"""The SDK's two halves on a stand-in transport (httpx.MockTransport): a gateway that is a
function from request to response, for the client's unit tests."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import httpx

from gateway.client import AsyncClient, Client, Retry

Handler = Callable[[httpx.Request], httpx.Response]
URL = "http://gateway.test"


def answering(status: int, body: dict | str, seen: list[httpx.Request]) -> Handler:
    """Answer every request with ``body`` (JSON), keeping each request in ``seen``."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if isinstance(body, str):
            return httpx.Response(status, text=body, headers={"Content-Type": "application/json"})
        return httpx.Response(status, json=body)

    return handle


def sync_client(handler: Handler) -> Client:
    client = Client(URL, "token", retry=Retry(retries=2, backoff=0))
    client._http = httpx.Client(
        base_url=URL, headers=client.headers, transport=httpx.MockTransport(handler)
    )
    return client


def async_client(handler: Handler) -> AsyncClient:
    client = AsyncClient(URL, "token", retry=Retry(retries=2, backoff=0))
    client._http = httpx.AsyncClient(
        base_url=URL, headers=client.headers, transport=httpx.MockTransport(handler)
    )
    return client


def on_sync(handler: Handler, act: Callable[[Any], Any]) -> Any:
    """What ``act(client)`` returns on the sync half."""
    with sync_client(handler) as client:
        return act(client)


def on_async(handler: Handler, act: Callable[[Any], Any]) -> Any:
    """What ``act(client)`` returns (awaited) on the async half."""

    async def main() -> Any:
        client = async_client(handler)
        try:
            done = act(client)
            return await done if inspect.isawaitable(done) else done
        finally:
            await client.aclose()

    return asyncio.run(main())
