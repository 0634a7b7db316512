"""Tenant quotas hold under simultaneous creates, warm pool or not, ids chosen or not.

Each attack fires a burst of creates at once for a tenant on tight quotas
while a canary session of another tenant keeps answering.
"""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest
from helpers import Canary, GatewayProcess, run, short_tmpdir

pytestmark = pytest.mark.docker

# One tenant per quota, each tight at 2 sessions' worth.
TOKENS = {"sessions": "sessions-token-5b0e21", "memory": "memory-token-a93c47",
          "disk": "disk-token-0d6f18"}  # fmt: skip
LIMITS = {"sessions": {}, "memory": {"memory": "384m"}, "disk": {"disk": "1g"}}
BURST = 6


def quota_gateway(start_gateway, *flags: str) -> GatewayProcess:
    """A gateway where each tenant may hold 2 sessions, 768m of memory or 2g of disk."""
    data_dir = short_tmpdir()
    tokens_file = data_dir / "tokens.toml"
    tokens_file.write_text(
        "".join(f'[[tokens]]\ntenant = "{t}"\ntoken = "{token}"\n' for t, token in TOKENS.items())
        + "[tenants.sessions]\nmax_sessions = 2\n"
        + '[tenants.memory]\nmax_memory = "768m"\n'
        + '[tenants.disk]\nmax_disk = "2g"\n'
    )
    return start_gateway("--tokens-file", str(tokens_file), *flags, data_dir=data_dir)


@pytest.fixture(scope="module", params=["cold", "pool"])
def gw(request, start_gateway) -> GatewayProcess:
    flags = ("--pool", "python3=2") if request.param == "pool" else ()
    return quota_gateway(start_gateway, *flags)


def client(gw: GatewayProcess, tenant: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {TOKENS[tenant]}"}
    return httpx.Client(base_url=gw.url, headers=headers, timeout=120)


def burst(gw: GatewayProcess, tenant: str, bodies: list[dict]) -> list[httpx.Response]:
    """POST every body at once, each on its own connection, released together."""
    go = threading.Barrier(len(bodies))
    answers: list[httpx.Response] = [None] * len(bodies)  # type: ignore[list-item]

    def create(n: int) -> None:
        with client(gw, tenant) as api:
            go.wait()
            answers[n] = api.post("/v1/sessions", json=bodies[n])

    threads = [threading.Thread(target=create, args=(n,)) for n in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return answers


def cleanup(gw: GatewayProcess, tenant: str) -> None:
    with client(gw, tenant) as api:
        for s in api.get("/v1/sessions").json()["sessions"]:
            api.delete(f"/v1/sessions/{s['id']}")


def outcome(answers: list[httpx.Response]) -> tuple[int, list[str]]:
    created = sum(r.status_code == 201 for r in answers)
    refused = [r.json()["error"]["code"] for r in answers if r.status_code != 201]
    return created, refused


@pytest.mark.parametrize("ids", ["gateway ids", "client ids"])
@pytest.mark.parametrize("quota", list(TOKENS))
def test_a_burst_of_creates_never_exceeds_a_quota(gw, canary, ids, quota):
    body = {"limits": {"memory": "128m", **LIMITS[quota]}}
    bodies = [
        {**body, "id": str(uuid.uuid4())} if ids == "client ids" else dict(body)
        for _ in range(BURST)
    ]
    try:
        with Canary(gw, canary, max_rss_growth=64 * 2**20):
            answers = burst(gw, quota, bodies)
        created, refused = outcome(answers)
        with client(gw, quota) as api:
            live = api.get("/v1/sessions").json()["sessions"]
        assert created == len(live) == 2 and refused == ["quota_exceeded"] * (BURST - 2), (
            f"{BURST} simultaneous creates ({ids}) against a {quota} quota that allows 2: "
            f"{created} were created, {len(live)} are live, refusals {refused}"
        )
        message = next(r.json()["error"]["message"] for r in answers if r.status_code == 429)
        assert quota in message, message
    finally:
        cleanup(gw, quota)


def test_the_same_client_id_twice_at_once_makes_one_session(gw, canary):
    sid = str(uuid.uuid4())
    try:
        answers = burst(gw, "sessions", [{"id": sid, "limits": {"memory": "128m"}}] * 2)
        codes = sorted(r.status_code for r in answers)
        assert codes == [201, 409], f"two creates of id {sid} at once answered {codes}"
        with client(gw, "sessions") as api:
            assert [s["id"] for s in api.get("/v1/sessions").json()["sessions"]] == [sid]
            assert run(api, sid, "print(1)")["status"] == "ok"
    finally:
        cleanup(gw, "sessions")


def test_disk_quota_counts_workspaces_and_says_what_to_do(gw, canary):
    try:
        with client(gw, "disk") as api:
            first = api.post("/v1/sessions", json={"limits": {"memory": "128m", "disk": "1536m"}})
            assert first.status_code == 201, first.text
            r = api.post("/v1/sessions", json={"limits": {"memory": "128m", "disk": "1g"}})
        assert r.status_code == 429 and r.json()["error"]["code"] == "quota_exceeded", r.text
        message = r.json()["error"]["message"]
        assert "disk" in message and "2 GiB" in message and "1.5 GiB" in message, message
        assert "smaller" in message and "delete" in message, message
    finally:
        cleanup(gw, "disk")
