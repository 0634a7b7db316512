"""E2B's network options as the gateway's allow and deny lists (create and update_network)."""

from __future__ import annotations

import pytest

from gateway.api.e2b.network import credentials_of, network_of
from gateway.errors import BadRequest, NotSupported

ALL = "0.0.0.0/0"  # E2B's ALL_TRAFFIC


@pytest.mark.parametrize(
    "network, internet, ours",
    [
        (None, None, None),  # nothing asked: the gateway's default
        (None, True, {"allow": ["public"]}),
        (None, False, {"allow": []}),
        ({"allowOut": ["api.example.com"], "denyOut": [ALL]}, None, {"allow": ["api.example.com"]}),
        ({"allowOut": ["api.example.com"]}, False, {"allow": ["api.example.com"]}),
        ({"denyOut": ["203.0.113.0/24"]}, None, {"allow": ["public"], "deny": ["203.0.113.0/24"]}),
        ({"allowOut": [ALL]}, None, {"allow": ["public"]}),
        ({"denyOut": [ALL]}, None, {"allow": []}),
        ({}, None, {"allow": ["public"]}),  # an update that omits everything clears the lists
    ],
)
def test_e2b_lists_map_onto_allow_and_deny(network, internet, ours):
    policy = network_of(network, internet)
    assert (policy.to_json() if policy is not None else None) == ours


def test_an_allowed_host_inside_a_denied_range_is_refused_not_silently_denied():
    """E2B lets allow_out win over deny_out; here deny wins, so the overlap is a 400."""
    inside = r"'203\.0\.113\.7' lies inside deny_out entry '203\.0\.113\.0/24'"
    with pytest.raises(BadRequest, match=inside):
        network_of({"allowOut": ["203.0.113.7"], "denyOut": ["203.0.113.0/24"]}, None)


@pytest.mark.parametrize(
    "network, says",
    [
        ({"allowOut": "x.example"}, "allowOut must be a list"),
        ({"allowOut": ["bad host"]}, "network.allow entry 'bad host'"),
        ({"egressProxy": {"address": "p.example:1080"}}, None),
        ({"rules": "x"}, "rules must be an object"),
        ("open", "network must be an object"),
    ],
)
def test_what_cannot_be_mapped_is_refused_saying_why(network, says):
    with pytest.raises((BadRequest, NotSupported)) as refused:
        network_of(network, None)
    if says:
        assert says in refused.value.message, refused.value.message


def test_header_transforms_with_secret_placeholders_become_credentials():
    rules = {
        "api.github.com": [
            {"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.GH_TOKEN}"}}}
        ],
        "*.openai.com": [{"transform": {"headers": {"X-Api-Key": "${e2b.secrets.OPENAI}"}}}],
    }
    assert [c.to_json() for c in credentials_of({"rules": rules})] == [
        {"secret": "GH_TOKEN", "hosts": ["api.github.com"], "header": "Authorization",
         "format": "Bearer {value}"},
        {"secret": "OPENAI", "hosts": ["*.openai.com"], "header": "X-Api-Key",
         "format": "{value}"},
    ]  # fmt: skip
    assert credentials_of(None) == () and credentials_of({"allowOut": ["a.example"]}) == ()


@pytest.mark.parametrize(
    "rules, says",
    [
        ({"a.example": [{"transform": {"headers": {"X": "static"}}}]}, "one Secret.fill"),
        ({"a.example": [{"transform": {"headers": {"X": "${e2b.iam.tokens.aws}"}}}]}, "iam"),
        ({"a.example": "x"}, "a list of rules"),
        ({"a.example": [{"transform": {"body": {}}}]}, "only headers"),
        ({"a.example": [{"transform": {"headers": {"X": "${e2b.secrets.a-b}"}}}]}, "letters"),
    ],
)
def test_transforms_that_cannot_be_brokered_are_refused_saying_why(rules, says):
    with pytest.raises((BadRequest, NotSupported)) as refused:
        credentials_of({"rules": rules})
    assert says in refused.value.message, refused.value.message
