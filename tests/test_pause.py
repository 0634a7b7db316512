"""Pause and resume: a pause freezes a sandbox first (resumed in milliseconds as it was),
then saves its state to disk and holds no kernel memory; either way it comes back."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from helpers import (
    execute_in_background,
    gateway_id,
    run,
    run_over_channels,
    text_of,
    unix_sockets_under,
    wait_for,
)

pytestmark = pytest.mark.docker

SETUP = """
import math
x = 41
def f(a):
    return a + 1
class Point:
    def __init__(self, v):
        self.v = v
p = Point(7)
_mine = 'kept'
with open('note.txt', 'w') as fh:
    fh.write('hi')
gen = (i for i in range(3))
"""
CHECK = "print(f(x), math.pi > 3, open('note.txt').read(), p.v, Point.__name__, _mine)"


def containers_of(engine, sid: str) -> list:
    return engine.containers.list(all=True, filters={"label": f"sbx.session={sid}"})


def pause(api, sid: str, **body) -> dict:
    r = api.post(f"/v1/sessions/{sid}/pause", json=body)
    assert r.status_code == 200, f"pause answered {r.status_code}: {r.text}"
    return r.json()


def resume(api, sid: str) -> dict:
    r = api.post(f"/v1/sessions/{sid}/resume", json={})
    assert r.status_code == 200, f"resume answered {r.status_code}: {r.text}"
    return r.json()


def test_pause_releases_the_kernel_and_resume_brings_its_state_back(api, engine, session):
    sid = session["id"]
    run(api, sid, SETUP)
    paused = pause(api, sid, strategy="namespace")
    assert paused["state"] == "paused" and paused["strategy"] == "namespace", paused
    lost = {entry["name"] for entry in paused["lost"]}
    assert lost == {"gen", "fh"}, f"the generator and the file should be listed: {paused['lost']}"
    assert containers_of(engine, sid) == [], "a paused session's container still exists"
    assert api.get(f"/v1/sessions/{sid}").json()["state"] == "paused"
    assert api.get(f"/v1/sessions/{sid}/files/note.txt").text == "hi"
    resumed = resume(api, sid)
    assert resumed["state"] == "idle" and resumed["strategy"] == "namespace", resumed
    reply = run(api, sid, CHECK)
    assert text_of(reply) == "42 True hi 7 Point kept\n", reply
    assert "resumed" not in reply


def test_a_pause_freezes_the_sandbox_and_a_resume_finds_everything_as_it_was(api, engine, session):
    sid = session["id"]
    setup = "import socket\na, b = socket.socketpair()\nnext(gen)\nlog = open('log.txt', 'a')"
    run(api, sid, SETUP + setup)
    paused = pause(api, sid)
    assert paused["strategy"] == "freeze" and paused["lost"] == [], paused
    assert paused["paused"]["deepens_at"] > paused["paused"]["saved_at"], paused
    (container,) = containers_of(engine, sid)
    assert container.status == "paused", "the sandbox was not frozen"
    r = api.post(f"/v1/sessions/{sid}/interrupt")
    assert r.status_code == 409 and "paused" in r.json()["error"]["message"], r.text
    resumed = resume(api, sid)
    assert resumed["strategy"] == "freeze" and resumed["lost"] == [], resumed
    assert engine.containers.get(container.id).status == "running"
    # The generator, the open file and the socket pair: what a saved pause loses.
    reply = run(api, sid, "a.send(b'x'); print(b.recv(1), next(gen), log.closed, f(x))")
    assert text_of(reply) == "b'x' 1 False 42\n", reply
    pause(api, sid)
    assert api.delete(f"/v1/sessions/{sid}").status_code == 204
    assert containers_of(engine, sid) == [], "a frozen sandbox was left behind its session"


def test_a_frozen_session_is_saved_before_a_snapshot_and_dead_if_its_sandbox_went(
    api, engine, new_session
):
    sid, gone = new_session()["id"], new_session()["id"]
    for each in (sid, gone):
        run(api, each, "kept = 'yes'")
        pause(api, each)
    r = api.post(f"/v1/sessions/{sid}/snapshots", json={})
    assert r.status_code == 201, r.text
    view = api.get(f"/v1/sessions/{sid}").json()
    assert view["state"] == "paused" and view["paused"]["strategy"] == "namespace", view
    assert containers_of(engine, sid) == [], "the snapshot left the frozen sandbox behind"
    child = api.post("/v1/sessions", json={"from_snapshot": r.json()["id"]}).json()
    try:
        assert text_of(run(api, child["id"], "print(kept)")) == "yes\n"
    finally:
        api.delete(f"/v1/sessions/{child['id']}")
    assert text_of(run(api, sid, "print(kept)")) == "yes\n"
    engine.containers.get(f"sbx-{gone}").remove(force=True)
    r = api.post(f"/v1/sessions/{gone}/resume", json={})
    assert r.status_code == 409 and "restart" in r.json()["error"]["message"], r.text
    view = api.get(f"/v1/sessions/{gone}").json()
    assert view["state"] == "dead" and "frozen sandbox is gone" in view["reason"], view


def test_a_frozen_pause_is_saved_to_disk_once_its_time_is_up(start_gateway, engine):
    gw = start_gateway("--pause-frozen-for", "1", "--cull-interval", "0.3")
    api = gw.client
    sid = api.post("/v1/sessions", json={}).json()["id"]
    run(api, sid, "kept = 'yes'")
    assert pause(api, sid)["strategy"] == "freeze"

    def saved() -> bool:
        """While it moves to disk (under a second) its view shows it idle, its kernel saving."""
        paused = api.get(f"/v1/sessions/{sid}").json()["paused"] or {}
        return paused.get("strategy") == "namespace"

    assert wait_for(saved, 20), "the frozen pause was never saved to disk"
    assert wait_for(lambda: containers_of(engine, sid) == [], 10), "its memory was kept"
    reply = run(api, sid, "print(kept)")
    assert text_of(reply) == "yes\n" and reply["resumed"]["strategy"] == "namespace", reply


def test_an_execute_on_a_paused_session_resumes_it_first(api, session):
    sid = session["id"]
    run(api, sid, "y = [1, 2, 3]")
    for strategy, count in (("freeze", 2), ("namespace", 3)):
        pause(api, sid, strategy=strategy)
        reply = run(api, sid, "print(sum(y))")
        assert text_of(reply) == "6\n", reply
        assert reply["resumed"]["strategy"] == strategy, reply
        assert reply["execution_count"] == count, "the count should go on where it stopped"


def test_pausing_or_snapshotting_a_busy_session_is_refused(api, session):
    sid = session["id"]
    thread, box = execute_in_background(api, sid, "import time; time.sleep(3); z = 1")
    wait_for(lambda: api.get(f"/v1/sessions/{sid}").json()["state"] == "busy")
    for path in ("pause", "snapshots"):
        r = api.post(f"/v1/sessions/{sid}/{path}", json={})
        assert r.status_code == 409 and r.json()["error"]["code"] == "session_busy", r.text
    thread.join()
    assert box["reply"]["status"] == "ok"


def test_a_strategy_that_cannot_be_honoured_is_refused(api, new_session):
    sid = new_session()["id"]
    r = api.post(f"/v1/sessions/{sid}/pause", json={"strategy": "checkpoint"})
    assert r.status_code == 409, r.text
    assert "Unix socket" in r.json()["error"]["message"], r.text
    bash = new_session(kernel="bash")["id"]
    r = api.post(f"/v1/sessions/{bash}/pause", json={"strategy": "namespace"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "strategy_unavailable", r.text
    r = api.post(f"/v1/sessions/{sid}/pause", json={"strategy": "magic"})
    assert r.status_code == 400, r.text


def test_resuming_a_session_that_is_not_paused_is_refused(api, session):
    r = api.post(f"/v1/sessions/{session['id']}/resume", json={})
    assert r.status_code == 409 and "not paused" in r.json()["error"]["message"], r.text


def test_replay_keeps_a_bash_session_and_reports_cells_that_differ(api, engine, new_session):
    sid = new_session(kernel="bash")["id"]
    run(api, sid, "x=5; echo start > log.txt")
    run(api, sid, "date +%s%N")
    paused = pause(api, sid, strategy="replay")
    assert paused["strategy"] == "replay" and paused["lost"] == [], paused
    assert containers_of(engine, sid) == []
    resumed = resume(api, sid)
    assert resumed["strategy"] == "replay", resumed
    assert [cell["execution_count"] for cell in resumed["differed"]] == [2], resumed
    assert text_of(run(api, sid, "echo $x; cat log.txt")) == "5\nstart\n"


def test_a_paused_session_stays_paused_across_a_gateway_restart(start_gateway, engine):
    first = start_gateway(keep_sessions=True)
    saved, frozen = (first.client.post("/v1/sessions", json={}).json()["id"] for _ in range(2))
    for sid, strategy in ((saved, "namespace"), (frozen, "freeze")):
        run(first.client, sid, "kept = 'yes'")
        pause(first.client, sid, strategy=strategy)
    first.stop()
    second = start_gateway(data_dir=first.data_dir)
    for sid in (saved, frozen):
        assert second.client.get(f"/v1/sessions/{sid}").json()["state"] == "paused"
    assert containers_of(engine, saved) == []
    (container,) = containers_of(engine, frozen)
    assert container.status == "paused", "the frozen sandbox was not kept frozen"
    for sid in (saved, frozen):
        assert text_of(run(second.client, sid, "print(kept)")) == "yes\n"


def test_idle_sessions_pause_when_told_and_the_ttl_still_ends_them(start_gateway):
    gw = start_gateway("--cull-interval", "0.3", "--idle-action", "pause")
    api = gw.client
    # The ttl outlasts the pause, the resume and the second pause (frozen: milliseconds each,
    # after a second idle), with room for a loaded machine (8 s ran out before the second).
    sid = api.post("/v1/sessions", json={"idle_timeout": 1, "ttl": 14}).json()["id"]
    ends = api.post("/v1/sessions", json={"idle_timeout": 1, "idle_action": "end"}).json()
    assert ends["idle_action"] == "end"
    run(api, sid, "v = 3")
    assert wait_for(lambda: api.get(f"/v1/sessions/{sid}").json()["state"] == "paused", 10)
    assert api.get(f"/v1/sessions/{ends['id']}").json()["state"] == "deleted"
    assert text_of(run(api, sid, "print(v)")) == "3\n"
    assert wait_for(lambda: api.get(f"/v1/sessions/{sid}").json()["state"] == "paused", 10)
    doc = wait_for(
        lambda: (d := api.get(f"/v1/sessions/{sid}").json())["state"] == "deleted" and d, 30
    )
    assert doc and doc["reason"] == "ttl expired after 14 s", doc


def test_a_gateway_killed_mid_pause_leaves_the_session_running_or_paused(start_gateway):
    first = start_gateway(keep_sessions=True)
    api = first.client
    sid = api.post("/v1/sessions", json={"limits": {"memory": "1g"}}).json()["id"]
    run(api, sid, "import numpy as np\nblob = np.ones(40 * 2**20, dtype=np.uint8)\nmark = 'here'")

    def pause_and_lose_the_answer() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the gateway dies under the request
            api.post(f"/v1/sessions/{sid}/pause", json={"strategy": "namespace"})

    paused = threading.Thread(target=pause_and_lose_the_answer)
    paused.start()
    time.sleep(0.3)
    first.stop(signal.SIGKILL)
    paused.join()
    second = start_gateway(data_dir=first.data_dir)
    state = second.client.get(f"/v1/sessions/{sid}").json()["state"]
    assert state in ("idle", "paused"), f"after a crash mid-pause the session is {state}"
    assert text_of(run(second.client, sid, "print(mark, int(blob.sum()))")) == (
        f"here {40 * 2**20}\n"
    )


def test_pause_snapshot_and_fork_under_gvisor(api, engine, new_session):
    sid = new_session(runtime="gvisor")["id"]
    run(api, sid, "g = {'under': 'gvisor'}")
    assert pause(api, sid)["strategy"] == "freeze", "runsc freezes as runc does"
    assert text_of(run(api, sid, "print(g['under'])")) == "gvisor\n"
    paused = pause(api, sid, strategy="namespace")
    assert paused["strategy"] == "namespace" and containers_of(engine, sid) == [], paused
    assert text_of(run(api, sid, "print(g['under'])")) == "gvisor\n"
    snap = api.post(f"/v1/sessions/{sid}/snapshots", json={}).json()
    child = api.post("/v1/sessions", json={"from_snapshot": snap["id"]}).json()
    try:
        assert child["runtime"] == "runc", "a fork's runtime is its own request's"
        assert text_of(run(api, child["id"], "print(g['under'])")) == "gvisor\n"
    finally:
        api.delete(f"/v1/sessions/{child['id']}")


def test_a_paused_session_interrupts_no_one_restarts_fresh_and_wakes_for_jupyter(
    gateway, api, session
):
    sid = session["id"]
    run(api, sid, "q = 9")
    pause(api, sid)
    r = api.post(f"/v1/sessions/{sid}/interrupt")
    assert r.status_code == 409 and "paused" in r.json()["error"]["message"], r.text
    seen = asyncio.run(
        run_over_channels(gateway.ws_url(f"/api/kernels/{sid}/channels"), "print(q)")
    )
    assert [m["content"]["text"] for m in seen if m["msg_type"] == "stream"] == ["9\n"], seen
    pause(api, sid)
    restarted = api.post(f"/v1/sessions/{sid}/restart")
    assert restarted.status_code == 200 and restarted.json()["paused"] is None, restarted.text
    reply = run(api, sid, "print('q' in globals())")
    assert text_of(reply) == "False\n" and "resumed" not in reply, reply


def test_a_resume_takes_a_pooled_container_when_one_is_free(start_gateway, engine):
    gw = start_gateway("--pool", "python3=1", keep_sessions=True)
    api = gw.client
    pool_ready = lambda: api.get("/healthz").json()["pool_ready"]["python3"] >= 1  # noqa: E731
    assert wait_for(pool_ready, 60), "the pool never filled"
    sid = api.post("/v1/sessions", json={"limits": {"memory": "512m"}}).json()["id"]
    run(api, sid, SETUP + "\nimport os; os.makedirs('sub/deeper'); os.symlink('note.txt', 'ln')")
    pause(api, sid, strategy="namespace")
    assert wait_for(pool_ready, 60), "the pool never refilled"
    sessions = {s["id"] for s in api.get("/v1/sessions").json()["sessions"]}
    labelled = engine.containers.list(filters={"label": f"sbx.gateway={gateway_id(gw.data_dir)}"})
    (warm,) = [c.id for c in labelled if c.labels["sbx.session"] not in sessions]
    resumed = resume(api, sid)
    assert resumed["state"] == "idle" and resumed["container_id"] == warm, (
        "the resume started a cold container although a pooled one was free"
    )
    assert {entry["name"] for entry in resumed["lost"]} == {"gen", "fh"}, resumed
    assert text_of(run(api, sid, CHECK)) == "42 True hi 7 Point kept\n"
    files = "import os; print(os.path.isdir('sub/deeper'), os.readlink('ln'), os.getcwd())"
    assert text_of(run(api, sid, files)) == "True note.txt /workspace\n"
    limits = engine.api.inspect_container(warm)["HostConfig"]
    assert limits["Memory"] == 512 * 2**20, "the pooled container kept the pool's limits"
    assert engine.containers.get(warm).name == f"sbx-{sid}", "the container is not named after it"
    gw.stop()
    again = start_gateway(data_dir=gw.data_dir)
    assert again.client.get(f"/v1/sessions/{sid}").json()["state"] == "idle"
    assert text_of(run(again.client, sid, "print(x, p.v)")) == "41 7\n"
    engine.containers.get(warm).kill()
    dead = lambda: again.client.get(f"/v1/sessions/{sid}").json()["state"] == "dead"  # noqa: E731
    assert wait_for(dead, 15), "the death of the session's (once pooled) container went unseen"


def test_a_replay_resume_in_a_pooled_container_runs_its_cells_over_its_files(start_gateway):
    gw = start_gateway("--pool", "python3=1")
    api = gw.client
    pool_ready = lambda: api.get("/healthz").json()["pool_ready"]["python3"] >= 1  # noqa: E731
    assert wait_for(pool_ready, 60), "the pool never filled"
    sid = api.post("/v1/sessions", json={}).json()["id"]
    run(api, sid, "import os\nif not os.path.exists('n.txt'): open('n.txt', 'w').write('1')")
    run(api, sid, "v = open('n.txt').read() * 2")
    assert pause(api, sid, strategy="replay")["strategy"] == "replay"
    assert wait_for(pool_ready, 60), "the pool never refilled"
    resumed = resume(api, sid)
    assert resumed["strategy"] == "replay" and resumed["differed"] == [], resumed
    hits = [
        line
        for line in api.get("/metrics").text.splitlines()
        if line.startswith('sbx_pool_claims_total{kernel="python3",result="hit"}')
    ]
    assert hits and hits[0].endswith(" 2.0"), f"create and resume not both warm: {hits}"
    assert text_of(run(api, sid, "print(v, open('n.txt').read())")) == "11 1\n"


def test_paused_and_resumed_sessions_leave_no_kernel_sockets_open(start_gateway, engine):
    """A kernel's guards listen per sandbox; each pause used to leave five of them open for good."""
    gw = start_gateway("--pool", "python3=1")
    api = gw.client
    pool_ready = lambda: api.get("/healthz").json()["pool_ready"]["python3"] >= 1  # noqa: E731
    for resumed in (True, False):  # warm into the pool, or deleted while paused
        assert wait_for(pool_ready, 60), "the pool never filled"
        sid = api.post("/v1/sessions", json={}).json()["id"]
        run(api, sid, "x = 1")
        pause(api, sid, strategy="namespace")
        if resumed:
            assert wait_for(pool_ready, 60), "the pool never refilled"
            resume(api, sid)
            assert text_of(run(api, sid, "print(x)")) == "1\n"
        assert api.delete(f"/v1/sessions/{sid}").status_code == 204
    assert wait_for(pool_ready, 60), "the pool never refilled"
    labelled = engine.containers.list(filters={"label": f"sbx.gateway={gateway_id(gw.data_dir)}"})
    running = {c.labels["sbx.session"] for c in labelled}
    sessions = gw.data_dir / "sessions"
    held = {Path(path).relative_to(sessions).parts[0] for path in unix_sockets_under(str(sessions))}
    assert held <= running, f"sockets still open for sandboxes gone: {held - running}"


