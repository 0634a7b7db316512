"""Host names chosen by a sandbox: parsed strictly before any allowlist rule is matched."""

from __future__ import annotations

import ipaddress
import re
import socket
import string
import unicodedata

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gateway.egress.policy import NetworkPolicy, Rule
from gateway.errors import BadRequest
from gateway.hosts import parse_host

ip_network = ipaddress.ip_network
POLICY = NetworkPolicy.parse({"allow": ["*.allowed.example", "allowed.example", "203.0.113.0/24"]})


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("evil.example\x00.allowed.example", "U\\+0000"),  # libc stops reading at the NUL
        ("evil.example\t.allowed.example", "U\\+0009"),
        ("evil example.allowed.example", "U\\+0020"),
        ("allowed.example\n", "U\\+000A"),
        ("evil.example\u200b.allowed.example", "U\\+200B"),
        ("user@allowed.example", "userinfo"),
        ("evil.example#@x.allowed.example", "userinfo"),
        ("evil%2eexample.allowed.example", "percent"),
        ("evil.example/.allowed.example", "'/'"),
        ("evil.example?.allowed.example", "'\\?'"),
        ("evil.example\\.allowed.example", "'\\\\'"),
        ("evil.example:80.allowed.example", "':'"),
        ("..allowed.example", "empty label"),
        ("a..allowed.example", "empty label"),
        ("allowed.example..", "empty label"),
        ("x" * 64 + ".allowed.example", "longer than 63"),
        ("a." * 120 + "allowed.example", "longer than 253"),
        ("-x.allowed.example", "hyphen"),
        ("x_y.allowed.example", "'_'"),
        ("*.allowed.example", "'\\*'"),
        ("xn--a.allowed.example", "IDNA"),
        ("allowed.example.1", "ends in a number"),
        ("1.2.3.4.5", "ends in a number"),
        ("256.0.0.1", "ends in a number"),
        ("1.256.1", "ends in a number"),  # libc refuses it too, rather than carry into 2.0.0.1
        ("0x", "ends in a number"),
        ("[allowed.example]", "IPv6"),
    ],
)
def test_crafted_hosts_are_refused_before_any_rule_is_matched(host, reason):
    with pytest.raises(ValueError, match=reason):
        permitted = POLICY.permits(host, 443)
        verdict = "permitted" if permitted else "refused"
        pytest.fail(f"{host!r} was taken for a host name and {verdict}")


def test_case_trailing_dots_and_idna_are_normalized_before_matching():
    policy = NetworkPolicy.parse({"allow": ["Bücher.example", "*.allowed.example"]})
    assert policy.to_json() == {"allow": ["xn--bcher-kva.example", "*.allowed.example"]}
    assert policy.permits("xn--bcher-kva.example", 443) and policy.permits("BÜCHER.example.", 443)
    assert policy.permits("WWW.Allowed.Example.", 443)
    fullwidth = "www.allowed".translate({c: c + 0xFEE0 for c in range(ord("a"), ord("z") + 1)})
    assert policy.permits(f"{fullwidth}.example", 443), "IDNA maps fullwidth letters to ASCII"
    assert not policy.permits("www.\u0430llowed.example", 443), "a Cyrillic a makes another name"
    assert not policy.permits("allowed.example", 443), "a wildcard matches subdomains only"
    for host in ("allowed.example.evil.example", "evilallowed.example", "allowedexample"):
        assert not policy.permits(host, 443), host


@pytest.mark.parametrize(
    "host",
    [
        "203.0.113.9",
        "3405803785",  # decimal
        "0xcb.0.113.9",  # hex
        "0313.0.0161.011",  # octal
        "0xcb007109",
        "203.28937",  # a.b: b fills the last three bytes
        "203.0.28937",
        "[::ffff:203.0.113.9]",  # IPv4-mapped IPv6
        "::ffff:cb00:7109",
        "203.0.113.9.",
    ],
)
def test_ip_literals_in_any_notation_match_ip_rules_and_never_name_rules(host):
    assert POLICY.permits(host, 443), f"{host} is 203.0.113.9, which the CIDR lists"
    names_only = NetworkPolicy.parse({"allow": ["*.allowed.example", "allowed.example"]})
    assert not names_only.permits(host, 443)


def test_rules_in_ip_notations_are_ip_rules():
    assert Rule.parse("2130706433").network == ip_network("127.0.0.1/32")
    assert Rule.parse("0x7f.1:80") == Rule(
        "127.0.0.1:80", network=ip_network("127.0.0.1/32"), port=80
    )
    assert Rule.parse("[::ffff:10.0.0.1]").network == ip_network("10.0.0.1/32")


@pytest.mark.parametrize(
    "rule",
    ["[evil.example]:80", "allowed.example..", "*.1.2.3.4", "*.9", "a\x00b.example", "*.*.example",
     "*", "user@allowed.example", "allowed.example:0", "allowed.example:\uff18\uff10"],
)  # fmt: skip
def test_bad_rules_are_refused(rule):
    with pytest.raises(BadRequest, match=r"network\.allow entry"):
        Rule.parse(rule)


def test_a_bad_rule_says_why():
    with pytest.raises(BadRequest, match=r"is not a host name.*: empty label"):
        Rule.parse("a..example")


# -- properties: the matcher against a reference simple enough to be obviously right -------

PROPERTY = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    # Generation time depends on the machine's load, never on the code under test.
    suppress_health_check=[HealthCheck.too_slow],
)
LDH = string.ascii_lowercase + string.digits + "-"
VOCABULARY = ["allowed", "example", "evil", "a", "b-c", "xn--bcher-kva"]
# Every character a resolver reads differently, or that ends a name in some parser.
HOSTILE = "\x00\t\n\r \x7f\x85\xa0\u200b\u202e\ufeff@%/\\?#:[]*_"


