"""Credentials brokered at egress: the sandbox holds a placeholder, the proxy adds the value.

A ``Credential`` binds one of the tenant's sealed secrets to host names and to
a request header (``Authorization: Bearer {value}``). A session with such
bindings gets, in the secret's variable, a placeholder instead of the value;
the egress proxy ends TLS for the bound hosts with a certificate from the
session's own authority (``SessionCA``, which the sandbox's clients trust
through ``SSL_CERT_FILE`` and its kin), sets the header on each request to a
bound host and swaps the placeholder for the value in that request's headers.
Anywhere else a placeholder is only a string: it is never resolved, and a
plain-HTTP request that carries one is recorded as such. Hosts without a
binding are never intercepted (their TLS stays end to end).

The authority's key is derived from the proxy's key and the session id, so a
restarted gateway signs for the same sandboxes without storing a key per session.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import ipaddress
import os
import re
import ssl
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import certifi
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..errors import BadRequest
from ..hosts import Host, Rule

MAX_CREDENTIALS = 16
VALUE = "{value}"
# RFC 9110 token characters: a header name the proxy can set without ambiguity.
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # the sealed secrets' names
# Where a sandbox finds the bundle (the operating system's authorities and its session's).
CA_PATH = "/etc/sbx/egress-ca.pem"
TRUST_ENV = {
    name: CA_PATH
    for name in (
        "SSL_CERT_FILE",  # OpenSSL: urllib, httpx, curl, pip's own
        "REQUESTS_CA_BUNDLE",  # requests (pip too)
        "CURL_CA_BUNDLE",
        "PIP_CERT",
        "NODE_EXTRA_CA_CERTS",  # Node: added to its own list
        "GIT_SSL_CAINFO",
    )
}
LEAVES_KEPT = 64  # certificates a session's authority keeps made, by host


@dataclasses.dataclass(frozen=True)
class Credential:
    """One sealed secret, the hosts it is sent to, and the header it goes in."""

    secret: str
    hosts: tuple[Rule, ...]
    header: str = "Authorization"
    format: str = VALUE

    @classmethod
    def parse(cls, raw: Any) -> Credential:
        if not isinstance(raw, dict) or set(raw) - {"secret", "hosts", "header", "format"}:
            raise BadRequest(
                'each network.credentials entry is {"secret": NAME, "hosts": [...], '
                '"header": "Authorization", "format": "Bearer {value}"}'
            )
        secret, header = raw.get("secret"), raw.get("header", "Authorization")
        template = raw.get("format", VALUE)
        if not isinstance(secret, str) or not SECRET_NAME.fullmatch(secret):
            raise BadRequest(
                f"network.credentials: secret must name a sealed secret, not {secret!r}"
            )
        if not isinstance(header, str) or not _HEADER.fullmatch(header):
            raise BadRequest(f"network.credentials: header {header!r} is not a header name")
        if header.lower() in ("host", "content-length", "transfer-encoding", "connection"):
            raise BadRequest(f"network.credentials: the proxy does not set {header}")
        if not isinstance(template, str) or template.count(VALUE) != 1 or len(template) > 1024:
            raise BadRequest(
                "network.credentials: format must hold '{value}' once, e.g. 'Bearer {value}'"
            )
        if any(c in template for c in "\r\n\0"):
            raise BadRequest("network.credentials: format may not hold line breaks or NUL")
        hosts = raw.get("hosts")
        if not isinstance(hosts, list) or not hosts or len(hosts) > 16:
            raise BadRequest("network.credentials: hosts must list 1 to 16 host names")
        rules = tuple(Rule.parse(h, "network.credentials hosts") for h in hosts)
        if any(r.name is None for r in rules):
            raise BadRequest(
                "network.credentials: hosts are names or *.domain wildcards (a certificate "
                "names the host), not addresses"
            )
        return cls(secret, rules, header, template)

    def applies_to(self, host: Host, port: int) -> bool:
        return isinstance(host, str) and any(r.matches_name(host, port) for r in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {
            "secret": self.secret,
            "hosts": [r.text for r in self.hosts],
            "header": self.header,
            "format": self.format,
        }


def parse_credentials(value: Any) -> tuple[Credential, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_CREDENTIALS:
        raise BadRequest(f"network.credentials must be a list of at most {MAX_CREDENTIALS}")
    return tuple(Credential.parse(entry) for entry in value)


def placeholder(key: bytes, session_id: str, secret: str) -> str:
    """What the sandbox holds instead of ``secret``'s value: stable, and names the secret."""
    digest = hmac.new(key, f"placeholder:{session_id}:{secret}".encode(), hashlib.sha256)
    return f"sbx-placeholder-{secret}-{digest.hexdigest()[:24]}"


