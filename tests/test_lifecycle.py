"""Session lifecycle: TTL, idle timeout, listing, interrupt, restart, death, reaping."""

from __future__ import annotations

import time

import pytest
from helpers import execute_in_background, run, text_of, wait_for

pytestmark = pytest.mark.docker


def state_of(api, sid: str) -> dict:
    return api.get(f"/v1/sessions/{sid}").json()


def test_session_past_its_ttl_is_gone_with_its_container(api, new_session, engine):
    sid = new_session(ttl=2)["id"]
    ended = wait_for(lambda: state_of(api, sid)["state"] == "deleted", timeout=10)
    assert ended, f"session outlived its 2 s TTL: {state_of(api, sid)}"
    assert "ttl expired" in state_of(api, sid)["reason"]
    assert not engine.containers.list(all=True, filters={"name": f"sbx-{sid}"})


def test_idle_session_is_culled_but_activity_keeps_it(api, new_session):
    sid = new_session(idle_timeout=3)["id"]
    for _ in range(3):  # keep it busy past its idle timeout
        run(api, sid, "import time; time.sleep(1)")
    assert state_of(api, sid)["state"] == "idle", "an active session was culled"
    assert wait_for(lambda: state_of(api, sid)["state"] == "deleted", timeout=10)
    assert "idle" in state_of(api, sid)["reason"]


def test_patch_extends_ttl_but_never_beyond_the_maximum(api, new_session):
    session = new_session(ttl=60)
    sid = session["id"]
    r = api.patch(f"/v1/sessions/{sid}", json={"ttl": 120, "idle_timeout": 90})
    assert r.status_code == 200, r.text
    assert r.json()["ttl"] == 120 and r.json()["idle_timeout"] == 90
    assert r.json()["expires_at"] > session["expires_at"]
    r = api.patch(f"/v1/sessions/{sid}", json={"ttl": 10**8})
    assert r.status_code == 422 and "maximum" in r.json()["error"]["message"]
    r = api.patch(f"/v1/sessions/{sid}", json={"kernel": "x"})
    assert r.status_code == 400


def test_list_filters_by_metadata_and_state(api, new_session):
    a = new_session(metadata={"agent": "alpha", "run": "7"})["id"]
    b = new_session(metadata={"agent": "beta"})["id"]
    ids = lambda **q: [s["id"] for s in api.get("/v1/sessions", params=q).json()["sessions"]]  # noqa: E731
    assert a in ids() and b in ids()
    assert ids(**{"metadata.agent": "alpha"}) == [a]
    assert ids(**{"metadata.agent": "alpha", "metadata.run": "7"}) == [a]
    assert ids(**{"metadata.agent": "gamma"}) == []
    assert a in ids(state="idle") and a not in ids(state="busy")
    typo = api.get("/v1/sessions", params={"state": "idel"})
    assert typo.status_code == 400
    assert "starting, idle, busy, dead" in typo.json()["error"]["message"]


def test_interrupt_stops_a_running_cell_and_keeps_state(api, session):
    sid = session["id"]
    run(api, sid, "x = 5")
    thread, box = execute_in_background(
        api, sid, "import time\nfor i in range(60): time.sleep(0.5)"
    )
    assert wait_for(lambda: state_of(api, sid)["state"] == "busy", timeout=5)
    time.sleep(0.5)
    assert api.post(f"/v1/sessions/{sid}/interrupt").status_code == 200
    thread.join(15)
    reply = box["reply"]
    assert reply["status"] == "interrupted", reply
    assert reply["error"]["ename"] == "KeyboardInterrupt"
    assert text_of(run(api, sid, "print(x)")) == "5\n"


def test_restart_gives_a_fresh_kernel_in_the_same_session(api, session):
    sid = session["id"]
    run(api, sid, "x = 5")
    r = api.post(f"/v1/sessions/{sid}/restart")
    assert r.status_code == 200 and r.json()["state"] == "idle"
    assert run(api, sid, "x")["error"]["ename"] == "NameError"


def test_execution_timeout_interrupts_a_busy_loop(api, session):
    sid = session["id"]
    run(api, sid, "kept = 1")
    reply = run(api, sid, "while True: pass", timeout=2)
    assert reply["status"] == "timeout", reply
    assert reply["error"]["ename"] == "ExecutionTimeout"
    assert reply["error"]["kernel_restarted"] is False
    assert text_of(run(api, sid, "print(kept)")) == "1\n", "state lost after an interrupt"


def test_execution_timeout_restarts_a_kernel_that_ignores_interrupts(api, session):
    sid = session["id"]
    code = (
        "import time\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(0.1)\n"
        "    except KeyboardInterrupt:\n"
        "        pass"
    )
    reply = run(api, sid, code, timeout=1)
    assert reply["status"] == "timeout" and reply["error"]["kernel_restarted"] is True, reply
    assert "restarted" in reply["error"]["evalue"]
    assert run(api, sid, "1 + 1")["status"] == "ok"


def test_killed_container_is_reported_dead_and_can_be_restarted(api, session, engine):
    sid = session["id"]
    thread, box = execute_in_background(api, sid, "import time; time.sleep(30)")
    assert wait_for(lambda: state_of(api, sid)["state"] == "busy", timeout=5)
    started = time.monotonic()
    engine.containers.get(f"sbx-{sid}").kill(signal="SIGKILL")
    thread.join(10)
    assert time.monotonic() - started < 3, "the in-flight execute did not notice the death"
    assert box["reply"]["status"] == "dead"
    assert "exited with code 137" in box["reply"]["error"]["evalue"]
    state = state_of(api, sid)
    assert state["state"] == "dead" and "code 137" in state["reason"]
    r = api.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "kernel_died"
    assert api.post(f"/v1/sessions/{sid}/restart").status_code == 200
    assert run(api, sid, "1 + 1")["status"] == "ok"


def test_history_records_every_execution(api, session):
    sid = session["id"]
    run(api, sid, "print('a')")
    run(api, sid, "1/0")
    history = api.get(f"/v1/sessions/{sid}/history").json()["executions"]
    assert [h["code"] for h in history] == ["print('a')", "1/0"]
    assert [h["status"] for h in history] == ["ok", "error"]
    assert [h["execution_count"] for h in history] == [1, 2]
    assert history[0]["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "a\n"}]
    assert history[0]["started_at"] <= history[0]["ended_at"]
    api.delete(f"/v1/sessions/{sid}")
    after = api.get(f"/v1/sessions/{sid}/history").json()["executions"]
    assert len(after) == 2, "history must outlive the session"


def test_max_sessions_gives_429(start_gateway):
    gw = start_gateway("--max-sessions", "1")
    first = gw.client.post("/v1/sessions", json={})
    assert first.status_code == 201
    r = gw.client.post("/v1/sessions", json={})
    assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_sessions"
    assert "maximum of 1" in r.json()["error"]["message"]
    gw.client.delete(f"/v1/sessions/{first.json()['id']}")
    second = gw.client.post("/v1/sessions", json={})
    assert second.status_code == 201
    gw.client.delete(f"/v1/sessions/{second.json()['id']}")
