"""Gateway restarts and crashes: sessions survive, nothing is lost or leaked.

These drive real gateway processes, stopped with SIGTERM or killed with
SIGKILL, and new ones started on the same data directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from helpers import (
    closed,
    execute_request,
    full_history,
    gateway_id,
    run,
    run_over_channels,
    text_of,
    wait_for,
)
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.docker


def make_sessions(gw, n: int) -> list[str]:
    """``n`` sessions, each holding ``x`` = its index times ten."""
    ids = []
    for i in range(n):
        r = gw.client.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
        run(gw.client, ids[-1], f"x = {i * 10}")
    return ids


def assert_state_kept(gw, ids: list[str]) -> None:
    for i, sid in enumerate(ids):
        session = gw.client.get(f"/v1/sessions/{sid}").json()
        assert session["state"] == "idle", f"session {sid} after the restart: {session}"
        assert text_of(run(gw.client, sid, "print(x)")) == f"{i * 10}\n", (
            f"session {sid} lost its variable across the gateway restart"
        )
    kernels = {k["id"] for k in gw.client.get("/api/kernels").json()}
    assert set(ids) <= kernels, "the Jupyter API does not list the reattached kernels"
    seen = asyncio.run(
        run_over_channels(gw.ws_url(f"/api/kernels/{ids[-1]}/channels"), "print(x + 1)")
    )
    streams = [m["content"]["text"] for m in seen if m["msg_type"] == "stream"]
    assert streams == [f"{(len(ids) - 1) * 10 + 1}\n"], seen


@pytest.mark.parametrize(
    "how, backend",
    [(signal.SIGTERM, "sqlite"), (signal.SIGKILL, "sqlite"), (signal.SIGKILL, "postgres")],
    ids=["graceful", "crash", "crash-postgres"],
)
def test_restart_keeps_five_sessions_and_their_state(start_gateway, request, how, backend):
    store = (
        ()
        if backend == "sqlite"
        else ("--database-url", request.getfixturevalue("postgres").database())
    )
    first = start_gateway(*store, keep_sessions=True)
    ids = make_sessions(first, 5)
    first.stop(how)
    if how == signal.SIGTERM:
        assert first.proc.returncode == 0, first.tail()
        assert "keeping 5 session(s)" in first.tail()
    second = start_gateway(*store, data_dir=first.data_dir)
    assert_state_kept(second, ids)


def test_crash_during_a_long_cell_keeps_what_it_printed(start_gateway):
    first = start_gateway(keep_sessions=True)
    sid = make_sessions(first, 1)[0]
    code = "import time\nprint('before', flush=True)\ntime.sleep(60)\nprint('after')"

    def execute() -> None:  # its connection dies with the gateway
        with httpx.Client(base_url=first.url, timeout=90, headers=first.client.headers) as own:
            try:
                own.post(f"/v1/sessions/{sid}/execute", json={"code": code})
            except httpx.HTTPError:
                pass

    thread = threading.Thread(target=execute)
    thread.start()

    def printed_before() -> bool:
        last = first.client.get(f"/v1/sessions/{sid}/history").json()["executions"][-1]
        return last["status"] == "running" and text_of(last) == "before\n"

    assert wait_for(printed_before, timeout=20), "the running cell's output was not recorded"
    first.stop(signal.SIGKILL)
    thread.join(10)
    second = start_gateway(data_dir=first.data_dir)
    last = second.client.get(f"/v1/sessions/{sid}/history").json()["executions"][-1]
    assert last["status"] == "interrupted_by_gateway_restart", last
    assert text_of(last) == "before\n" and last["error"]["ename"] == "GatewayRestarted"
    cell = second.client.get(f"/v1/sessions/{sid}/notebook").json()["cells"][-1]
    assert cell["metadata"]["sbx"]["status"] == "interrupted_by_gateway_restart"
    assert cell["outputs"][0]["text"] == "before\n"
    started = time.monotonic()
    assert text_of(run(second.client, sid, "print(x)")) == "0\n"
    assert time.monotonic() - started < 10, "the cut cell kept the kernel busy"


def test_what_changed_while_the_gateway_was_down_is_reported(start_gateway, engine):
    first = start_gateway(keep_sessions=True)
    stopped, removed, expiring = make_sessions(first, 3)
    first.client.patch(f"/v1/sessions/{expiring}", json={"ttl": 1})
    image = first.client.get(f"/v1/sessions/{stopped}").json()["image"]
    first.stop()
    engine.containers.get(f"sbx-{stopped}").kill()
    engine.containers.get(f"sbx-{removed}").remove(force=True)
    stray = engine.containers.run(
        image,
        entrypoint=["sleep"],
        command=["300"],
        labels={"sbx.gateway": gateway_id(first.data_dir), "sbx.session": "stray"},
        network_mode="none",
        detach=True,
    )
    second = start_gateway(data_dir=first.data_dir)
    state = lambda sid: second.client.get(f"/v1/sessions/{sid}").json()  # noqa: E731
    assert state(stopped)["state"] == "dead"
    assert "killed by signal 9" in state(stopped)["reason"]
    assert "while the gateway was down" in state(stopped)["reason"]
    assert state(removed)["state"] == "dead" and "removed" in state(removed)["reason"]
    assert second.client.post(f"/v1/sessions/{removed}/restart").status_code == 200
    assert run(second.client, removed, "1 + 1")["status"] == "ok"
    assert state(expiring)["state"] == "deleted" and "ttl expired" in state(expiring)["reason"]
    assert not engine.containers.list(all=True, filters={"name": f"sbx-{expiring}"})
    assert not engine.containers.list(all=True, filters={"id": stray.id}), "a stray was left"


def test_a_workspace_unmounted_while_the_gateway_was_down_is_mounted_again(start_gateway, engine):
    """As after a host reboot: the container stopped, the workspace's loop mount gone."""
    first = start_gateway(keep_sessions=True)
    sid = make_sessions(first, 1)[0]
    assert first.client.put(f"/v1/sessions/{sid}/files/keep.txt", content=b"keep").is_success
    first.stop()
    engine.containers.get(f"sbx-{sid}").kill()
    mountpoint = first.data_dir / "sessions" / sid / "workspace"
    assert os.path.ismount(mountpoint), "workspaces are loop-mounted only when run as root"
    subprocess.run(["umount", str(mountpoint)], check=True)
    second = start_gateway(data_dir=first.data_dir)
    assert second.client.get(f"/v1/sessions/{sid}").json()["state"] == "dead"
    r = second.client.get(f"/v1/sessions/{sid}/files/keep.txt")
    assert r.content == b"keep", f"the dead session's file was lost after the restart: {r.text}"


