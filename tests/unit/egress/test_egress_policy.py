"""Network policies: what an allowlist matches, and which addresses are never reachable."""

from __future__ import annotations

import ipaddress

import pytest

from gateway.config import ConfigError, Settings
from gateway.egress.policy import AddressGuard, NetworkPolicy, Rule
from gateway.errors import BadRequest

ip = ipaddress.ip_address


def test_none_is_the_default_and_allows_nothing():
    for value in (None, "none"):
        policy = NetworkPolicy.parse(value)
        assert policy.is_none and policy.to_json() == "none"
        assert not policy.permits("example.org", 443)


def test_allowlist_matches_names_wildcards_addresses_and_ports():
    policy = NetworkPolicy.parse(
        {"allow": ["Files.Example.org", "*.pkg.example", "203.0.113.0/24", "api.example:443"]}
    )
    assert policy.to_json() == {
        "allow": ["files.example.org", "*.pkg.example", "203.0.113.0/24", "api.example:443"]
    }
    assert policy.permits("files.example.org", 443) and policy.permits("FILES.example.org.", 80)
    assert policy.permits("a.b.pkg.example", 443) and not policy.permits("pkg.example", 443)
    assert not policy.permits("evilfiles.example.org", 443)
    assert policy.permits("203.0.113.9", 8080) and not policy.permits("203.0.114.9", 8080)
    assert policy.permits("api.example", 443) and not policy.permits("api.example", 80)


def test_names_never_match_addresses_and_cidrs_never_match_names():
    """An IP rule cannot be reached through a name, nor a name rule through its address."""
    policy = NetworkPolicy.parse({"allow": ["203.0.113.0/24", "files.example.org"]})
    assert not policy.permits("host-in-that-range.example", 443)
    assert not policy.permits("198.51.100.7", 443)


def test_ipv6_rules_with_and_without_ports():
    policy = NetworkPolicy.parse({"allow": ["[2001:db8::1]:443", "2001:db8:1::/48"]})
    assert policy.permits("2001:db8::1", 443) and not policy.permits("2001:db8::1", 80)
    assert policy.permits("[2001:db8:1::5]", 22)


@pytest.mark.parametrize(
    "value",
    [
        "host",
        {"allow": "example.org"},
        {"allow": ["exa mple.org"]},
        {"allow": ["-bad.example"]},
        {"allow": ["example.org:99999"]},
        {"allow": [42]},
        {"allow": ["a.example"], "block": []},
        {"allow": [f"h{i}.example" for i in range(65)]},
    ],
)
def test_bad_policies_are_refused_with_a_clear_message(value):
    with pytest.raises(BadRequest, match="network"):
        NetworkPolicy.parse(value)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.17.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("100.64.0.1", "not globally routable"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("::ffff:127.0.0.1", "loopback"),
        ("2002:7f00:1::", "tunnel"),
        ("64:ff9b::7f00:1", "tunnel"),
    ],
)
def test_the_guard_refuses_every_non_public_address(address, kind):
    guard = AddressGuard([], own_ports=set())
    refusal = guard.refusal(ip(address), 443)
    assert refusal is not None and kind in refusal, refusal


def test_the_guard_lets_public_addresses_through():
    guard = AddressGuard([], own_ports=set())
    assert guard.refusal(ip("8.8.8.8"), 443) is None
    assert guard.refusal(ip("2606:4700::1"), 443) is None


def test_operator_ranges_open_private_space_but_never_the_gateways_own_ports():
    guard = AddressGuard([ipaddress.ip_network("127.0.0.0/8")], own_ports={8765})
    assert guard.refusal(ip("127.0.0.1"), 8080) is None
    assert "the gateway itself" in guard.refusal(ip("127.0.0.1"), 8765)
    assert "the gateway itself" in guard.refusal(ip("0.0.0.0"), 8765)
    assert "private" in guard.refusal(ip("10.0.0.1"), 8080)


def test_settings_validate_runtimes_policies_and_egress_options():
    s = Settings.from_mapping(
        {"runtimes": "runc", "egress_allow_ranges": "127.0.0.0/8, 10.0.0.0/8"}
    )
    assert s.runtimes == ("runc",) and len(s.egress_allow_ranges) == 2
    assert s.egress_proxy_ports == range(47000, 47100)
    for bad, message in [
        ({"runtimes": "kata"}, "runtimes must name"),
        ({"runtimes": "runc", "default_runtime": "gvisor"}, "default_runtime"),
        ({"network_policies": "open"}, "network_policies"),
        ({"egress_proxy_ports": "a-b"}, "egress_proxy_ports"),
        ({"egress_allow_ranges": "everything"}, "egress_allow_ranges"),
        ({"egress_always_allow": "not a host"}, "egress_always_allow"),
        ({"egress_network": "a-network-name-too-long"}, "egress_network"),
        ({"seccomp_profile": "/nonexistent/profile.json"}, "seccomp_profile"),
    ]:
        with pytest.raises(ConfigError, match=message):
            Settings.from_mapping(bad)
    assert Rule.parse("pkg.example:443").port == 443
