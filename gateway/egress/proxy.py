"""The filtering proxy: the only way out of the network allowlist sessions live on.

It speaks just the HTTP/1.1 that clients send proxies: ``CONNECT host:port``
(HTTPS, or any TCP, tunnelled byte for byte) and absolute-form requests
(``GET http://host/path``) for plain HTTP. Each session authenticates with its
own token (Basic ``Proxy-Authorization``, from the proxy URL in its
environment; derived from a key, so a restarted gateway accepts the tokens
of the kernels it reattaches to), which selects its allowlist. A target whose
host ``parse_authority`` refuses gets 400; one off the list, or resolving only
to addresses ``AddressGuard`` refuses, 403; each is reported as an
``EgressDenial``. It runs on the gateway's event loop: name lookups go to a
few resolver threads of its own, each given ``dns_timeout`` (a sandbox asking
for names that never resolve fills those threads, never the loop's default
executor that every session's file and Docker calls wait on), all else is
non-blocking sockets.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import dataclasses
import functools
import hashlib
import hmac
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from ipaddress import ip_address
from urllib.parse import urlsplit

from ..hosts import Host, IPAddress, format_authority, parse_authority
from ..tasks import end_task
from .credentials import Broker, Brokered, TunnelRefused
from .policy import AddressGuard, NetworkPolicy
from .sni import server_name

log = logging.getLogger(__name__)

HEAD_LIMIT = 64 * 1024
CHUNK = 64 * 1024
# Proxy-specific headers end at the proxy; the upstream connection is one-shot.
_HOP_BY_HOP = {"proxy-authorization", "proxy-connection", "connection", "keep-alive"}
_REASONS = {403: "Forbidden", 407: "Proxy Authentication Required", 400: "Bad Request"}
_REASONS |= {502: "Bad Gateway", 504: "Gateway Timeout"}


@dataclasses.dataclass(frozen=True)
class EgressDenial:
    """One refused request, for logs and the denial hook (the audit log)."""

    session_id: str | None
    method: str
    target: str
    reason: str
    at: float
    suppressed: int = 0  # denials of this session not reported since the last one


DenialHook = Callable[[EgressDenial], None]
# Asked once per session and host:port before the first connection: may it go ahead?
HostHook = Callable[[str, str], Awaitable[bool]]


@dataclasses.dataclass
class EgressConnection:
    """One connection a session made through the proxy, allowed or not, for its record."""

    session_id: str
    method: str  # CONNECT, or the plain-HTTP request's method
    host: str  # the host asked for (the raw target until it parses)
    started: float  # time.time() at its start
    port: int | None = None
    sni: str | None = None  # the TLS server name a CONNECT tunnel's client sent
    decision: str = "denied"  # allowed, denied (by policy), failed (bad request, upstream)
    rule: str | None = None  # the allowlist entry that let it through
    reason: str | None = None  # why it was refused or failed
    bytes_up: int = 0  # from the sandbox
    bytes_down: int = 0  # to the sandbox
    duration_ms: float = 0.0
    intercepted: bool = False  # TLS ended at the proxy to put a bound credential in
    injected: list[str] = dataclasses.field(default_factory=list)  # secrets put in, by name
    unresolved: list[str] = dataclasses.field(default_factory=list)  # placeholders sent as is


# Hears of every authenticated connection once it has ended.
ConnectionHook = Callable[[EgressConnection], None]
# Masks a session's secrets out of text (a target it asked for) before it is logged.
Redactor = Callable[[str, str], str]


class _Refused(Exception):
    """Ends a request with an error response; ``denied`` marks a policy decision."""

    def __init__(self, status: int, reason: str, denied: bool = False) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.denied = denied


@dataclasses.dataclass
class _Upstream:
    """Where an open connection leads: what a change of rules is checked against."""

    host: Host
    port: int
    address: IPAddress
    writer: asyncio.StreamWriter
    record: EgressConnection


@dataclasses.dataclass
class _Tenant:
    session_id: str
    policy: NetworkPolicy
    # its open connections, each with its upstream once connected
    tasks: dict[asyncio.Task, _Upstream | None] = dataclasses.field(default_factory=dict)
    window: float = 0.0  # start of the current one-second reporting window
    reported: int = 0
    suppressed: int = 0
    hosts: dict[str, asyncio.Future[bool]] = dataclasses.field(default_factory=dict)  # decided
    broker: Broker | None = None  # credentials it has bound to hosts


class EgressProxy:
    """An HTTP/CONNECT proxy that lets each session reach only its allowlist."""

    DNS_THREADS = 4  # lookups at once; the rest wait their turn, within dns_timeout

    def __init__(
        self,
        guard: AddressGuard,
        key: bytes,
        on_denied: DenialHook | None = None,
        max_connections: int = 64,
        connect_timeout: float = 10.0,
        head_timeout: float = 10.0,
        reports_per_second: int = 20,
        dns_timeout: float = 5.0,
    ) -> None:
        self.guard = guard
        self.key = key
        self.on_denied = on_denied  # the hook an audit log plugs into
        self.redact: Redactor | None = None  # (session id, text) -> text without its secrets
        self.on_connection: ConnectionHook | None = None  # the session's connection record
        self.on_new_host: HostHook | None = None  # a policy that holds first connections
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.head_timeout = head_timeout
        self.reports_per_second = reports_per_second
        self.dns_timeout = dns_timeout
        self._resolver = ThreadPoolExecutor(self.DNS_THREADS, thread_name_prefix="sbx-egress-dns")
        self._server: asyncio.Server | None = None
        self._tenants: dict[str, _Tenant] = {}  # by session id
        self._handlers: set[asyncio.Task] = set()
        self._peers: collections.Counter[str] = collections.Counter()  # open, per address

    async def start(self, host: str, ports: range, preferred: int | None = None) -> int:
        """Listen on ``preferred`` or else the first free port of ``ports``; return it."""
        candidates = [preferred] if preferred in ports else []
        for port in [*candidates, *ports]:
            try:
                self._server = await asyncio.start_server(
                    self._serve, host, port, limit=HEAD_LIMIT, reuse_address=True
                )
            except OSError:
                continue
            bound = self._server.sockets[0].getsockname()[1]  # port 0 picks one
            self.guard.own_ports.add(bound)
            return bound
        raise OSError(f"no free port for the egress proxy in {ports.start}-{ports.stop - 1}")

    async def stop(self) -> None:
        """Stop listening and cut every open connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        self._resolver.shutdown(wait=False, cancel_futures=True)  # a lookup may hang for long
        if self._server is not None:
            await self._server.wait_closed()

    def token_for(self, session_id: str) -> str:
        """The secret a session's kernel presents as its proxy password."""
        digest = hmac.new(self.key, session_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def admit(self, session_id: str, policy: NetworkPolicy, broker: Broker | None = None) -> str:
        """Let ``session_id`` use the proxy under ``policy``; return its token."""
        self._tenants[session_id] = _Tenant(session_id, policy, broker=broker)
        return self.token_for(session_id)

    def update(self, session_id: str, policy: NetworkPolicy) -> None:
        """Put ``policy`` in force for a session's next connection, now.

        Open connections the new policy refuses are cut; those it still
        permits go on (a KeyError for a session the proxy does not serve).
        """
        tenant = self._tenants[session_id]
        tenant.policy = policy
        for upstream in filter(None, tenant.tasks.values()):
            refusal = _refusal(policy, upstream.host, upstream.port, upstream.address)
            if refusal is not None:
                upstream.record.reason = f"cut when the rules changed: {refusal}"
                upstream.writer.close()  # both directions end; the handler cleans up

    def release(self, session_id: str) -> None:
        """Forget a session and cut its open connections (called when it ends)."""
        tenant = self._tenants.pop(session_id, None)
        if tenant is not None:
            for task in tenant.tasks:
                task.cancel()

    # -- one client connection ------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Counted per address before anything is read: one sandbox holding many idle
        # connections must not use up the gateway's file descriptors.
        peer = str((writer.get_extra_info("peername") or ("?",))[0])
        if self._peers[peer] >= self.max_connections:
            writer.close()
            return
        self._peers[peer] += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        tenant = record = None
        method, target = "?", "?"
        started = time.monotonic()
        try:
            try:
                async with asyncio.timeout(self.head_timeout):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                raise _Refused(400, "incomplete or oversized request head") from None
            method, target, version, headers = _parse_head(head)
            tenant = self._authenticate(headers)
            tenant.tasks[task] = None
            record = EgressConnection(tenant.session_id, method, _printable(target), time.time())
            await self._relay(tenant, reader, writer, record, target, version, headers)
        except _Refused as refused:
            if record is not None:
                record.decision = "denied" if refused.denied else "failed"
                record.reason = refused.reason
            shown, reason = self._redacted(tenant, _printable(target), refused.reason)
            if refused.denied:
                self._report(tenant, method, shown, reason)
            else:
                log.debug("egress %s %s failed: %s", method, shown, reason)
            await _answer(writer, refused.status, refused.reason)
        except (ConnectionError, OSError):
            pass  # the client or the upstream went away
        finally:
            if tenant is not None:
                tenant.tasks.pop(task, None)
            if record is not None:
                record.duration_ms = (time.monotonic() - started) * 1000
                self._recorded(record)
            writer.close()
            self._handlers.discard(task)
            self._peers[peer] -= 1
            if not self._peers[peer]:
                del self._peers[peer]

    def _recorded(self, record: EgressConnection) -> None:
        if self.on_connection is not None:
            try:
                self.on_connection(record)
            except Exception:
                log.exception("the egress connection hook failed")

    def _authenticate(self, headers: dict[str, str]) -> _Tenant:
        scheme, _, credentials = headers.get("proxy-authorization", "").partition(" ")
        tenant = None
        if scheme.lower() == "basic":
            with contextlib.suppress(binascii.Error, UnicodeDecodeError):
                decoded = base64.b64decode(credentials, validate=True).decode()
                session_id, _, token = decoded.partition(":")
                expected = self.token_for(session_id).encode()
                if hmac.compare_digest(token.encode(), expected):
                    tenant = self._tenants.get(session_id)
        if tenant is None:
            raise _Refused(407, "no valid session credentials; use the proxy URL in the "
                           "session's HTTPS_PROXY / HTTP_PROXY", denied=True)  # fmt: skip
        return tenant

    async def _relay(
        self,
        tenant: _Tenant,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        record: EgressConnection,
        target: str,
        version: str,
        headers: dict[str, str],
    ) -> None:
        method = record.method
        # Refused whole, before urlsplit quietly drops tabs and newlines from a URL.
        odd = next((c for c in target if not c.isprintable()), None)
        if odd is not None:
            reason = f"control, space or invisible character U+{ord(odd):04X} in the target"
            raise _Refused(400, reason, denied=True)
        broker = tenant.broker
        scan = None if broker is None else _scanner(broker, record)
        if method == "CONNECT":
            host, port = _target(target, None)
            up_reader, up_writer = await self._open(tenant, host, port, record)
            if broker is not None and isinstance(host, str) and broker.binds(host, port):
                try:
                    await self._intercept(broker, reader, writer, up_writer, host, port, record)
                except BaseException:
                    up_writer.close()
                    raise
            else:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            url = None
            with contextlib.suppress(ValueError):  # a stray '[' or ']'
                url = urlsplit(target)
            if url is None or url.scheme != "http" or not url.netloc:
                raise _Refused(400, "send http://host/path, or CONNECT host:port for HTTPS")
            host, port = _target(url.netloc, 80)
            up_reader, up_writer = await self._open(tenant, host, port, record)
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            authority = format_authority(host, None if port == 80 else port)
            head = _origin_head(method, path, version, headers, authority)
            if scan is not None:
                scan(head)  # a placeholder in a plain request is never resolved
            up_writer.write(head)
            record.bytes_up += len(head)  # what went out, as a tunnel's bytes are counted
        await _splice(reader, writer, up_reader, up_writer, record, scan)

    async def _intercept(
        self,
        broker: Broker,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_writer: asyncio.StreamWriter,
        host: str,
        port: int,
        record: EgressConnection,
    ) -> None:
        """End the sandbox's TLS here, check the origin's, and send its request on with the
        bound credentials in; the rest of the tunnel is then spliced as any other."""
        record.intercepted = True
        loop = asyncio.get_running_loop()
        leaf = await loop.run_in_executor(self._resolver, broker.ca.leaf, host)
        # Nothing may be read in the clear once the tunnel is up: the client's hello must
        # reach the TLS layer, not this reader's buffer.
        writer.transport.pause_reading()
        if reader._buffer:
            raise _Refused(400, "bytes sent before the tunnel was granted")
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            async with asyncio.timeout(self.head_timeout):
                await writer.start_tls(leaf)
                head = await reader.readuntil(b"\r\n\r\n")
        except (ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            raise _Refused(400, "no TLS handshake and request head in time") from None
        found = Brokered()
        try:
            rewritten = broker.rewrite(head, host, port, found)
        except TunnelRefused as refused:
            raise _Refused(refused.status, refused.reason, denied=True) from None
        try:
            async with asyncio.timeout(self.connect_timeout):
                await up_writer.start_tls(broker.ca.upstream, server_hostname=host)
        except (ssl.SSLError, OSError, TimeoutError) as e:
            raise _Refused(502, f"TLS to {host} failed: {e}") from None
        record.injected.extend(found.injected)
        record.unresolved.extend(s for s in found.unresolved if s not in record.unresolved)
        up_writer.write(rewritten)
        record.bytes_up += len(rewritten)

    async def _open(
        self, tenant: _Tenant, host: Host, port: int, record: EgressConnection
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to ``host:port`` if the policy and the guard allow it."""
        target = format_authority(host, port)
        record.host, record.port = format_authority(host, None), port
        rule = tenant.policy.rule_for(host, port)
        if rule is None:
            raise _Refused(403, f"{target} is not on this session's allowlist", denied=True)
        record.rule = rule.text
        if self.on_new_host is not None and not await self._first_use(tenant, target):
            raise _Refused(403, f"the first connection to {target} was not approved", denied=True)
        refusals, failure = [], None
        for address in await self._addresses(host, port):
            refusal = self.guard.refusal(address, port) or _refusal(
                tenant.policy, host, port, address
            )
            if refusal is not None:
                refusals.append(refusal)
                continue
            try:
                async with asyncio.timeout(self.connect_timeout):
                    opened = await asyncio.open_connection(str(address), port, limit=CHUNK)
            except (OSError, TimeoutError) as e:
                failure = e
                continue
            # The rules may have changed while it connected: the ones in force now decide.
            refusal = _refusal(tenant.policy, host, port, address)
            if refusal is not None:
                opened[1].close()
                raise _Refused(403, f"{target} refused: {refusal}", denied=True)
            task = asyncio.current_task()
            assert task is not None
            tenant.tasks[task] = _Upstream(host, port, address, opened[1], record)
            record.decision = "allowed"
            return opened
        if failure is not None:
            raise _Refused(502, f"cannot connect to {target}: {str(failure) or 'timed out'}")
        raise _Refused(403, f"{target} refused: " + "; ".join(refusals), denied=True)

    async def _first_use(self, tenant: _Tenant, target: str) -> bool:
        """Ask the hook once per host:port; connections meanwhile wait for the same answer."""
        assert self.on_new_host is not None
        decided = tenant.hosts.get(target)
        if decided is None:
            decided = asyncio.ensure_future(self.on_new_host(tenant.session_id, target))
            tenant.hosts[target] = decided
        try:
            return await asyncio.shield(decided)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the egress host hook failed; %s refused", target)
            return False

    async def _addresses(self, host: Host, port: int) -> list[IPAddress]:
        if not isinstance(host, str):
            return [host]
        lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        try:
            async with asyncio.timeout(self.dns_timeout):
                # Cancelled while queued, a lookup never runs; running, it ends on its own.
                infos = await asyncio.get_running_loop().run_in_executor(self._resolver, lookup)
        except TimeoutError:
            raise _Refused(504, f"resolving {host} timed out") from None
        except socket.gaierror as e:
            raise _Refused(502, f"cannot resolve {host}: {e.strerror}") from None
        inet = (socket.AF_INET, socket.AF_INET6)
        return list(dict.fromkeys(ip_address(i[4][0]) for i in infos if i[0] in inet))

    def _redacted(self, tenant: _Tenant | None, *texts: str) -> tuple[str, ...]:
        """``texts`` without the secrets of the session asking, for logs and the audit."""
        if tenant is None or self.redact is None:
            return texts
        return tuple(self.redact(tenant.session_id, text) for text in texts)

    def _report(self, tenant: _Tenant | None, method: str, target: str, reason: str) -> None:
        """Log a denial and pass it to the hook, at most ``reports_per_second`` per session.

        A sandbox can be denied in a tight loop; the excess is counted, not logged.
        """
        suppressed = 0
        if tenant is not None:
            now = time.monotonic()
            if now - tenant.window >= 1.0:
                tenant.window, tenant.reported = now, 0
            if tenant.reported >= self.reports_per_second:
                tenant.suppressed += 1
                return
            tenant.reported += 1
            suppressed, tenant.suppressed = tenant.suppressed, 0
        denial = EgressDenial(
            session_id=tenant.session_id if tenant else None,
            method=method,
            target=target,
            reason=reason,
            at=time.time(),
            suppressed=suppressed,
        )
        log.warning(
            "egress denied: session=%s method=%s target=%s reason=%r suppressed=%d",
            denial.session_id or "-",
            method,
            target,
            reason,
            suppressed,
            extra={"sbx_event": "egress_denied", "egress_denial": denial},
        )
        if self.on_denied is not None:
            try:
                self.on_denied(denial)
            except Exception:
                log.exception("the egress denial hook failed")


def _refusal(policy: NetworkPolicy, host: Host, port: int, address: IPAddress) -> str | None:
    """Why ``policy`` refuses ``host:port`` at ``address`` (a name's resolved one), or None."""
    if policy.rule_for(host, port) is None:
        return f"{format_authority(host, port)} is not on this session's allowlist"
    denied = policy.denied_address(address, port)
    return f"{address} is in the denied range {denied}" if denied else None


def _scanner(broker: Broker, record: EgressConnection) -> Callable[[bytes], None]:
    """Look for placeholders in what goes out, a chunk at a time (each with the end of the
    one before, so a placeholder cut in two is still seen)."""
    found = Brokered(unresolved=record.unresolved)
    overlap = max((len(p) for p in broker.placeholders.values()), default=1) - 1
    tail = b""

    def scan(data: bytes) -> None:
        nonlocal tail
        joined = tail + data
        broker.scan(joined, found)
        tail = joined[-overlap:] if overlap else b""

    return scan


def _printable(text: str) -> str:
    """``text`` with what could forge or hide a log line escaped."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Refused(400, "not an HTTP/1.x request")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return parts[0].upper(), parts[1], parts[2], headers


def _target(authority: str, default_port: int | None) -> tuple[Host, int]:
    """The host and port of a CONNECT target or URL: the only ones matched and resolved."""
    try:
        host, port = parse_authority(authority)
    except ValueError as e:
        raise _Refused(400, str(e), denied=True) from None
    if port is None and default_port is None:
        raise _Refused(400, f"CONNECT needs host:port, not {authority!r}", denied=True)
    return host, port or default_port


def _origin_head(
    method: str, path: str, version: str, headers: dict[str, str], authority: str
) -> bytes:
    """The request as the origin server expects it, without the proxy's headers."""
    listed = {h.strip().lower() for h in headers.get("connection", "").split(",")}
    lines = [f"{method} {path} {version}"]
    kept = {k: v for k, v in headers.items() if k not in _HOP_BY_HOP | listed}
    kept["host"] = authority  # the host checked, never a Host header naming another one
    lines += [f"{name}: {value}" for name, value in kept.items()]
    lines += ["connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Callable[[bytes], None]
) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(CHUNK):
            seen(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    record: EgressConnection,
    scan: Callable[[bytes], None] | None = None,
) -> None:
    """Copy both ways until the upstream is done; the client's EOF only half-closes.

    The bytes each way are counted, and a tunnel's first bytes read for a TLS
    server name; what the proxy can read going out (plain HTTP, an intercepted
    tunnel) is ``scan``ned for placeholders.
    """

    def up(data: bytes) -> None:
        if record.method == "CONNECT" and not record.bytes_up and not record.intercepted:
            record.sni = server_name(data)
        if scan is not None and (record.method != "CONNECT" or record.intercepted):
            scan(data)
        record.bytes_up += len(data)

    def down(data: bytes) -> None:
        record.bytes_down += len(data)

    upload = asyncio.create_task(_pipe(reader, up_writer, up))
    try:
        await _pipe(up_reader, writer, down)
    finally:
        try:
            await end_task(upload)
        finally:
            up_writer.close()


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    body = f"sbx egress proxy: {reason}\n".encode()
    head = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if status == 407:
        head.append('Proxy-Authenticate: Basic realm="sbx"')
    with contextlib.suppress(ConnectionError, OSError):
        writer.write("\r\n".join([*head, "", ""]).encode() + body)
        await writer.drain()
