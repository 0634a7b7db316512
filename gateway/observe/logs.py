"""The gateway's log output, written a turn of the event loop at a time."""

from __future__ import annotations

import asyncio
import logging
from typing import TextIO


class TurnBufferedHandler(logging.StreamHandler):
    """Lines logged in one turn of the event loop are written together at its end.

    An execute logs two lines (its access line and its audit event) on the
    one thread that serves every session; written one by one, each cost a
    system call. Lines logged off the loop (the store's thread, the engine's
    event reader) go out at once, with any the loop has waiting, and so does
    whatever waits when the process exits (``logging.shutdown`` flushes).
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self._pending: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        self._pending.append(line)  # under the handler's lock, taken by handle()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        if len(self._pending) == 1:
            loop.call_soon(self.flush)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # an RLock: emit() may hold it already
            if self._pending:
                text, self._pending = "".join(self._pending), []
                try:
                    self.stream.write(text)
                except (OSError, ValueError):  # stderr closed or gone: as logging's own shutdown
                    return
            super().flush()
