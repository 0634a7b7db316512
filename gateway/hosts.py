"""Hosts, addresses and allowlist rules as people write them: one strict grammar.

A host name (IDNA, each label checked), an IP literal (IPv6 in brackets; the
forms ``inet_aton`` would read refused), an authority with a port, a rule (a
name, a ``*.`` wildcard, an address or a CIDR, each with an optional port) and
a list of ranges. Settings, create requests and the egress proxy all read
hosts through here, so nothing is parsed two ways. Pure values: no I/O.
"""

from __future__ import annotations

import dataclasses
import encodings.idna
import ipaddress
import re
import unicodedata
from typing import Any

from .errors import BadRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Host = str | IPAddress  # a normalized host name, or the address an IP literal spells

_LABEL = re.compile(r"[a-z0-9-]{1,63}")
_NUMBER = re.compile(r"0x[0-9a-f]*|[0-9]+")  # what inet_aton reads as a number
_PORT = re.compile(r"[0-9]{1,5}")
_PUNCTUATION = "/\\?#[]*_"  # named when refused: they end or change a name elsewhere
# Prefixes that carry an IPv4 address inside IPv6 (6to4, Teredo, NAT64):


def parse_host(text: str) -> Host:
    """The host a resolver will see in ``text``: a normalized name or an IP address.

    A sandbox chooses its host names, and libc reads what this matcher would not
    (it stops at a NUL, takes ``0x7f.1`` for 127.0.0.1), so whatever could be
    read two ways is refused here, before any rule is matched, with a
    ValueError saying why. Names come back lowercase, without the trailing dot,
    as IDNA A-labels (the standard library's IDNA 2003 codec, which is also
    what ``socket`` applies); IP literals in any notation inet_aton accepts
    (decimal, octal, hex, shortened) and IPv4-mapped IPv6 come back as the
    address they reach, so only IP rules can ever match them.
    """
    _refuse_characters(text)
    if text.startswith("[") or ":" in text:
        return _ipv6(text)
    name = text.lower() if text.isascii() else _to_ascii(text)
    labels = name.removesuffix(".").split(".")
    if _NUMBER.fullmatch(labels[-1]):
        return _ipv4(labels, text)
    for label in labels:
        _check_label(label)
    name = ".".join(labels)
    if len(name) > 253:
        raise ValueError("host name longer than 253 characters")
    return name


def parse_authority(text: str) -> tuple[Host, int | None]:
    """Split ``host[:port]`` (IPv6 in brackets) and parse both; ValueError saying why."""
    _refuse_characters(text)
    host, sep, port = text.rpartition(":")
    if not sep or text.endswith("]"):
        return parse_host(text), None
    parsed = parse_host(host)
    if not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
        raise ValueError(f"port {port!r} is not a number from 1 to 65535")
    return parsed, int(port)


def format_authority(host: Host, port: int | None) -> str:
    """``host[:port]`` as ``parse_authority`` reads it back."""
    text = f"[{host}]" if isinstance(host, ipaddress.IPv6Address) else str(host)
    return text if port is None else f"{text}:{port}"


def _refuse_characters(text: str) -> None:
    """Refuse what makes a host mean something else to another parser, or to libc."""
    if len(text) > 1024:  # before any Unicode work on it
        raise ValueError("host name longer than 253 characters")
    for char in text:
        if unicodedata.category(char)[0] in "CZ":
            raise ValueError(f"control, space or invisible character U+{ord(char):04X} in host")
    if "@" in text:
        raise ValueError("userinfo ('user@') in host")
    if "%" in text:
        raise ValueError("percent-encoding or an IPv6 zone in host")


def _to_ascii(text: str) -> str:
    try:
        return text.encode("idna").decode("ascii").lower()
    except UnicodeError as e:
        raise ValueError(f"not a valid internationalized (IDNA) host name: {e}") from None


