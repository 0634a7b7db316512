"""Requests that once got a 5xx (found by the contract test and the schemathesis run), pinned.

Each answered 500 or 503 with nothing a client could do about it; each must
now get a clear 2xx or 4xx and leave the gateway serving.
"""

from __future__ import annotations

import time
import urllib.parse
from datetime import datetime

import pytest
from helpers import run

pytestmark = pytest.mark.docker


def test_a_file_named_in_any_script_downloads(api, session):
    name = "놞 données ☃.txt"
    url = f"/v1/sessions/{session['id']}/files/{urllib.parse.quote(name)}"
    assert api.put(url, content=b"hi").status_code == 201
    r = api.get(url)  # was 500: Tornado refuses header values beyond Latin-1
    assert r.status_code == 200 and r.content == b"hi"
    disposition = r.headers["content-disposition"]
    assert "filename*=UTF-8''" + urllib.parse.quote(name, safe="") in disposition
    assert 'filename="_ donn_es _.txt"' in disposition


def test_a_notebook_with_a_wrongly_typed_minor_version_is_a_400(api):
    body = b'{"nbformat": 4, "nbformat_minor": {}, "metadata": {}, "cells": []}'
    r = api.post("/v1/notebooks/replay", content=body)  # was 500: an empty validation message
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"


@pytest.mark.parametrize("image", ["sbx/", "sbx/python:", "sbx/nothing:here", "sbx/python\n"])
def test_an_image_that_is_not_here_is_a_400(api, image):
    r = api.post(
        "/v1/sessions", json={"image": image}
    )  # was 503 engine_unavailable / image_not_built
    assert r.status_code == 400, r.text
    assert "GET /v1/kernels" in r.json()["error"]["message"]


@pytest.mark.parametrize("env", [{"A": "nul\x00byte"}, {"A\n": "x"}])
def test_environment_the_runtime_cannot_take_is_a_400(api, env):
    # A NUL made the runtime refuse to start (503 engine_unavailable); "A\n" passed the name check.
    r = api.post("/v1/sessions", json={"env": env})
    assert r.status_code == 400, r.text


def test_a_mime_value_nbformat_refuses_is_kept_as_text(api, session):
    reply = run(api, session["id"], "display({'x': 1, 'text/plain': 'shown'}, raw=True)")
    assert reply["status"] == "ok"  # was 500, and the session stayed busy for good
    assert reply["outputs"][0]["data"] == {"x": "1", "text/plain": "shown"}
    assert api.get(f"/v1/sessions/{session['id']}").json()["state"] == "idle"


def test_a_session_whose_ttl_runs_out_while_starting_is_a_409(start_gateway):
    gw = start_gateway("--cull-interval", "0.05")  # the culler surely runs during the start
    r = gw.client.post("/v1/sessions", json={"ttl": 5e-324})  # was 500: its directory vanished
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_ended", r.text
    assert "ended while it started: ttl expired" in r.json()["error"]["message"]
    assert gw.client.get("/v1/sessions").json()["sessions"] == []
    assert gw.client.post("/v1/sessions", json={}).status_code == 201  # still serving


def test_a_session_whose_ttl_runs_out_while_restarting_is_a_409(start_gateway):
    gw = start_gateway("--cull-interval", "0.05")
    session = gw.client.post("/v1/sessions", json={}).json()
    age = time.time() - datetime.fromisoformat(session["created_at"]).timestamp()
    # Expire a fifth of a second from now: a restart (a cold container, half a
    # second and more) outlives it, and the culler looks every 50 ms.
    gw.client.patch(f"/v1/sessions/{session['id']}", json={"ttl": age + 0.2})
    r = gw.client.post(f"/v1/sessions/{session['id']}/restart")  # was 500: its sockets vanished
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_ended", r.text
    assert "ended while it restarted: ttl expired" in r.json()["error"]["message"]
    assert gw.client.post("/v1/sessions", json={}).status_code == 201  # still serving


@pytest.mark.parametrize(
    "body", [b'{"metadata": {}, "cells": []}', b'{"nbformat": 3, "cells": {}}']
)
def test_only_version_4_notebooks_replay(api, body):
    r = api.post("/v1/notebooks/replay", content=body)  # was 200: read as an empty v1 notebook
    assert r.status_code == 400 and "not 4" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(
    "body", [b'{"ttl": NaN}', b'{"metadata": {"x": Infinity}}', b'{"limits": {"cpus": -Infinity}}']
)
def test_nan_and_infinity_are_not_json(api, body):
    # Python's json took them: a NaN ttl made the session's JSON a 500, a NaN label invalid JSON.
    r = api.post("/v1/sessions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not a JSON number" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(
    "limits", [{"memory": "32m"}, {"disk": "64k"}, {"pids": 4}, {"cpus": 0.001}, {"pids": "nan"}]
)
def test_limits_no_kernel_starts_under_are_a_422(api, limits):
    r = api.post("/v1/sessions", json={"limits": limits})  # were 500 (mkfs, NaN) or 503
    assert r.status_code == 422 and r.json()["error"]["code"] == "limit_exceeded", r.text
