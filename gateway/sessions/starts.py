"""Cold starts, a few at a time, the rest waiting their turn fairly by tenant.

A burst of creates the warm pool cannot serve would otherwise start every
sandbox at once: on a small host they starve each other (and the live
sessions) until their kernels time out. Here at most ``concurrency`` start
at once; the others wait in a bounded queue, served round robin across
tenants, so one tenant's burst cannot hold another's single create behind
it. A create that finds the queue full, or its tenant's share of it, or that
would wait past ``max_wait``, is refused at once with 503 and a Retry-After
sized to the queue ahead of it, and nothing of it is left behind.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from ..errors import Overloaded

T = TypeVar("T")
START_SECONDS = 2.0  # what a cold start takes on a small host, until one has been timed


class StartQueue:
    """At most ``concurrency`` cold starts at once; a bounded, fair queue for the rest."""

    def __init__(
        self,
        concurrency: int,
        size: int,
        per_tenant: int,
        max_wait: float,
        clock: Callable[[], float] = time.monotonic,
        pace: float = START_SECONDS,
    ) -> None:
        """``pace``: seconds a cold start takes, until starts here have been timed."""
        self.concurrency = concurrency
        self.size = size
        self.per_tenant = per_tenant
        self.max_wait = max_wait
        self.clock = clock
        self.running = 0
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}
        self._turns: collections.deque[str] = collections.deque()  # tenants, in turn order
        self._took = pace  # a recent cold start's seconds (moving average)

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        """Hold a start slot while starting a sandbox for ``tenant``."""
        if self.running >= self.concurrency or self.queued:
            await self._wait(tenant)
        else:
            self.running += 1
        started = self.clock()
        try:
            yield
            # Only starts that worked set the pace: one that hung to its timeout (a
            # sandbox with almost no CPU) must not make every later create look slow.
            self._took = 0.8 * self._took + 0.2 * (self.clock() - started)
        finally:
            self._release()

    async def run(self, tenant: str, start: Callable[[], Awaitable[T]]) -> T:
        """``start()`` under a start slot (a resume's or a restart's cold start)."""
        async with self.slot(tenant):
            return await start()

    async def _wait(self, tenant: str) -> None:
        ahead = self.queued
        mine = len(self._waiting.get(tenant, ()))
        # Round robin: of each other tenant's waiters, only as many as this tenant's go first.
        before = mine + sum(
            min(len(queue), mine + 1) for other, queue in self._waiting.items() if other != tenant
        )
        expected = self._expected(before + 1)
        if mine >= self.per_tenant:
            why = f"this tenant already has {mine} creates waiting for a cold start"
        elif ahead >= self.size:
            why = f"{ahead} creates already wait for one of this host's {self.concurrency} starts"
        elif expected > self.max_wait:
            why = (
                f"the {before} creates ahead of it would take about {expected:.0f} s to start, "
                f"more than the {self.max_wait:g} s a create waits"
            )
        else:
            why = ""
        if why:
            raise Overloaded(
                f"{why}; the warm pool is empty: try again in a few seconds",
                retry_after=max(1, math.ceil(expected)),
            )
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.setdefault(tenant, collections.deque())
        if not queue:
            self._turns.append(tenant)
        queue.append(turn)
        try:
            async with asyncio.timeout(self.max_wait):
                await asyncio.shield(turn)
        except BaseException as e:
            if turn.done() and not turn.cancelled():  # given the slot as it gave up
                self._release()
            else:
                turn.cancel()
                self._drop(tenant, turn)
            if isinstance(e, TimeoutError):
                raise Overloaded(
                    f"waited {self.max_wait:g} s for a cold start without getting one; "
                    "the host is busy starting sandboxes: try again shortly",
                    retry_after=max(1, math.ceil(self._expected(self.queued + 1))),
                ) from None
            raise

    def _expected(self, place: int) -> float:
        """Seconds until the ``place``-th waiter starts, at the recent pace."""
        return math.ceil(place / self.concurrency) * self._took

    def _release(self) -> None:
        """Pass the slot to the next tenant in turn, or give it back."""
        while self._turns:
            tenant = self._turns.popleft()
            queue = self._waiting[tenant]
            turn = queue.popleft()
            if queue:
                self._turns.append(tenant)  # its next create waits for its next turn
            else:
                del self._waiting[tenant]
            if not turn.done():
                turn.set_result(None)
                return
        self.running -= 1

    def _drop(self, tenant: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is None or turn not in queue:
            return
        queue.remove(turn)
        if not queue:
            del self._waiting[tenant]
            self._turns.remove(tenant)
