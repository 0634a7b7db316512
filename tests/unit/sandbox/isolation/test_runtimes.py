"""The engine's runtimes are asked for once however many sessions want them at once."""

from __future__ import annotations

import asyncio
import threading
import time

from gateway.sandbox.isolation.runtimes import Runtimes


class CountingEngine:
    """A Docker client whose ``info`` takes a while and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def info(self) -> dict:
        with self._lock:
            self.calls += 1
        time.sleep(0.01)
        return {"Runtimes": {"runc": {}}}


def test_many_sessions_at_once_ask_the_engine_once() -> None:
    """A restart adopting thousands of sessions at once asked the engine once per session."""
    engine = CountingEngine()
    runtimes = Runtimes(["runc"], "runc", engine)

    async def adopt_all() -> list[str]:
        return await asyncio.gather(*(runtimes.engine_name("runc", False) for _ in range(50)))

    assert asyncio.run(adopt_all()) == ["runc"] * 50
    assert engine.calls == 1