def test_a_frozen_session_that_ends_leaves_no_kernel_sockets_open(gateway, api, new_session):
    """Its end skipped the kernel's shutdown as a saved pause's does: its guards stayed open."""
    sid = new_session()["id"]
    run(api, sid, "x = 1")
    assert pause(api, sid)["strategy"] == "freeze"
    assert api.delete(f"/v1/sessions/{sid}").status_code == 204
    held = lambda: unix_sockets_under(str(gateway.data_dir / "sessions" / sid))  # noqa: E731
    assert wait_for(lambda: not held(), 5), f"sockets still open for a sandbox gone: {held()}"


def test_a_gateway_killed_between_the_engine_and_the_record_finds_each_sandbox_as_recorded(
    start_gateway, engine
):
    """Killed after a thaw, before its record said so: the sandbox ran on while paused and
    the resume's thaw of a running one marked it dead. Killed after a freeze, before its
    record said so: the idle session's frozen kernel never answered and it died."""
    first = start_gateway(keep_sessions=True)
    thawed, frozen = (first.client.post("/v1/sessions", json={}).json()["id"] for _ in range(2))
    for sid in (thawed, frozen):
        run(first.client, sid, "kept = 'yes'")
    pause(first.client, thawed)
    first.stop(signal.SIGKILL)
    engine.containers.get(f"sbx-{thawed}").unpause()  # what the engine did, not the record
    engine.containers.get(f"sbx-{frozen}").pause()
    second = start_gateway(data_dir=first.data_dir)
    api = second.client
    assert api.get(f"/v1/sessions/{thawed}").json()["state"] == "paused"
    assert engine.containers.get(f"sbx-{thawed}").status == "paused", "it runs while paused"
    for sid in (thawed, frozen):
        assert text_of(run(api, sid, "print(kept)")) == "yes\n"


