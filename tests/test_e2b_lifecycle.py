"""The stock E2B SDK's snapshots, forks, auto-pause and metrics, against a real gateway.

Each maps onto the gateway's own (docs/e2b.md): an E2B snapshot is a
gateway snapshot, a sandbox created from one is a fork, ``fork()`` is a
snapshot taken and forked ``count`` times, auto-pause is ``idle_action:
pause``, and metrics are the container's own.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from e2b import NotFoundException, SandboxException
from e2b_code_interpreter import AsyncSandbox, Sandbox
from helpers import GatewayProcess, e2b_env

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def pointed(gateway: GatewayProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in e2b_env(gateway, gateway.token).items():
        monkeypatch.setenv(name, value)


def test_a_snapshot_is_listed_created_from_and_deleted() -> None:
    source = Sandbox.create()
    made: list[Sandbox] = []
    try:
        source.run_code("kept = 41")
        source.files.write("note.txt", "from the source")
        snapshot = source.create_snapshot(name="before-the-fix")
        assert snapshot.snapshot_id and snapshot.names == ["before-the-fix"]
        mine = [s.snapshot_id for s in source.list_snapshots().next_items()]
        assert mine == [snapshot.snapshot_id]
        everyone = [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
        assert snapshot.snapshot_id in everyone

        child = Sandbox.create(snapshot.snapshot_id)
        made.append(child)
        assert child.sandbox_id != source.sandbox_id
        assert child.run_code("kept + 1").text == "42", "the fork lost the kernel's state"
        assert child.files.read("note.txt") == "from the source"
        child.run_code("kept = 0")
        assert source.run_code("kept").text == "41", "the source was touched by its fork"

        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False
        assert source.list_snapshots().next_items() == []
        with pytest.raises(SandboxException):
            Sandbox.create(snapshot.snapshot_id)
    finally:
        for sbx in [source, *made]:
            sbx.kill()


def test_fork_makes_independent_copies() -> None:
    source = Sandbox.create()
    forks: list = []
    try:
        source.run_code("n = 10")
        forks = source.fork(count=2)
        assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
        assert len({f.sandbox_id for f in forks} | {source.sandbox_id}) == 3
        forks[0].run_code("n += 1")
        assert [f.run_code("n").text for f in forks] == ["11", "10"]
        assert source.run_code("n").text == "10"
        assert source.list_snapshots().next_items() == [], "fork's own snapshot was kept"
        with pytest.raises(SandboxException, match="count"):
            Sandbox.fork(source.sandbox_id, count=21)
    finally:
        for sbx in [source, *forks]:
            if isinstance(sbx, Sandbox):
                sbx.kill()


def test_async_snapshots_and_fork() -> None:
    async def main() -> None:
        source = await AsyncSandbox.create()
        made: list[AsyncSandbox] = []
        try:
            await source.run_code("word = 'kept'")
            snapshot = await source.create_snapshot()
            assert snapshot.names == []
            listed = await source.list_snapshots().next_items()
            assert [s.snapshot_id for s in listed] == [snapshot.snapshot_id]
            child = await AsyncSandbox.create(snapshot.snapshot_id)
            made.append(child)
            assert (await child.run_code("word")).text == "'kept'"
            (forked,) = await source.fork()
            assert isinstance(forked, AsyncSandbox), forked
            made.append(forked)
            assert (await forked.run_code("word.upper()")).text == "'KEPT'"
            assert await AsyncSandbox.delete_snapshot(snapshot.snapshot_id) is True
        finally:
            for sbx in [source, *made]:
                await sbx.kill()

    asyncio.run(main())


TOKENS = {"acme": "acme-e2b-key", "rival": "rival-e2b-key"}  # the E2B API keys


def test_another_tenants_snapshots_do_not_exist(tenants, monkeypatch) -> None:
    for name, value in e2b_env(tenants[0], "acme-e2b-key").items():
        monkeypatch.setenv(name, value)
    mine = Sandbox.create()
    try:
        snapshot = mine.create_snapshot()
        rival = {"api_key": "rival-e2b-key"}
        assert Sandbox.list_snapshots(**rival).next_items() == []
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **rival) is False
        with pytest.raises(SandboxException):
            Sandbox.create(snapshot.snapshot_id, **rival)
        with pytest.raises(NotFoundException):
            Sandbox.fork(mine.sandbox_id, **rival)
        with pytest.raises(NotFoundException):
            Sandbox.create_snapshot(mine.sandbox_id, **rival)
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    finally:
        mine.kill()


def test_metrics_are_the_containers_own() -> None:
    sbx = Sandbox.create()
    try:
        (before,) = sbx.get_metrics()
        assert before.mem_used > 0 and before.mem_total > before.mem_used
        assert 0 <= before.cpu_used_pct and before.cpu_count >= 1
        sbx.run_code("block = bytearray(100 * 2**20)\nblock[::4096] = b'x' * len(block[::4096])")
        (after,) = sbx.get_metrics()
        assert after.mem_used - before.mem_used > 80 * 2**20, (before, after)
    finally:
        sbx.kill()


def test_auto_pause_pauses_at_the_timeout(gateway: GatewayProcess) -> None:
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause"})
    try:
        session = gateway.client.get(f"/v1/sessions/{sbx.sandbox_id}").json()
        assert session["idle_action"] == "pause"
        sbx.run_code("kept = 'across the pause'")
        deadline = time.monotonic() + 30
        while sbx.get_info().state.value != "paused":
            assert time.monotonic() < deadline, "the sandbox was not paused at its timeout"
            time.sleep(0.5)
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.run_code("kept").text == "'across the pause'"
    finally:
        sbx.kill()
