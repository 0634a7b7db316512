"""Sessions on a real multi-node Swarm: every core behaviour with kernels on each worker.

The gateway runs as a service on the manager; kernels are one-task services on
the workers, reached over the internal overlay (CurveZMQ + HMAC). The last
test stops a worker's engine: its sessions die with the reason, the rest
keep working.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import httpx
import pytest
from helpers import SCHEDULING_CLASSES, closed, text_of
from tornado.websocket import websocket_connect

# The first test's setup builds the swarm and pushes the images: minutes, not seconds.
pytestmark = [pytest.mark.docker, pytest.mark.cluster, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]


def run(api: httpx.Client, sid: str, code: str, **kw) -> dict:
    r = api.post(f"/v1/sessions/{sid}/execute", json={"code": code, **kw})
    assert r.status_code == 200, f"execute answered {r.status_code}: {r.text}"
    return r.json()


def stdout(reply: dict) -> str:
    return "".join(o["text"] for o in reply["outputs"] if o.get("name") == "stdout")


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def test_warm_pool_is_spread_over_the_workers_and_serves_creates(cluster):
    """Runs first: the pool the gateway filled at start holds one kernel on each worker."""
    pooled = cluster.manager.api.services(filters={"label": "sbx.session"})
    nodes = sorted(cluster.node_of(s["Spec"]["Labels"]["sbx.session"]) for s in pooled)
    assert nodes == ["w1", "w2"], f"pooled kernels run on {nodes}"
    with cluster.client as api:
        r = api.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        metrics = api.get("/metrics").text
        api.delete(f"/v1/sessions/{r.json()['id']}")
    assert 'sbx_pool_claims_total{kernel="python3",result="hit"} 1.0' in metrics, metrics


@pytest.fixture(scope="module")
def placed(cluster) -> dict[str, str]:
    """One session per worker (sessions spread over the nodes): worker -> session id."""
    by_node: dict[str, str] = {}
    with cluster.client as api:
        for _ in range(6):
            r = api.post("/v1/sessions", json={"metadata": {"suite": "cluster"}})
            assert r.status_code == 201, f"create failed: {r.status_code} {r.text}"
            sid = r.json()["id"]
            node = cluster.node_of(sid)
            assert node in ("w1", "w2"), f"session {sid} runs on {node}, not on a worker"
            if node in by_node:
                api.delete(f"/v1/sessions/{sid}")
            else:
                by_node[node] = sid
            if len(by_node) == 2:
                return by_node
    raise AssertionError(f"sessions did not spread over both workers: {by_node}")


@pytest.mark.parametrize("worker", ["w1", "w2"])
def test_execute_keeps_state_on_each_worker(api, placed, worker):
    sid = placed[worker]
    assert run(api, sid, "x = 41")["status"] == "ok"
    reply = run(api, sid, "import socket; print(socket.gethostname()); x + 1")
    assert reply["status"] == "ok", reply
    assert reply["outputs"][-1]["data"]["text/plain"] == "42"
    record = api.get(f"/v1/sessions/{sid}").json()
    assert record["state"] == "idle" and record["kernel"] == "python3"


def test_a_workers_kernel_runs_as_batch_work(api, placed):
    """As on one host: the agent and the kernel it starts never preempt on waking."""
    out = text_of(run(api, placed["w1"], SCHEDULING_CLASSES)).strip()
    assert out == "[3]", f"scheduling classes of the sandbox's threads: {out} (3 is SCHED_BATCH)"


@pytest.mark.parametrize("worker", ["w1", "w2"])
def test_stream_events_arrive_as_they_happen(cluster, placed, worker):
    code = "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.5)"

    async def scenario() -> list[tuple[float, dict]]:
        ws = await websocket_connect(cluster.ws_url(f"/v1/sessions/{placed[worker]}/stream"))
        ws.write_message(json.dumps({"type": "execute", "id": "c1", "code": code}))
        events = []
        while True:
            event = json.loads(await asyncio.wait_for(ws.read_message(), 60))
            events.append((time.monotonic(), event))
            if event["type"] == "done":
                await closed(ws)
                return events

    events = asyncio.run(scenario())
    ticks = [(at, e) for at, e in events if e["type"] == "stream"]
    assert [e["text"] for _, e in ticks] == ["tick 0\n", "tick 1\n", "tick 2\n"]
    assert ticks[-1][0] - ticks[0][0] > 0.7, "outputs came in one batch, not as they happened"
    assert events[-1][1]["status"] == "ok"


@pytest.mark.parametrize("worker", ["w1", "w2"])
def test_interrupt_stops_a_running_cell(cluster, api, placed, worker):
    sid = placed[worker]
    box: dict = {}

    def long_cell() -> None:
        with cluster.client as own:
            box["reply"] = run(own, sid, "import time; time.sleep(60)")

    thread = threading.Thread(target=long_cell)
    started = time.monotonic()
    thread.start()
    wait_for(lambda: api.get(f"/v1/sessions/{sid}").json()["state"] == "busy", 20, "busy")
    time.sleep(0.5)
    assert api.post(f"/v1/sessions/{sid}/interrupt").status_code == 200
    thread.join(30)
    assert box["reply"]["status"] == "interrupted", box
    assert time.monotonic() - started < 30
    assert run(api, sid, "x")["outputs"][-1]["data"]["text/plain"] == "41", "state was lost"


@pytest.mark.parametrize("worker", ["w1", "w2"])
def test_files_round_trip_through_the_sandbox(api, placed, worker):
    sid = placed[worker]
    data = bytes(range(256)) * 4096  # 1 MiB: several chunks each way
    r = api.put(f"/v1/sessions/{sid}/files/in/data.bin", content=data)
    assert r.status_code == 201, r.text
    reply = run(
        api, sid,
        "d = open('in/data.bin', 'rb').read(); open('out.txt', 'w').write(str(len(d)))",
    )  # fmt: skip
    assert reply["status"] == "ok", reply
    assert [a["path"] for a in reply["artifacts"]] == ["out.txt"]
    assert api.get(f"/v1/sessions/{sid}/files/out.txt").content == str(len(data)).encode()
    assert api.get(f"/v1/sessions/{sid}/files/in/data.bin").content == data
    listing = api.get(f"/v1/sessions/{sid}/files", params={"path": "in"}).json()
    assert [(e["name"], e["size"]) for e in listing["entries"]] == [("data.bin", len(data))]
    archive = api.get(f"/v1/sessions/{sid}/files", params={"format": "tar"})
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        assert sorted(tar.getnames()) == ["in/data.bin", "out.txt"]
    # The same walls as on one host: no way out of the workspace, links never followed.
    assert run(api, sid, "import os; os.symlink('/etc/passwd', 'link')")["status"] == "ok"
    assert api.get(f"/v1/sessions/{sid}/files/link").status_code == 403
    assert api.get(f"/v1/sessions/{sid}/files/..%2F..%2Fetc%2Fpasswd").status_code == 400
    r = api.post(f"/v1/sessions/{sid}/files", params={"path": "batch"},
                 files={"f": ("a.txt", b"abc")})  # fmt: skip
    sha = hashlib.sha256(b"abc").hexdigest()
    assert r.status_code == 201, r.text
    assert r.json()["files"] == [{"path": "batch/a.txt", "size": 3, "sha256": sha}]
    assert api.delete(f"/v1/sessions/{sid}/files/in/data.bin").status_code == 204
    assert api.get(f"/v1/sessions/{sid}/files/in/data.bin").status_code == 404


@pytest.mark.parametrize("worker", ["w1", "w2"])
def test_notebook_export_and_history(api, placed, worker):
    sid = placed[worker]
    notebook = api.get(f"/v1/sessions/{sid}/notebook").json()
    sources = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    assert "x = 41" in sources
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    assert len(api.get(f"/v1/sessions/{sid}/history").json()["executions"]) >= 2


@pytest.mark.parametrize("worker", ["w1", "w2"])
def test_restart_in_place_keeps_the_workspace(api, placed, worker):
    sid = placed[worker]
    assert api.put(f"/v1/sessions/{sid}/files/keep.txt", content=b"kept").status_code == 201
    r = api.post(f"/v1/sessions/{sid}/restart")
    assert r.status_code == 200 and r.json()["state"] == "idle", r.text
    reply = run(api, sid, "print(open('keep.txt').read()); 'x' in dir()")
    assert stdout(reply) == "kept\n"
    assert reply["outputs"][-1]["data"]["text/plain"] == "False", "the kernel was not fresh"
    run(api, sid, "x = 41")


def test_out_of_memory_is_the_reason_on_each_worker(cluster, api):
    hogs = {}
    for _ in range(6):
        r = api.post("/v1/sessions", json={"limits": {"memory": "256m"}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        node = cluster.node_of(sid)
        if node in hogs:
            api.delete(f"/v1/sessions/{sid}")
            continue
        hogs[node] = sid
        if len(hogs) == 2:
            break
    assert sorted(hogs) == ["w1", "w2"], hogs
    for node, sid in hogs.items():
        reply = run(api, sid, "b = bytearray(1024 * 2**20)")
        assert reply["status"] == "dead", f"{node}: {reply}"
        record = api.get(f"/v1/sessions/{sid}").json()
        assert record["state"] == "dead"
        assert record["reason"] == "out of memory: limit 256 MiB", f"{node}: {record}"
        # Dead but not gone: its files stay readable, and a restart brings it back.
        assert api.get(f"/v1/sessions/{sid}/files").status_code == 200
        assert api.post(f"/v1/sessions/{sid}/restart").status_code == 200
        assert run(api, sid, "1 + 1")["outputs"][-1]["data"]["text/plain"] == "2"
        api.delete(f"/v1/sessions/{sid}")


def test_an_exiting_kernel_dies_with_its_exit_code(api, placed):
    sid = placed["w2"]
    reply = run(api, sid, "import os; os._exit(3)")
    assert reply["status"] == "dead", reply
    record = api.get(f"/v1/sessions/{sid}").json()
    assert record["reason"] == "kernel process exited with code 3", record
    assert api.post(f"/v1/sessions/{sid}/restart").status_code == 200
    run(api, sid, "x = 41")


def test_ttl_ends_the_session_and_removes_its_service(cluster, api):
    r = api.post("/v1/sessions", json={"ttl": 3})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert cluster.manager.api.services(filters={"name": f"sbx-{sid}"})
    record = wait_for(
        lambda: (doc := api.get(f"/v1/sessions/{sid}").json())["state"] == "deleted" and doc,
        20,
        "the ttl ending the session",
    )
    assert record["reason"].startswith("ttl expired after 3 s")
    assert not cluster.manager.api.services(filters={"name": f"sbx-{sid}"})


# Run in a kernel: whether each (host, port) answers a ZeroMQ greeting, or why not.
PROBE = """
import json, socket
found = {}
for host, port in json.loads(TARGETS):
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.sendall(bytes([255] + [0] * 8 + [127, 3]))
            answer = sock.recv(64)
            found[f"{host}:{port}"] = f"answered {answer!r}" if answer else "closed"
    except OSError as e:
        found[f"{host}:{port}"] = type(e).__name__
