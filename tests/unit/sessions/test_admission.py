"""Admission: this gateway's maximum in memory, the tenant's quota claimed in the store."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gateway.access.auth import Quota
from gateway.errors import QuotaExceeded, TooManySessions
from gateway.sessions.admission import Admission, HostCaps
from gateway.sessions.leases import Leases
from gateway.sessions.model import Limits
from gateway.store.sqlite import SQLiteStore

GIB = 2**30


def session(sid: str, memory: int = GIB, cpus: float = 1.0) -> SimpleNamespace:
    limits = Limits(memory=memory, cpus=cpus, pids=64, disk=GIB, timeout=60, output_bytes=2**20)
    return SimpleNamespace(id=sid, tenant="acme", limits=limits)


def admitting(tmp_path, quota: Quota, max_sessions: int = 10, host: HostCaps | None = None):
    async def go():
        store = SQLiteStore(tmp_path / "db.sqlite3")
        await store.open()
        registry: dict = {}
        return (
            store,
            registry,
            Admission(
                registry, lambda tenant: quota, max_sessions, store, Leases(store, 3.0), host
            ),
        )

    return go()


async def admit(admission: Admission, new) -> None:
    admission.reserve(new)
    await admission.claim(new)


def test_a_refused_create_is_unregistered_and_says_which_quota_and_what_to_do(tmp_path):
    async def scenario():
        quota = Quota(max_sessions=5, max_memory=4 * GIB, max_disk=100 * GIB, max_cpus=2.5)
        store, registry, admission = await admitting(tmp_path, quota)
        await admit(admission, session("a", cpus=2.0))
        with pytest.raises(QuotaExceeded) as cpus:
            await admit(admission, session("b", cpus=1.0))
        assert "would use 3 of cpus, over its quota of 2.5 (2 in use)" in cpus.value.message
        assert "ask for fewer CPUs" in cpus.value.message and "b" not in registry
        with pytest.raises(QuotaExceeded) as memory:
            await admit(admission, session("c", memory=3 * GIB + 1, cpus=0.5))
        assert "of memory, over its quota of 4" in memory.value.message
        await store.close()

    asyncio.run(scenario())


def test_creates_per_minute_are_refused_with_a_retry_after(tmp_path):
    async def scenario():
        quota = Quota(max_sessions=5, max_memory=8 * GIB, max_disk=100 * GIB,
                      creates_per_minute=1)  # fmt: skip
        store, _, admission = await admitting(tmp_path, quota)
        await admit(admission, session("a"))
        with pytest.raises(QuotaExceeded) as rate:
            await admit(admission, session("b"))
        assert rate.value.retry_after == 60 and "a minute" in rate.value.message
        await store.close()

    asyncio.run(scenario())


def test_a_create_that_never_started_gives_its_claim_back_and_a_warm_one_keeps_it(tmp_path):
    async def scenario():
        quota = Quota(max_sessions=1, max_memory=8 * GIB, max_disk=100 * GIB)
        store, registry, admission = await admitting(tmp_path, quota)
        failed = session("a")
        await admit(admission, failed)
        await admission.done(failed, started=False)
        registry.clear()
        warm = session("b")
        await admit(admission, warm)
        admission.rebind("b", "pooled-1")
        warm.id = "pooled-1"
        await admission.done(warm, started=True)
        await store.save_session(
            {
                "id": "pooled-1",
                "tenant": "acme",
                "state": "idle",
                "created_at": "t",
                "ended_at": None,
            }
        )
        registry.clear()
        assert await store.release_stale_claims(admission.leases.owner) == 0  # bound to its id
        with pytest.raises(QuotaExceeded):
            await admit(admission, session("c"))
        await store.close()

    asyncio.run(scenario())


def test_this_gateways_maximum_is_checked_in_memory_before_any_claim(tmp_path):
    async def scenario():
        quota = Quota(max_sessions=5, max_memory=8 * GIB, max_disk=100 * GIB)
        store, _, admission = await admitting(tmp_path, quota, max_sessions=1)
        await admit(admission, session("a"))
        with pytest.raises(TooManySessions, match="maximum of 1"):
            admission.reserve(session("b"))
        await store.close()

    asyncio.run(scenario())


def test_a_hosts_caps_count_every_tenants_sessions_and_say_so_with_a_retry_after(tmp_path):
    async def scenario():
        quota = Quota(max_sessions=5, max_memory=8 * GIB, max_disk=100 * GIB)
        host = HostCaps("h1", max_sessions=2, max_memory=0)
        store, _, admission = await admitting(tmp_path, quota, host=host)
        await admit(admission, session("a"))
        other = SimpleNamespace(**{**vars(session("b")), "tenant": "zeta"})
        await admit(admission, other)
        with pytest.raises(TooManySessions) as full:
            await admit(admission, session("c"))
        assert not isinstance(full.value, QuotaExceeded)
        assert (
            "this host's gateways together hold 2 live sessions, its cap of 2"
            in (full.value.message)
            and "host_max_sessions" in full.value.message
        )
        assert full.value.status == 429 and full.value.retry_after == 30
        elsewhere = Admission({}, lambda t: quota, 10, store, Leases(store, 3.0), HostCaps("h2", 2))
        await admit(elsewhere, session("d"))  # another host's count is its own
        await store.close()

    asyncio.run(scenario())
