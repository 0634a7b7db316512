"""The Docker engine stops or crashes under a running gateway, then comes back.

A gateway runs against a dockerd of the tests' own (``own_engine``), which
is crashed (SIGKILL: the kernels keep running in their shims, and the
restarted engine kills them before anyone can watch) and stopped (SIGTERM).
Meanwhile creates must be refused with 503 engine_unavailable and a
Retry-After, /healthz must say the engine is down, and once it is back
every session whose kernel died is dead with a reason, within seconds.
"""

from __future__ import annotations

import contextlib
import signal
import time

import pytest
from helpers import GatewayProcess, remove_leftovers, run, short_tmpdir, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.faults]

# Far below any real start-up, so the test says how long marking the dead took.
WITHIN = 15.0


@pytest.fixture
def gw(own_engine):
    data_dir = short_tmpdir()
    gateway = GatewayProcess(
        data_dir, "--pool", "", "--end-sessions-on-stop", env={"DOCKER_HOST": own_engine.host}
    )
    yield gateway
    gateway.stop()
    if not own_engine.running:  # a failure left it down
        own_engine.start()
    with contextlib.closing(own_engine.client()) as engine:
        remove_leftovers(engine, data_dir)


def engine_state(gw: GatewayProcess) -> str:
    r = gw.client.get("/healthz")
    assert r.status_code == 200, f"/healthz answered {r.status_code}: {r.text}"
    return r.json()["engine"]


def assert_refused_while_down(gw: GatewayProcess) -> None:
    r = gw.client.post("/v1/sessions", json={})
    assert r.status_code == 503, f"a create with the engine down got {r.status_code}: {r.text}"
    error = r.json()["error"]
    assert error["code"] == "engine_unavailable", error
    assert "engine" in error["message"] and "retry" in error["message"], error["message"]
    assert int(r.headers["Retry-After"]) > 0, "a 503 must say when to retry"


def assert_all_dead(gw: GatewayProcess, ids: list[str], cause: str) -> None:
    def states() -> dict[str, tuple[str, str]]:
        docs = [gw.client.get(f"/v1/sessions/{sid}").json() for sid in ids]
        return {d["id"]: (d["state"], d.get("reason") or "") for d in docs}

    started = time.monotonic()
    dead = wait_for(lambda: all(s == "dead" for s, _ in states().values()), WITHIN)
    assert dead, (
        f"{WITHIN:g} s after the engine came back, sessions whose kernels it killed "
        f"({cause}) still look alive: {states()}"
    )
    for state, reason in states().values():
        assert reason, f"a dead session must say why: {state!r} with no reason"
    print(f"marked dead {time.monotonic() - started:.1f} s after the engine answered")


def assert_clean_log(gw: GatewayProcess) -> None:
    log = "".join(gw.log)
    for sign in ("Task exception was never retrieved", "Traceback", "uncaught exception"):
        assert sign not in log, f"the gateway log shows {sign!r}:\n{gw.tail(60)}"


def assert_usable(gw: GatewayProcess) -> str:
    r = gw.client.post("/v1/sessions", json={})
    assert r.status_code == 201, f"a create with the engine back got {r.status_code}: {r.text}"
    sid = r.json()["id"]
    assert run(gw.client, sid, "6 * 7")["outputs"][0]["data"]["text/plain"] == "42"
    return sid


def test_engine_crash_and_stop(gw, own_engine):
    ids = [gw.client.post("/v1/sessions", json={}).json()["id"] for _ in range(2)]
    assert run(gw.client, ids[0], "x = 1")["status"] == "ok"
    assert engine_state(gw) == "up"

    # A crash: the kernels outlive their engine, which kills them as it starts again.
    own_engine.stop(signal.SIGKILL)
    assert wait_for(lambda: engine_state(gw) == "down", 10), "/healthz did not notice the crash"
    assert_refused_while_down(gw)
    assert run(gw.client, ids[0], "x + 1")["status"] == "ok", "kernels outlive a crashed engine"
    own_engine.start()
    assert_all_dead(gw, ids, "engine crash")
    assert wait_for(lambda: engine_state(gw) == "up", 10), "/healthz did not see the engine back"
    survivor = assert_usable(gw)
    r = gw.client.post(f"/v1/sessions/{ids[0]}/restart")
    assert r.status_code == 200, f"a dead session could not be restarted: {r.text}"

    # A clean stop: the engine stops its containers on the way down.
    own_engine.stop(signal.SIGTERM)
    assert wait_for(lambda: engine_state(gw) == "down", 10), "/healthz did not notice the stop"
    assert_refused_while_down(gw)
    own_engine.start()
    assert_all_dead(gw, [ids[0], survivor], "engine stop")
    assert wait_for(lambda: engine_state(gw) == "up", 10)
    assert_usable(gw)
    assert_clean_log(gw)
