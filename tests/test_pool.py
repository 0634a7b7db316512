"""The warm pool: claims, fitting a claimed sandbox, refills, fallbacks, limits."""

from __future__ import annotations

import signal

import pytest
from helpers import gateway_id, run, text_of, wait_for

pytestmark = pytest.mark.docker


def pooled_containers(engine, gw) -> set[str]:
    """Ids of the gateway's containers that no session owns yet."""
    sessions = {s["id"] for s in gw.client.get("/v1/sessions").json()["sessions"]}
    found = engine.containers.list(filters={"label": f"sbx.gateway={gateway_id(gw.data_dir)}"})
    return {c.id for c in found if c.labels["sbx.session"] not in sessions}


def ready(gw, n: int = 1) -> bool:
    return wait_for(lambda: gw.client.get("/healthz").json()["pool_ready"]["python3"] >= n, 60)


def claims(gw) -> dict[str, int]:
    metrics = gw.client.get("/metrics").text
    found = {}
    for line in metrics.splitlines():
        if line.startswith('sbx_pool_claims_total{kernel="python3"'):
            result = line.split('result="')[1].split('"')[0]
            found[result] = int(float(line.rsplit(" ", 1)[1]))
    return found


@pytest.fixture(scope="module")
def pooled(start_gateway):
    return start_gateway(
        "--pool", "python3=1", "--max-sessions", "3", "--pool-imports", "numpy,no_such_module"
    )


def test_a_claim_gets_the_warm_kernel_fitted_to_the_request(pooled, engine):
    assert ready(pooled), "the pool never filled"
    (warm,) = pooled_containers(engine, pooled)
    body = {
        "limits": {"memory": "256m", "cpus": 0.5, "pids": 64},
        "env": {"GREETING": "hello from the request"},
    }
    session = pooled.client.post("/v1/sessions", json=body).json()
    assert session["container_id"] == warm, "the create did not use the warm kernel"
    assert claims(pooled).get("hit") == 1
    host = engine.api.inspect_container(warm)["HostConfig"]
    assert host["Memory"] == host["MemorySwap"] == 256 * 2**20
    assert host["NanoCpus"] == 5 * 10**8 and host["PidsLimit"] == 64
    code = (
        "import os\n"
        "print(os.environ['GREETING'])\n"
        "st = os.statvfs('/workspace'); print(round(st.f_blocks * st.f_frsize / 2**30, 1))"
    )
    reply = run(pooled.client, session["id"], code)
    assert reply["execution_count"] == 1, "the pool's setup must leave no execution count"
    assert text_of(reply) == "hello from the request\n1.0\n"
    # The pool refills with a new sandbox; the claimed one is this session's alone.
    assert ready(pooled)
    assert warm not in pooled_containers(engine, pooled)
    pooled.client.delete(f"/v1/sessions/{session['id']}")
    assert not engine.containers.list(all=True, filters={"id": warm})


def test_a_pooled_python_kernel_has_imported_what_it_was_told_and_named_nothing(pooled):
    assert ready(pooled), "the pool never filled"
    sid = pooled.client.post("/v1/sessions", json={}).json()["id"]
    try:
        code = "import sys; print(sorted({'numpy', 'no_such_module'} & set(sys.modules)), dir())"
        assert text_of(run(pooled.client, sid, code)).startswith("['numpy'] ['In', 'Out', ")
        assert "_sbx_module" not in text_of(run(pooled.client, sid, "print(dir())"))
    finally:
        pooled.client.delete(f"/v1/sessions/{sid}")


def test_a_memory_limit_applied_on_claim_is_enforced(pooled):
    assert ready(pooled)
    sid = pooled.client.post("/v1/sessions", json={"limits": {"memory": "256m"}}).json()["id"]
    reply = run(pooled.client, sid, "x = bytearray(400 * 2**20)")
    assert reply["status"] == "dead" and "out of memory: limit 256 MiB" in reply["error"]["evalue"]
    pooled.client.delete(f"/v1/sessions/{sid}")


@pytest.mark.parametrize(
    "body",
    [
        {"limits": {"disk": "64m"}},  # its workspace is made at pool time
        {"limits": {"memory": "128m"}},  # its /tmp would be smaller
        {"network": {"allow": ["example.com"]}},
        {"id": "7d7c2a3e-5b0f-4c38-9d7b-1f6a1e2d3c4b"},
    ],
    ids=["other-disk", "smaller-tmp", "network", "chosen-id"],
)
def test_requests_the_pool_cannot_fit_start_cold(pooled, engine, body):
    assert ready(pooled)
    (warm,) = pooled_containers(engine, pooled)
    before = claims(pooled).get("miss", 0)
    r = pooled.client.post("/v1/sessions", json=body)
    if r.status_code != 201:  # a policy this host does not offer is refused, not fitted
        assert body.get("network") and r.status_code in (403, 503), r.text
        return
    session = r.json()
    assert session["container_id"] != warm
    assert claims(pooled)["miss"] == before + 1
    assert run(pooled.client, session["id"], "1 + 1")["status"] == "ok"
    assert warm in pooled_containers(engine, pooled), "a cold start must leave the pool alone"
    pooled.client.delete(f"/v1/sessions/{session['id']}")


def test_a_dead_pooled_kernel_is_replaced(pooled, engine):
    assert ready(pooled)
    (warm,) = pooled_containers(engine, pooled)
    engine.containers.get(warm).kill()
    replaced = wait_for(lambda: pooled_containers(engine, pooled) - {warm}, timeout=60)
    assert replaced, "the pool did not replace its dead kernel"
    assert not engine.containers.list(all=True, filters={"id": warm}), "the dead one was left"


def test_pooled_kernels_count_against_the_server_limit_and_give_way(pooled):
    assert ready(pooled)
    ids = [pooled.client.post("/v1/sessions", json={}).json()["id"] for _ in range(3)]
    r = pooled.client.post("/v1/sessions", json={})
    assert r.status_code == 429, "max_sessions 3 must hold with a pool beside the sessions"
    health = pooled.client.get("/healthz").json()
    assert health["sessions"] == 3 and health["pool_ready"]["python3"] == 0
    for sid in ids:
        pooled.client.delete(f"/v1/sessions/{sid}")
    assert ready(pooled), "the pool did not refill once there was room"


def test_stopping_and_crashing_leave_no_pooled_kernels(start_gateway, engine):
    gw = start_gateway("--pool", "python3=2", keep_sessions=True)
    assert ready(gw, 2)
    gid = gateway_id(gw.data_dir)
    gw.stop()
    assert not engine.containers.list(all=True, filters={"label": f"sbx.gateway={gid}"})
    again = start_gateway("--pool", "python3=1", data_dir=gw.data_dir, keep_sessions=True)
    assert ready(again)
    again.stop(signal.SIGKILL)
    assert engine.containers.list(filters={"label": f"sbx.gateway={gid}"}), "test premise"
    third = start_gateway(data_dir=gw.data_dir)  # no pool: anything left is a leak
    assert third.client.get("/healthz").json()["sessions"] == 0
    assert not engine.containers.list(all=True, filters={"label": f"sbx.gateway={gid}"})
