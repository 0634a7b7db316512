"""E2B's ``Sandbox.create(mcp=...)`` (an MCP gateway run in the sandbox, catalogue servers over
stdio) is refused with what to do instead: give the session tools the gateway reaches."""

from __future__ import annotations

import pytest

from gateway.api.e2b.control import create_request
from gateway.errors import NotSupported


def test_e2bs_mcp_is_refused_with_the_gateways_own_way_to_give_tools():
    body = {"templateID": "mcp-gateway", "mcp": {"github": {"githubPersonalAccessToken": "x"}}}
    with pytest.raises(NotSupported) as refused:
        create_request(body, 3600)
    message = refused.value.message
    assert "stdio" in message and "PUT /v1/sessions/{id}/tools" in message
    assert "docs/tools.md" in message
