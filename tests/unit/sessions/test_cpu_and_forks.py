"""The E2B edge's domain helpers: CPU shares between samples, and forking a session N times."""

from __future__ import annotations

import asyncio
import types

import pytest

from gateway.access.auth import Principal
from gateway.errors import BadRequest, QuotaExceeded
from gateway.sessions.cpu import CpuShares
from gateway.sessions.forks import Forks

WHO = Principal(tenant="acme")


def session(sid: str = "s1", cpus: float = 2.0, created_at: float = 100.0):
    return types.SimpleNamespace(
        id=sid, created_at=created_at, limits=types.SimpleNamespace(cpus=cpus)
    )


def test_a_share_is_over_the_interval_since_the_last_sample() -> None:
    now = [110.0]
    shares = CpuShares(clock=lambda: now[0])
    assert shares.sample(session(), 10.0) == (110.0, 50.0)  # 10 s of 2 CPUs over 10 s
    now[0] = 120.0
    assert shares.sample(session(), 12.0)[1] == 10.0  # 2 s more over 10 s
    now[0] = 130.0
    assert shares.sample(session(), 1.0)[1] == 5.0  # restarted: counted from zero


def test_samples_are_bounded_the_oldest_dropped() -> None:
    shares = CpuShares(clock=lambda: 200.0, bound=2)
    for sid in ("a", "b", "c"):
        shares.sample(session(sid), 1.0)
    assert list(shares.samples) == ["b", "c"]


class FakeManager:
    """Snapshots and creates as the manager does; the third create hits a quota."""

    def __init__(self) -> None:
        self.created = 0
        self.deleted: list[str] = []
        self.snapshots = types.SimpleNamespace(delete=self.delete)
        self.requests = []

    def get(self, session_id, who):
        source = {"idle_action": "pause", "metadata": {"k": "v"}, "survive_crashes": True}
        return types.SimpleNamespace(**source)

    async def snapshot(self, session_id, who, request):
        return {"id": "snap1"}

    async def create(self, request, who):
        await asyncio.sleep(0)
        self.created += 1
        self.requests.append(request)
        if self.created == 3:
            raise QuotaExceeded("too many")
        return types.SimpleNamespace(id=f"fork{self.created}")

    async def delete(self, snapshot_id, who):
        self.deleted.append(snapshot_id)


def test_each_fork_succeeds_or_fails_on_its_own_and_the_snapshot_goes() -> None:
    manager = FakeManager()
    snapshot_id, forks = asyncio.run(Forks(manager, 3600.0).fork("src", WHO, 3, 60))
    assert snapshot_id == "snap1" and manager.deleted == ["snap1"]
    assert [getattr(f, "id", None) for f in forks[:2]] == ["fork1", "fork2"]
    assert isinstance(forks[2], QuotaExceeded)
    request = manager.requests[0]  # an auto-pausing source: its forks live to max_ttl
    assert (request.ttl, request.idle_timeout, request.from_snapshot) == (3600.0, 60, "snap1")
    assert request.survive_crashes, "a fork survives crashes as its source does"


@pytest.mark.parametrize("count", [0, 21, True, "2", 1.5])
def test_a_bad_count_is_refused_before_any_snapshot(count) -> None:
    manager = FakeManager()
    with pytest.raises(BadRequest, match="count must be an integer from 1 to 20"):
        asyncio.run(Forks(manager, 3600.0).fork("src", WHO, count, 60))
    assert manager.deleted == []
