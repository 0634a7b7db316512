"""Egress for sessions whose network policy is an allowlist.

Such a kernel joins the gateway's internal egress network (``network``), gets
the proxy's URL with its own credentials in ``HTTP(S)_PROXY`` and a resolver
that answers nothing (names are resolved by the proxy, and only names on the
list), so the filtering proxy (``proxy``) is its only way out. Everything is
set up on the first allowlist session, so gateways that never see one need
neither root nor iptables for it. The token key and the proxy's port are kept
in the data directory: a restarted gateway that reattaches to a running kernel
serves it at the same URL with the same credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
from pathlib import Path

import docker

from ..errors import BadRequest, EgressUnavailable, NotAllowed
from ..hosts import IPNetwork, Rule
from .credentials import TRUST_ENV, Broker, Credential, SessionCA, placeholder, upstream_context
from .network import EgressNetwork
from .policy import AddressGuard, NetworkPolicy
from .proxy import (
    ConnectionHook,
    DenialHook,
    EgressConnection,
    EgressDenial,
    EgressProxy,
    HostHook,
    Redactor,
)

__all__ = [
    "Brokering",
    "Egress",
    "EgressConnection",
    "EgressDenial",
    "NetworkPolicy",
    "SandboxNetwork",
]

log = logging.getLogger(__name__)

# No resolver inside the sandbox: lookups fail at once instead of timing out.
_RESOLV_CONF = "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n"


@dataclasses.dataclass(frozen=True)
class SandboxNetwork:
    """How a kernel container is attached: Docker network, extra env, resolv.conf, and
    the bundle of authorities it trusts when the proxy adds credentials for it."""

    mode: str = "none"
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    resolv_conf: Path | None = None
    ca_bundle: Path | None = None


@dataclasses.dataclass(frozen=True)
class Brokering:
    """A session's credential bindings and the values of their secrets (never its sandbox's)."""

    credentials: tuple[Credential, ...] = ()
    values: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EgressOptions:
    """The egress settings, as values."""

    policies: tuple[str, ...] = ("none", "allowlist")  # what sessions may ask for
    network: str = "sbx-egress"
    proxy_ports: range = range(47000, 47100)
    allow_ranges: tuple[IPNetwork, ...] = ()  # private ranges allowlists may reach anyway
    always_allow: tuple[Rule, ...] = ()  # entries every allowlist gets
    state_dir: Path = Path("egress")  # where the proxy keeps its per-session state
    upstream_authorities: Path | None = None  # trusted beside the host's, for bound hosts


class Egress:
    """Admits sessions to the egress network and the proxy, and lets them go."""

    def __init__(self, options: EgressOptions, client: docker.DockerClient) -> None:
        self.policies = options.policies
        self.always_allow = list(options.always_allow)
        self.guard = AddressGuard(list(options.allow_ranges), own_ports=set())
        self.network = EgressNetwork(client, options.network, options.proxy_ports)
        self.state_dir = options.state_dir
        self.upstream = upstream_context(options.upstream_authorities)
        self.proxy: EgressProxy | None = None
        self._on_denied: DenialHook | None = None
        self._redact: Redactor | None = None
        self._on_connection: ConnectionHook | None = None
        self._on_new_host: HostHook | None = None
        self._endpoint: tuple[str, int] | None = None
        self._lock = asyncio.Lock()

    def set_denial_hook(self, hook: DenialHook | None) -> None:
        """Route every reported denial to ``hook`` too (the audit log plugs in here)."""
        self._on_denied = hook
        if self.proxy is not None:
            self.proxy.on_denied = hook

    def set_redactor(self, redact: Redactor) -> None:
        """Mask sessions' secrets out of the targets the proxy logs and reports."""
        self._redact = redact
        if self.proxy is not None:
            self.proxy.redact = redact

    def set_connection_hook(self, hook: ConnectionHook) -> None:
        """Hand every connection a session made, once ended, to ``hook`` (its record)."""
        self._on_connection = hook
        if self.proxy is not None:
            self.proxy.on_connection = hook

    def set_host_hook(self, hook: HostHook | None) -> None:
        """Ask ``hook`` before each session's first connection to a host (approvals)."""
        self._on_new_host = hook
        if self.proxy is not None:
            self.proxy.on_new_host = hook

    def protect_port(self, port: int) -> None:
        """Never let a sandbox reach ``port`` on this host (the gateway's API port)."""
        self.guard.own_ports.add(port)

    def check(
        self, policy: NetworkPolicy, credentials: tuple[Credential, ...] = ()
    ) -> NetworkPolicy:
        """Refuse a network policy this server does not offer, and credentials it cannot send."""
        kind = "none" if policy.is_none else "allowlist"
        if kind not in self.policies:
            raise NotAllowed(
                f"network policy {kind!r} is not offered by this server; "
                f"allowed: {', '.join(self.policies)}"
            )
        for credential in credentials:
            for rule in credential.hosts:
                if policy.is_none or not any(rule.within(r) for r in policy.rules or ()):
                    raise BadRequest(
                        f"credential {credential.secret!r} is bound to {rule.text}, which the "
                        "network's allow list does not name: add it there too"
                    )
        return policy

    async def admit(
        self, session_id: str, policy: NetworkPolicy, brokering: Brokering | None = None
    ) -> SandboxNetwork:
        """The network a session's container gets; allowlists get the proxy, and sessions
        with credentials a trust bundle and placeholders in their secrets' variables."""
        if policy.is_none:
            return SandboxNetwork()
        address, port = await self._start()
        assert self.proxy is not None
        broker, bundle = None, None
        if brokering is not None and brokering.credentials:
            broker, bundle = await self._broker(session_id, brokering)
        token = self.proxy.admit(session_id, policy.extended(self.always_allow), broker)
        url = f"http://{session_id}:{token}@{address}:{port}"
        env = {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
        env |= {"NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1"}
        if broker is not None:
            env |= TRUST_ENV | broker.placeholders
        return SandboxNetwork(self.network.name, env, self.state_dir / "resolv.conf", bundle)

    async def _broker(self, session_id: str, brokering: Brokering) -> tuple[Broker, Path]:
        """The session's authority (its bundle written for the sandbox to trust) and broker."""
        assert self.proxy is not None
        ca = await asyncio.to_thread(SessionCA, self.proxy.key, session_id, self.upstream)
        bundle = self.state_dir / "ca" / f"{session_id}.pem"
        await asyncio.to_thread(_write_public, bundle, ca.bundle())
        names = {c.secret for c in brokering.credentials}
        marks = {n: placeholder(self.proxy.key, session_id, n) for n in names}
        return Broker(brokering.credentials, dict(brokering.values), marks, ca), bundle

    def update(self, session_id: str, policy: NetworkPolicy) -> None:
        """Put a session's new rules in force for its next connection (the operator's
        ``always_allow`` entries stay added); a session not served now gets them when it is."""
        if self.proxy is not None:
            with contextlib.suppress(KeyError):
                self.proxy.update(session_id, policy.extended(self.always_allow))

    def release(self, session_id: str) -> None:
        """Revoke a session's proxy access and cut its connections."""
        if self.proxy is not None:
            self.proxy.release(session_id)
        (self.state_dir / "ca" / f"{session_id}.pem").unlink(missing_ok=True)

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()

    async def _start(self) -> tuple[str, int]:
        async with self._lock:
            if self._endpoint is None:
                address = await asyncio.to_thread(self.network.ensure)
                key, preferred = await asyncio.to_thread(self._load_state)
                proxy = EgressProxy(self.guard, key, on_denied=self._on_denied)
                proxy.redact = self._redact
                proxy.on_connection = self._on_connection
                proxy.on_new_host = self._on_new_host
                try:
                    port = await proxy.start(address, self.network.ports, preferred)
                except OSError as e:
                    raise EgressUnavailable(f"cannot start the egress proxy: {e}") from e
                await asyncio.to_thread((self.state_dir / "port").write_text, str(port))
                self.proxy, self._endpoint = proxy, (address, port)
                log.info("egress proxy on %s:%d for network %s", address, port, self.network.name)
        return self._endpoint

    def _load_state(self) -> tuple[bytes, int | None]:
        """The token key (made once, private) and the port used last time."""
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.state_dir / "resolv.conf").write_text(_RESOLV_CONF)
        key_file = self.state_dir / "key"
        if not key_file.exists():
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        port_file = self.state_dir / "port"
        port = port_file.read_text().strip() if port_file.exists() else ""
        return bytes.fromhex(key_file.read_text().strip()), int(port) if port.isdigit() else None


def _write_public(path: Path, data: bytes) -> None:
    """A file any sandbox user may read (a bundle of public certificates), made anew."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    tmp.replace(path)
