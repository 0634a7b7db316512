"""A burst of creates: each ends in a working session or a clear 503 with Retry-After.

The warm pool serves what it holds and grows while creates find it empty;
the rest start a few at a time (``start_concurrency``) or wait in a bounded
queue, and past it are refused at once, leaving nothing behind, while a
canary session keeps answering.
"""

from __future__ import annotations

import threading

import httpx
import pytest
from helpers import Canary, canary_session, gateway_id, text_of, wait_for

pytestmark = pytest.mark.docker

BURST = 10


@pytest.fixture(scope="module")
def gw(start_gateway):
    return start_gateway(
        "--pool", "python3=1", "--pool-max", "python3=3", "--start-concurrency", "1",
        "--start-queue", "3", "--start-queue-per-tenant", "3",
    )  # fmt: skip


def create_and_run(gw, go: threading.Barrier, answers: list, n: int) -> None:
    with httpx.Client(base_url=gw.url, headers=gw.client.headers, timeout=120) as api:
        go.wait()
        r = api.post("/v1/sessions", json={})  # what the pool holds: a warm one fits
        if r.status_code == 201:
            ran = api.post(f"/v1/sessions/{r.json()['id']}/execute", json={"code": "print(1 + 1)"})
            answers[n] = (r, ran.json())
        else:
            answers[n] = (r, None)


def test_a_burst_ends_each_create_in_a_session_or_a_503_with_retry_after(gw, engine):
    with canary_session(gw) as canary:
        ready = lambda: gw.client.get("/healthz").json()["pool_ready"]["python3"]  # noqa: E731
        assert wait_for(ready, timeout=60), "the pool never refilled after the canary's create"
        go = threading.Barrier(BURST)
        answers: list = [None] * BURST
        threads = [
            threading.Thread(target=create_and_run, args=(gw, go, answers, n)) for n in range(BURST)
        ]
        with Canary(gw, canary):
            for t in threads:
                t.start()
            for t in threads:
                t.join(180)
        made = [(r, ran) for r, ran in answers if r.status_code == 201]
        refused = [r for r, _ in answers if r.status_code != 201]
        assert all(text_of(ran) == "2\n" for _, ran in made), made
        assert refused, "ten creates on a host that starts one at a time all started at once"
        for r in refused:
            assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded", r.text
            assert int(r.headers["Retry-After"]) >= 1, r.headers
        assert len(made) >= 5, (  # a warm one, one starting, three waiting their turn
            f"only {len(made)} of {BURST} made it: the queue should have held 3"
        )
        live = {s["id"] for s in gw.client.get("/v1/sessions").json()["sessions"]}
        assert {r.json()["id"] for r, _ in made} <= live
        labelled = engine.containers.list(
            all=True, filters={"label": f"sbx.gateway={gateway_id(gw.data_dir)}"}
        )
        extra = {c.labels.get("sbx.session") for c in labelled} - live - {canary}
        assert len(extra) <= 3, (  # pooled sandboxes, at most --pool-max of them
            f"containers left that no session holds: {extra}"
        )
        for r, _ in made:
            gw.client.delete(f"/v1/sessions/{r.json()['id']}")
