"""The event-loop lag monitor: a stall it must see, and the metric that shows it."""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import time

import pytest
from helpers import short_tmpdir

from gateway.app import Gateway
from gateway.config import Settings
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


@pytest.mark.docker
def test_metrics_carry_the_loop_lag(api):
    lines = api.get("/metrics").text.splitlines()
    assert "# TYPE sbx_event_loop_lag_max_seconds gauge" in lines
    value = next(line for line in lines if line.startswith("sbx_event_loop_lag_max_seconds "))
    assert 0 <= float(value.split()[1]) < 5, value


@pytest.mark.docker
def test_what_the_start_made_is_kept_out_of_full_collections(engine):
    """A full pass of the cyclic collector walks only what was made after the start.

    It walked everything, modules and the app included: at 20 busy sessions,
    a 90 ms stall of the loop every ten seconds or so, every session waiting.
    """
    data_dir = short_tmpdir()
    settings = Settings(
        data_dir=str(data_dir), port=0, pool={}, package_cache=False, npm_cache=False
    )

    async def start_and_count() -> int:
        gateway = Gateway(settings)
        gc.unfreeze()
        try:
            await gateway.start()
            return gc.get_freeze_count()
        finally:
            await gateway.stop()
            gc.unfreeze()

    try:
        frozen = asyncio.run(start_and_count())
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    assert frozen > 10_000, f"only {frozen} objects are out of the collector's full passes"
