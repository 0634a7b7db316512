"""Snapshots and forks: try two paths from one state, roll back a failed one."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess

import pytest
from helpers import run, short_tmpdir, text_of, wait_for

from gateway.client import AsyncClient, Client

pytestmark = pytest.mark.docker


def snapshot(api, sid: str, **body) -> dict:
    r = api.post(f"/v1/sessions/{sid}/snapshots", json=body)
    assert r.status_code == 201, f"snapshot answered {r.status_code}: {r.text}"
    assert r.headers["Location"] == f"/v1/snapshots/{r.json()['id']}"
    return r.json()


def fork(api, snapshot_id: str, **body) -> dict:
    r = api.post("/v1/sessions", json={"from_snapshot": snapshot_id, **body})
    assert r.status_code == 201, f"fork answered {r.status_code}: {r.text}"
    return r.json()


def test_forks_hold_the_snapshot_state_and_diverge(api, new_session):
    sid = new_session()["id"]
    run(api, sid, "import json\nrows = [1, 2, 3]\nopen('data.txt', 'w').write('v1')")
    run(api, sid, "gen = (r for r in rows)")
    snap = snapshot(api, sid, name="before the fix")
    assert snap["session_id"] == sid and snap["name"] == "before the fix", snap
    assert snap["strategy"] == "namespace" and snap["size_bytes"] > 0, snap
    assert [lost["name"] for lost in snap["lost"]] == ["gen"], snap
    assert api.get(f"/v1/sessions/{sid}").json()["state"] == "idle", "the session keeps running"
    run(api, sid, "rows.append(4)")  # the original goes on after the snapshot

    first, second = fork(api, snap["id"]), fork(api, snap["id"])
    try:
        assert first["forked_from"] == {
            "session_id": sid,
            "snapshot_id": snap["id"],
            "snapshot_name": "before the fix",
        }, first
        run(api, first["id"], "rows.append('a'); open('data.txt', 'w').write('first')")
        run(api, second["id"], "rows.append('b')")
        assert text_of(run(api, first["id"], "print(rows, open('data.txt').read())")) == (
            "[1, 2, 3, 'a'] first\n"
        )
        assert text_of(run(api, second["id"], "print(rows, open('data.txt').read())")) == (
            "[1, 2, 3, 'b'] v1\n"
        )
        assert text_of(run(api, sid, "print(rows, open('data.txt').read())")) == (
            "[1, 2, 3, 4] v1\n"
        ), "the original session was touched by its forks"
        page = api.get(f"/v1/sessions/{first['id']}/history").json()
        history = page["executions"]
        assert [h["code"][:11] for h in history[:2]] == ["import json", "gen = (r fo"], history
        assert page["forked_from"] == first["forked_from"], "a fork's history names its origin"
        assert api.get(f"/v1/sessions/{sid}/history").json()["forked_from"] is None
        nb = api.get(f"/v1/sessions/{first['id']}/notebook").json()
        assert nb["metadata"]["sbx"]["forked_from"]["snapshot_id"] == snap["id"], nb["metadata"]
    finally:
        for f in (first, second):
            api.delete(f"/v1/sessions/{f['id']}")


def test_snapshots_are_listed_read_and_deleted(api, session):
    sid = session["id"]
    snap = snapshot(api, sid)
    assert api.get(f"/v1/snapshots/{snap['id']}").json() == snap
    listed = api.get(f"/v1/sessions/{sid}/snapshots").json()["snapshots"]
    assert [s["id"] for s in listed] == [snap["id"]]
    assert api.delete(f"/v1/snapshots/{snap['id']}").status_code == 204
    r = api.get(f"/v1/snapshots/{snap['id']}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "snapshot_not_found", r.text
    r = api.post("/v1/sessions", json={"from_snapshot": snap["id"]})
    assert r.status_code == 404, r.text


def test_bash_snapshots_replay_and_other_kernels_are_refused(api, new_session):
    sid = new_session(kernel="bash")["id"]
    run(api, sid, "x=7; echo hello > f.txt")
    snap = snapshot(api, sid)
    assert snap["strategy"] == "replay", snap
    r = api.post("/v1/sessions", json={"from_snapshot": snap["id"], "kernel": "python3"})
    assert r.status_code == 409 and "bash" in r.json()["error"]["message"], r.text
    child = fork(api, snap["id"])
    try:
        assert text_of(run(api, child["id"], "echo $x; cat f.txt")) == "7\nhello\n"
    finally:
        api.delete(f"/v1/sessions/{child['id']}")


def test_a_paused_session_is_snapshotted_and_stays_paused(api, session):
    sid = session["id"]
    run(api, sid, "asleep = 'kept'")
    # Saved to disk (a frozen one is saved by the strategy its snapshot asks for: test_pause).
    pause = api.post(f"/v1/sessions/{sid}/pause", json={"strategy": "namespace"})
    assert pause.status_code == 200
    r = api.post(f"/v1/sessions/{sid}/snapshots", json={"strategy": "replay"})
    assert r.status_code == 409 and "resume it" in r.json()["error"]["message"], r.text
    snap = snapshot(api, sid)
    assert snap["strategy"] == "namespace", snap
    assert api.get(f"/v1/sessions/{sid}").json()["state"] == "paused"
    child = fork(api, snap["id"])
    try:
        assert text_of(run(api, child["id"], "print(asleep)")) == "kept\n"
    finally:
        api.delete(f"/v1/sessions/{child['id']}")


def test_a_damaged_snapshot_makes_no_half_session(start_gateway):
    gw = start_gateway()
    api = gw.client
    sid = api.post("/v1/sessions", json={}).json()["id"]
    run(api, sid, "v = 1")
    snap = snapshot(api, sid)
    state = gw.data_dir / "snapshots" / snap["id"] / "namespace.pkl"
    state.write_bytes(b"not a pickle")
    before = {s["id"] for s in api.get("/v1/sessions").json()["sessions"]}
    r = api.post("/v1/sessions", json={"from_snapshot": snap["id"]})
    assert r.status_code == 409 and r.json()["error"]["code"] == "state_not_restored", r.text
    assert {s["id"] for s in api.get("/v1/sessions").json()["sessions"]} == before
    (gw.data_dir / "snapshots" / snap["id"] / "workspace.tar.gz").unlink()
    r = api.post("/v1/sessions", json={"from_snapshot": snap["id"]})
    assert r.status_code == 409 and "archive" in r.json()["error"]["message"], r.text


def test_snapshots_count_toward_the_quota_and_survive_restarts(start_gateway):
    data_dir = short_tmpdir()
    token = "quota-user-token-1"
    digest = hashlib.sha256(token.encode()).hexdigest()
    (data_dir / "tokens.toml").write_text(
        f'[[tokens]]\ntenant = "t"\nsha256 = "{digest}"\n\n[tenants.t]\nmax_snapshots = 1\n'
    )
    first = start_gateway("--tokens-file", str(data_dir / "tokens.toml"), data_dir=data_dir)
    api = first.client
    api.headers["Authorization"] = f"Bearer {token}"
    sid = api.post("/v1/sessions", json={}).json()["id"]
    run(api, sid, "kept = 5")
    snap = snapshot(api, sid)
    r = api.post(f"/v1/sessions/{sid}/snapshots", json={})
    assert r.status_code == 429 and r.json()["error"]["code"] == "quota_exceeded", r.text
    first.stop()
    second = start_gateway("--tokens-file", str(data_dir / "tokens.toml"), data_dir=data_dir)
    api = second.client
    api.headers["Authorization"] = f"Bearer {token}"
    assert api.get(f"/v1/snapshots/{snap['id']}").json()["id"] == snap["id"]
    child = fork(api, snap["id"])
    assert text_of(run(api, child["id"], "print(kept)")) == "5\n"
    audit = second.client.get("/v1/audit", headers={"Authorization": f"Bearer {second.token}"})
    taken = [
        e
        for e in audit.json()["events"]
        if e["action"] == "snapshot.create" and e["outcome"] == "ok"
    ]
    assert [e["detail"]["snapshot_id"] for e in taken] == [snap["id"]], taken


def test_the_sdk_pauses_snapshots_and_forks_both_ways(gateway):
    token = getattr(gateway, "token", "")
    with Client(gateway.url, token) as client, client.create_session() as session:
        session.run("n = 10")
        assert session.pause().state == "paused" and session.info.raw["strategy"] == "freeze"
        assert session.resume().state == "idle"
        assert session.pause("namespace").state == "paused"
        assert session.info.raw["strategy"] == "namespace"
        assert session.resume().state == "idle"
        snap = session.snapshot("ten")
        assert (snap.name, snap.strategy, snap.lost) == ("ten", "namespace", [])
        assert [s.id for s in session.snapshots()] == [snap.id]
        assert client.snapshot(snap.id).size_bytes == snap.size_bytes
        with snap.fork() as child:
            assert child.run("print(n + 1)").stdout == "11\n"
        snap.delete()
        assert session.snapshots() == []

    async def scenario() -> tuple[str, str]:
        async with AsyncClient(gateway.url, token) as client:
            async with client.create_session() as session:
                await session.run("m = 3")
                paused = await session.pause()
                await session.resume()
                taken = await session.snapshot(name="three")
                async with taken.fork() as child:
                    out = (await child.run("print(m * 2)")).stdout
                await taken.delete()
                return paused.state, out

    assert asyncio.run(scenario()) == ("paused", "6\n")


def test_a_full_disk_fails_the_snapshot_and_the_session_runs_on(start_gateway):
    data_dir = short_tmpdir()
    kept = data_dir / "snapshots"
    kept.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(kept)], check=True)
    try:
        gw = start_gateway(data_dir=data_dir)
        api = gw.client
        sid = api.post("/v1/sessions", json={}).json()["id"]
        run(api, sid, "import os\nopen('big.bin', 'wb').write(os.urandom(3 * 2**20))\nw = 1")
        r = api.post(f"/v1/sessions/{sid}/snapshots", json={})
        assert r.status_code == 409 and r.json()["error"]["code"] == "state_not_saved", r.text
        assert "No space left" in r.json()["error"]["message"], r.text
        assert text_of(run(api, sid, "print(w)")) == "1\n", "the session stopped running"
        assert api.get(f"/v1/sessions/{sid}/snapshots").json()["snapshots"] == []
        assert list(kept.iterdir()) == [], "a failed snapshot left files behind"
        gw.stop()
    finally:
        subprocess.run(["umount", "-l", str(kept)], check=False)


def test_a_fork_takes_a_pooled_container(start_gateway):
    gw = start_gateway("--pool", "python3=1")
    api = gw.client
    sid = api.post("/v1/sessions", json={}).json()["id"]
    run(api, sid, "pooled = 'no matter'")
    snap = snapshot(api, sid)
    assert wait_for(lambda: api.get("/healthz").json()["pool_ready"] == {"python3": 1}, 60)
    child = fork(api, snap["id"])
    assert text_of(run(api, child["id"], "print(pooled)")) == "no matter\n"
    assert f"session {child['id']} started (" in gw.tail(200)
    assert "warm)" in next(
        line for line in gw.tail(200).splitlines() if f"session {child['id']} started" in line
    ), "the fork started cold although a pooled kernel was ready"
