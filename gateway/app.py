"""Assemble the Tornado application and run the gateway's lifecycle."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import resource
import signal
from collections.abc import Callable
from pathlib import Path

import docker
import docker.errors
import tornado.httpserver
import tornado.netutil
import tornado.web
from tornado import httputil

from .access.audit import AuditLog
from .access.auth import Authenticator, Quota
from .access.preview_links import PreviewLinks
from .access.secrets import SecretVault, load_key
from .api import (
    approvals,
    audit,
    contexts,
    e2b,
    files,
    health,
    jupyter,
    kernels,
    metrics,
    notebooks,
    openapi,
    previews,
    secrets,
    sessions,
    snapshots,
    stream,
    template_tags,
    templates,
    tools,
    volumes,
    webhooks,
)
from .api.base import ApiOptions, NotFoundHandler, log_request
from .api.edge import Edge
from .api.forward import Forwarder
from .config import Settings
from .egress.npm import NpmCache
from .egress.packages import Cache, PackageCache, PackageGate, PackagePolicy
from .egress.policy import AddressGuard
from .errors import EngineUnavailable
from .execution.transport.guard import MessageGuard
from .execution.transport.libzmq import limit_kernel_messages, shared_context
from .notebooks.compare import diff_outputs
from .observe.loop_lag import LoopLagMonitor
from .observe.metrics import GatewayMetrics
from .policy.approvals import ApprovalDesk
from .policy.book import PolicyBook
from .policy.gate import Gate
from .policy.scan import Scanner
from .relays.agent_stream import RelayOptions
from .sandbox.factory import make_placement
from .sandbox.images import ImageBuilder
from .sandbox.isolation.manager import IsolationManager
from .sandbox.kernelspecs import KernelSpecs
from .sandbox.preview import PreviewCaps
from .sandbox.templates import BuildLimits, TemplateEngine
from .sandbox.wheels import Wheels
from .sessions.cpu import CpuShares
from .sessions.egress_hooks import EgressHooks
from .sessions.executions import ExecutionLimits, Executions
from .sessions.forks import Forks
from .sessions.lifecycle import SandboxLifecycle
from .sessions.listing import Listing
from .sessions.locations import Locations
from .sessions.manager import SessionManager
from .sessions.model import Session
from .sessions.networks import NetworkRules
from .sessions.pool import PoolTargets, WarmPool
from .sessions.previews import Previews
from .sessions.reports import Reports
from .sessions.snapshots import Snapshots
from .sessions.state import KernelState
from .sessions.template_files import UploadedSets
from .sessions.template_pools import TemplatePools
from .sessions.templates import BuildBounds, Templates
from .sessions.tools import SessionTools
from .sessions.upkeep import Upkeep
from .sessions.volumes import Volumes
from .sessions.webhooks import Webhooks, read_endpoints
from .sessions.workspaces import Workspaces
from .store.base import Store
from .store.datadir import DataDirLock
from .tools.specs import CallLimits
from .wiring import (
    isolation_options,
    make_store,
    session_options,
    swarm_options,
    volume_options,
    webhook_options,
)

log = logging.getLogger(__name__)

# The largest body a handler buffers (a multipart batch); uploads stream to disk instead.
MAX_BUFFERED_BODY = 64 * 2**20


def make_app(
    manager: SessionManager,
    auth: Authenticator,
    audit_log: AuditLog,
    secrets_vault: SecretVault,
    settings: Settings,
    observed: GatewayMetrics,
    forwarder: Forwarder,
    e2b_credentials: e2b.Credentials,
    domain: Domain,
) -> tornado.web.Application:
    """Build the application from each handler module's route list."""
    return tornado.web.Application(
        [
            *previews.host_routes,  # a PORT-ID.DOMAIN Host is a preview, whatever its path
            *sessions.routes,
            *snapshots.routes,
            *templates.routes,
            *template_tags.routes,
            *volumes.routes,
            *stream.routes,
            *files.routes,
            *notebooks.routes,
            *contexts.routes,
            *kernels.routes,
            *health.routes,
            *openapi.routes,
            *audit.routes,
            *secrets.routes,
            *approvals.routes,
            *webhooks.routes,
            *metrics.routes,
            *jupyter.routes,
            *e2b.routes,
            *previews.routes,
            *tools.routes,
        ],
        default_handler_class=NotFoundHandler,
        log_function=log_request,
        sbx_manager=manager,
        sbx_executions=domain.executions,
        sbx_reports=domain.reports,
        sbx_workspaces=domain.workspaces,
        sbx_networks=domain.networks,
        sbx_locations=domain.locations,
        sbx_listing=domain.listing,
        sbx_kernelspecs=manager.lifecycle.kernelspecs,
        sbx_desk=manager.gate.desk,
        sbx_webhooks=domain.webhooks,
        sbx_book=manager.gate.book,
        sbx_snapshots=manager.snapshots,
        sbx_templates=manager.templates,
        sbx_volumes=manager.volumes,
        sbx_template_pools=domain.template_pools,
        sbx_options=ApiOptions(
            cors_origins=settings.cors_origins,
            max_timeout=settings.max_timeout,
            max_request_body=settings.max_request_body,
            client_write_buffer=settings.client_write_buffer,
            max_archive_size=settings.max_archive_size,
            jupyter_ttl_from=settings.jupyter_ttl_from,
            max_ttl=settings.max_ttl,
        ),
        sbx_images=manager.lifecycle.images,
        sbx_relay_options=RelayOptions(
            settings.reconnect_grace, settings.replay_buffer_events, settings.replay_buffer_size
        ),
        sbx_auth=auth,
        sbx_audit=audit_log,
        sbx_secrets=secrets_vault,
        sbx_forwarder=forwarder,
        sbx_metrics=observed,
        sbx_e2b_credentials=e2b_credentials,
        sbx_e2b_tokens=e2b_credentials.tokens,
        sbx_e2b_forks=Forks(manager, settings.max_ttl),
        sbx_e2b_cpu=CpuShares(),
        sbx_previews=domain.previews,
        sbx_tools=domain.tools,
        sbx_preview_links=PreviewLinks(e2b_credentials.tokens),
        websocket_ping_interval=settings.ws_ping_interval,
        websocket_ping_timeout=settings.ws_ping_interval,
        # Past the code limit, so an oversized cell gets a clear refusal, not a dropped socket.
        websocket_max_message_size=settings.max_request_body,
    )