print(json.dumps(found))
"""


def _overlay_address(cluster, service: str) -> str:
    """The running task's address on the kernel overlay."""
    for task in cluster.manager.api.tasks(filters={"service": service}):
        if task["Status"]["State"] != "running":
            continue
        for attachment in task.get("NetworksAttachments") or []:
            if attachment["Network"]["Spec"]["Name"] == "sbx-kernels":
                return attachment["Addresses"][0].partition("/")[0]
    raise AssertionError(f"service {service} has no running task on sbx-kernels")


def test_the_overlay_carries_only_gateway_to_sandbox_traffic(cluster, api, placed):
    """A kernel reaches neither the gateway's API nor another session's agent or kernel."""
    attacker, victim = placed["w1"], placed["w2"]
    gateway = _overlay_address(cluster, "sbx_gateway")
    other = _overlay_address(cluster, f"sbx-{victim}")
    targets = [[gateway, 8765], ["sbx_gateway", 8765], ["tasks.sbx_gateway", 8765]]
    targets += [[host, port] for host in (other, f"sbx-{victim}") for port in range(50000, 50006)]
    code = f"TARGETS = {json.dumps(json.dumps(targets))}\n{PROBE}"
    reply = run(api, attacker, code, timeout=120)
    assert reply["status"] == "ok", reply
    found = json.loads(stdout(reply))
    answered = {target: answer for target, answer in found.items() if "answered" in answer}
    assert not answered, f"a kernel got answers from {answered} (all: {found})"
    gateway_api = [found[f"{host}:8765"] for host in (gateway, "tasks.sbx_gateway")]
    assert gateway_api == ["ConnectionRefusedError"] * 2, f"the gateway's API: {found}"
    assert stdout(run(api, attacker, "print(open('/proc/net/if_inet6').read())")) == "\n", "IPv6"
    # The walls stop sandboxes only: the gateway still reaches both sessions.
    assert run(api, victim, "x + 1")["outputs"][-1]["data"]["text/plain"] == "42"
    assert run(api, attacker, "x + 1")["outputs"][-1]["data"]["text/plain"] == "42"