class SessionCA:
    """A session's certificate authority: the bundle its sandbox trusts, and leaf contexts."""

    def __init__(self, key: bytes, session_id: str, upstream: ssl.SSLContext) -> None:
        seed = hmac.new(key, f"ca:{session_id}".encode(), hashlib.sha256).digest()
        curve = ec.SECP256R1()
        self._key = ec.derive_private_key(int.from_bytes(seed, "big") % _ORDER or 1, curve)
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sandbox-gateway egress"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"session {session_id[:36]}"),
            ]
        )
        self.name = name
        now = datetime.datetime.now(datetime.UTC)
        public = self._key.public_key()
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(int.from_bytes(seed[:16], "big") >> 1)
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.upstream = upstream
        self._leaves: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._lock = threading.Lock()  # leaves are made on the proxy's worker threads

    def bundle(self) -> bytes:
        """The sandbox's trust: the usual public authorities, then this session's."""
        return Path(certifi.where()).read_bytes() + self.cert.public_bytes(
            serialization.Encoding.PEM
        )

    def leaf(self, host: str) -> ssl.SSLContext:
        """A server context with a certificate for ``host`` (a few ms: called off the loop)."""
        with self._lock:
            return self._leaf(host)

    def _leaf(self, host: str) -> ssl.SSLContext:
        found = self._leaves.get(host)
        if found is not None:
            self._leaves.move_to_end(host)
            return found
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([_san(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        # load_cert_chain reads files only: an anonymous one in memory, never on a disk.
        pem = cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.memfd_create("sbx-egress-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        self._leaves[host] = context
        if len(self._leaves) > LEAVES_KEPT:
            self._leaves.popitem(last=False)
        return context


class TunnelRefused(Exception):
    """A request inside an intercepted tunnel that is answered with an error, not sent on."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclasses.dataclass
class Brokered:
    """What one request carried: the secrets put in, the placeholders left as they were."""

    injected: list[str] = dataclasses.field(default_factory=list)
    unresolved: list[str] = dataclasses.field(default_factory=list)


class Broker:
    """A session's bindings and values: which tunnels to open up, and each request's headers."""

    def __init__(
        self,
        credentials: tuple[Credential, ...],
        values: dict[str, str],
        placeholders: dict[str, str],
        ca: SessionCA,
    ) -> None:
        self.credentials = tuple(c for c in credentials if c.secret in values)
        for credential in self.credentials:
            value = values[credential.secret]
            if not value.isascii() or any(ord(c) < 32 or ord(c) == 127 for c in value):
                raise BadRequest(
                    f"the value of secret {credential.secret!r} holds a line break, control or "
                    "non-ASCII character, so it cannot go in a header: store it without (PUT "
                    f"/v1/secrets/{credential.secret})"
                )
        self.values = values
        self.placeholders = placeholders  # secret -> what the sandbox holds instead
        self.ca = ca

    def binds(self, host: Host, port: int) -> bool:
        return any(c.applies_to(host, port) for c in self.credentials)

    def scan(self, data: bytes, found: Brokered) -> None:
        """Note the placeholders in bytes that go out unresolved (a query, a body, a plain
        request); the caller keeps the last bytes of a chunk with the next."""
        for secret, text in self.placeholders.items():
            if text.encode() in data and secret not in found.unresolved:
                found.unresolved.append(secret)

    def rewrite(self, head: bytes, host: str, port: int, found: Brokered) -> bytes:
        """A request head from the sandbox, with the bound secrets put in; strict, since what
        reaches the origin must mean to it what the proxy read (no smuggling)."""
        method, target, headers = _parse(head)
        if method in ("TRACE", "TRACK"):  # they echo the request, credential and all
            raise TunnelRefused(405, f"{method} is not sent to a host a credential is bound to")
        hosts = [v for n, v in headers if n.lower() == "host"]
        if len(hosts) != 1 or hosts[0].lower() not in (host, f"{host}:{port}"):
            raise TunnelRefused(421, f"a request in the tunnel to {host} must name Host: {host}")
        bound = [c for c in self.credentials if c.applies_to(host, port)]
        by_placeholder = {self.placeholders[c.secret]: c.secret for c in bound}
        set_here = {c.header.lower() for c in bound}
        kept = []
        for name, value in headers:
            lower = name.lower()
            if lower in set_here or lower in ("connection", "proxy-authorization", "keep-alive"):
                continue
            for text, secret in by_placeholder.items():
                if text in value:
                    value = value.replace(text, self.values[secret])
                    found.injected.append(secret)
            kept.append((name, value))
        for credential in bound:
            value = credential.format.replace(VALUE, self.values[credential.secret])
            kept.append((credential.header, value))
            found.injected.append(credential.secret)
        kept.append(("Connection", "close"))  # one request per tunnel: each one is read here
        self.scan(target.encode(), found)
        lines = [f"{method} {target} HTTP/1.1", *(f"{n}: {v}" for n, v in kept), "", ""]
        found.injected = list(dict.fromkeys(found.injected))
        return "\r\n".join(lines).encode("ascii")


_METHOD = re.compile(r"[A-Z]{1,16}")


def _parse(head: bytes) -> tuple[str, str, list[tuple[str, str]]]:
    """Method, target and headers of a request head; TunnelRefused(400) saying what is wrong."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise TunnelRefused(400, "a request head must be ASCII") from None
    lines = text.removesuffix("\r\n\r\n").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _METHOD.fullmatch(parts[0]) or parts[2] != "HTTP/1.1":
        raise TunnelRefused(400, "not an HTTP/1.1 request line")
    if not parts[1].startswith("/") or not parts[1].isprintable():
        raise TunnelRefused(400, "the request target must be a path")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        controls = any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in value)
        if not sep or not _HEADER.fullmatch(name) or controls:
            raise TunnelRefused(400, f"malformed header line {line[:40]!r}")
        headers.append((name, value.strip(" \t")))
    names = [n.lower() for n, _ in headers]
    lengths = {v for n, v in headers if n.lower() == "content-length"}
    if len(lengths) > 1 or (lengths and "transfer-encoding" in names):
        raise TunnelRefused(400, "conflicting Content-Length / Transfer-Encoding")
    return parts[0], parts[1], headers


def upstream_context(extra_authorities: Path | None = None) -> ssl.SSLContext:
    """How the proxy checks a bound host: the host's trust store (and the operator's extra)."""
    context = ssl.create_default_context()
    if extra_authorities is not None:
        context.load_verify_locations(cafile=str(extra_authorities))
    context.set_alpn_protocols(["http/1.1"])
    return context


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


# The order of P-256's group: a derived scalar must lie below it.
_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