def test_a_delete_cut_short_by_a_crash_is_finished_at_the_restart(start_gateway, engine):
    """Killed after a delete removed the sandbox and its directory, before the record said so."""
    first = start_gateway(keep_sessions=True)
    sid = make_sessions(first, 1)[0]
    first.stop(signal.SIGKILL)
    engine.containers.get(f"sbx-{sid}").remove(force=True)
    directory = first.data_dir / "sessions" / sid
    if os.path.ismount(directory / "workspace"):
        subprocess.run(["umount", str(directory / "workspace")], check=True)
    subprocess.run(["rm", "-rf", str(directory)], check=True)
    second = start_gateway(data_dir=first.data_dir)
    session = second.client.get(f"/v1/sessions/{sid}").json()
    assert session["state"] == "deleted", f"left open after the restart: {session}"
    assert "cannot be restored" in session["reason"], session
    with sqlite3.connect(first.data_dir / "gateway.sqlite3") as db:
        row = db.execute("SELECT ended_at FROM sessions WHERE id = ?", (sid,)).fetchone()
    assert row[0] is not None, "the session's record stayed open"


def test_end_sessions_on_stop_removes_every_container(start_gateway, engine):
    gw = start_gateway()  # the fixture's default: --end-sessions-on-stop
    sid = gw.client.post("/v1/sessions", json={}).json()["id"]
    gw.stop()
    assert gw.proc.returncode == 0, gw.tail()
    assert "sessions end when it stops" in "".join(gw.log)
    assert not engine.containers.list(all=True, filters={"name": f"sbx-{sid}"})