def test_gateway_restart_reattaches_to_running_services(cluster, api, placed):
    sid = placed["w1"]
    run(api, sid, "y = 'survives'")
    old = {t["ID"] for t in cluster.manager.api.tasks(filters={"service": "sbx_gateway"})}
    cluster.manager.services.get("sbx_gateway").force_update()
    wait_for(lambda: _new_gateway_answers(cluster, old), 180, "the restarted gateway answering")
    reply = run(api, sid, "y")
    assert reply["outputs"][-1]["data"]["text/plain"] == "'survives'", reply


def _new_gateway_answers(cluster, old: set[str]) -> bool:
    """Whether a new gateway task (not one of ``old``) runs, alone, and answers."""
    tasks = cluster.manager.api.tasks(filters={"service": "sbx_gateway"})
    running = [t["ID"] for t in tasks if t["Status"]["State"] == "running"]
    if len(running) != 1 or running[0] in old:
        return False
    try:
        with cluster.client as api:
            return api.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def test_a_killed_replica_s_stream_client_goes_on_through_another(cluster, replicated):
    """Two gateway replicas on PostgreSQL; the one owning a session is killed mid-cell.

    The client reconnects (to the mesh) with its last event id and the
    session answers through the other replica, which adopted it: its kernel,
    and so its variables, kept. The killed replica, started again by Swarm on
    its data volume, leaves the adopted session's service alone.
    """
    with replicated.client as api:
        r = api.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert run(api, sid, "x = 41")["status"] == "ok"
    owner, address = replicated.owner(sid)
    victim = replicated.container_at(address)
    code = "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(.2)"

    async def read_until(ws, done) -> list[dict]:
        events = []
        while True:
            raw = await asyncio.wait_for(ws.read_message(), 60)
            assert raw is not None, f"the stream closed; events so far: {events}"
            events.append(json.loads(raw))
            if done(events[-1]):
                return events

    async def scenario() -> tuple[list[dict], float]:
        ws = await websocket_connect(replicated.ws_url(f"/v1/sessions/{sid}/stream"))
        ws.write_message(json.dumps({"type": "execute", "id": "long", "code": code}))
        seen = await read_until(ws, lambda e: e["type"] == "stream")
        await asyncio.to_thread(cluster.manager.api.kill, victim)
        killed, refused = time.monotonic(), []
        ws.close()  # as the client finds its connection dropped
        while True:  # as a client would: reconnect until the stream is back
            assert time.monotonic() - killed < 60, f"no stream back in 60 s: {refused[-3:]}"
            url = replicated.ws_url(
                f"/v1/sessions/{sid}/stream", last_event_id=seen[-1]["event_id"]
            )
            try:  # a gateway passing it on to the dead owner accepts, then closes
                ws = await websocket_connect(url, connect_timeout=5)
                first = await asyncio.wait_for(ws.read_message(), 10)
                if first is not None:
                    break
                refused.append(f"{time.monotonic() - killed:.1f} closed")
            except Exception as e:  # the owner is gone, then its lease runs out
                refused.append(f"{time.monotonic() - killed:.1f} {e!r}")
            await asyncio.sleep(0.25)
        resumed, resumed_at = json.loads(first), time.monotonic() - killed
        assert resumed["type"] == "gap", f"the stream's first event after the kill: {resumed}"
        ws.write_message(json.dumps({"type": "execute", "id": "after", "code": "print(x + 1)"}))
        after = await read_until(ws, lambda e: e["type"] == "done" and e.get("id") == "after")
        answered = time.monotonic() - killed
        print(f"\nrefused while the owner was gone: {refused}; resumed at {resumed_at:.1f} s")
        await closed(ws)
        return after, answered

    after, answered = asyncio.run(scenario())
    printed = "".join(e.get("text", "") for e in after if e.get("id") == "after")
    assert after[-1]["status"] == "ok" and printed == "42\n", f"after the kill: {after}"
    # A lease (3 s) runs out, the other adopts within a third of one, clients retry.
    assert answered < 10, f"the session answered again {answered:.1f} s after the kill"
    new_owner, _ = replicated.owner(sid)
    assert new_owner != owner, "the session answered only once its own replica came back"
    print(f"\nsession answered through the other replica {answered:.1f} s after the kill")
    # The killed replica comes back on its data volume (its gateway id) and
    # leaves alone the service of the session the other one adopted.
    wait_for(lambda: len(replicated.tasks()) == 2 and victim not in str(replicated.tasks()),
             120, "the killed replica started again")  # fmt: skip
    time.sleep(5)  # its recovery has run
    with replicated.client as api:
        for _ in range(4):  # through either replica
            assert stdout(run(api, sid, "print(x)")) == "41\n"
    assert cluster.manager.api.services(filters={"name": f"sbx-{sid}"}), "its service was reaped"
    # The cell the killed replica ran was interrupted on adoption, its outputs so far kept.
    with replicated.client as api:
        executions = api.get(f"/v1/sessions/{sid}/history").json()["executions"]
    cut = [e for e in executions if e["status"] == "interrupted_by_gateway_restart"]
    assert len(cut) == 1, executions
    cut = cut[0]
    assert "tick 0" in "".join(o.get("text", "") for o in cut["outputs"]), cut
    # Its new owner restarts its kernel in place (the connection file is written here now).
    with replicated.client as api:
        r = api.post(f"/v1/sessions/{sid}/restart")
        assert r.status_code == 200 and r.json()["state"] == "idle", r.text
        assert stdout(run(api, sid, "print('x' in dir())")) == "False\n"


def test_a_lost_node_kills_its_sessions_only(cluster, api, placed):
    """Runs last: it stops worker w2's engine."""
    lost, kept = placed["w2"], placed["w1"]
    subprocess.run(["scripts/cluster", "stop-node", "w2"], cwd=ROOT, check=True, timeout=120)
    record = wait_for(
        lambda: (doc := api.get(f"/v1/sessions/{lost}").json())["state"] == "dead" and doc,
        60,
        "the session on the stopped node being reported dead",
    )
    assert "node w2 was lost" in record["reason"], record
    r = api.post(f"/v1/sessions/{lost}/execute", json={"code": "1"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "kernel_died", r.text
    assert run(api, kept, "x + 1")["outputs"][-1]["data"]["text/plain"] == "42"
    r = api.post("/v1/sessions", json={})
    assert r.status_code == 201, r.text
    assert cluster.node_of(r.json()["id"]) == "w1", "a new session went to the lost node"
