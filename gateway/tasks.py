"""Background tasks: owned so that a stop ends them, and ended without losing a cancel.

Two idioms of asyncio on Python 3.11 lose a cancel, and a stop that waits on a
task then waits for ever (a unit test hung in CI on the first): ``wait_for``
returns its result when a cancel lands as what it awaits completes (use
``asyncio.timeout``; ruff bans ``wait_for`` in the gateway), and
``suppress(CancelledError)`` around awaiting a task just cancelled also
swallows a cancel aimed at the caller (use ``end_task``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


async def end_task(task: asyncio.Task | None) -> None:
    """Cancel ``task`` and wait for it to end; the caller's own cancel still reaches it.

    An error the task ended with (other than its cancel) is raised here.
    """
    if task is None:
        return
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.result()


class TaskSet:
    """Runs background coroutines and cancels whatever is left on ``cancel``."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def cancel(self, timeout: float) -> None:
        """Cancel every task and give them ``timeout`` seconds to clean up after themselves."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
