"""The SDK's HTTP calls, both halves, on a stand-in gateway: the request each method sends,
what it makes of the answer, which calls are retried, and the errors it raises."""

from __future__ import annotations

import json

import httpx
import pytest
from fake_gateway import answering, on_async, on_sync

from gateway.client import GatewayUnreachable, SessionNotFound

HALVES = pytest.mark.parametrize("on", [on_sync, on_async], ids=["sync", "async"])
DOC = {"id": "s1", "state": "idle", "kernel": "python3", "ttl": 60.0, "metadata": {"team": "a"}}


@HALVES
def test_create_sends_only_the_options_given_with_the_limits_gathered(on):
    seen: list[httpx.Request] = []
    session = on(
        answering(201, DOC, seen),
        lambda c: c.create_session(
            kernel="python3", memory="512m", execution_timeout=30, ttl=60, metadata={"team": "a"}
        ),
    )
    (request,) = seen
    assert (request.method, request.url.path) == ("POST", "/v1/sessions")
    assert request.headers["Authorization"] == "Bearer token"
    assert json.loads(request.content) == {
        "kernel": "python3", "ttl": 60, "metadata": {"team": "a"},
        "limits": {"memory": "512m", "timeout": 30},
    }  # fmt: skip
    assert (session.id, session.info.state, session.info.metadata) == ("s1", "idle", {"team": "a"})


@HALVES
def test_credentials_are_sent_as_given(on):
    seen: list[httpx.Request] = []
    bound = [{"secret": "GH_TOKEN", "hosts": ["api.github.com"], "format": "Bearer {value}"}]
    on(
        answering(201, DOC, seen),
        lambda c: c.create_session(network={"allow": ["api.github.com"]}, credentials=bound),
    )
    assert json.loads(seen[0].content)["credentials"] == bound


@HALVES
def test_an_option_the_gateway_does_not_have_is_refused_before_sending(on):
    seen: list[httpx.Request] = []
    with pytest.raises(TypeError, match=r"unknown session option\(s\) \['colour'\]"):
        on(answering(201, DOC, seen), lambda c: c.create_session(colour="blue"))
    with pytest.raises(TypeError, match="ttl= for the session's lifetime"):
        on(answering(201, DOC, seen), lambda c: c.create_session(timeout=60))
    assert seen == []


@HALVES
def test_listing_filters_by_state_and_metadata_in_the_query(on):
    seen: list[httpx.Request] = []
    found = on(
        answering(200, {"sessions": [DOC, {**DOC, "id": "s2"}]}, seen),
        lambda c: c.list_sessions(state="idle", metadata={"team": "a", "n": 1}),
    )
    assert dict(seen[0].url.params) == {"state": "idle", "metadata.team": "a", "metadata.n": "1"}
    assert [s.id for s in found] == ["s1", "s2"]


@HALVES
def test_history_follows_the_cursor_to_the_last_page(on):
    seen: list[httpx.Request] = []
    pages = {
        None: {"executions": [{"id": 1, "code": "a = 1"}, {"id": 2, "code": "b"}], "next": 2},
        "2": {"executions": [{"id": 3, "code": "c", "status": "error"}]},
    }

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=pages[request.url.params.get("after")])

    history = on(handle, lambda c: c.session("s1").history())
    assert [r.url.path for r in seen] == ["/v1/sessions/s1/history"] * 2
    assert [(e.id, e.code) for e in history] == [(1, "a = 1"), (2, "b"), (3, "c")]


@HALVES
def test_set_timeout_counts_from_now_and_an_empty_change_is_refused_before_sending(on):
    seen: list[httpx.Request] = []
    info = on(answering(200, DOC, seen), lambda c: c.session("s1").set_timeout(30))
    assert (seen[0].method, seen[0].url.path) == ("PATCH", "/v1/sessions/s1")
    assert json.loads(seen[0].content) == {"expires_in": 30} and info.id == "s1"
    with pytest.raises(TypeError, match="needs ttl, idle_timeout or both"):
        on(answering(200, DOC, seen), lambda c: c.session("s1").set_ttl())
    assert len(seen) == 1


@HALVES
def test_update_network_sends_the_new_lists_and_reads_back_the_session(on):
    seen: list[httpx.Request] = []
    changed = {**DOC, "network": {"allow": ["*.example.org"], "deny": ["admin.example.org"]}}
    info = on(
        answering(200, changed, seen),
        lambda c: c.session("s1").update_network(["*.example.org"], deny=["admin.example.org"]),
    )
    assert (seen[0].method, seen[0].url.path) == ("PATCH", "/v1/sessions/s1/network")
    assert json.loads(seen[0].content) == {
        "allow": ["*.example.org"],
        "deny": ["admin.example.org"],
    }
    assert info.network == changed["network"]
    with pytest.raises(TypeError, match="a list of hosts"):
        on(answering(200, DOC, seen), lambda c: c.session("s1").update_network("a.example"))
    assert len(seen) == 1


def files_sync(c):
    files = c.session("s1").files
    return files.write("data/x.csv", "a,b"), files.read("data/x.csv"), files.list("data")


async def files_async(c):
    files = c.session("s1").files
    return (
        await files.write("data/x.csv", "a,b"),
        await files.read("data/x.csv"),
        await files.list("data"),
    )


@HALVES
def test_files_go_up_whole_and_come_back_as_bytes(on):
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "PUT":
            return httpx.Response(201, json={"path": "data/x.csv", "size": 3})
        if request.url.path.endswith("/files"):
            return httpx.Response(200, json={"entries": [{"path": "data/x.csv", "size": 3}]})
        return httpx.Response(200, content=b"a,b")

    written, content, listed = on(handle, files_sync if on is on_sync else files_async)
    put, get, ls = seen
    assert (put.method, put.url.path, put.content) == (
        "PUT",
        "/v1/sessions/s1/files/data/x.csv",
        b"a,b",
    )
    assert put.headers["Content-Length"] == "3"
    assert (get.method, get.url.path) == ("GET", "/v1/sessions/s1/files/data/x.csv")
    assert (ls.url.path, dict(ls.url.params)) == ("/v1/sessions/s1/files", {"path": "data"})
    assert (written.path, written.size, content) == ("data/x.csv", 3, b"a,b")
    assert [(f.name, f.type) for f in listed] == [("x.csv", "file")]


@HALVES
def test_a_read_is_retried_after_a_dropped_connection_and_a_create_is_not(on):
    """A create may have reached the gateway before the connection dropped: never sent twice."""
    seen: list[httpx.Request] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"status": "ok"})

    assert on(flaky, lambda c: c.health()) == {"status": "ok"}
    assert [r.url.path for r in seen] == ["/healthz", "/healthz"]

    def dropped(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        raise httpx.ReadError("connection reset", request=request)

    seen.clear()
    with pytest.raises(GatewayUnreachable):
        on(dropped, lambda c: c.create_session())
    assert len(seen) == 1


@HALVES
def test_the_gateways_error_comes_back_typed_with_its_message(on):
    body = {"error": {"code": "session_not_found", "message": "no session s9: it ended"}}
    with pytest.raises(SessionNotFound) as raised:
        on(answering(404, body, []), lambda c: c.session("s9").refresh())
    error = raised.value
    assert (error.status, error.code, error.message) == (
        404,
        "session_not_found",
        body["error"]["message"],
    )
