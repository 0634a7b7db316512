"""The store's writer: one thread, calls batched into one transaction each, and checkpoints.

One connection lives on one dedicated thread: a driver's connection stays on
the thread that made it, and a single writer never contends for SQLite's WAL
lock. Callers await the results, so the event loop never blocks on disk.
Calls run in batches, in the order queued (the ``Database`` runs a batch as
one transaction, each call in a savepoint of its own when one fails). A
call someone waits for flushes the batch at the end of the loop's turn;
bookkeeping nobody waits for (an execution's running row, outputs no client
is shown yet, audit events) rides along with the next flush, or goes within
``LAZY_DELAY``. Each batch is one commit, where an execute's writes would
otherwise cost several.

A batch of nothing but single-row writes (an execute's records, audit
events) runs on the loop itself when the thread is idle and the dialect
allows it (SQLite: in WAL mode with ``synchronous=NORMAL`` its commit writes
to the WAL without waiting for the disk, and handing it to the thread cost
more, two thread switches, than the write). Anything that may read or touch
many rows, or finds the thread busy, goes to the thread as before.

The WAL's checkpoints wait for the disk. Every ``CHECKPOINT_EVERY`` batches
one copies the WAL into the database on a thread of its own, while the writes
go on; if they kept adding, a short one in line with the writes copies the
rest. Either way the WAL starts over at the next write and stays small. Run
in line whole, a checkpoint held up every write behind it: at 20 busy
sessions, 12 ms every second or so, each session's execute waiting.

Knows no SQL: what a batch and a checkpoint do is the database's and the dialect's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

LAZY_DELAY = 0.05  # seconds a write nobody waits for may wait for company
CHECKPOINT_EVERY = 200  # batches committed between two checkpoints of the WAL

Call = tuple[Callable[..., Any], tuple]
Outcome = tuple[bool, Any]  # (ok, result or error)


class Checkpoints(Protocol):
    """A write-ahead log copied into the database beside the writes (SQLite's WAL)."""

    def copy(self) -> bool:
        """On the checkpoint thread: copy what the writes added; whether it all went."""

    def catch_up(self) -> None:
        """On the store's thread, writes held: copy the rest."""

    def close(self) -> None:
        """On the checkpoint thread: let go of what copying holds."""


class Writer:
    """Queues calls and runs them in batches: on the store's thread, or on the loop.

    ``run_batch`` runs a batch's calls (one transaction) and returns each
    one's outcome; ``is_open`` says whether the connection is there (a batch
    may run on the loop only then); ``loop_writes`` whether single-row writes
    may run on the loop at all; ``checkpoints`` what is copied every
    ``CHECKPOINT_EVERY`` batches, if anything.
    """

    def __init__(
        self,
        run_batch: Callable[[list[Call]], list[Outcome]],
        is_open: Callable[[], bool],
        loop_writes: bool,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        self._run_batch = run_batch
        self._is_open = is_open
        self._loop_writes = loop_writes
        self._checkpoints = checkpoints
        self._thread = StoreThread("sbx-store")
        # Checkpoints alongside the writes: a thread of their own.
        self._checkpointer = StoreThread("sbx-store-checkpoint") if checkpoints else None
        self.checkpointing = False  # from the start of a checkpoint to the end of its catch-up
        self._queue: list[tuple[Callable[..., Any], tuple, asyncio.Future]] = []
        self._quick = True  # the queued calls are all single-row writes
        self._flush_due: asyncio.Handle | None = None
        self._flush_now = False
        self._flushed: list[Callable[[], None]] = []  # told when the queue goes to a batch
        self._in_thread = 0  # batches (and catch-ups) handed to the thread and not settled yet
        self._commits = 0  # batches committed since the last checkpoint

    def submit(
        self, fn: Callable[..., T], *args: Any, lazy: bool = False, quick: bool = False
    ) -> asyncio.Future[T]:
        """Queue a call for the store; calls run in the order submitted.

        ``lazy``: nobody waits for it, so it may wait for the next flush;
        ``quick``: a single-row write, which may run on the loop (see the
        module's docstring).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.append((fn, args, future))
        self._quick = self._quick and quick
        if not lazy and not self._flush_now:
            if self._flush_due is not None:
                self._flush_due.cancel()
            self._flush_due = loop.call_soon(self._flush)
            self._flush_now = True
        elif self._flush_due is None:
            self._flush_due = loop.call_later(LAZY_DELAY, self._flush)
        return future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a call in its turn and wait for its result."""
        return await self.submit(fn, *args)

    def queued(self) -> int:
        """The place in the queue the next call submitted takes (until the next flush)."""
        return len(self._queue)

    def take_over(self, at: int, fn: Callable[[], Any]) -> None:
        """Run ``fn`` instead of the call queued at ``at``; its caller hears of ``fn``'s outcome."""
        self._queue[at] = (fn, (), self._queue[at][2])

    def on_flush(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` whenever the queue goes to a batch: the places in it are gone."""
        self._flushed.append(hook)

    async def on_thread(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the store's thread, outside any batch (closing the connection)."""
        return await self._thread.run(fn)

    async def stop(self) -> None:
        """End the threads, after the checkpoint under way, if any."""
        if self._checkpointer is not None and self._checkpoints is not None:
            await self._checkpointer.run(self._checkpoints.close)
            self._checkpointer.stop()
            self._checkpointer = None
        self._thread.stop()

    def _flush(self) -> None:
        self._flush_due, self._flush_now = None, False
        batch, self._queue = self._queue, []
        for hook in self._flushed:
            hook()
        quick, self._quick = self._quick, True
        calls = [(fn, args) for fn, args, _ in batch]
        self._commits += 1
        if self._commits >= CHECKPOINT_EVERY and self._checkpointer and not self.checkpointing:
            self._commits = 0
            self.checkpointing = True
            self._checkpointer.run(self._copy).add_done_callback(self._checkpointed)
        if self._loop_writes and quick and self._in_thread == 0 and self._is_open():
            # Nothing runs on the thread: the connection is the loop's for this batch.
            try:
                outcomes = self._run_batch(calls)
            except Exception as e:  # the transaction itself failed: each caller hears of it
                outcomes = [(False, e)] * len(batch)
            for (_, _, future), outcome in zip(batch, outcomes, strict=True):
                _deliver(future, outcome)
            return
        self._in_thread += 1
        done = self._thread.run(self._run_batch, calls)
        done.add_done_callback(lambda finished: self._settled(batch, finished))

    def _settled(self, batch: list[tuple[Any, Any, asyncio.Future]], done: asyncio.Future) -> None:
        self._in_thread -= 1
        _settle(batch, done)

    def _copy(self) -> bool:
        assert self._checkpoints is not None
        return self._checkpoints.copy()

    def _checkpointed(self, done: asyncio.Future) -> None:
        _warn_if_failed(done)
        if not self._is_open() or (not done.cancelled() and not done.exception() and done.result()):
            self.checkpointing = False
            return
        # The writes kept adding to the WAL: a short checkpoint in line copies
        # the rest, so no reader or writer is left on the WAL and it starts over.
        assert self._checkpoints is not None
        self._in_thread += 1
        self._thread.run(self._checkpoints.catch_up).add_done_callback(self._caught_up)

    def _caught_up(self, done: asyncio.Future) -> None:
        self._in_thread -= 1
        self.checkpointing = False
        _warn_if_failed(done)


class StoreThread:
    """One thread of the store: runs calls in order, hands each outcome back to the loop.

    Leaner per batch than a one-worker executor, whose every call makes a
    ``concurrent.futures`` future (a lock and a condition) and chains it to an
    asyncio one.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        future = asyncio.get_running_loop().create_future()
        self._calls.put((future, fn, args))
        return future

    def stop(self) -> None:
        """Finish the calls queued, then end the thread."""
        self._calls.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            try:
                outcome = (True, fn(*args))
            except BaseException as e:  # handed to the caller, whatever it is
                outcome = (False, e)
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                future.get_loop().call_soon_threadsafe(_deliver, future, outcome)


def _warn_if_failed(checkpoint: asyncio.Future) -> None:
    if not checkpoint.cancelled() and checkpoint.exception() is not None:
        log.warning("checkpointing the store's WAL failed: %s", checkpoint.exception())


def _deliver(future: asyncio.Future, outcome: Outcome) -> None:
    ok, value = outcome
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _settle(batch: list[tuple[Any, Any, asyncio.Future]], finished: asyncio.Future) -> None:
    """Hand each caller its call's outcome (or the batch's failure)."""
    if finished.cancelled() or finished.exception() is not None:
        error = finished.exception() if not finished.cancelled() else asyncio.CancelledError()
        outcomes: list[Outcome] = [(False, error)] * len(batch)
    else:
        outcomes = finished.result()
    for (_, _, future), outcome in zip(batch, outcomes, strict=True):
        _deliver(future, outcome)
