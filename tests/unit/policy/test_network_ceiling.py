"""A tenant's policy bounds the network rules its sessions may be given, at create and later."""

from __future__ import annotations

import pytest

from gateway.egress.policy import NetworkPolicy
from gateway.errors import NotAllowed, PolicyInvalid
from gateway.policy.approvals import ApprovalDesk
from gateway.policy.book import PolicyBook
from gateway.policy.gate import Gate
from gateway.policy.model import Policy, session_policy
from gateway.policy.scan import Scanner

CEILING = """
mode = "enforce"
[network]
allow = ["*.example.org", "203.0.113.0/24"]
deny = ["secret.example.org"]
"""


@pytest.fixture
def gate(tmp_path):
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "acme.toml").write_text(CEILING)
    book = PolicyBook(tmp_path / "policies")
    book.load()
    return Gate(book, Scanner(), ApprovalDesk(None, 5, live=lambda session_id: True))


def test_rules_inside_the_ceiling_are_kept_and_get_its_deny_entries(gate):
    asked = NetworkPolicy.parse({"allow": ["api.example.org", "203.0.113.7"]})
    bounded = gate.bound_network("acme", None, asked)
    assert bounded.to_json() == {
        "allow": ["api.example.org", "203.0.113.7"],
        "deny": ["secret.example.org"],
    }
    wide = gate.bound_network("acme", None, NetworkPolicy.parse({"allow": ["*.example.org"]}))
    assert not wide.permits("secret.example.org", 443) and wide.permits("www.example.org", 443)


@pytest.mark.parametrize("entry", ["other.net", "public", "example.org", "203.0.0.0/16"])
def test_an_entry_outside_the_ceiling_is_a_403_naming_it(gate, entry):
    with pytest.raises(NotAllowed) as refused:
        gate.bound_network("acme", None, NetworkPolicy.parse({"allow": [entry]}))
    assert repr(entry) in refused.value.message and "*.example.org" in refused.value.message


def test_no_network_is_always_within_and_a_tenant_without_a_ceiling_bounds_nothing(gate):
    assert gate.bound_network("acme", None, NetworkPolicy()).is_none
    public = NetworkPolicy.parse({"allow": ["public"]})
    assert gate.bound_network("other-tenant", None, public) == public


def test_a_sessions_own_policy_can_only_narrow_the_ceiling(gate):
    narrower = session_policy({"network": {"allow": ["api.example.org"]}})
    gate.bound_network("acme", narrower, NetworkPolicy.parse({"allow": ["api.example.org"]}))
    with pytest.raises(NotAllowed):
        gate.bound_network("acme", narrower, NetworkPolicy.parse({"allow": ["www.example.org"]}))
    wider = session_policy({"network": {"allow": ["public"]}})
    with pytest.raises(NotAllowed):
        gate.bound_network("acme", wider, NetworkPolicy.parse({"allow": ["other.net"]}))


def test_a_malformed_network_table_names_its_line():
    with pytest.raises(PolicyInvalid, match=r"line 3.*network.allow entry 'bad host'"):
        Policy.parse('mode = "enforce"\n[network]\nallow = ["bad host"]\n', "toml", "p")
    with pytest.raises(PolicyInvalid, match="network"):
        Policy.parse('[network]\nallow = "x.example"\n', "toml", "p")
