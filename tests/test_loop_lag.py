"""The event-loop lag monitor: a stall it must see, and the metric that shows it."""

from __future__ import annotations

import asyncio
import gc
import shutil

import pytest
from helpers import short_tmpdir

from gateway.app import Gateway
from gateway.config import Settings


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
