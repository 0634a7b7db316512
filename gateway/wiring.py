"""From ``Settings`` to each collaborator's own group of values.

The rooms below never read ``Settings``: each is handed the few values it
needs (``IsolationOptions``, ``SwarmOptions``, a store's ``Retention``, ...),
built here once from the flags and ``SBX_*`` variables ``config`` parsed.
``app`` (the composition root) calls these; so may a test that wants a
collaborator built as the gateway builds it.
"""

from __future__ import annotations

from pathlib import Path

from .config import Settings
from .egress import EgressOptions
from .sandbox.isolation import seccomp
from .sandbox.isolation.manager import IsolationOptions
from .sandbox.swarm.placement import SwarmOptions
from .sessions.options import SessionOptions
from .sessions.volumes import VolumeOptions
from .sessions.webhooks import WebhookOptions
from .store.base import Retention, Store
from .store.sqlite import SQLiteStore


def isolation_options(settings: Settings) -> IsolationOptions:
    """The isolation layer's settings: runtimes, the seccomp profile, egress."""
    profile = settings.seccomp_profile
    return IsolationOptions(
        runtimes=settings.runtimes,
        default_runtime=settings.default_runtime,
        seccomp=seccomp.profile_json() if profile.source == "gateway" else profile.json,
        egress=EgressOptions(
            policies=settings.network_policies,
            network=settings.egress_network,
            proxy_ports=settings.egress_proxy_ports,
            allow_ranges=settings.egress_allow_ranges,
            always_allow=settings.egress_always_allow,
            state_dir=Path(settings.data_dir) / "egress",
            upstream_authorities=Path(settings.egress_ca_file) if settings.egress_ca_file else None,
        ),
    )


def session_options(settings: Settings) -> SessionOptions:
    """The session layer's defaults, maximums and timings."""
    return SessionOptions(
        data_dir=settings.data_dir,
        max_sessions=settings.max_sessions,
        default_limits=settings.default_limits,
        max_limits=settings.max_limits,
        default_ttl=settings.default_ttl,
        max_ttl=settings.max_ttl,
        default_idle_timeout=settings.default_idle_timeout,
        max_idle_timeout=settings.max_idle_timeout,
        idle_action=settings.idle_action,
        kernel_start_timeout=settings.kernel_start_timeout,
        lease_ttl=settings.lease_ttl,
        start_concurrency=settings.start_concurrency,
        start_queue=settings.start_queue,
        start_queue_per_tenant=settings.start_queue_per_tenant,
        start_wait=settings.start_wait,
        host_id=settings.host_id,
        host_max_sessions=settings.host_max_sessions,
        host_max_memory=settings.host_max_memory,
        pause_frozen_for=settings.pause_frozen_for,
        checkpoint_idle_after=settings.checkpoint_idle_after,
        checkpoint_every=settings.checkpoint_every,
        checkpoint_max_size=settings.checkpoint_max_size,
    )


def volume_options(settings: Settings) -> VolumeOptions:
    """Where named volumes live (the data dir's ``volumes``), their sizes, their host."""
    return VolumeOptions(
        root=Path(settings.data_dir) / "volumes",
        default_size=settings.volume_size,
        max_size=settings.max_volume_size,
        host=settings.host_id,
    )


def make_store(settings: Settings) -> Store:
    """The store the settings name: SQLite in the data dir, or a shared PostgreSQL."""
    retention = Retention(
        max_age=settings.history_max_age,
        max_executions=settings.history_max_executions,
        interval=settings.history_prune_interval,
    )
    if settings.database_url:
        from .store.postgres import PostgresStore  # psycopg only where it is used

        return PostgresStore(settings.database_url, Path(settings.data_dir), retention)
    return SQLiteStore(Path(settings.data_dir) / "gateway.sqlite3", retention)


def swarm_options(settings: Settings) -> SwarmOptions:
    """The swarm placement's settings."""
    return SwarmOptions(
        network=settings.swarm_network,
        registry=settings.registry,
        constraints=settings.swarm_constraints,
        poll_interval=settings.swarm_poll_interval,
    )


def webhook_options(settings: Settings) -> WebhookOptions:
    """The lifecycle webhooks' delivery settings."""
    return WebhookOptions(
        timeout=settings.webhook_timeout,
        attempts=settings.webhook_attempts,
        backoff=settings.webhook_backoff,
        concurrency=settings.webhook_concurrency,
        queue=settings.webhook_queue,
        keep=settings.webhook_log_max_age,
        allow_ranges=settings.webhook_allow_ranges,
    )
