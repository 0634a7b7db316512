"""Shared fixtures: a real gateway process on a real port, against a real engine.

One gateway serves most tests (starting kernels is what costs time); tests
that need other server settings start their own with ``start_gateway``.
Importing this file needs no engine (the unit tier under ``unit/`` loads it
too): the engine is reached only when a test asks for ``engine``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from helpers import (
    GatewayProcess,
    PostgresServer,
    canary_session,
    e2b_env,
    remove_leftovers,
    short_tmpdir,
    tenant_gateway,
)

if TYPE_CHECKING:
    import docker


def _names_in(function) -> set[str]:
    code = getattr(function, "__code__", None)
    return set(code.co_names) if code else set()


def pytest_collection_modifyitems(config, items):
    """Mark ``liveness`` the tests that time a canary's answers during an attack.

    scripts/test runs the rest in two processes and these after, alone: beside another
    module's kernels on two cores, a canary's 1-2 s bound measured the machine, not the
    gateway. A test is one when its code or a fixture's names the timed ``Canary``, or its
    code a canary's bound (the check after each security attack is not one: it asks twice,
    riding out a pause of the machine).
    """
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        defs = fixtures.name2fixturedefs.values() if fixtures else ()
        used = set().union(*(_names_in(d.func) for each in defs for d in each))
        own = _names_in(getattr(item, "function", None))
        if "Canary" in own | used or "CANARY_SECONDS" in own:
            item.add_marker("liveness")


@pytest.fixture(scope="session")
def engine() -> docker.DockerClient:
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        pytest.fail(f"these tests need a running Docker engine (scripts/setup starts one): {e}")
    return client


_started: list[GatewayProcess] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the gateways' logs to a failure: what the server saw explains most of them."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for gw in _started:
            if gw.log and not gw.stopped:
                report.sections.append((f"gateway log ({gw.data_dir})", gw.tail(80)))


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the tests' shared stores, started once."""
    server = PostgresServer()
    yield server
    server.remove()


@pytest.fixture(scope="session")
def start_gateway(engine: docker.DockerClient) -> Iterator:
    """Factory for gateways with custom flags; all are stopped at the end."""
    started = _started

    def start(
        *args: str,
        data_dir: Path | None = None,
        keep_sessions: bool = False,
        env: dict[str, str] | None = None,
    ) -> GatewayProcess:
        """A gateway that ends its sessions when stopped, unless ``keep_sessions``.

        No warm pool unless asked for: its kernels would only slow the tests down.
        """
        flags = args if keep_sessions else ("--end-sessions-on-stop", *args)
        if "--pool" not in args:
            flags = ("--pool", "", *flags)
        gw = GatewayProcess(data_dir or short_tmpdir(), *flags, env=env)
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.stop()
    for data_dir in {gw.data_dir for gw in started}:
        remove_leftovers(engine, data_dir)


@pytest.fixture(autouse=True)
def _stop_the_tests_own_gateways(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stop the gateways a test (or its function fixtures) started, when it ends.

    Left to the session's end, they idled along for the rest of the run: ~75
    gateways at ~2% of a core each (their cullers, their kernels' heartbeats),
    then 38 s of stopping at the very end. Gateways of wider-scoped fixtures
    start before this fixture and stay.
    """
    first = len(_started)
    yield
    mine = _started[first:]
    for gw in mine:
        gw.stop()
    in_use = {gw.data_dir for gw in _started if not gw.stopped}
    for data_dir in {gw.data_dir for gw in mine} - in_use:
        remove_leftovers(request.getfixturevalue("engine"), data_dir)


@pytest.fixture(scope="session")
def gateway(start_gateway) -> GatewayProcess:
    # Sessions of the shared gateway come from a warm pool, as in production.
    return start_gateway(
        "--interrupt-grace", "2", "--cull-interval", "0.5", "--reconnect-grace", "1",
        "--pool", "python3=2", "--tool-allow-ranges", "127.0.0.0/8",
    )  # fmt: skip


@pytest.fixture
def api(gateway: GatewayProcess) -> httpx.Client:
    return gateway.client


@pytest.fixture
def new_session(api: httpx.Client) -> Iterator:
    """Factory creating sessions that are deleted after the test."""
    created: list[str] = []

    def create(**body) -> dict:
        r = api.post("/v1/sessions", json=body)
        assert r.status_code == 201, f"creating a session failed: {r.status_code} {r.text}"
        created.append(r.json()["id"])
        return r.json()

    yield create
    for sid in created:
        api.delete(f"/v1/sessions/{sid}")


@pytest.fixture
def session(new_session) -> dict:
    return new_session()


@pytest.fixture(scope="module")
def e2b_sandbox(gateway: GatewayProcess) -> Iterator:
    """A sandbox made by the stock E2B SDK on the shared gateway, for one module's tests."""
    from e2b_code_interpreter import Sandbox

    with pytest.MonkeyPatch.context() as mp:
        for name, value in e2b_env(gateway, gateway.token).items():
            mp.setenv(name, value)
        sandbox = Sandbox.create()
        yield sandbox
        sandbox.kill()


@pytest.fixture(scope="module")
def tenants(request, start_gateway) -> Iterator[tuple[GatewayProcess, dict[str, httpx.Client]]]:
    """A gateway with a token for each tenant of the module's ``TOKENS`` (tenant -> token),
    and a client each. The module may add ``TENANTS`` (more of the tokens file, e.g. a
    ``[tenants.beta]`` table) and ``TENANT_FLAGS`` (more ``sbx serve`` flags)."""
    module = request.module
    flags = getattr(module, "TENANT_FLAGS", ())
    with tenant_gateway(
        start_gateway, module.TOKENS, *flags, tenants=getattr(module, "TENANTS", "")
    ) as found:
        yield found


@pytest.fixture(scope="module")
def canary(gw: GatewayProcess) -> Iterator[str]:
    """A session on the module's gateway ``gw`` where ``alive = 42`` ran, for ``Canary``
    (or a test) to ask while something else strains that gateway; deleted after."""
    with canary_session(gw) as sid:
        yield sid