def stream_url(gw, sid: str, **query: str) -> str:
    return gw.ws_url(f"/v1/sessions/{sid}/stream", **query)


async def read_until(ws, kind: str, seen: list[dict]) -> dict:
    while True:
        raw = await asyncio.wait_for(ws.read_message(), 30)
        assert raw is not None, f"the stream closed; events so far: {seen}"
        event = json.loads(raw)
        seen.append(event)
        if event["type"] == kind:
            return event


def test_stream_client_resumes_from_the_last_event_it_saw(gateway, session):
    code = "import time\nfor i in range(6):\n    print('tick', i, flush=True)\n    time.sleep(0.3)"

    async def scenario():
        seen: list[dict] = []
        ws = await websocket_connect(stream_url(gateway, session["id"]))
        ws.write_message(json.dumps({"type": "execute", "id": "c", "code": code}))
        last = await read_until(ws, "stream", seen)
        await closed(ws)
        await asyncio.sleep(0.5)  # ticks go on while the client is away
        ws = await websocket_connect(
            stream_url(gateway, session["id"], last_event_id=last["event_id"])
        )
        done = await read_until(ws, "done", seen)
        await closed(ws)
        stale = await websocket_connect(stream_url(gateway, session["id"], last_event_id="x-1"))
        gap = json.loads(await asyncio.wait_for(stale.read_message(), 10))
        await closed(stale)
        return seen, done, gap

    seen, done, gap = asyncio.run(scenario())
    assert done["status"] == "ok", "the cell was interrupted although the client came back"
    text = "".join(e.get("text", "") for e in seen)
    assert text == "".join(f"tick {i}\n" for i in range(6)), "events were lost or repeated"
    seqs = [int(e["event_id"].rsplit("-", 1)[1]) for e in seen]
    assert seqs == sorted(set(seqs)), seqs
    assert gap["type"] == "gap" and "history" in gap["message"]


def test_jupyter_client_gets_what_was_sent_while_it_was_away(gateway, session):
    url = gateway.ws_url(f"/api/kernels/{session['id']}/channels", session_id="client-1")
    request = execute_request("import time; time.sleep(0.3); print('while away')")

    async def scenario():
        ws = await websocket_connect(url)
        ws.write_message(json.dumps(request))
        await closed(ws)
        await asyncio.sleep(0.8)
        ws = await websocket_connect(url)
        seen = []
        while not any(m["msg_type"] == "execute_reply" for m in seen):
            msg = json.loads(await asyncio.wait_for(ws.read_message(), 30))
            if msg["parent_header"].get("msg_id") == request["header"]["msg_id"]:
                seen.append(msg)
        await closed(ws)
        return seen

    seen = asyncio.run(scenario())
    streams = [m["content"]["text"] for m in seen if m["msg_type"] == "stream"]
    assert streams == ["while away\n"], f"messages sent while away were not replayed: {seen}"


def test_store_stays_consistent_when_killed_under_write_load(start_gateway):
    first = start_gateway(keep_sessions=True)
    ids = make_sessions(first, 3)
    acknowledged: list[tuple[str, str]] = []
    stop = threading.Event()

    def hammer(sid: str) -> None:
        with httpx.Client(base_url=first.url, timeout=30, headers=first.client.headers) as own:
            n = 0
            while not stop.is_set():
                code = f"print({n!r} * 2000)"
                try:
                    r = own.post(f"/v1/sessions/{sid}/execute", json={"code": code})
                except httpx.HTTPError:
                    return  # the gateway is gone
                if r.status_code == 200:
                    acknowledged.append((sid, code))
                n += 1

    threads = [threading.Thread(target=hammer, args=(sid,)) for sid in ids]
    for t in threads:
        t.start()
    time.sleep(4)
    first.stop(signal.SIGKILL)
    stop.set()
    for t in threads:
        t.join(10)
    assert len(acknowledged) > 20, "too little load to mean anything"
    with sqlite3.connect(first.data_dir / "gateway.sqlite3") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    second = start_gateway(data_dir=first.data_dir)
    for sid in ids:
        history = full_history(second.client, sid)  # acknowledged ones may be past a page
        recorded = {h["code"] for h in history if h["status"] == "ok"}
        missing = [code for s, code in acknowledged if s == sid and code not in recorded]
        assert not missing, f"acknowledged executions lost in the crash: {missing[:3]}"
        assert all(h["status"] != "running" for h in history)


