"""Several gateways on one shared PostgreSQL store: ownership, leases, faults.

Real gateway processes on the machine's engine, each with its own data
directory (and so its own id and containers), sharing a real PostgreSQL
server started by the tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import threading
import time
import urllib.parse
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
from helpers import PostgresServer, closed, run, run_over_channels, text_of, wait_for
from helpers import gateway_id as gateway_id_of
from tornado.websocket import websocket_connect

pytestmark = [pytest.mark.docker, pytest.mark.faults]

LEASE = "1.5"  # seconds: short, so the tests see leases run out quickly


@pytest.fixture
def database(postgres) -> str:
    return postgres.database()


def shared(start_gateway, database: str, *args: str, **kw):
    return start_gateway("--database-url", database, "--lease-ttl", LEASE, *args, **kw)


def new_session(gw) -> str:
    r = gw.client.post("/v1/sessions", json={})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_a_second_gateway_leaves_the_first_ones_sessions_alone(start_gateway, database):
    first = shared(start_gateway, database)
    sid = new_session(first)
    run(first.client, sid, "x = 41")
    second = shared(start_gateway, database)
    assert run(second.client, new_session(second), "1 + 1")["status"] == "ok"
    with psycopg.connect(database) as db:
        row = db.execute("SELECT state, doc FROM sessions WHERE id = %s", (sid,)).fetchone()
    assert row[0] == "idle", f"the second gateway took the first one's session: {row[1]}"
    reply = run(first.client, sid, "print(x + 1)")
    assert text_of(reply) == "42\n", (
        f"the first gateway's session broke when a second gateway started: {reply}"
    )
    assert first.client.get(f"/v1/sessions/{sid}").json()["state"] == "idle"


def test_a_gateway_that_loses_a_lease_stops_acting_for_the_session_at_once(
    start_gateway, database, engine
):
    gw = shared(start_gateway, database)
    sid = new_session(gw)
    run(gw.client, sid, "x = 1")
    box: dict = {}

    def slow_cell() -> None:
        with httpx.Client(base_url=gw.url, timeout=60, headers=gw.client.headers) as own:
            r = own.post(
                f"/v1/sessions/{sid}/execute", json={"code": "import time; time.sleep(30)"}
            )
            box["reply"] = (r.status_code, r.text)

    worker = threading.Thread(target=slow_cell)
    worker.start()
    time.sleep(0.5)
    with psycopg.connect(database, autocommit=True) as db:  # another gateway takes it over
        db.execute(
            "UPDATE leases SET owner = 'thief', expires_at = extract(epoch from now()) + 600"
            " WHERE session_id = %s",
            (sid,),
        )
        stolen = time.monotonic()
        worker.join(10)
        took = time.monotonic() - stolen
        assert not worker.is_alive() and took < float(LEASE) + 1, (
            f"the execute in flight still waited {took:.1f} s after the lease was taken"
        )
        assert "lease" in str(box["reply"]), box
        assert gw.client.post(f"/v1/sessions/{sid}/execute", json={"code": "x"}).status_code in (
            404,
            503,
        ), "the gateway still ran code for a session it no longer owns"
        time.sleep(float(LEASE))
        state = db.execute("SELECT state FROM sessions WHERE id = %s", (sid,)).fetchone()[0]
    assert state in ("idle", "busy"), f"the gateway wrote the session's record as {state}"
    container = engine.containers.get(f"sbx-{sid}")
    assert container.status == "running", "the gateway stopped a kernel it no longer owns"
    assert "lease" in gw.tail(200)


def test_an_open_session_whose_owner_is_gone_is_503_not_404_until_adopted(
    start_gateway, database, engine
):
    """Between a dead owner's lease running out and the adoption, clients are told to retry."""
    gw = shared(start_gateway, database)
    sid = new_session(gw)
    with psycopg.connect(database, autocommit=True) as db:  # its owner died, on another host
        db.execute(
            "UPDATE sessions SET runtime = jsonb_set(runtime::jsonb, '{session_dir}',"
            " '\"/nonexistent\"')::text WHERE id = %s",
            (sid,),
        )
        db.execute(
            "UPDATE leases SET owner = 'ghost', expires_at = extract(epoch from now()) - 1"
            " WHERE session_id = %s",
            (sid,),
        )
    try:
        time.sleep(2 * float(LEASE))  # gw lets go; it cannot adopt it (not on its host)
        r = gw.client.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "owner_unavailable", r.text
        assert r.headers.get("Retry-After"), r.headers
        r = gw.client.get(f"/v1/sessions/{new_session(gw)}x")  # an unknown one is still a 404
        assert r.status_code == 404, r.text
    finally:
        engine.containers.get(f"sbx-{sid}").remove(force=True)