class Gateway:
    """The running server: store, session manager, HTTP listener."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = make_store(settings)
        self.manager: SessionManager | None = None
        self.domain: Domain | None = None
        self.server: tornado.httpserver.HTTPServer | None = None
        self.port: int | None = None
        self.audit: AuditLog | None = None
        self.lock: DataDirLock | None = None
        self.loop_lag = LoopLagMonitor(settings.loop_lag_warning)
        self.forwarder = Forwarder(idle=settings.idle_connection_timeout / 2)
        data = Path(settings.data_dir)
        self.package_caches: list[Cache] = [
            *([PackageCache(data / "packages")] if settings.package_cache else []),
            *([NpmCache(data / "npm")] if settings.npm_cache else []),
        ]

    async def start(self) -> None:
        # Before anything reads the directory: a second gateway on it refuses here.
        self.lock = DataDirLock.take(Path(self.settings.data_dir))
        _raise_file_limit()
        self.loop_lag.start()
        try:
            client = await asyncio.to_thread(docker.from_env)
            await asyncio.to_thread(client.ping)
        except docker.errors.DockerException as e:
            raise EngineUnavailable(
                f"no Docker engine answers ({e}); run scripts/setup to install and start one"
            ) from e
        await self.store.open()
        policies = PolicyBook(self.settings.policies_path())
        await policies.reload()  # a malformed policy stops the start, naming its line
        auth = Authenticator.from_settings(self.settings)
        if not auth.enabled:
            _warn_unauthenticated(self.settings.host)
        audit_log = self.audit = AuditLog(self.store)
        key = await asyncio.to_thread(load_key, self.settings.secrets_key_path())
        vault = SecretVault(self.store, key, self.settings.max_secret_size)
        packages: dict[str, PackageGate] = {}
        try:
            await asyncio.gather(*(cache.start() for cache in self.package_caches))
        except BaseException:  # the gateway does not start: leave no cache running
            await asyncio.gather(*(cache.stop() for cache in self.package_caches))
            raise
        for cache in self.package_caches:
            gate = packages[cache.language] = PackageGate(cache, self._package_policy)
            gate.on_install = lambda install: audit_log.package_install(
                install, self.manager.owner_of(install.session_id) if self.manager else None
            )
        self.manager = build_manager(
            self.settings, client, self.store, auth.quota, policies, vault, packages
        )
        self.domain = build_domain(self.settings, self.manager)
        self.manager.gate.desk.on_change = audit_log.approval
        self.domain.tools.on_call = lambda session_id, who, outcome, call: audit_log.record(
            "tool.call", who, outcome, session_id=session_id, detail=call
        )
        events, webhook_sink = self.manager.events, self.domain.webhooks
        events.sinks.append(webhook_sink.publish)
        self.manager.gate.desk.listeners.append(events.approval)
        self.manager.metrics.watch(
            "counter", "sbx_webhook_attempts", "Webhook delivery attempts by outcome.",
            ["outcome"], lambda: {(k,): float(v) for k, v in webhook_sink.outcomes.items()},
        )  # fmt: skip
        lag = self.loop_lag.max_lag
        self.manager.metrics.watch(
            "gauge", "sbx_event_loop_lag_max_seconds",
            "Longest event-loop stall in the last minute.", [], lambda: {(): lag()},
        )  # fmt: skip
        _freeze_what_lives_for_good()
        upkeep = self.domain.upkeep
        await self.manager.start(upkeep.on_death, upkeep.resync)
        if self.manager.volumes is not None:
            await self.manager.volumes.sweep()  # a volume delete a crash cut short
        self.manager.spawn(self.domain.tools.restore())  # servers reached in the background
        await self.manager.templates.start()
        if self.domain.template_pools is not None:
            await self.domain.template_pools.start()
        upkeep.start()
        await self.domain.webhooks.start(self.manager.leases.owner)
        first, *others = self.manager.lifecycle.placement.api_hosts(self.settings.host)
        reuse = self.settings.reuse_port
        sockets = tornado.netutil.bind_sockets(self.settings.port, first, reuse_port=reuse)
        self.port = sockets[0].getsockname()[1]
        if self.store.SHARED:
            network = self.settings.advertise_network
            placement = self.manager.lifecycle.placement
            address = self.settings.advertised(
                self.port, placement.address_on(network) if network else ""
            )
            if reuse and not self.settings.advertise_url:  # the shared port reaches any worker
                sockets += tornado.netutil.bind_sockets(0, "127.0.0.1")
                address = f"http://127.0.0.1:{sockets[-1].getsockname()[1]}"
            await self.store.announce(self.manager.leases.owner, address)
        for host in others:
            sockets += tornado.netutil.bind_sockets(self.port, host, reuse_port=reuse)
        manager = self.manager
        egress, hooks = manager.lifecycle.isolation.egress, self.domain.egress
        egress.protect_port(self.port)
        self.domain.webhooks.guard.own_ports.add(self.port)
        self.domain.tools.guard.own_ports.add(self.port)
        egress.set_redactor(hooks.redact)
        egress.set_connection_hook(hooks.record_connection)
        egress.set_denial_hook(
            lambda denial: audit_log.egress_denied(denial, manager.owner_of(denial.session_id))
        )
        egress.set_host_hook(hooks.approve_host)
        # Until the edge knows the caller, a body may be max_anonymous_body at most.
        settings = self.settings
        credentials = e2b.Credentials.in_data_dir(
            Path(settings.data_dir), auth, manager.owner_of, manager.mcp_token_of
        )
        app = make_app(
            self.manager,
            auth,
            audit_log,
            vault,
            settings,
            self.manager.metrics,
            self.forwarder,
            credentials,
            self.domain,
        )
        link_holder = previews.link_holder(PreviewLinks(credentials.tokens))

        def also_accepts(start: httputil.RequestStartLine, headers: httputil.HTTPHeaders) -> bool:
            return credentials.accepts(start, headers) or link_holder(start, headers)

        self.server = tornado.httpserver.HTTPServer(
            Edge(app, auth, audit_log, settings, MAX_BUFFERED_BODY, also_accepts),
            max_body_size=settings.max_anonymous_body,
            max_buffer_size=MAX_BUFFERED_BODY,
            max_header_size=settings.max_header_size,
            idle_connection_timeout=settings.idle_connection_timeout,
        )
        self.server.add_sockets(sockets)

    async def stop(self) -> None:
        """Stop accepting requests, keep (or end) the sessions, close the store."""
        if self.server is not None:
            self.server.stop()
        if self.domain is not None:
            await self.domain.upkeep.stop()
            await self.domain.webhooks.stop()
        if self.manager is not None:
            await self.manager.templates.stop()
            await self.manager.stop(
                end_sessions=self.settings.end_sessions_on_stop,
                drain_timeout=self.settings.drain_timeout,
            )
        if self.manager is not None:
            for gate in self.manager.lifecycle.packages.values():
                gate.stop()
        if self.domain is not None:
            self.domain.previews.stop()
            await self.domain.tools.stop()
        await asyncio.gather(*(cache.stop() for cache in self.package_caches))
        if self.audit is not None:
            self.audit.close()
        self.loop_lag.stop()
        self.forwarder.close()
        await self.store.close()
        if self.lock is not None:
            self.lock.release()

    def _package_policy(self, session_id: str) -> PackagePolicy | None:
        """The package policy of a live session's tenant (None: no such session)."""
        owner = self.manager.owner_of(session_id) if self.manager is not None else None
        if owner is None:
            return None
        quota = self.manager.quota(owner.tenant)
        return PackagePolicy(quota.package_allow, quota.package_deny)

    async def serve(self) -> None:
        """Run until SIGINT/SIGTERM, then shut down cleanly."""
        await self.start()
        on_stop = (
            "sessions end when it stops (--end-sessions-on-stop)"
            if self.settings.end_sessions_on_stop
            else "sessions keep running when it stops, for the next start to reattach "
            "(--end-sessions-on-stop ends them instead)"
        )
        log.info(
            "sandbox gateway listening on http://%s:%s (data in %s); %s",
            self.settings.host,
            self.port,
            self.settings.data_dir,
            on_stop,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        verb = "ending" if self.settings.end_sessions_on_stop else "keeping"
        log.info("stopping: %s %d session(s)", verb, len(self.manager.sessions))
        await self.stop()


def _wheel_index(packages: dict[str, PackageGate] | None) -> str | None:
    """Where template builds fetch wheels: the package cache when it runs, else pip's own."""
    cache = gate.cache if (gate := (packages or {}).get("python")) else None
    return cache.simple_url if isinstance(cache, PackageCache) else None


def build_manager(
    settings: Settings,
    client: docker.DockerClient,
    store: Store,
    quota: Callable[[str], Quota],
    policies: PolicyBook,
    vault: SecretVault,
    packages: dict[str, PackageGate] | None = None,
) -> SessionManager:
    """Wire the session manager and what it is handed, from the settings."""
    lifecycle = build_lifecycle(settings, client, vault, packages)
    sessions: dict[str, Session] = {}
    desk = ApprovalDesk(store, settings.approval_timeout, live=sessions.__contains__)
    pool = WarmPool(
        lifecycle,
        PoolTargets(settings.pool, settings.pool_max, settings.pool_shrink_after),
        refill_concurrency=settings.pool_refill_concurrency,
        max_sandboxes=settings.max_sessions,
        live=sessions,
        imports=settings.pool_imports,
    )
    state = KernelState(lifecycle, store, diff_outputs, settings.interrupt_grace)
    kept = Snapshots(
        Path(settings.data_dir) / "snapshots", store, state, quota, settings.max_archive_size
    )
    gate = Gate(policies, Scanner(), desk)
    limits = BuildLimits(
        memory=settings.template_build_memory,
        disk=settings.template_build_disk,
        timeout=settings.template_build_timeout,
    )
    kept_templates = Templates(
        store,
        TemplateEngine(client, limits, wheels=Wheels(index=_wheel_index(packages))),
        lifecycle.kernelspecs,
        lifecycle.images,
        lambda image: any(s.image == image for s in sessions.values()),
        UploadedSets(Path(settings.data_dir) / "template-files", settings.template_upload_disk),
        BuildBounds(running=settings.template_builds),
        None
        if lifecycle.placement.name == "docker"
        else f"the {lifecycle.placement.name} placement runs sessions on other nodes, "
        "which do not hold this host's template images",
        lambda tenant: (
            PackagePolicy(quota(tenant).package_allow, quota(tenant).package_deny).refusal
        ),
    )
    named_volumes = Volumes(store, quota, gate, volume_options(settings))
    observed = GatewayMetrics()
    watch_sessions(observed, sessions, pool)
    return SessionManager(
        session_options(settings),
        lifecycle,
        store,
        pool,
        quota,
        sessions,
        state,
        kept,
        gate=gate,
        templates=kept_templates,
        metrics=observed,
        volumes=named_volumes,
    )


@dataclasses.dataclass(frozen=True)
class Domain:
    """What the handlers are handed besides the manager, each with one concern."""

    executions: Executions
    reports: Reports
    workspaces: Workspaces
    locations: Locations
    listing: Listing
    egress: EgressHooks
    upkeep: Upkeep
    networks: NetworkRules
    previews: Previews
    webhooks: Webhooks
    tools: SessionTools
    template_pools: TemplatePools | None  # None: this gateway builds no templates


def build_domain(settings: Settings, manager: SessionManager) -> Domain:
    """The execute pipeline, the read side, files, locations and upkeep over the manager."""
    limits = ExecutionLimits(
        max_code_size=settings.max_code_size,
        max_timeout=settings.max_timeout,
        interrupt_grace=settings.interrupt_grace,
        session_output_bytes=settings.session_output_bytes,
    )
    lifecycle, store, gate = manager.lifecycle, manager.store, manager.gate
    guard = AddressGuard(list(settings.tool_allow_ranges), set())
    session_tools = SessionTools(manager, gate, lifecycle.secrets, CallLimits(), guard)
    return Domain(
        executions=Executions(
            manager,
            gate,
            store,
            lifecycle,
            manager.commands,
            manager.leases,
            manager.metrics,
            limits,
            session_tools,
        ),
        reports=Reports(
            manager, store, lifecycle.placement, manager.snapshots, manager.pool, manager.clock
        ),
        workspaces=Workspaces(manager, gate, manager.watchers),
        locations=Locations(manager.sessions, manager.leases, store),
        listing=Listing(manager.sessions, store, manager.leases, manager.clock),
        egress=EgressHooks(manager.sessions, gate, store),
        upkeep=Upkeep(
            manager,
            lifecycle,
            manager.pool,
            manager.leases,
            store,
            settings.cull_interval,
            settings.pause_memory_floor,
        ),
        networks=NetworkRules(manager, gate, lifecycle.isolation.egress),
        previews=Previews(
            lifecycle.placement,
            PreviewCaps(settings.preview_max_connections, settings.preview_max_bytes),
        ),
        webhooks=Webhooks(
            store,
            read_endpoints(settings.tokens_file),
            webhook_options(settings),
            AddressGuard(list(settings.webhook_allow_ranges), set()),
        ),
        tools=session_tools,
        template_pools=None
        if manager.templates is None
        else TemplatePools(
            manager.templates, manager.pool, store, settings.template_pool_per_tenant
        ),
    )


def watch_sessions(observed: GatewayMetrics, sessions: dict[str, Session], pool: WarmPool) -> None:
    """Expose the live sessions' states and the warm pool, read on each scrape."""

    def states() -> dict[tuple[str, ...], float]:
        counts = dict.fromkeys((("idle",), ("busy",), ("dead",), ("starting",)), 0.0)
        for session in sessions.values():
            counts[(session.state,)] = counts.get((session.state,), 0.0) + 1
        return counts

    def pool_stat(key: str) -> Callable[[], dict[tuple[str, ...], float]]:
        return lambda: {(name,): stats[key] for name, stats in pool.stats().items()}

    observed.watch("gauge", "sbx_sessions", "Live sessions by state.", ["state"], states)
    observed.watch(
        "gauge", "sbx_pool_ready", "Warm kernels ready to be claimed.", ["kernel"],
        pool_stat("ready"),
    )  # fmt: skip
    observed.watch(
        "gauge", "sbx_pool_target", "Warm kernels the pool keeps.", ["kernel"], pool_stat("target")
    )
    observed.watch(
        "counter", "sbx_pool_claims", "Session creates, by whether a warm kernel served them.",
        ["kernel", "result"], lambda: {k: float(v) for k, v in pool.claims.items()},
    )  # fmt: skip


def build_lifecycle(
    settings: Settings,
    client: docker.DockerClient,
    vault: SecretVault,
    packages: dict[str, PackageGate] | None = None,
) -> SandboxLifecycle:
    """Wire the sandbox side from the settings: the one place that reads them for it."""
    limit_kernel_messages(settings.max_kernel_message)
    images = ImageBuilder(client, Path(settings.images_dir), base=settings.base_image)
    placement = make_placement(
        settings.placement,
        client,
        images,
        sessions_dir=Path(settings.data_dir) / "sessions",
        tmp_size=settings.tmp_size,
        swarm=swarm_options(settings),
        context=shared_context(),
        max_message=settings.max_kernel_message if settings.kernel_message_guard else 0,
        guard=MessageGuard,
    )
    return SandboxLifecycle(
        session_options(settings),
        KernelSpecs(Path(settings.kernels_dir)),
        images,
        IsolationManager(isolation_options(settings), client),
        placement,
        vault,
        packages,
    )


def _warn_unauthenticated(host: str) -> None:
    """Say loudly that anyone who reaches the port can run code, and what is still refused."""
    where = (
        "any program on this machine, of any user, can run code here"
        if host in ("127.0.0.1", "localhost", "::1")
        else f"ANYONE WHO CAN REACH {host} CAN RUN CODE HERE, as can any program on this machine"
    )
    log.warning(
        "AUTHENTICATION IS OFF (--auth none): every caller is an admin; %s. Refused: web pages "
        "the user opens (a state-changing request or WebSocket with another site's Origin), DNS "
        "names pointed at this machine (a Host other than localhost, an IP address or %s) and "
        "JSON bodies without Content-Type: application/json. "
        "Use API tokens for anything but a single user on this machine.",
        where,
        host,
    )


def _freeze_what_lives_for_good() -> None:
    """Keep what the start made so far (modules, settings, the manager) out of full collections.

    It lives as long as the process, yet each full pass of the cyclic collector
    walked all of it: at 20 busy sessions, one 90 ms stall of the loop, every
    session waiting, every ten seconds or so. Only what is made later is walked.
    Called before sessions are recovered: what ends is never frozen (a frozen
    cycle is never collected).
    """
    gc.collect()
    gc.freeze()


def _raise_file_limit() -> None:
    """Every session holds sockets and files: use the whole allowance the host grants."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
