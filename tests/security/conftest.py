"""The hostile-code suite: each attack runs as session code, under each runtime.

Every attack test gets ``attack`` (sessions on a gateway kept for attacks,
under the runtime of the test's parameter) and, once it is done, a canary
session on the same gateway must answer within a second: whatever a session
does must not slow its neighbours or the gateway down. gVisor runs here
whenever scripts/setup installed it; when the engine lacks it, its half of
the suite fails saying so (never skips), since scripts/test sets it up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest
from helpers import GatewayProcess, run, text_of

RUNTIMES = ["runc", "gvisor"]
# Put into the gateway's environment: no sandbox may ever read it.
HOST_SECRET = "sbx-host-secret-7f3a"
CANARY_SECONDS = 1.0


@pytest.fixture(scope="session")
def gvisor_ready(engine) -> None:
    runtimes = engine.info().get("Runtimes") or {}
    missing = [name for name in ("runsc", "runsc-net") if name not in runtimes]
    if missing:
        pytest.fail(
            f"gVisor runtimes {missing} are not registered with the Docker engine; "
            "run scripts/setup-gvisor as root (scripts/setup and scripts/test do)"
        )


@pytest.fixture(params=RUNTIMES)
def runtime(request) -> str:
    if request.param == "gvisor":
        request.getfixturevalue("gvisor_ready")
    return request.param


@pytest.fixture(scope="session")
def hostile_gateway(start_gateway) -> GatewayProcess:
    os.environ["HOST_SECRET_CANARY"] = HOST_SECRET
    try:
        return start_gateway("--interrupt-grace", "2", "--cull-interval", "0.5")
    finally:
        del os.environ["HOST_SECRET_CANARY"]


@pytest.fixture(scope="session")
def gw(hostile_gateway) -> GatewayProcess:
    """Where the shared ``canary`` fixture keeps its session: the attacks' gateway."""
    return hostile_gateway


class Attack:
    """Sessions for one attack, under one runtime; deleted when the test ends."""

    def __init__(self, gateway: GatewayProcess, runtime: str) -> None:
        self.gateway = gateway
        self.api: httpx.Client = gateway.client
        self.runtime = runtime
        self.created: list[str] = []

    @property
    def gvisor(self) -> bool:
        return self.runtime == "gvisor"

    def session(self, **body) -> str:
        r = self.api.post("/v1/sessions", json={"runtime": self.runtime, **body})
        assert r.status_code == 201, f"creating an attack session failed: {r.text}"
        self.created.append(r.json()["id"])
        return self.created[-1]

    def run(self, sid: str, code: str, **kw) -> dict:
        return run(self.api, sid, code, **kw)

    def out(self, sid: str, code: str, **kw) -> str:
        reply = self.run(sid, code, **kw)
        assert reply["status"] == "ok", f"the attack cell failed unexpectedly: {reply}"
        return text_of(reply)

    def delete_all(self) -> None:
        for sid in self.created:
            r = self.api.delete(f"/v1/sessions/{sid}")
            assert r.status_code in (204, 404), r.text
        self.created = []


@pytest.fixture
def attack(hostile_gateway, canary, runtime) -> Iterator[Attack]:
    a = Attack(hostile_gateway, runtime)
    yield a
    a.delete_all()
    assert hostile_gateway.proc.poll() is None, "the gateway died during the attack"
    assert a.api.get("/healthz").status_code == 200
    # One retry rides out a pause of the shared machine; two slow answers are a failure.
    for _ in range(2):
        started = time.monotonic()
        reply = run(a.api, canary, "print(alive)")
        took = time.monotonic() - started
        if took < CANARY_SECONDS:
            break
    assert text_of(reply) == "42\n", f"the canary session lost its state: {reply}"
    assert took < CANARY_SECONDS, f"the canary took {took:.2f} s to answer after the attack"