def _check_label(label: str) -> None:
    if not label:
        raise ValueError("empty label in host name ('..', or a leading or second trailing dot)")
    if len(label) > 63:
        raise ValueError(f"label {label[:20]!r}... longer than 63 characters in host name")
    bad = next((c for c in label if c in _PUNCTUATION), None)
    if bad is not None:
        raise ValueError(f"'{bad}' in host name")
    if not _LABEL.fullmatch(label):
        raise ValueError(f"label {label!r}: only letters, digits and '-' in host names")
    if label[0] == "-" or label[-1] == "-":
        raise ValueError(f"label {label!r} starts or ends with a hyphen")
    if label.startswith("xn--") and not _is_a_label(label):
        raise ValueError(f"label {label!r} is not a valid IDNA A-label")


def _is_a_label(label: str) -> bool:
    """Whether an ``xn--`` label decodes to Unicode that encodes back to it."""
    try:
        decoded = encodings.idna.ToUnicode(label)
        return decoded != label and encodings.idna.ToASCII(decoded) == label.encode()
    except UnicodeError:
        return False


def _ipv4(labels: list[str], text: str) -> ipaddress.IPv4Address:
    """The address inet_aton reads in ``a[.b[.c[.d]]]``, each part decimal, 0octal or 0xhex."""
    refusal = ValueError(f"host {text!r} ends in a number but is not an IPv4 address")
    if len(labels) > 4 or not all(_NUMBER.fullmatch(part) for part in labels):
        raise refusal
    try:
        values = [
            int(p[2:], 16) if p.startswith("0x") else int(p, 8 if p[0] == "0" else 10)
            for p in labels
        ]
    except ValueError:  # 08 is not octal, 0x is no number
        raise refusal from None
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        raise refusal
    return ipaddress.IPv4Address(sum(v << (8 * (3 - i)) for i, v in enumerate(head)) + last)


def _ipv6(text: str) -> IPAddress:
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        address = ipaddress.IPv6Address(inner)
    except ValueError:
        raise ValueError(
            f"{text!r} is not an IPv6 address: only IPv6 goes in [brackets], and a ':' "
            "in a host only in IPv6"
        ) from None
    return address.ipv4_mapped or address


@dataclasses.dataclass(frozen=True)
class Rule:
    """One allowlist entry: a name, a ``*.`` wildcard, or a network; any port if None."""

    text: str
    name: str | None = None
    network: IPNetwork | None = None
    port: int | None = None

    @classmethod
    def parse(cls, raw: Any) -> Rule:
        if not isinstance(raw, str) or not raw.strip():
            raise BadRequest("network.allow entries must be host names, IPs or CIDRs as strings")
        text = raw.strip()
        try:
            if "/" in text:
                network = ipaddress.ip_network(text, strict=False)
                return cls(text=str(network), network=network)
            wildcard = text.startswith("*.")
            host, port = parse_authority(text.removeprefix("*."))
            if not isinstance(host, str):
                if wildcard:
                    raise ValueError("a '*.' wildcard needs a domain name, not an address")
                return cls(
                    format_authority(host, port), network=ipaddress.ip_network(host), port=port
                )
        except ValueError as e:
            raise BadRequest(
                f"network.allow entry {raw!r} is not a host name, '*.domain', IP address or "
                f"CIDR (optionally with ':port'): {e}"
            ) from None
        name = f"*.{host}" if wildcard else host
        return cls(format_authority(name, port), name=name, port=port)

    def matches_name(self, host: str, port: int) -> bool:
        if self.name is None or (self.port is not None and self.port != port):
            return False
        if self.name.startswith("*."):
            return host.endswith(self.name[1:])
        return host == self.name

    def matches_address(self, address: IPAddress, port: int) -> bool:
        if self.network is None or (self.port is not None and self.port != port):
            return False
        return address in self.network


def parse_ranges(text: str, what: str) -> list[IPNetwork]:
    """Comma-separated CIDRs from a setting; raises ValueError naming the bad one."""
    ranges = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            ranges.append(ipaddress.ip_network(part, strict=False))
        except ValueError as e:
            raise ValueError(f"{what}: {part!r} is not a CIDR ({e})") from None
    return ranges