async def stream_then_resume_elsewhere(first, second, sid: str):
    """Start a cell on the agent stream of ``first``, leave, resume on ``second``."""
    code = "import time\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.3)"
    seen: list[dict] = []

    async def until(ws, kind: str) -> dict:
        while True:
            raw = await asyncio.wait_for(ws.read_message(), 30)
            assert raw is not None, f"the stream closed; events so far: {seen}"
            seen.append(json.loads(raw))
            if seen[-1]["type"] == kind:
                return seen[-1]

    ws = await websocket_connect(first.ws_url(f"/v1/sessions/{sid}/stream"))
    ws.write_message(json.dumps({"type": "execute", "id": "c", "code": code}))
    last = await until(ws, "stream")
    await closed(ws)
    url = second.ws_url(f"/v1/sessions/{sid}/stream", last_event_id=last["event_id"])
    ws = await websocket_connect(url)
    done = await until(ws, "done")
    await closed(ws)
    return "".join(e.get("text", "") for e in seen), seen, done


def together(start, n: int = 2) -> list:
    """``n`` gateways started at once (each takes seconds to come up)."""
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: start(), range(n)))


def deployment(start_gateway, database: str) -> list:
    """Two gateways on the store sharing one token, as the gateways of a deployment do."""
    token = "shared-token-of-the-deployment"
    gateways = together(lambda: shared(start_gateway, database, env={"SBX_TOKEN": token}))
    for gw in gateways:
        gw.client.headers["Authorization"] = f"Bearer {token}"
        gw.token = token
    return gateways


def test_any_gateway_answers_for_any_session(start_gateway, database):
    owner, other = deployment(start_gateway, database)
    sid = new_session(owner)
    run(owner.client, sid, "x = 20")
    reply = run(other.client, sid, "x += 1; print(x)")
    assert text_of(reply) == "21\n", f"an execute through the other gateway: {reply}"
    session = other.client.get(f"/v1/sessions/{sid}")
    assert session.status_code == 200 and session.json()["id"] == sid, session.text
    history = other.client.get(f"/v1/sessions/{sid}/history").json()
    assert [e["code"] for e in history["executions"]] == ["x = 20", "x += 1; print(x)"]
    seen = asyncio.run(
        run_over_channels(other.ws_url(f"/api/kernels/{sid}/channels"), "print(x * 2)")
    )
    streams = [m["content"]["text"] for m in seen if m["msg_type"] == "stream"]
    assert streams == ["42\n"], f"the Jupyter channels through the other gateway: {seen}"
    ticks, seen, done = asyncio.run(stream_then_resume_elsewhere(owner, other, sid))
    assert done["status"] == "ok" and ticks == "".join(f"tick {i}\n" for i in range(5)), (
        f"a stream client that reconnected to another gateway did not continue: {seen}"
    )
    assert other.client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert owner.client.get(f"/v1/sessions/{sid}").json()["state"] == "deleted"


