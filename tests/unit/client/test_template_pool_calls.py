"""The SDK's template pool calls, both halves, and ``sbx templates pool`` parsed."""

from __future__ import annotations

import asyncio
import inspect
import json

import httpx
import pytest
from fake_gateway import on_async, on_sync

from gateway.cli.main import build_parser

HALVES = pytest.mark.parametrize("on", [on_sync, on_async], ids=["sync", "async"])
POOL = {"size": 2, "version": 3, "ready": 1, "starting": 1, "served": 0, "waiting": None}


def answer(seen: list[httpx.Request]):
    def reply(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "PUT":
            return httpx.Response(200, json=POOL)
        return httpx.Response(200, json={"name": "geo", "versions": [], "pool": POOL})

    return reply


async def _both(client) -> list:
    results = []
    for call in (lambda: client.set_template_pool("geo", 2), lambda: client.template_pool("geo")):
        result = call()
        results.append(await result if inspect.isawaitable(result) else result)
    return results


@HALVES
def test_a_templates_pool_is_sized_and_read(on):
    seen: list[httpx.Request] = []

    def act(client):
        return asyncio.run(_both(client)) if on is on_sync else _both(client)

    sized, read = on(answer(seen), act)
    assert [(r.method, r.url.raw_path.decode(), json.loads(r.content or "null")) for r in seen] == [
        ("PUT", "/v1/templates/geo/pool", {"size": 2}),
        ("GET", "/v1/templates/geo", None),
    ]
    assert sized == read == POOL


def test_sbx_templates_pool_takes_a_name_and_an_optional_size():
    parser = build_parser()
    sized = parser.parse_args(["templates", "pool", "geo", "2"])
    shown = parser.parse_args(["templates", "pool", "geo"])
    assert (sized.name, sized.size, shown.size) == ("geo", 2, None)
