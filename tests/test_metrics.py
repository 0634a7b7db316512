"""``GET /metrics``: prometheus_client's exposition of latencies, outcomes, sessions and pool."""

from __future__ import annotations

import pytest
from helpers import run, tenant_gateway
from prometheus_client.parser import text_string_to_metric_families


def scrape(client) -> dict[str, list]:
    """Every sample of the gateway's /metrics, by metric family name."""
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def value(samples: list, name: str, **labels: str) -> float:
    """The sample called ``name`` whose labels include ``labels``; 0 when there is none."""
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    return sum(found)


@pytest.mark.docker
def test_latency_outcomes_sessions_and_pool_by_kernel_and_tenant(start_gateway):
    with tenant_gateway(start_gateway, {"acme": "acme-token-0123456789"}) as (gw, clients):
        acme = clients["acme"]
        sid = acme.post("/v1/sessions", json={}).json()["id"]
        run(acme, sid, "x = 1")
        run(acme, sid, "1 / 0")
        families = scrape(gw.client)

        execute = families["sbx_execute_seconds"]
        ok = {"kernel": "python3", "tenant": "acme", "status": "ok"}
        assert value(execute, "sbx_execute_seconds_count", **ok) == 1, execute
        assert value(execute, "sbx_execute_seconds_bucket", le="+Inf", **ok) == 1
        executions = families["sbx_executions"]
        assert value(executions, "sbx_executions_total", status="error", tenant="acme") == 1

        create = families["sbx_session_create_seconds"]
        assert value(create, "sbx_session_create_seconds_count", kernel="python3") == 1, create
        creates = families["sbx_session_creates"]
        assert value(creates, "sbx_session_creates_total", tenant="acme", outcome="ok") == 1, (
            creates
        )

        sessions = families["sbx_sessions"]
        assert value(sessions, "sbx_sessions", state="idle") == 1, sessions
        assert value(sessions, "sbx_sessions", state="busy") == 0
        assert "sbx_pool_ready" in families and "sbx_pool_target" in families
        assert "sbx_event_loop_lag_max_seconds" in families

        # A refused create counts too, with the error's code as its outcome.
        r = acme.post("/v1/sessions", json={"kernel": "no-such-kernel"})
        assert r.status_code == 404, r.text
        creates = scrape(gw.client)["sbx_session_creates"]
        refused = {"tenant": "acme", "outcome": "kernel_not_found"}
        assert value(creates, "sbx_session_creates_total", **refused) == 1, creates
        assert acme.get("/metrics").status_code == 403  # for admins only
