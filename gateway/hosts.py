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
from collections.abc import Iterable
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


PUBLIC = "public"  # the rule for every host, name or address (the guard still applies)
MAX_RULES = 64


@dataclasses.dataclass(frozen=True)
class Rule:
    """One list entry: a name, a ``*.`` wildcard, a network, or ``public``; any port if None."""

    text: str
    name: str | None = None
    network: IPNetwork | None = None
    port: int | None = None
    public: bool = False

    @classmethod
    def parse(cls, raw: Any, field: str = "network.allow") -> Rule:
        if not isinstance(raw, str) or not raw.strip():
            raise BadRequest(f"{field} entries must be host names, IPs or CIDRs as strings")
        text = raw.strip()
        if text == PUBLIC:
            if field != "network.allow":
                raise BadRequest(f"{field} entry 'public': only an allow list can name every host")
            return cls(text, public=True)
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
                f"{field} entry {raw!r} is not a host name, '*.domain', IP address or "
                f"CIDR (optionally with ':port'){' or public' if field == 'network.allow' else ''}"
                f": {e}"
            ) from None
        name = f"*.{host}" if wildcard else host
        return cls(format_authority(name, port), name=name, port=port)

    def matches_name(self, host: str, port: int) -> bool:
        if self.public:
            return True
        if self.name is None or (self.port is not None and self.port != port):
            return False
        if self.name.startswith("*."):
            return host.endswith(self.name[1:])
        return host == self.name

    def matches_address(self, address: IPAddress, port: int) -> bool:
        if self.public:
            return True
        if self.network is None or (self.port is not None and self.port != port):
            return False
        return address in self.network

    def within(self, outer: Rule) -> bool:
        """Whether every host and port this rule matches, ``outer`` matches too."""
        if outer.public:
            return True
        if self.public or (outer.port is not None and outer.port != self.port):
            return False
        if self.network is not None and outer.network is not None:
            return self.network.version == outer.network.version and self.network.subnet_of(
                outer.network  # type: ignore[arg-type]
            )
        if self.name is None or outer.name is None:
            return False
        if outer.name.startswith("*."):
            return self.name.removeprefix("*").endswith(outer.name[1:])
        return self.name == outer.name


def _rules(value: Any, field: str) -> tuple[Rule, ...]:
    if not isinstance(value, list):
        raise BadRequest(f"{field} must be a list of host names, IPs or CIDRs")
    if len(value) > MAX_RULES:
        raise BadRequest(f"{field} has {len(value)} entries; at most {MAX_RULES}")
    return tuple(Rule.parse(entry, field) for entry in value)


def _first(rules: tuple[Rule, ...], host: Host, port: int) -> Rule | None:
    by_name = isinstance(host, str)
    for rule in rules:
        if by_name and rule.matches_name(host, port):  # type: ignore[arg-type]
            return rule
        if not by_name and rule.matches_address(host, port):  # type: ignore[arg-type]
            return rule
    return None


@dataclasses.dataclass(frozen=True)
class NetworkPolicy:
    """A session's network: ``rules is None`` means no network at all.

    Otherwise ``rules`` is the allow list and ``deny`` its exceptions: a host
    is reached when an allow entry matches it and no deny entry does (a
    name's addresses, once the proxy resolves them, are checked against the
    denied ranges too). ``granted`` are the operator's entries every allowlist
    gets (``egress_always_allow``), which no deny entry of a session removes.
    """

    rules: tuple[Rule, ...] | None = None
    deny: tuple[Rule, ...] = ()
    granted: tuple[Rule, ...] = ()

    @property
    def is_none(self) -> bool:
        return self.rules is None

    @classmethod
    def parse(cls, value: Any) -> NetworkPolicy:
        """Read ``"none"`` or ``{"allow": [...], "deny": [...]}`` (a create's or a change's)."""
        if value is None or value == "none":
            return cls()
        if not isinstance(value, dict) or "allow" not in value or set(value) - {"allow", "deny"}:
            raise BadRequest(
                'network must be "none" or {"allow": ["host.example", "*.example.org", '
                '"10.0.0.0/8", "public", ...], "deny": [...]} (deny optional)'
            )
        return cls(
            _rules(value["allow"], "network.allow"), _rules(value.get("deny", []), "network.deny")
        )

    def extended(self, rules: Iterable[Rule]) -> NetworkPolicy:
        """This allowlist plus the operator's ``rules`` (``egress_always_allow``)."""
        assert self.rules is not None
        return dataclasses.replace(self, granted=(*self.granted, *rules))

    def to_json(self) -> str | dict[str, list[str]]:
        if self.rules is None:
            return "none"
        shown = {"allow": [r.text for r in self.rules]}
        if self.deny:
            shown["deny"] = [r.text for r in self.deny]
        return shown

    def permits(self, host: str | IPAddress, port: int) -> bool:
        """Whether ``host:port`` may be reached; a string goes through ``parse_host`` first."""
        return self.rule_for(host, port) is not None

    def rule_for(self, host: str | IPAddress, port: int) -> Rule | None:
        """The entry that lets ``host:port`` through, or None."""
        if isinstance(host, str):
            host = parse_host(host)
        granted = _first(self.granted, host, port)
        if granted is not None:
            return granted
        if _first(self.deny, host, port) is not None:
            return None
        return _first(self.rules or (), host, port)

    def denied_address(self, address: IPAddress, port: int) -> str | None:
        """The deny entry that covers an address a name resolved to, or None."""
        rule = next((r for r in self.deny if r.network and r.matches_address(address, port)), None)
        return rule.text if rule else None

    def outside(self, ceiling: NetworkPolicy) -> list[str]:
        """The allow entries no entry of ``ceiling``'s allow list covers."""
        bounds = ceiling.rules or ()
        return [r.text for r in self.rules or () if not any(r.within(b) for b in bounds)]

    def bounded(self, ceiling: NetworkPolicy) -> NetworkPolicy:
        """This policy with ``ceiling``'s deny entries added (its allow list checked first)."""
        if self.rules is None:
            return self
        deny = (*self.deny, *(r for r in ceiling.deny if r not in self.deny))
        return dataclasses.replace(self, deny=deny)


def parse_ranges(text: str, what: str) -> list[IPNetwork]:
    """Comma-separated CIDRs from a setting; raises ValueError naming the bad one."""
    ranges = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            ranges.append(ipaddress.ip_network(part, strict=False))
        except ValueError as e:
            raise ValueError(f"{what}: {part!r} is not a CIDR ({e})") from None
    return ranges
