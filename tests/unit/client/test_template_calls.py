"""The SDK's template calls, both halves, on a stand-in gateway: the requests they send."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json

import httpx
import pytest
from fake_gateway import on_async, on_sync

HALVES = pytest.mark.parametrize("on", [on_sync, on_async], ids=["sync", "async"])
BUILD = {"id": "b1", "name": "geo", "version": 1, "status": "building", "kernel": "python3"}


def handle(seen: list[httpx.Request]):
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "DELETE":
            return httpx.Response(204)
        if request.method == "POST":
            return httpx.Response(202, json=BUILD)
        if request.url.path == "/v1/templates":
            return httpx.Response(200, json={"templates": [BUILD]})
        return httpx.Response(200, json={"name": "geo", "versions": [BUILD]})

    return answer


async def _all(client) -> list:
    results = []
    for call in (
        lambda: client.build_template("geo", "FROM sbx/python\n", b"tar", kernel="python3"),
        client.templates,
        lambda: client.template("geo"),
        lambda: client.delete_template("geo"),
    ):
        result = call()
        results.append(await result if inspect.isawaitable(result) else result)
    return results


@HALVES
def test_templates_are_built_listed_inspected_and_deleted_by_name(on):
    seen: list[httpx.Request] = []

    def act(client):
        return asyncio.run(_all(client)) if on is on_sync else _all(client)

    built, listed, versions, gone = on(handle(seen), act)
    assert [(r.method, r.url.raw_path.decode()) for r in seen] == [
        ("POST", "/v1/templates"),
        ("GET", "/v1/templates"),
        ("GET", "/v1/templates/geo"),
        ("DELETE", "/v1/templates/geo"),
    ]
    assert json.loads(seen[0].content) == {
        "name": "geo",
        "dockerfile": "FROM sbx/python\n",
        "context": base64.b64encode(b"tar").decode(),
        "kernel": "python3",
    }
    assert built == BUILD and listed == [BUILD] and versions == [BUILD] and gone is None


def test_a_session_asks_for_its_template_as_given():
    from gateway.client.base import session_request

    assert session_request({"template": "geo:2"}) == {"template": "geo:2"}
