"""E2B's ``Sandbox.create(mcp=...)``: ``sbxTools`` names streamable-HTTP servers the gateway
reaches; E2B's catalogue servers (stdio processes, most needing the internet) are a 400 naming
the entry, and the SDK's ``mcp-gateway`` command is recognised for its token only."""

from __future__ import annotations

import json
import shlex

import pytest

from gateway.api.e2b.control import create_request
from gateway.api.e2b.mcp import mcp_gateway_token
from gateway.errors import BadRequest


def test_a_catalogue_server_is_refused_naming_the_entry_and_why():
    body = {"templateID": "mcp-gateway", "mcp": {"github": {"githubPersonalAccessToken": "x"}}}
    with pytest.raises(BadRequest) as refused:
        create_request(body, 3600)
    message = refused.value.message
    assert message.startswith("mcp.github: ") and "stdio" in message and "internet" in message
    assert "sbxTools" in message and "docs/e2b.md" in message


def test_sbx_tools_names_streamable_http_servers_and_an_empty_mcp_gives_none():
    server = {"url": "https://warehouse.example/mcp", "name": "wh"}
    request = create_request(
        {"templateID": "mcp-gateway", "mcp": {"sbxTools": {"mcp": [server]}}}, 60
    )
    assert request.kernel == "python3" and request.tools is not None
    assert [s.name for s in request.tools.mcp] == ["wh"]
    assert create_request({"templateID": "base", "mcp": {}}, 60).tools is None
    with pytest.raises(BadRequest):
        create_request({"templateID": "base", "mcp": ["x"]}, 60)


def test_the_sdks_mcp_gateway_command_is_told_apart_from_any_other():
    config = json.dumps({"sbxTools": {}})
    line = f"mcp-gateway --config {shlex.quote(config)}"
    env = {"GATEWAY_ACCESS_TOKEN": "t" * 36}
    assert mcp_gateway_token(["/bin/bash", "-l", "-c", line], env) == "t" * 36
    assert mcp_gateway_token(["/bin/bash", "-l", "-c", line + "; rm -rf /"], env) is None
    assert mcp_gateway_token(["/bin/bash", "-l", "-c", "echo hi"], env) is None
    assert mcp_gateway_token(["mcp-gateway", "--config", config], env) is None
    with pytest.raises(BadRequest, match="GATEWAY_ACCESS_TOKEN"):
        mcp_gateway_token(["/bin/bash", "-l", "-c", line], {})
