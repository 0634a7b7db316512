"""Rules changed while a sandbox starts are the ones the proxy enforces once it serves it."""

from __future__ import annotations

import asyncio

from gateway.hosts import NetworkPolicy
from gateway.limits import Limits
from gateway.sessions.lifecycle import SandboxLifecycle
from gateway.sessions.model import Session


class SlowIsolation:
    """Prepares a sandbox slowly (the proxy admits the rules it was handed), and records
    the rules it is told later."""

    def __init__(self) -> None:
        self.admitted: NetworkPolicy | None = None
        self.updates: list[NetworkPolicy] = []
        self.egress = self
        self.started = asyncio.Event()

    async def prepare(self, session_id, runtime, policy, pids, brokering=None):
        self.admitted = policy
        self.started.set()
        await asyncio.sleep(0.05)
        return None

    def update(self, session_id, policy) -> None:
        self.updates.append(policy)


def test_a_change_during_the_start_is_put_in_force_once_the_proxy_serves_the_session():
    async def scenario():
        isolation = SlowIsolation()
        lifecycle = SandboxLifecycle(None, None, None, isolation, None)  # type: ignore[arg-type]
        limits = Limits(2**30, 1.0, 256, 2**30, 30.0, 2**20)
        session = Session("python3", "img", limits, 60, 60, {}, {})
        session.network = NetworkPolicy.parse({"allow": ["public"]})
        starting = asyncio.create_task(lifecycle._isolate(session))
        await asyncio.wait_for(isolation.started.wait(), 5)
        narrowed = NetworkPolicy.parse({"allow": ["api.example.org"]})
        session.network = narrowed  # what NetworkRules.change does meanwhile
        await starting
        assert isolation.admitted != narrowed and isolation.updates == [narrowed]

    asyncio.run(scenario())
