"""What a session may reach: its network policy, and the ranges nobody may reach.

A policy (``hosts.NetworkPolicy``, a pure value) is ``none`` (no network at
all) or an allow list with deny exceptions. A rule is a host name
(``files.example.org``), a wildcard for its subdomains (``*.example.org``),
an IP address or a CIDR, each optionally with a port (``example.org:443``,
``[2001:db8::1]:443``), or ``public`` (every host). Names match names only
and addresses match IP literals only: the proxy never resolves a name that
no entry allows, so DNS cannot be used to smuggle data out, and a CIDR cannot
be reached through some other name that happens to point into it (``public``
opts out of both; deny ranges then apply to the addresses a name resolves to).

Whatever the list says, ``AddressGuard`` refuses every address that is not
globally routable (private, loopback, link-local such as cloud metadata,
shared, reserved, multicast) and every address of the host itself, unless the
operator's ``egress_allow_ranges`` permits the range; the gateway's own ports
on the host are refused even then. It checks the addresses a name resolves
to, and the proxy connects to exactly the address it checked.
"""

from __future__ import annotations

import ipaddress
import socket

from ..hosts import IPAddress, IPNetwork, NetworkPolicy, Rule

__all__ = ["AddressGuard", "NetworkPolicy", "Rule", "is_host_address"]

# a connection to them can end at any IPv4 address, so they are never global.
_TUNNELS = [ipaddress.ip_network(n) for n in ("2002::/16", "2001::/32", "64:ff9b::/96")]


class AddressGuard:
    """Decides whether the proxy may connect to an address at all."""

    def __init__(self, allowed_ranges: list[IPNetwork], own_ports: set[int]) -> None:
        self.allowed_ranges = allowed_ranges
        self.own_ports = own_ports  # the gateway's listening ports; the proxy adds its own

    def refusal(self, address: IPAddress, port: int) -> str | None:
        """Why ``address:port`` is off limits, or None when it may be reached."""
        if address.version == 6 and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        local = address.is_unspecified or is_host_address(address)
        if local and port in self.own_ports:
            return f"{address} port {port} is the gateway itself"
        kind = _special_kind(address) or ("this host" if local else None)
        if kind is None:
            return None
        if any(address in r for r in self.allowed_ranges if r.version == address.version):
            return None
        return f"{address} is {kind}, which sandboxes may not reach"


def _special_kind(address: IPAddress) -> str | None:
    """A name for a non-public address, or None for a globally routable one."""
    checks = (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local (cloud metadata lives here)"),
        ("is_multicast", "multicast"),
        ("is_unspecified", "unspecified"),
        ("is_private", "a private range"),
        ("is_reserved", "a reserved range"),
    )
    if any(address in net for net in _TUNNELS if net.version == address.version):
        return "an IPv6 tunnel to IPv4"
    for attribute, kind in checks:
        if getattr(address, attribute):
            return kind
    if not address.is_global:
        return "not globally routable"
    return None


def is_host_address(address: IPAddress) -> bool:
    """Whether ``address`` belongs to this host: only then can a socket bind to it."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:  # EADDRNOTAVAIL, or EINVAL for a link-local address without scope
            return False
    return True
