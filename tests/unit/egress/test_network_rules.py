"""Allow and deny lists, "public", one rule inside another, and rules changed on a live proxy."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
from test_egress_proxy import Harness, run

from gateway.egress.policy import NetworkPolicy, Rule
from gateway.errors import BadRequest

ip = ipaddress.ip_address


def test_public_allows_every_name_and_address_and_deny_wins_over_it():
    policy = NetworkPolicy.parse(
        {"allow": ["public"], "deny": ["*.evil.example", "198.51.100.0/24", "x.example:25"]}
    )
    assert policy.to_json() == {
        "allow": ["public"],
        "deny": ["*.evil.example", "198.51.100.0/24", "x.example:25"],
    }
    assert policy.permits("files.example.org", 443) and policy.permits("203.0.113.9", 80)
    assert not policy.permits("a.evil.example", 443)
    assert not policy.permits("198.51.100.7", 443)
    assert policy.permits("x.example", 443) and not policy.permits("x.example", 25)
    # a name's addresses are checked against the denied ranges once resolved
    assert policy.denied_address(ip("198.51.100.7"), 443) == "198.51.100.0/24"
    assert policy.denied_address(ip("203.0.113.9"), 443) is None


def test_a_deny_entry_carves_an_exception_out_of_a_wildcard():
    policy = NetworkPolicy.parse({"allow": ["*.example.org"], "deny": ["secret.example.org"]})
    assert policy.permits("api.example.org", 443) and not policy.permits("secret.example.org", 443)


def test_an_allowlist_without_deny_keeps_its_old_shape():
    assert NetworkPolicy.parse({"allow": ["a.example"]}).to_json() == {"allow": ["a.example"]}
    assert NetworkPolicy.parse({"allow": ["a.example"], "deny": []}).to_json() == {
        "allow": ["a.example"]
    }


@pytest.mark.parametrize(
    "value, says",
    [
        ({"allow": ["a.example"], "deny": "b.example"}, "network.deny must be a list"),
        ({"deny": ["b.example"]}, "allow"),
        ({"allow": [], "block": []}, "allow"),
        ({"allow": [], "deny": ["public"]}, "network.deny entry 'public'"),
        ({"allow": [], "deny": ["b..example"]}, "network.deny entry 'b..example'"),
    ],
)
def test_bad_allow_and_deny_lists_are_400s_saying_which_entry(value, says):
    with pytest.raises(BadRequest) as caught:
        NetworkPolicy.parse(value)
    assert says in caught.value.message, caught.value.message


@pytest.mark.parametrize(
    "inner, outer, inside",
    [
        ("api.example.org", "*.example.org", True),
        ("*.a.example.org", "*.example.org", True),
        ("example.org", "*.example.org", False),
        ("*.example.org", "api.example.org", False),
        ("api.example.org:443", "api.example.org", True),
        ("api.example.org", "api.example.org:443", False),
        ("10.1.2.0/24", "10.0.0.0/8", True),
        ("10.0.0.0/8", "10.1.2.0/24", False),
        ("10.1.2.3", "10.0.0.0/8", True),
        ("anything.example", "public", True),
        ("10.0.0.0/8", "public", True),
        ("public", "*.example.org", False),
        ("10.1.2.3", "*.example.org", False),
        ("2001:db8::/48", "10.0.0.0/8", False),
    ],
)
def test_one_rule_lies_within_another(inner, outer, inside):
    assert Rule.parse(inner).within(Rule.parse(outer)) is inside


def test_the_entries_a_ceiling_does_not_cover_are_named():
    ceiling = NetworkPolicy.parse({"allow": ["*.example.org", "10.0.0.0/8"]})
    asked = NetworkPolicy.parse({"allow": ["api.example.org", "other.net", "10.1.0.0/16"]})
    assert asked.outside(ceiling) == ["other.net"]


def test_narrowed_rules_hold_for_the_next_connection_and_cut_open_tunnels_they_refuse():
    """What happens to open connections: those the new rules refuse are cut, others stay."""

    async def go():
        async with Harness(["127.0.0.1", "localhost"]) as h:
            kept_reply, kept_reader, kept = await h.ask(
                f"CONNECT 127.0.0.1:{h.up_port} HTTP/1.1\r\n{h.auth()}\r\n"
            )
            cut_reply, cut_reader, _ = await h.ask(
                f"CONNECT localhost:{h.up_port} HTTP/1.1\r\n{h.auth()}\r\n"
            )
            assert b" 200 " in kept_reply and b" 200 " in cut_reply
            h.proxy.update("s1", NetworkPolicy.parse({"allow": ["127.0.0.1"]}))
            # the refused tunnel ends at once; the kept one still echoes
            assert await asyncio.wait_for(cut_reader.read(), 5) == b""
            kept.write(b"PING\r\n\r\nstill here\n")
            assert await asyncio.wait_for(kept_reader.readline(), 5) == b"PING\r\n"
            reply, reader, _ = await h.ask(
                f"CONNECT localhost:{h.up_port} HTTP/1.1\r\n{h.auth()}\r\n"
            )
            reply += await reader.read()
            assert b" 403 " in reply and b"not on this session's allowlist" in reply

    run(go())


def test_updating_a_session_the_proxy_does_not_know_is_refused():
    async def go():
        async with Harness(["127.0.0.1"]) as h:
            with pytest.raises(KeyError):
                h.proxy.update("other", NetworkPolicy.parse({"allow": []}))

    run(go())


def test_a_name_resolving_into_a_denied_range_is_refused():
    async def go():
        async with Harness(["localhost"]) as h:
            h.proxy.update(
                "s1", NetworkPolicy.parse({"allow": ["localhost"], "deny": ["127.0.0.0/8"]})
            )
            reply, reader, _ = await h.ask(
                f"CONNECT localhost:{h.up_port} HTTP/1.1\r\n{h.auth()}\r\n"
            )
            reply += await reader.read()
            assert b" 403 " in reply and b"denied range 127.0.0.0/8" in reply, reply

    run(go())