def test_a_frozen_session_whose_sandbox_went_restarts(api, engine, session):
    sid = session["id"]
    pause(api, sid)
    engine.containers.get(f"sbx-{sid}").remove(force=True)
    r = api.post(f"/v1/sessions/{sid}/restart")
    assert r.status_code == 200 and r.json()["state"] == "idle", r.text
    assert text_of(run(api, sid, "print(6 * 7)")) == "42\n"


def test_a_command_running_when_its_sandbox_freezes_still_ends_at_its_timeout(api, session):
    """Its kill at the timeout met a frozen sandbox: a 500, and it ran on once resumed."""
    sid = session["id"]
    answers: list = []

    def command() -> None:
        body = {"command": "sleep 30", "timeout": 2}
        answers.append(api.post(f"/v1/sessions/{sid}/commands", json=body, timeout=30))

    running = threading.Thread(target=command)
    running.start()
    time.sleep(0.5)
    pause(api, sid)
    running.join(30)
    (r,) = answers
    assert r.status_code == 200 and r.json()["timed_out"], r.text
    resume(api, sid)
    ps = lambda: api.post(f"/v1/sessions/{sid}/commands", json={"command": "ps -eo args"})  # noqa: E731
    assert wait_for(lambda: "sleep 30" not in ps().json()["stdout"], 5), "it outlived its timeout"


def test_a_command_on_a_paused_session_resumes_it_first(api, session):
    """As an execute does: E2B's auto_resume wakes a sandbox for its commands too."""
    sid = session["id"]
    run(api, sid, "x = 5")
    for strategy in ("freeze", "namespace"):
        pause(api, sid, strategy=strategy)
        r = api.post(f"/v1/sessions/{sid}/commands", json={"command": "echo hi"})
        assert r.status_code == 200 and r.json()["stdout"] == "hi\n", r.text
        assert api.get(f"/v1/sessions/{sid}").json()["state"] == "idle"
    assert text_of(run(api, sid, "print(x)")) == "5\n"