def test_churn_with_kills_and_a_crash_leaves_nothing_behind(start_gateway, engine):
    first = start_gateway("--max-sessions", "32", keep_sessions=True)
    data_dir = first.data_dir
    gateways = {"current": first}
    # 60 cold starts, each kernel a real container: kills (every 6th), a crash at half-way
    # and survivors (every 10th) all occur several times (100 took 70-100 s).
    total, created = 60, []
    give_up = time.monotonic() + 240  # a gateway that stopped answering fails the test, not CI

    def one(n: int) -> None:
        for _ in range(30):  # the gateway may be restarting: retry until it answers
            if time.monotonic() > give_up:
                return
            try:
                gw = gateways["current"]
                with httpx.Client(base_url=gw.url, timeout=60, headers=gw.client.headers) as client:
                    r = client.post("/v1/sessions", json={})
                    if r.status_code != 201:
                        raise AssertionError(r.text)
                    sid = r.json()["id"]
                    created.append(sid)
                    run(client, sid, "1 + 1")
                    if n % 6 == 0:
                        engine.containers.get(f"sbx-{sid}").kill()
                    if n % 10:  # every tenth lives on through the crash
                        client.delete(f"/v1/sessions/{sid}")
                return
            except (httpx.HTTPError, AssertionError):
                time.sleep(0.5)

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, n) for n in range(total)]
        wait_for(lambda: sum(f.done() for f in futures) >= total // 2, timeout=300)
        first.stop(signal.SIGKILL)
        gateways["current"] = start_gateway(
            "--max-sessions", "32", data_dir=data_dir, keep_sessions=True
        )
        for f in futures:
            f.result()
    assert len(set(created)) >= total, "some sessions were never created"
    gw = gateways["current"]
    for sid in [s["id"] for s in gw.client.get("/v1/sessions").json()["sessions"]]:
        assert gw.client.delete(f"/v1/sessions/{sid}").status_code == 204
    gid = gateway_id(data_dir)
    assert not engine.containers.list(all=True, filters={"label": f"sbx.gateway={gid}"})
    assert not list((data_dir / "sessions").iterdir()), "session directories were left"
    with open("/proc/mounts") as mounts:
        assert str(data_dir) not in mounts.read(), "workspaces are still mounted"
    with sqlite3.connect(data_dir / "gateway.sqlite3") as db:
        open_rows = db.execute("SELECT id, state FROM sessions WHERE ended_at IS NULL").fetchall()
    assert open_rows == [], f"sessions left in a live state: {open_rows}"


def test_a_code_context_after_a_gateway_restart_starts_empty_and_its_old_kernel_ends(
    start_gateway,
):
    first = start_gateway(keep_sessions=True)
    sid = make_sessions(first, 1)[0]
    context = first.client.post(f"/v1/sessions/{sid}/contexts", json={}).json()["id"]
    assert run(first.client, sid, "y = 1", context=context)["status"] == "ok"
    first.stop()
    second = start_gateway(data_dir=first.data_dir)
    view = second.client.get(f"/v1/sessions/{sid}/contexts/{context}").json()
    assert view["state"] == "stopped" and "gateway restarted" in view["stopped"], view
    again = run(second.client, sid, "print('y' in dir())", context=context)
    assert text_of(again) == "False\n" and "gateway restarted" in again["context"]["restarted"]
    count = (
        "import os\nn = 0\nfor p in os.listdir('/proc'):\n    try:\n"
        f"        n += 'context-{context}.json' in open(f'/proc/{{p}}/cmdline').read()\n"
        "    except OSError:\n        pass\nprint(n)"
    )
    assert text_of(run(second.client, sid, count)) == "1\n", "the old context kernel still runs"
    assert text_of(run(second.client, sid, "print(x)")) == "0\n"
