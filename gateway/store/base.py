"""What the rest of the gateway sees of its store: the ``Store`` protocol and its values.

Two backends satisfy it: ``sqlite.SQLiteStore`` (a file in the data dir) and
``postgres.PostgresStore`` (a server several gateways share); the domain
annotates with ``Store`` and never names either.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, NamedTuple, Protocol, runtime_checkable

HISTORY_PAGE = 100  # executions in a page of history unless asked otherwise
HISTORY_PAGE_MAX = 1000
AUDIT_FILTERS = ("tenant", "session_id", "action", "outcome")

# A session's record and what reattaching to its kernel needs (None: nothing).
OpenSession = tuple[dict[str, Any], dict[str, Any] | None]


class HistoryPage(NamedTuple):
    """Executions, and the cursor (an execution id) of the next page, None at the end."""

    executions: list[dict[str, Any]]
    next: int | None


@dataclasses.dataclass(frozen=True)
class Retention:
    """How much history is kept; 0 keeps everything.

    ``max_age``: seconds an execution (and an ended session's record, once
    its executions are gone) is kept after it started (ended).
    ``max_executions``: the newest executions kept per session. Running
    executions are never pruned. ``interval``: seconds between pruning passes.
    """

    max_age: float = 0.0
    max_executions: int = 0
    interval: float = 60.0


@runtime_checkable
class Store(Protocol):
    """Sessions, executions, the audit log, secrets, snapshots, approvals and leases.

    Writes that return a future are queued at once and batched (the future
    settles when the write is committed); the rest are awaited.
    """

    SHARED: bool  # whether other gateways may use the same database
    down: str | None  # why the database does not answer, while it does not

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def gateway_id(self) -> str: ...
    async def prune(self) -> bool: ...

    # sessions
    def save_session(
        self, doc: dict[str, Any], runtime: dict[str, Any] | None = None
    ) -> asyncio.Future: ...
    async def get_session(self, session_id: str) -> dict[str, Any] | None: ...
    async def open_sessions(self, owner: str) -> list[OpenSession]: ...

    # leases and the gateways sharing the store
    async def orphans(self, owner: str) -> list[OpenSession]: ...
    async def unheld(self, session_id: str) -> bool: ...
    async def owned_elsewhere(self, owner: str) -> set[str]: ...
    async def claim_lease(self, session_id: str, owner: str, ttl: float) -> bool: ...
    async def renew_leases(self, owner: str, ttl: float) -> set[str]: ...
    async def release_lease(self, session_id: str, owner: str) -> None: ...
    async def announce(self, gateway_id: str, address: str) -> None: ...
    async def owner_address(self, session_id: str) -> tuple[str, str] | None: ...

    # executions and their outputs
    def start_execution(
        self, session_id: str, record: dict[str, Any]
    ) -> tuple[int, asyncio.Future]: ...
    def add_output(
        self, execution_id: int, output: dict[str, Any] | None, shown: bool = False
    ) -> asyncio.Future: ...
    def finish_execution(self, execution_id: int, record: dict[str, Any]) -> asyncio.Future: ...
    async def running_executions(self) -> list[dict[str, Any]]: ...
    async def history(
        self, session_id: str, after: int = 0, limit: int = HISTORY_PAGE
    ) -> HistoryPage: ...
    async def last_execution(self, session_id: str) -> int: ...
    async def copy_history(self, source: str, target: str, up_to: int) -> int: ...

    # egress connections
    def add_connection(
        self, session_id: str, execution_id: int | None, record: dict[str, Any]
    ) -> asyncio.Future: ...
    async def connections(
        self, session_id: str, after: int = 0, limit: int = HISTORY_PAGE
    ) -> tuple[list[dict[str, Any]], int | None]: ...

    # the audit log
    def add_audit(self, event: dict[str, Any]) -> asyncio.Future: ...
    async def audit_events(
        self,
        filters: dict[str, str],
        since: str | None = None,
        until: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]: ...

    # the records' hash chains (chain.py)
    async def verify_chains(
        self, tenant: str | None = None, session_id: str | None = None
    ) -> dict[str, Any]: ...
    async def chain_head(self, session_id: str, place: int | None = None) -> dict[str, Any]: ...

    # tenants' sealed secrets
    async def put_secret(
        self, tenant: str, name: str, sealed: bytes, at: str, overwrite: bool
    ) -> tuple[dict[str, str], bool] | None: ...
    async def delete_secret(self, tenant: str, name: str) -> bool: ...
    async def secret_dates(self, tenant: str) -> list[dict[str, str]]: ...
    async def sealed_secrets(self, tenant: str, names: list[str]) -> dict[str, bytes]: ...

    # snapshots
    async def add_snapshot(self, doc: dict[str, Any]) -> None: ...
    async def get_snapshot(self, snapshot_id: str) -> dict[str, Any] | None: ...
    async def snapshots_of(self, session_id: str) -> list[dict[str, Any]]: ...
    async def snapshots_of_tenant(self, tenant: str) -> list[dict[str, Any]]: ...
    async def snapshot_usage(self, tenant: str) -> tuple[int, int]: ...
    async def delete_snapshot(self, snapshot_id: str) -> None: ...

    # approvals of held executes
    def save_approval(self, doc: dict[str, Any]) -> asyncio.Future: ...
    async def approvals(
        self, tenant: str | None = None, state: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]: ...
    async def get_approval(self, approval_id: str) -> dict[str, Any] | None: ...
