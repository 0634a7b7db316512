"""Executions recorded while they run, so a crash or restart loses no output.

A row is written as ``running`` before the kernel sees the code, each output
is appended the moment it is kept, and the outcome replaces the row at the
end. Outputs reach a streaming client only once they are stored, so nothing
a client was shown can be missing from the history. A gateway that dies
mid-execution leaves a running row with its outputs, which the next start
closes as ``interrupted_by_gateway_restart`` (``close_cut_executions``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..store.base import Store
from ..store.executions import replay_outputs
from ..timestamps import iso, parse_iso
from .kernel import ExecutionResult
from .outputs import OutputListener

log = logging.getLogger(__name__)

CUT_BY_RESTART = "interrupted_by_gateway_restart"

# What a history entry ran as (``review["kind"]``; none: a cell). Silent executes
# are a client's own work in the kernel, commands ran beside it: neither is a cell.
CELL, SILENT, COMMAND = "cell", "silent", "command"
TOOL = "tool"  # a tool call through the sandbox's MCP URL: no code ran at all


def kind_of(entry: dict[str, Any]) -> str:
    """What a recorded execution ran as: ``CELL``, ``SILENT`` or ``COMMAND``."""
    return (entry.get("review") or {}).get("kind", CELL)


def context_of(entry: dict[str, Any]) -> str | None:
    """The code context a recorded execution ran in; None: the session's own kernel."""
    return (entry.get("review") or {}).get("context")


def ran_in_kernel(entry: dict[str, Any]) -> bool:
    """Whether a recorded execution's code reached the session's own kernel (a replay of
    its state runs it); a code context's ran in a kernel of its own."""
    ran = kind_of(entry) not in (COMMAND, TOOL)
    return entry.get("status") != "denied" and ran and not context_of(entry)


class ExecutionRecorder:
    """One execution's row in the store, kept current while it runs."""

    def __init__(
        self,
        store: Store,
        session_id: str,
        code: str,
        description: str | None = None,
        review: dict[str, Any] | None = None,
    ) -> None:
        """Queue the ``running`` row; make one before the kernel gets the code.

        ``review``: what the policy made of the code (findings, decision, approval).
        """
        self.store = store
        self.review = review
        self.tool_calls: list[dict[str, Any]] = []  # what its code called, kept with its review
        record = {
            "code": code,
            "description": description,
            "started_at": iso(time.time()),
            "review": review,
        }
        self.id, self._begun = store.start_execution(session_id, record)

    def listener(self, forward: OutputListener | None = None) -> OutputListener:
        """An output listener that stores each change, then passes it on once stored."""

        def hear(output: dict[str, Any] | None) -> None:
            written = self.store.add_output(self.id, output, shown=forward is not None)
            written.add_done_callback(lambda done: self._written(done, output, forward))

        return hear

    def _written(
        self,
        done: asyncio.Future,
        output: dict[str, Any] | None,
        forward: OutputListener | None,
    ) -> None:
        if not done.cancelled() and done.exception() is not None:
            log.error("execution %s: an output could not be stored: %s", self.id, done.exception())
        if forward is not None:
            forward(output)

    def finish(self, result: ExecutionResult) -> asyncio.Future:
        """Queue the outcome in place of the running row; returns the write to await."""
        if self._begun.done() and self._begun.exception() is not None:
            log.error("execution %s was never recorded: %s", self.id, self._begun.exception())
        record = {**result.to_json(), "ended_at": iso(time.time())}
        if self.tool_calls:
            record["review"] = {**(self.review or {}), "tools": self.tool_calls}
        return self.store.finish_execution(self.id, record)


async def close_cut_executions(store: Store, of: set[str]) -> set[str]:
    """Close executions a previous gateway process left running in sessions ``of``.

    Returns the sessions they were in. Other sessions' running executions
    belong to other gateways, still running them.
    """
    now = time.time()
    sessions = set()
    for row in await store.running_executions():
        if row["session_id"] not in of:
            continue
        sessions.add(row["session_id"])
        await store.finish_execution(
            row["id"],
            {
                "execution_count": None,
                "status": CUT_BY_RESTART,
                "outputs": replay_outputs(row["outputs"]),
                "truncated": False,
                "error": {
                    "ename": "GatewayRestarted",
                    "evalue": (
                        "the gateway stopped while this cell ran; the outputs recorded up to "
                        "then are kept, and the cell was interrupted when the gateway came back"
                    ),
                    "traceback": [],
                },
                "ended_at": iso(now),
                "duration_ms": max(0.0, (now - parse_iso(row["started_at"])) * 1000),
            },
        )
    return sessions