def connections_to(gw, port: int) -> set[int]:
    """The local ports of ``gw``'s open TCP connections to ``port``."""
    return {
        c.laddr.port
        for c in psutil.Process(gw.pid).net_connections("tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    }


def test_a_forwarding_gateway_keeps_one_connection_to_the_owner(start_gateway, database):
    owner, other = deployment(start_gateway, database)
    sid = new_session(owner)
    run(owner.client, sid, "x = 1")
    port = urllib.parse.urlsplit(owner.url).port
    seen = set()
    for n in range(5):
        assert text_of(run(other.client, sid, "x += 1; print(x)")) == f"{n + 2}\n"
        seen |= connections_to(other, port)
    assert len(seen) == 1 and connections_to(other, port) == seen, (
        f"each forwarded request opened its own connection to the owner: ports {seen}"
    )
    time.sleep(0.5)  # audit rows are written in batches
    with psycopg.connect(database) as db:
        audited = db.execute(
            "SELECT count(*) FROM audit WHERE action = 'session.execute' AND session_id = %s",
            (sid,),
        ).fetchone()[0]
    assert audited == 6, f"6 executes, {audited} audit events: the forwarder audited them too"
    # A reply the owner streams (chunked) comes through whole.
    export = other.client.get(f"/v1/sessions/{sid}/notebook")
    assert export.status_code == 200, export.text
    assert export.headers["content-type"] == "application/x-ipynb+json"
    direct = owner.client.get(f"/v1/sessions/{sid}/notebook")
    assert export.json()["cells"] == direct.json()["cells"]
    owner.stop(signal.SIGKILL)  # its kept connection dies with it: the next request says so
    started = time.monotonic()
    r = other.client.post(f"/v1/sessions/{sid}/execute", json={"code": "print(x)"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "owner_unavailable", r.text
    assert time.monotonic() - started < 5, "the forwarder hung on a dead owner's connection"


def test_an_unreachable_database_is_a_clear_503_while_executes_in_flight_finish(start_gateway):
    server = PostgresServer()  # its own: this test stops it
    try:
        gw = start_gateway("--database-url", server.database(), "--lease-ttl", "20")
        sid = new_session(gw)
        run(gw.client, sid, "x = 1")
        box: dict = {}

        def slow_cell() -> None:
            with httpx.Client(base_url=gw.url, timeout=60, headers=gw.client.headers) as own:
                code = "import time; time.sleep(4); print(x + 1)"
                r = own.post(f"/v1/sessions/{sid}/execute", json={"code": code})
                box["reply"] = (r.status_code, r.json())

        worker = threading.Thread(target=slow_cell)
        worker.start()
        time.sleep(1)
        server.stop("kill")
        refused = gw.client.post("/v1/sessions", json={})
        worker.join(30)
        status, reply = box["reply"]
        assert status == 200 and text_of(reply) == "2\n", (
            f"an execute in flight when the database went away did not finish: {status} {reply}"
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "store_unavailable", refused.text
        assert "database" in refused.json()["error"]["message"]
        server.start()
        back = wait_for(lambda: gw.client.get(f"/v1/sessions/{sid}").status_code == 200)
        assert back, "the gateway did not come back when its database did"
        assert text_of(run(gw.client, sid, "print(x)")) == "1\n"
    finally:
        server.remove()


def worker_pid(gw, gateway_id: str) -> int:
    """The process of the worker of ``sbx serve --workers`` whose id is ``gateway_id``."""
    data_dir = next(d for d in gw.data_dir.glob("worker-*") if gateway_id_of(d) == gateway_id)
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if str(data_dir).encode() in (proc / "cmdline").read_bytes().split(b"\0"):
                return int(proc.name)
    raise AssertionError(f"no worker runs on {data_dir}")


def test_workers_share_one_port_and_a_crashed_one_comes_back_with_its_sessions(
    start_gateway, database
):
    gw = shared(start_gateway, database, "--workers", "2")

    def fresh(timeout: float = 120) -> httpx.Client:  # a new connection may reach either worker
        return httpx.Client(base_url=gw.url, timeout=timeout, headers=gw.client.headers)

    ids = []
    for n in range(8):
        with fresh() as client:
            r = client.post("/v1/sessions", json={})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
            run(client, ids[-1], f"x = {n}")
    with psycopg.connect(database) as db:
        owners = dict(db.execute("SELECT session_id, owner FROM leases").fetchall())
    for n, sid in enumerate(ids):
        with fresh() as client:
            assert text_of(run(client, sid, "print(x)")) == f"{n}\n", "a worker lost a session"
    os.kill(worker_pid(gw, owners[ids[0]]), signal.SIGKILL)
    killed = time.monotonic()

    def answers() -> bool:
        # A connection the kernel gave the dying worker's listening socket is reset.
        with fresh(10) as client, contextlib.suppress(httpx.TransportError):
            r = client.post(f"/v1/sessions/{ids[0]}/execute", json={"code": "print(x)"})
            return r.status_code == 200 and text_of(r.json()) == "0\n"
        return False

    assert wait_for(answers, timeout=30, interval=0.2), "a crashed worker's session never came back"
    back = time.monotonic() - killed
    print(f"{len(set(owners.values()))} workers own sessions; a crashed one's back in {back:.1f} s")


def test_sessions_dropped_in_a_long_database_outage_are_taken_back_when_it_returns(
    start_gateway,
):
    server = PostgresServer()  # its own: this test stops it
    try:
        gw = start_gateway("--database-url", server.database(), "--lease-ttl", LEASE)
        sid = new_session(gw)
        run(gw.client, sid, "x = 7")
        server.stop("kill")
        time.sleep(3 * float(LEASE))  # every lease runs out: the gateway lets go of them all
        assert gw.client.get(f"/v1/sessions/{sid}").status_code == 503
        server.start()
        back = time.monotonic()

        def answers() -> bool:
            r = gw.client.post(f"/v1/sessions/{sid}/execute", json={"code": "print(x)"})
            return r.status_code == 200 and text_of(r.json()) == "7\n"

        assert wait_for(answers, timeout=20, interval=0.3), (
            "the gateway never took its session back after the database returned"
        )
        print(f"taken back {time.monotonic() - back:.1f} s after the database returned")
    finally:
        server.remove()


def test_a_killed_gateways_sessions_are_adopted_by_another_with_their_state(
    start_gateway, database, engine
):
    token = "shared-token-of-the-deployment"
    first, second = together(
        lambda: shared(start_gateway, database, keep_sessions=True, env={"SBX_TOKEN": token})
    )
    for gw in (first, second):
        gw.client.headers["Authorization"] = f"Bearer {token}"
        gw.token = token
    ids = [new_session(first) for _ in range(2)]
    for n, sid in enumerate(ids):
        run(first.client, sid, f"x = {n + 40}")
    assert first.client.put(f"/v1/sessions/{ids[0]}/files/kept.txt", content=b"kept").is_success
    first.stop(signal.SIGKILL)
    killed = time.monotonic()

    def answers(sid: str, n: int) -> bool:
        r = second.client.post(f"/v1/sessions/{sid}/execute", json={"code": "print(x)"})
        return r.status_code == 200 and text_of(r.json()) == f"{n + 40}\n"

    assert wait_for(lambda: answers(ids[0], 0), timeout=30, interval=0.2), (
        "no gateway adopted the killed gateway's session"
    )
    print(f"adopted {time.monotonic() - killed:.1f} s after its gateway was killed")
    # Both are taken over in one sweep, each as soon as its kernel answers.
    assert wait_for(lambda: answers(ids[1], 1), timeout=10, interval=0.2), (
        "the killed gateway's other session was not adopted"
    )
    assert second.client.get(f"/v1/sessions/{ids[0]}/files/kept.txt").content == b"kept"
    with psycopg.connect(database) as db:
        owners = {row[0] for row in db.execute("SELECT owner FROM leases").fetchall()}
    assert owners == {gateway_id_of(second.data_dir)}, owners
    # The killed gateway comes back on its data directory: it leaves the adopted ones alone.
    again = shared(start_gateway, database, data_dir=first.data_dir, env={"SBX_TOKEN": token})
    again.client.headers["Authorization"] = f"Bearer {token}"
    assert again.client.get("/v1/sessions").status_code == 200
    time.sleep(2 * float(LEASE))
    assert answers(ids[0], 0) and answers(ids[1], 1), "the restarted gateway broke them"
    # The adopter, restarted on its data directory, reattaches to what it adopted
    # (their containers still carry the first gateway's label).
    again.stop(signal.SIGKILL)
    second.stop(signal.SIGKILL)
    second = shared(
        start_gateway, database, keep_sessions=True, data_dir=second.data_dir,
        env={"SBX_TOKEN": token},
    )  # fmt: skip
    second.client.headers["Authorization"] = f"Bearer {token}"
    assert answers(ids[0], 0) and answers(ids[1], 1), (
        f"the restarted adopter lost what it adopted: {second.client.get('/v1/sessions').text}"
    )
    # Dying, an adopted kernel is noticed; deleted, it leaves nothing behind.
    engine.containers.get(f"sbx-{ids[1]}").kill()
    assert wait_for(
        lambda: second.client.get(f"/v1/sessions/{ids[1]}").json()["state"] == "dead", timeout=10
    ), "the death of an adopted kernel went unnoticed"
    for sid in ids:
        assert second.client.delete(f"/v1/sessions/{sid}").status_code == 204
        assert not engine.containers.list(all=True, filters={"name": f"sbx-{sid}"})
        assert not (first.data_dir / "sessions" / sid).exists(), "its directory was left"
