"""The v1 HTTP API's contract: shapes, status codes and JSON errors."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.docker


def error_of(response) -> dict:
    assert response.headers["content-type"].startswith("application/json"), response.text
    return response.json()["error"]


def test_create_returns_201_with_location_and_the_session(api, new_session):
    r = api.post("/v1/sessions", json={"metadata": {"agent": "a1"}, "limits": {"memory": "256m"}})
    assert r.status_code == 201, r.text
    body = r.json()
    api.delete(f"/v1/sessions/{body['id']}")
    assert r.headers["location"] == f"/v1/sessions/{body['id']}"
    assert body["state"] == "idle" and body["kernel"] == "python3"
    assert body["limits"]["memory"] == 256 * 2**20
    assert body["metadata"] == {"agent": "a1"}
    assert body["expires_at"] > body["created_at"]


def test_unknown_session_is_a_404_json_error(api):
    for method, path in [
        ("GET", "/v1/sessions/nope"),
        ("DELETE", "/v1/sessions/0b7c1e9e-0000-4000-8000-000000000000"),
        ("POST", "/v1/sessions/nope/execute"),
    ]:
        r = api.request(method, path, json={"code": "1"} if method == "POST" else None)
        assert r.status_code == 404, f"{method} {path} -> {r.status_code}"
        assert error_of(r)["code"] == "session_not_found"
        assert "POST /v1/sessions" in error_of(r)["message"]


def test_malformed_json_is_a_400_json_error(api, session):
    for path in ("/v1/sessions", f"/v1/sessions/{session['id']}/execute"):
        r = api.post(path, content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert error_of(r)["code"] == "bad_request"
        assert "not valid JSON" in error_of(r)["message"]
    r = api.post(f"/v1/sessions/{session['id']}/execute", json={"code": 42})
    assert r.status_code == 400 and "code must be a string" in error_of(r)["message"]


def test_unknown_kernel_and_endpoint(api):
    r = api.post("/v1/sessions", json={"kernel": "cobol"})
    assert r.status_code == 404 and error_of(r)["code"] == "kernel_not_found"
    assert "python3" in error_of(r)["message"]
    r = api.get("/v1/nothing-here")
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"


def test_limit_above_maximum_is_refused_naming_the_limit(api):
    r = api.post("/v1/sessions", json={"limits": {"memory": "512g"}})
    assert r.status_code == 422
    assert error_of(r)["code"] == "limit_exceeded"
    assert "memory" in error_of(r)["message"] and "maximum" in error_of(r)["message"]
    r = api.post("/v1/sessions", json={"limits": {"gpus": 1}})
    assert r.status_code == 400 and "gpus" in error_of(r)["message"]
    r = api.post("/v1/sessions", json={"ttl": 10**9})
    assert r.status_code == 422 and "ttl" in error_of(r)["message"]


def test_healthz(api):
    r = api.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
