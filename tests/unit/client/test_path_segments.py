"""An id the caller passes (a context's, a session's, a volume's) stays one path segment: a
dot segment ('.', '..') sent as is is folded away by the URL, so remove_context(S, '..')
became DELETE /v1/sessions/S, the whole session."""

from __future__ import annotations

import httpx
import pytest
from fake_gateway import answering, on_async, on_sync

from gateway.errors import BadRequest

HALVES = pytest.mark.parametrize("on", [on_sync, on_async], ids=["sync", "async"])
CONTEXT = {"id": "c1", "kernel": "python3", "language": "python", "cwd": "/", "state": "idle"}


@HALVES
@pytest.mark.parametrize("odd", ["..", ".", "a/..", "%2E%2E"])
def test_an_odd_context_id_stays_inside_the_contexts_route(on, odd):
    seen: list[httpx.Request] = []
    on(answering(200, CONTEXT, seen), lambda c: c.session("s1").restart_context(odd))
    on(answering(204, {}, seen), lambda c: c.session("s1").remove_context(odd))
    restart, remove = (r.url.raw_path.decode() for r in seen)
    assert restart.startswith("/v1/sessions/s1/contexts/") and restart.endswith("/restart")
    assert restart.count("/") == 6, restart
    assert remove.startswith("/v1/sessions/s1/contexts/") and remove.count("/") == 5, remove


@HALVES
@pytest.mark.parametrize("odd", ["..", "."])
def test_an_odd_session_id_stays_inside_the_sessions_route(on, odd):
    seen: list[httpx.Request] = []
    on(answering(200, {"contexts": []}, seen), lambda c: c.session(odd).contexts())
    (request,) = seen
    path = request.url.raw_path.decode()
    assert path.startswith("/v1/sessions/") and path.endswith("/contexts") and path.count("/") == 4


@HALVES
@pytest.mark.parametrize("odd", ["../tools", "a/../../tools", "./../notebook"])
def test_a_workspace_path_above_the_workspace_is_refused_before_sending(on, odd):
    """'../tools' was sent as /v1/sessions/s1/files/../tools, which the URL folds into
    /v1/sessions/s1/tools: a write_file of it replaced the session's tools."""
    seen: list[httpx.Request] = []
    with pytest.raises(BadRequest, match="above the workspace"):
        on(answering(200, {}, seen), lambda c: c.session("s1").files.write(odd, b"{}"))
    assert seen == []


@HALVES
def test_a_workspace_path_with_dot_segments_inside_it_is_sent_folded(on):
    seen: list[httpx.Request] = []
    on(answering(200, {}, seen), lambda c: c.session("s1").files.read("./a/../data.csv"))
    assert seen[0].url.path == "/v1/sessions/s1/files/data.csv"
