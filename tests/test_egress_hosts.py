"""Host names chosen by a sandbox: parsed strictly before any allowlist rule is matched."""

from __future__ import annotations

import ipaddress

import pytest

from gateway.errors import BadRequest
from gateway.sandbox.egress.policy import NetworkPolicy, Rule

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
