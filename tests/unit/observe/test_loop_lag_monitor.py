"""The event-loop lag monitor: a stall it must see, and a worst lag it forgets."""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.observe.loop_lag import LoopLagMonitor


def test_a_blocking_callback_shows_as_lag_and_a_warning(caplog):
    async def main() -> tuple[float, float]:
        monitor = LoopLagMonitor(warn_after=0.1, interval=0.02)
        monitor.start()
        await asyncio.sleep(0.1)
        quiet = monitor.max_lag()
        asyncio.get_running_loop().call_soon(time.sleep, 0.2)  # what a blocking call does
        await asyncio.sleep(0.1)
        monitor.stop()
        return quiet, monitor.max_lag()

    with caplog.at_level(logging.WARNING, logger="gateway.observe.loop_lag"):
        quiet, blocked = asyncio.run(main())
    assert quiet < 0.1, f"an idle loop showed {quiet * 1000:.0f} ms of lag"
    assert 0.15 < blocked < 1.0, f"a 200 ms stall showed as {blocked * 1000:.0f} ms"
    assert "event loop was blocked for" in caplog.text


def test_the_worst_lag_is_forgotten_after_its_window():
    async def main() -> float:
        monitor = LoopLagMonitor(warn_after=10, interval=0.01, window=0.2)
        monitor.start()
        asyncio.get_running_loop().call_soon(time.sleep, 0.1)
        await asyncio.sleep(0.5)
        monitor.stop()
        return monitor.max_lag()

    assert asyncio.run(main()) < 0.05
