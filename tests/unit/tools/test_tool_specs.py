"""What a client may give a session as tools, read strictly (``tools/specs.py``)."""

from __future__ import annotations

import pytest

from gateway.errors import BadRequest
from gateway.tools.specs import CallLimits, default_action, parse_tools


def test_a_full_config_is_read():
    config = parse_tools({
        "mcp": [{"url": "https://mcp.example/mcp", "name": "wh",
                 "headers": {"Authorization": {"secret": "WH_TOKEN", "prefix": "Bearer "},
                             "X-Team": "data"}}],
        "rules": {"drop": "deny", "post": {"action": "hold", "approval_covers": 50}},
        "limits": {"calls_per_execute": 10, "call_timeout": 2.5},
    })  # fmt: skip
    (server,) = config.mcp
    assert server.secrets == ("WH_TOKEN",) and config.secrets == ("WH_TOKEN",)
    assert server.headers[0].resolve({"WH_TOKEN": "t"}) == "Bearer t"
    assert server.to_json() == {"name": "wh", "url": "https://mcp.example/mcp",
                                "headers": ["Authorization", "X-Team"]}  # fmt: skip
    assert config.rules["post"].approval_covers == 50 and config.rules["drop"].action == "deny"
    assert config.limits == CallLimits(calls_per_execute=10, call_timeout=2.5)
    assert parse_tools({"mcp": [{"url": "http://10.0.0.1:8/mcp"}]}).mcp[0].name == "10.0.0.1"


@pytest.mark.parametrize(
    "body, message",
    [
        ([], "tools must be an object"),
        ({"servers": []}, "tools takes mcp, stdio, rules and limits"),
        ({"mcp": [{"url": "file:///etc/passwd"}]}, "http(s) URL"),
        ({"mcp": [{"url": "http://user:pw@host/mcp"}]}, "no user info"),
        ({"mcp": [{"url": "http://a/mcp", "command": "sh"}]}, "url, name and headers"),
        ({"mcp": [{"url": "http://a/mcp"}, {"url": "http://a/other"}]}, "name of its own"),
        ({"mcp": [{"url": "http://a/mcp", "headers": {"Bad Name": "x"}}]}, "not a header name"),
        ({"mcp": [{"url": "http://a/mcp", "headers": {"X": "a\r\nInjected: 1"}}]}, "printable"),
        (
            {"mcp": [{"url": "http://a/mcp", "headers": {"X": {"secret": "no-such name"}}}]},
            "tenant's secrets",
        ),
        ({"mcp": [{"url": "http://a/mcp"}] * 9}, "at most 8 servers"),
        ({"rules": {"t": "maybe"}}, "allow, hold, deny"),
        ({"rules": {"t": {"action": "hold", "approval_covers": 0}}}, "1 to 10000"),
        ({"limits": {"calls_per_execute": 0}}, "positive"),
        ({"limits": {"calls_per_execute": 1.5}}, "whole"),
        ({"limits": {"result_bytes": True}}, "positive"),
        ({"limits": {"forever": 1}}, "tools.limits is an object of"),
    ],
)
def test_a_malformed_config_is_a_400_saying_what_to_send(body, message):
    with pytest.raises(BadRequest) as refused:
        parse_tools(body)
    assert message in refused.value.message


def test_actions_follow_the_tools_annotations_as_mcp_defines_them():
    assert default_action({"readOnlyHint": True}) == "allow"
    assert default_action({"readOnlyHint": False, "destructiveHint": False}) == "allow"
    assert default_action({"destructiveHint": True}) == "hold"
    assert default_action({}) == "hold"  # MCP: destructive unless it says otherwise


def test_a_session_asks_for_no_more_than_the_servers_ceiling():
    ceiling = CallLimits(100, 1000, 5.0, 4)
    assert CallLimits(1000, 10, 60.0, 2).within(ceiling) == CallLimits(100, 10, 5.0, 2)
