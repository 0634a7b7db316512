"""Assemble the Tornado application and run the gateway's lifecycle."""

from __future__ import annotations

import asyncio
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

from .access.audit import AuditLog
from .access.auth import Authenticator, Quota
from .access.sandbox_tokens import SandboxTokens
from .api import (
    audit,
    e2b,
    files,
    health,
    jupyter,
    kernels,
    metrics,
    notebooks,
    openapi,
    sessions,
    stream,
)
from .api.base import NotFoundHandler, log_request
from .api.edge import Edge
from .config import Settings
from .errors import EngineUnavailable
from .execution.kernel import limit_kernel_messages, shared_context
from .observe.loop_lag import LoopLagMonitor
from .sandbox.factory import make_placement
from .sandbox.images import ImageBuilder
from .sandbox.isolation.manager import IsolationManager
from .sandbox.kernelspecs import KernelSpecs
from .sessions.lifecycle import SandboxLifecycle
from .sessions.manager import SessionManager
from .sessions.model import Session
from .sessions.pool import WarmPool
from .store.sqlite import Store

log = logging.getLogger(__name__)

# The largest body a handler buffers (a multipart batch); uploads stream to disk instead.
MAX_BUFFERED_BODY = 64 * 2**20


def make_app(
    manager: SessionManager,
    auth: Authenticator,
    audit_log: AuditLog,
    settings: Settings,
    loop_lag: LoopLagMonitor,
    e2b_credentials: e2b.Credentials,
) -> tornado.web.Application:
    """Build the application from each handler module's route list."""
    return tornado.web.Application(
        [
            *sessions.routes,
            *stream.routes,
            *files.routes,
            *notebooks.routes,
            *kernels.routes,
            *health.routes,
            *openapi.routes,
            *audit.routes,
            *metrics.routes,
            *jupyter.routes,
            *e2b.routes,
        ],
        default_handler_class=NotFoundHandler,
        log_function=log_request,
        sbx_manager=manager,
        sbx_auth=auth,
        sbx_audit=audit_log,
        sbx_loop_lag=loop_lag,
        sbx_e2b_credentials=e2b_credentials,
        sbx_e2b_tokens=e2b_credentials.tokens,
        websocket_ping_interval=settings.ws_ping_interval,
        websocket_ping_timeout=settings.ws_ping_interval,
        # Past the code limit, so an oversized cell gets a clear refusal, not a dropped socket.
        websocket_max_message_size=settings.max_request_body,
    )


class Gateway:
    """The running server: store, session manager, HTTP listener."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = Store(Path(settings.data_dir) / "gateway.sqlite3", settings.retention())
        self.manager: SessionManager | None = None
        self.server: tornado.httpserver.HTTPServer | None = None
        self.port: int | None = None
        self.audit: AuditLog | None = None
        self.loop_lag = LoopLagMonitor(settings.loop_lag_warning)

    async def start(self) -> None:
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
        auth = Authenticator.from_settings(self.settings)
        if not auth.enabled:
            _warn_unauthenticated(self.settings.host)
        audit_log = self.audit = AuditLog(self.store)
        self.manager = build_manager(self.settings, client, self.store, auth.quota)
        await self.manager.start()
        first, *others = self.manager.lifecycle.placement.api_hosts(self.settings.host)
        sockets = tornado.netutil.bind_sockets(self.settings.port, first)
        self.port = sockets[0].getsockname()[1]
        for host in others:
            sockets += tornado.netutil.bind_sockets(self.port, host)
        self.manager.isolation.egress.protect_port(self.port)
        manager = self.manager
        manager.isolation.egress.set_denial_hook(
            lambda denial: audit_log.egress_denied(denial, manager.owner_of(denial.session_id))
        )
        # Until the edge knows the caller, a body may be max_anonymous_body at most.
        settings = self.settings
        credentials = e2b.Credentials(SandboxTokens.in_data_dir(Path(settings.data_dir)))
        app = make_app(self.manager, auth, audit_log, settings, self.loop_lag, credentials)
        self.server = tornado.httpserver.HTTPServer(
            Edge(app, auth, audit_log, settings, MAX_BUFFERED_BODY, credentials.accepts),
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
        if self.manager is not None:
            await self.manager.stop(
                end_sessions=self.settings.end_sessions_on_stop,
                drain_timeout=self.settings.drain_timeout,
            )
        if self.audit is not None:
            self.audit.close()
        self.loop_lag.stop()
        await self.store.close()

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


def build_manager(
    settings: Settings, client: docker.DockerClient, store: Store, quota: Callable[[str], Quota]
) -> SessionManager:
    """Wire the session manager and what it is handed, from the settings."""
    lifecycle = build_lifecycle(settings, client)
    sessions: dict[str, Session] = {}
    pool = WarmPool(
        lifecycle,
        settings.pool,
        refill_concurrency=settings.pool_refill_concurrency,
        max_sandboxes=settings.max_sessions,
        live=sessions,
    )
    return SessionManager(settings, lifecycle, store, pool, quota, sessions)


def build_lifecycle(settings: Settings, client: docker.DockerClient) -> SandboxLifecycle:
    """Wire the sandbox side from the settings: the one place that reads them for it."""
    limit_kernel_messages(settings.max_kernel_message)
    images = ImageBuilder(client, Path(settings.images_dir), base=settings.base_image)
    placement = make_placement(
        settings.placement,
        client,
        images,
        sessions_dir=Path(settings.data_dir) / "sessions",
        tmp_size=settings.tmp_size,
        swarm=settings.swarm_options(),
        context=shared_context(),
    )
    return SandboxLifecycle(
        settings,
        KernelSpecs(Path(settings.kernels_dir)),
        images,
        IsolationManager(settings.isolation_options(), client),
        placement,
    )


def _warn_unauthenticated(host: str) -> None:
    """Say loudly that anyone who reaches the port can run code."""
    where = (
        "only this machine can reach it"
        if host in ("127.0.0.1", "localhost", "::1")
        else f"ANYONE WHO CAN REACH {host} CAN RUN CODE HERE"
    )
    log.warning(
        "AUTHENTICATION IS OFF (--auth none): every caller is an admin; %s. "
        "Use API tokens for anything but a single user on this machine.",
        where,
    )


def _raise_file_limit() -> None:
    """Every session holds sockets and files: use the whole allowance the host grants."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
