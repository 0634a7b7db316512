"""The store the gateway is handed: its tables' repositories over one database.

Each method of the ``Store`` protocol is the method of the repository that
owns its table (``METHODS``); the facade adds only opening, closing and the
gateway's id. ``sqlite.SQLiteStore`` and ``postgres.PostgresStore`` are this
facade over their dialect.
"""

from __future__ import annotations

from .approvals import Approvals
from .audit import Audit
from .base import Retention
from .chain import Chain
from .claims import Claims
from .connections import Connections
from .database import Database, Dialect
from .executions import Executions
from .leases import Leases
from .retention import Pruner
from .secrets import Secrets
from .sessions import Sessions
from .snapshots import Snapshots
from .templates import Templates
from .volumes import Volumes
from .webhooks import WebhookDeliveries

# The Store protocol's methods, by the repository that serves them.
METHODS = {
    "sessions": ("save_session", "get_session", "open_sessions", "open_page", "orphans"),
    "claims": (
        "claim_quota", "extend_claims", "rebind_claim", "release_claim", "release_stale_claims",
    ),
    "leases": (
        "unheld", "owned_elsewhere", "claim_lease", "renew_leases", "release_lease", "announce",
        "owner_address",
    ),
    "connections": ("add_connection", "connections"),
    "executions": (
        "start_execution", "add_output", "finish_execution", "running_executions", "history",
        "last_execution", "copy_history",
    ),
    "audit": ("add_audit", "audit_events"),
    "chain": ("verify_chains", "chain_head"),
    "secrets": ("put_secret", "delete_secret", "secret_dates", "sealed_secrets"),
    "snapshots": (
        "add_snapshot", "get_snapshot", "snapshots_of", "snapshots_of_tenant", "snapshot_usage",
        "delete_snapshot",
    ),
    "approvals": ("save_approval", "approvals", "get_approval"),
    "templates": (
        "save_template", "template_versions", "templates_of_tenant", "templates_in_status",
        "delete_template_version", "tag_template", "untag_template", "template_tags",
        "set_template_pool", "template_pools",
    ),
    "volumes": (
        "add_volume", "get_volume", "volumes_of_tenant", "volume_holders", "delete_volume",
        "mount_volumes", "volume_ids",
    ),
    "webhooks": (
        "add_deliveries", "claim_deliveries", "finish_attempt", "release_deliveries", "deliveries",
        "get_delivery", "prune_deliveries",
    ),
    "pruner": ("prune",),
}  # fmt: skip


class StoreFacade:
    """One database, its repositories, and history pruned by the ``Retention`` given."""

    def __init__(self, dialect: Dialect, retention: Retention | None = None) -> None:
        self.db = Database(dialect)
        self.SHARED = dialect.shared
        self.retention = retention or Retention()
        self.pruner = Pruner(self.db, self.retention)
        chain = Chain(self.db, self.retention)
        connections = Connections(self.db, chain)
        self.parts = {
            "sessions": Sessions(self.db),
            "leases": Leases(self.db),
            "claims": Claims(self.db),
            "connections": connections,
            "executions": Executions(self.db, connections, chain, grew=self.pruner.grew),
            "audit": Audit(self.db, chain),
            "chain": chain,
            "secrets": Secrets(self.db),
            "snapshots": Snapshots(self.db),
            "approvals": Approvals(self.db),
            "templates": Templates(self.db),
            "volumes": Volumes(self.db),
            "webhooks": WebhookDeliveries(self.db),
            "pruner": self.pruner,
        }
        for part, names in METHODS.items():
            for name in names:
                setattr(self, name, getattr(self.parts[part], name))

    @property
    def down(self) -> str | None:
        """Why the database does not answer, while it does not."""
        return self.db.down

    async def open(self) -> None:
        await self.db.open()
        self.pruner.start()

    async def close(self) -> None:
        """Stop pruning, finish what is queued, then close the connection."""
        await self.pruner.stop()
        await self.db.close()

    async def gateway_id(self) -> str:
        """This gateway's stable id, used to label its containers."""
        return await self.db.run(self.db.dialect.gateway_id, self.db)
