"""The SDK's volume calls, both halves, on a stand-in gateway: the requests they send."""

from __future__ import annotations

import asyncio
import inspect
import json

import httpx
import pytest
from fake_gateway import on_async, on_sync

HALVES = pytest.mark.parametrize("on", [on_sync, on_async], ids=["sync", "async"])
VOLUME = {"id": "v1", "name": "data sets", "size_bytes": 2**30, "created_at": "t"}


def handle(seen: list[httpx.Request]):
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path
        if request.method == "DELETE":
            return httpx.Response(204)
        if path == "/v1/volumes":
            body = VOLUME if request.method == "POST" else {"volumes": [VOLUME]}
            return httpx.Response(201 if request.method == "POST" else 200, json=body)
        if path.endswith("/files"):
            entry = {"name": "a.csv", "path": "in/a.csv", "type": "file", "size": 3}
            return httpx.Response(200, json={"path": "in", "entries": [entry]})
        if request.method == "PUT":
            return httpx.Response(201, json={"volume": "data sets", "path": "in/a.csv", "size": 3})
        if "/files/" in path:
            return httpx.Response(200, content=b"a,b", headers={"Content-Length": "3"})
        return httpx.Response(200, json={**VOLUME, "used_bytes": 3, "mounted_by": []})

    return answer


async def _all(client) -> list:
    results = []
    for call in (
        lambda: client.create_volume("data sets", "2g"),
        client.volumes,
        lambda: client.volume("data sets"),
        lambda: client.volume_files("data sets").write("in/a.csv", b"a,b"),
        lambda: client.volume_files("data sets").read("in/a.csv"),
        lambda: client.volume_files("data sets").list("in"),
        lambda: client.delete_volume("data sets"),
    ):
        result = call()
        results.append(await result if inspect.isawaitable(result) else result)
    return results


@HALVES
def test_volumes_are_made_listed_read_written_and_deleted_by_name(on):
    seen: list[httpx.Request] = []

    def act(client):  # the sync half's calls return at once: _all awaits nothing of theirs
        return asyncio.run(_all(client)) if on is on_sync else _all(client)

    made, listed, view, saved, content, entries, gone = on(handle(seen), act)
    assert [(r.method, r.url.raw_path.decode()) for r in seen] == [
        ("POST", "/v1/volumes"),
        ("GET", "/v1/volumes"),
        ("GET", "/v1/volumes/data%20sets"),
        ("PUT", "/v1/volumes/data%20sets/files/in/a.csv"),
        ("GET", "/v1/volumes/data%20sets/files/in/a.csv"),
        ("GET", "/v1/volumes/data%20sets/files?path=in"),
        ("DELETE", "/v1/volumes/data%20sets"),
    ]
    assert json.loads(seen[0].content) == {"name": "data sets", "size": "2g"}
    assert seen[3].content == b"a,b"
    assert made["id"] == "v1" and listed == [VOLUME] and view["used_bytes"] == 3
    assert (saved.path, saved.size, content) == ("in/a.csv", 3, b"a,b")
    assert [(e.path, e.type) for e in entries] == [("in/a.csv", "file")]
    assert gone is None


def test_a_session_asks_for_its_volumes_as_given():
    from gateway.client.base import session_request

    mounts = [{"name": "ds", "path": "data", "read_only": True}]
    assert session_request({"volumes": mounts}) == {"volumes": mounts}
