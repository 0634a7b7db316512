"""Ending a background task never swallows a cancel meant for whoever ends it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gateway.tasks import end_task


async def slow_to_end() -> None:
    """A task that takes its time over its cancel (a refill removing its sandbox, say)."""
    try:
        await asyncio.sleep(60)
    finally:
        await asyncio.shield(asyncio.sleep(1))


def test_a_caller_whose_own_time_runs_out_while_a_task_ends_hears_of_it():
    """The idiom it replaced (``suppress(CancelledError)`` around ``await task``) took the
    caller's cancel for the task's: the caller's timeout passed unseen, a stop ran on."""

    async def scenario() -> None:
        task = asyncio.create_task(slow_to_end())
        await asyncio.sleep(0)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await end_task(task)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


def test_a_task_ended_is_done_and_an_error_it_ended_with_is_raised():
    async def failing() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            raise RuntimeError("its cleanup failed")

    async def scenario() -> None:
        task = asyncio.create_task(slow_to_end())
        await asyncio.sleep(0)
        await end_task(task)
        assert task.cancelled()
        await end_task(None)  # never started: nothing to end
        broken = asyncio.create_task(failing())
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="its cleanup failed"):
            await end_task(broken)

    asyncio.run(scenario())