def reference_name(host: str) -> list[str] | None:
    """The labels of an ASCII host name, or None where it is no plain DNS name.

    IDNA A-labels are taken as they are: the generators make only valid ones.
    """
    labels = host.lower().removesuffix(".").split(".")
    valid = all(
        0 < len(label) < 64
        and set(label) <= set(LDH)
        and not label.startswith("-")
        and not label.endswith("-")
        for label in labels
    )
    return labels if valid and len(".".join(labels)) <= 253 else None


def reference_permits(rules: list[tuple[bool, list[str], int | None]], labels, port) -> bool:
    """A rule matches the same labels, or for ``*.`` any labels ending in its own."""
    return any(
        rule_port in (None, port)
        and (labels[-len(own) :] == own and len(labels) > len(own) if wildcard else labels == own)
        for wildcard, own, rule_port in rules
    )


# Random labels leave out 'x', so the only xn-- labels are the vocabulary's valid one.
labels = st.lists(
    st.sampled_from(VOCABULARY) | st.text(LDH.replace("x", "") + "ABC", max_size=5), max_size=5
)
rules = st.lists(
    st.tuples(
        st.booleans(),
        st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=3),
        st.sampled_from([None, 80, 443]),
    ),
    max_size=4,
)


@st.composite
def crafted_hosts(draw) -> str:
    """Listed-looking names with hostile characters, dots and case spliced in."""
    host = ".".join(draw(labels)) + draw(st.sampled_from(["", ".", ".."]))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(host)))
        host = host[:at] + draw(st.sampled_from([*HOSTILE, "."])) + host[at:]
    return host


@PROPERTY
@given(rules, crafted_hosts(), st.sampled_from([80, 443]))
def test_the_matcher_agrees_with_the_reference_on_crafted_ascii_names(rules, host, port):
    texts = [
        ("*." if wild else "") + ".".join(own) + (f":{p}" if p else "") for wild, own, p in rules
    ]
    policy = NetworkPolicy.parse({"allow": texts})
    expected = reference_name(host)
    assume(expected is None or not re.fullmatch(r"0x[0-9a-f]*|[0-9]+", expected[-1]))
    try:
        permitted = policy.permits(host, port)
    except ValueError:
        assert expected is None, f"{host!r} was refused"
        return
    assert expected is not None, f"{host!r} should have been refused"
    assert permitted == reference_permits(rules, expected, port), (host, texts)


def render_ipv4(draw, value: int) -> str:
    """``value`` in one of the notations inet_aton reads: 1 to 4 parts, each dec, oct or hex."""
    parts = draw(st.integers(1, 4))
    octets = value.to_bytes(4, "big")
    numbers = [*octets[: parts - 1], int.from_bytes(octets[parts - 1 :], "big")]
    rendered = []
    for number in numbers:
        style = draw(st.sampled_from(["dec", "oct", "hex", "HEX"]))
        text = {"dec": str(number), "oct": f"0{number:o}", "hex": f"0x{number:x}"}.get(style)
        rendered.append(text or f"0X{number:X}")
    return ".".join(rendered)


@st.composite
def ip_notations(draw) -> tuple[str, ipaddress.IPv4Address]:
    value = draw(st.integers(0, 2**32 - 1))
    address = ipaddress.IPv4Address(value)
    text = draw(
        st.sampled_from(
            [
                render_ipv4(draw, value),
                f"[::ffff:{address}]",
                f"::ffff:{value >> 16:x}:{value & 0xFFFF:x}",
            ]
        )
    )
    return text + draw(st.sampled_from(["", "."]) if ":" not in text else st.just("")), address


@PROPERTY
@given(ip_notations(), rules)
def test_every_ip_notation_is_its_address_and_never_matches_a_name_rule(notation, rules):
    text, address = notation
    assert parse_host(text) == address
    if ":" not in text:  # libc, which resolves what the proxy is given, reads the same address
        assert ipaddress.IPv4Address(socket.inet_aton(text.removesuffix("."))) == address
    names = [("*." if wild else "") + ".".join(own) for wild, own, _ in rules]
    assert not NetworkPolicy.parse({"allow": names}).permits(text, 443)
    assert NetworkPolicy.parse({"allow": [f"{address}/32"]}).permits(text, 443)


@PROPERTY
@given(st.lists(st.text("0123456789abcdefxX", max_size=6), min_size=1, max_size=5).map(".".join))
def test_what_libc_reads_as_an_address_is_that_address_or_refused_never_a_name(text):
    try:
        ours = parse_host(text)
    except ValueError:
        ours = None
    try:
        libc = ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        libc = None
    if libc is not None:
        assert ours in (libc, None), f"libc reads {text!r} as {libc}, the matcher as {ours!r}"
    if isinstance(ours, ipaddress.IPv4Address) and not text.endswith("."):
        assert ours == libc, f"the matcher reads {text!r} as {ours}, libc as {libc}"


@PROPERTY
@given(st.text(max_size=40))
def test_any_text_is_refused_or_becomes_a_name_socket_resolves_unchanged(text):
    try:
        host = parse_host(text)
    except ValueError:
        return
    if isinstance(host, str):
        assert not any(unicodedata.category(c)[0] in "CZ" for c in text), text
        assert reference_name(host) == host.split("."), host
        assert host.encode("idna") == host.encode("ascii"), "socket would resolve another name"
        assert parse_host(host) == host
