"""One deployment, one view: three gateways on one PostgreSQL answer alike.

Whichever gateway a load balancer picks, a tenant sees the same sessions,
the same pending approvals and the same quota: counted once, in the shared
store, with one atomic claim per create.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import signal
import threading
import time

import httpx
import pytest
from helpers import run, short_tmpdir, text_of, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.faults]

LEASE = "1.5"  # seconds: a killed gateway's claims and leases run out quickly
TOKENS = {"agent": ("acme", ""), "approver": ("acme", "approver = true"), "other": ("zeta", "")}
QUOTA = 3
POLICY = "mode: enforce\nrules:\n  shell: hold\n"
SHELL = "import os\nprint(os.system('true'))"


@pytest.fixture(scope="module")
def deployment(start_gateway, postgres):
    """Three gateways on one store; tenant acme may hold 3 sessions and holds shell for approval."""
    database = postgres.database()
    config = short_tmpdir()
    (config / "tokens.toml").write_text(
        "".join(
            f'[[tokens]]\ntenant = "{tenant}"\ntoken = "{name}-token"\n{extra}\n'
            for name, (tenant, extra) in TOKENS.items()
        )
        + f"[tenants.acme]\nmax_sessions = {QUOTA}\n"
    )
    (config / "policies").mkdir()
    (config / "policies" / "acme.yaml").write_text(POLICY)
    flags = (
        "--database-url", database, "--lease-ttl", LEASE, "--tokens-file",
        str(config / "tokens.toml"), "--policies-dir", str(config / "policies"),
    )  # fmt: skip
    gateways = at_once(start_gateway, flags, 3)
    gateways[0].flags = flags  # for a gateway that joins later
    return gateways


def at_once(start_gateway, flags: tuple[str, ...], n: int) -> list:
    """``n`` gateways with ``flags``, started together (each takes seconds to come up)."""
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: start_gateway(*flags), range(n)))


def client(gw, name: str = "agent") -> httpx.Client:
    return httpx.Client(
        base_url=gw.url, timeout=120, headers={"Authorization": f"Bearer {name}-token"}
    )


def end_all(gateways) -> None:
    with client(gateways[0]) as api:
        for s in api.get("/v1/sessions").json()["sessions"]:
            api.delete(f"/v1/sessions/{s['id']}")


def test_every_gateway_lists_every_session_of_the_deployment(deployment):
    made = {}
    try:
        for n, gw in enumerate(deployment[:2]):
            with client(gw) as api:
                r = api.post("/v1/sessions", json={"metadata": {"made_by": f"gw{n}"}})
                assert r.status_code == 201, r.text
                made[r.json()["id"]] = n
        with client(deployment[0], "other") as api:
            assert api.post("/v1/sessions", json={}).status_code == 201  # another tenant's
        for n, gw in enumerate(deployment):
            with client(gw) as api:
                listed = api.get("/v1/sessions").json()["sessions"]
                assert {s["id"] for s in listed} == set(made), (
                    f"gateway {n} lists {[s['id'] for s in listed]}, the deployment holds {made}"
                )
                assert all(s["confirmed_at"] for s in listed), listed
                only = api.get("/v1/sessions", params={"metadata.made_by": "gw1"}).json()
                assert [s["id"] for s in only["sessions"]] == [
                    sid for sid, m in made.items() if m == 1
                ]
                kernels = api.get("/api/kernels").json()
                assert {k["id"] for k in kernels} == set(made), f"gateway {n}'s /api/kernels"
                e2b = api.get("/v2/sandboxes", headers={"X-API-Key": "agent-token"}).json()
                assert {s["sandboxID"] for s in e2b} == set(made), f"gateway {n}'s E2B list"
        # Snapshots and secrets are the deployment's: made through one gateway, used through all.
        sid0 = next(sid for sid, n in made.items() if n == 0)
        with client(deployment[0]) as api:
            run(api, sid0, "open('kept.txt', 'w').write('kept'); x = 6")
            snap = api.post(f"/v1/sessions/{sid0}/snapshots", json={"name": "base"})
            assert snap.status_code == 201, snap.text
            assert api.put("/v1/secrets/TOKEN", json={"value": "s3cret"}).status_code in (200, 201)
        with client(deployment[2]) as api:
            e2b = api.get("/snapshots", headers={"X-API-Key": "agent-token"}).json()
            assert [s["snapshotID"] for s in e2b] == [snap.json()["id"]], e2b
            assert [s["name"] for s in api.get("/v1/secrets").json()["secrets"]] == ["TOKEN"]
            fork = api.post("/v1/sessions", json={"from_snapshot": snap.json()["id"]})
            assert fork.status_code == 201, f"a fork through another gateway: {fork.text}"
            forked = run(api, fork.json()["id"], "print(x * 7, open('kept.txt').read())")
            assert text_of(forked) == "42 kept\n", forked
            assert api.delete(f"/v1/snapshots/{snap.json()['id']}").status_code == 204
            assert api.delete("/v1/secrets/TOKEN").status_code == 204
    finally:
        end_all(deployment)
        with client(deployment[0], "other") as api:
            for s in api.get("/v1/sessions").json()["sessions"]:
                api.delete(f"/v1/sessions/{s['id']}")


def test_thirty_creates_through_three_gateways_give_exactly_the_quota(deployment):
    go = threading.Barrier(30)
    answers: list[httpx.Response] = [None] * 30  # type: ignore[list-item]

    def create(n: int) -> None:
        with client(deployment[n % 3]) as api:
            go.wait()
            answers[n] = api.post("/v1/sessions", json={})

    threads = [threading.Thread(target=create, args=(n,)) for n in range(30)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        made = [r for r in answers if r.status_code == 201]
        refused = [r for r in answers if r.status_code != 201]
        assert len(made) == QUOTA, (
            f"{len(made)} of 30 creates through 3 gateways succeeded against a quota of {QUOTA}"
        )
        for r in refused:
            assert r.status_code == 429 and r.json()["error"]["code"] == "quota_exceeded", r.text
            assert "quota of 3" in r.json()["error"]["message"], r.text
        for r in made:  # every one a working session, whichever gateway it is asked through
            with client(deployment[2]) as api:
                assert text_of(run(api, r.json()["id"], "print(1 + 1)")) == "2\n"
    finally:
        end_all(deployment)
    with client(deployment[1]) as api:  # ended sessions give their claims back at once
        r = api.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        api.delete(f"/v1/sessions/{r.json()['id']}")


def test_an_approval_decided_through_one_gateway_releases_the_execute_held_on_another(
    deployment, start_gateway
):
    owner, other = deployment[0], deployment[1]
    with client(owner) as api:
        sid = api.post("/v1/sessions", json={}).json()["id"]
        r = api.post(f"/v1/sessions/{sid}/execute", json={"code": SHELL})
        assert r.status_code == 202, r.text
    try:
        # A gateway joining the deployment leaves requests others' executes wait for alone.
        start_gateway(*deployment[0].flags).stop()
        with client(other, "approver") as approver:
            pending = approver.get("/v1/approvals", params={"state": "pending"}).json()
            assert [a["id"] for a in pending["approvals"]] == [r.json()["approval_id"]], (
                f"the other gateway lists {pending} as pending"
            )
            decided = approver.post(
                f"/v1/approvals/{r.json()['approval_id']}/approve", json={"reason": "ok"}
            )
            assert decided.status_code == 200 and decided.json()["state"] == "approved", (
                decided.text
            )
        with client(deployment[2]) as api:

            def ran() -> list:
                history = api.get(f"/v1/sessions/{sid}/history").json()["executions"]
                return history and history[-1]["status"] == "ok" and history

            history = wait_for(ran, timeout=30)
            assert history, "the execute held on the owner was not released"
            assert history[-1]["outputs"][0]["text"] == "0\n"
    finally:
        end_all(deployment)


def test_a_gateway_killed_mid_create_gives_its_claim_back(start_gateway, postgres):
    database = postgres.database()
    config = short_tmpdir()
    (config / "tokens.toml").write_text(
        '[[tokens]]\ntenant = "acme"\ntoken = "agent-token"\n[tenants.acme]\nmax_sessions = 1\n'
    )
    flags = ("--database-url", database, "--lease-ttl", LEASE, "--tokens-file",
             str(config / "tokens.toml"))  # fmt: skip
    doomed, survivor = at_once(start_gateway, flags, 2)
    with client(doomed) as api:
        first = api.post("/v1/sessions", json={}).json()["id"]
    with client(survivor) as api:
        r = api.post("/v1/sessions", json={})
        assert r.status_code == 429, f"a second gateway let the tenant past its quota: {r.text}"
        assert api.delete(f"/v1/sessions/{first}").status_code == 204

    def create_on_doomed() -> None:
        with contextlib.suppress(httpx.HTTPError), client(doomed) as api:
            api.post("/v1/sessions", json={})  # never answered: the gateway is killed

    creating = threading.Thread(target=create_on_doomed, daemon=True)
    creating.start()
    time.sleep(0.3)  # the claim is made, the kernel still starting
    doomed.stop(signal.SIGKILL)
    killed = time.monotonic()

    def creates() -> bool:
        with client(survivor) as api:
            r = api.post("/v1/sessions", json={})
            assert r.status_code in (201, 429), r.text
            return r.status_code == 201

    assert wait_for(creates, timeout=30, interval=0.5), (
        "the killed gateway's claim was never given back: the tenant stays at its quota"
    )
    print(f"the claim came back {time.monotonic() - killed:.1f} s after the kill")


def test_a_hosts_cap_holds_for_all_its_gateways_together(start_gateway, postgres):
    flags = ("--database-url", postgres.database(), "--lease-ttl", LEASE,
             "--host-max-sessions", "2")  # fmt: skip
    gateways = at_once(start_gateway, flags, 2)
    go = threading.Barrier(8)
    answers: list[httpx.Response] = [None] * 8  # type: ignore[list-item]

    def create(n: int) -> None:
        gw = gateways[n % 2]
        with httpx.Client(base_url=gw.url, headers=gw.client.headers, timeout=120) as api:
            go.wait()
            answers[n] = api.post("/v1/sessions", json={})

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made = [r for r in answers if r.status_code == 201]
    assert len(made) == 2, f"{len(made)} of 8 creates through two gateways on a host capped at 2"
    for r in answers:
        if r.status_code != 201:
            assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_sessions", r.text
            assert "host_max_sessions" in r.json()["error"]["message"] and r.headers["Retry-After"]
