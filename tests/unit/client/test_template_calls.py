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


def tag_answers(seen: list[httpx.Request]):
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "DELETE":
            return httpx.Response(204)
        if request.method == "POST":
            return httpx.Response(200, json={"name": "geo", "version": 2, "tags": ["prod"]})
        row = {"tag": "prod", "version": 2, "build_id": "b2", "created_at": 1.0}
        return httpx.Response(200, json={"name": "geo", "tags": [row]})

    return answer


async def _tag_calls(client) -> list:
    results = []
    for call in (
        lambda: client.tag_template("geo", 2, ["prod"]),
        lambda: client.template_tags("geo"),
        lambda: client.untag_template("geo", ["prod"]),
    ):
        result = call()
        results.append(await result if inspect.isawaitable(result) else result)
    return results


@HALVES
def test_tags_are_moved_listed_and_removed(on):
    seen: list[httpx.Request] = []

    def act(client):
        return asyncio.run(_tag_calls(client)) if on is on_sync else _tag_calls(client)

    moved, listed, gone = on(tag_answers(seen), act)
    assert [(r.method, r.url.raw_path.decode(), json.loads(r.content or "null")) for r in seen] == [
        ("POST", "/v1/templates/geo/tags", {"version": 2, "tags": ["prod"]}),
        ("GET", "/v1/templates/geo/tags", None),
        ("DELETE", "/v1/templates/geo/tags", {"tags": ["prod"]}),
    ]
    assert moved == {"name": "geo", "version": 2, "tags": ["prod"]} and gone is None
    assert listed == [{"tag": "prod", "version": 2, "build_id": "b2", "created_at": 1.0}]


@HALVES
def test_a_build_asks_for_its_tags(on):
    seen: list[httpx.Request] = []

    on(handle(seen), lambda client: client.build_template("geo", "FROM sbx/python\n", tags=["v1"]))
    assert json.loads(seen[0].content)["tags"] == ["v1"]
