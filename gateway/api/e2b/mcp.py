"""The sandbox's MCP URL (E2B's ``get_mcp_url()``: ``https://50005-ID.DOMAIN/mcp``).

E2B runs an MCP gateway process in the sandbox; here the gateway itself
answers MCP over streamable HTTP (the ``mcp`` package's server, stateless,
JSON answers) with the session's tools, each call through
``SessionTools.call_over_mcp``: the gate, limits and record of a call from
the kernel. The caller brings the sandbox's MCP token (``get_mcp_token()``),
checked before the body is read (``base.Credentials``). The token comes from
the SDK's ``mcp-gateway`` command, taken by ``process.py``; a ``connect``ed
SDK reads ``TOKEN_FILE``, which ``envd.py`` answers with one for its caller.
"""

from __future__ import annotations

import asyncio
import shlex
from typing import Any

from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from ...errors import BadRequest
from ...sessions.tools import SessionTools
from ...tools.endpoint import MAX_BODY, CallRefused
from ...tools.specs import ToolsConfig, parse_tools
from .base import MCP_PORT, SandboxHandler
from .connect import serve_asgi

MAX_MESSAGE = MAX_BODY  # bytes of one MCP request: what the tool socket takes of a call
COMMAND = "mcp-gateway"  # what the SDK runs in the sandbox after create(mcp=...)
TOKEN_ENV = "GATEWAY_ACCESS_TOKEN"
# What get_mcp_token() reads after Sandbox.connect: in E2B, mcp-gateway's file. Here no such
# file is in the sandbox (its code can neither read nor plant one): the gateway answers it.
TOKEN_FILE = "/etc/mcp-gateway/.token"
OWN_ENTRY = "sbxTools"  # the mcp= entry naming streamable-HTTP servers (no E2B catalogue name)


def mcp_gateway_token(argv: list[str], env: dict[str, str]) -> str | None:
    """The token of the SDK's ``mcp-gateway --config ...`` command (run through a shell), if
    ``argv`` is that command; else None."""
    line = argv[-1] if len(argv) >= 3 and argv[-2] == "-c" else ""
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    if words[:2] != [COMMAND, "--config"] or len(words) != 3:
        return None
    token = env.get(TOKEN_ENV)
    if not token:
        raise BadRequest(f"{COMMAND} needs its token in {TOKEN_ENV}")
    return token


def tools_of(servers: object) -> ToolsConfig | None:
    """E2B's ``mcp=`` as the session's tools: ``sbxTools`` (this gateway's own entry, the
    body of ``PUT /v1/sessions/{id}/tools``) names servers by URL or stdio command; E2B's
    catalogue entries are refused, each by name (None: no entry, an MCP URL of no tools)."""
    if not isinstance(servers, dict):
        raise BadRequest("mcp must be an object of MCP servers by name")
    catalogue = sorted(set(servers) - {OWN_ENTRY})
    if catalogue:
        raise BadRequest(
            f"mcp.{catalogue[0]}: E2B's catalogue servers are stdio processes that E2B runs in "
            "the sandbox and most reach the internet; this gateway's sandboxes have no network. "
            f"Serve it over streamable HTTP and name it in mcp.{OWN_ENTRY}: "
            f'{{"mcp": [{{"url": ..., "name": ...}}]}}, or give a stdio one that needs no '
            'network as {"stdio": [{"name": ..., "command": [...]}]} (docs/e2b.md)'
        )
    return parse_tools(servers[OWN_ENTRY]) if OWN_ENTRY in servers else None


def _server(tools: SessionTools, handler: McpHandler) -> Server[Any]:
    """An MCP server of one sandbox's tools, for one request's caller."""
    sandbox_id, who = handler.sandbox_id, handler.principal

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        listed = [
            types.Tool(
                name=t["name"],
                description=t["description"],
                input_schema=t["input_schema"],
                annotations=types.ToolAnnotations.model_validate(t["annotations"] or {}),
            )
            for t in tools.mcp_listing(sandbox_id)
        ]
        return types.ListToolsResult(tools=listed)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            answer = await tools.call_over_mcp(sandbox_id, who, params.name, params.arguments or {})
        except CallRefused as e:
            text = types.TextContent(type="text", text=f"{e.code}: {e.message}")
            return types.CallToolResult(content=[text], is_error=True)
        return types.CallToolResult.model_validate({"content": answer["content"]})

    return Server("sbx-sandbox-tools", on_list_tools=list_tools, on_call_tool=call_tool)


class McpHandler(SandboxHandler):
    """``/mcp`` on port 50005: MCP over streamable HTTP, one stateless exchange a request."""

    port = MCP_PORT
    actions = {"POST": "sandbox.mcp", "GET": "sandbox.mcp", "DELETE": "sandbox.mcp"}
    closed: asyncio.Event

    def body_limit(self) -> int:
        return MAX_MESSAGE

    async def _serve(self) -> None:
        self.closed = asyncio.Event()
        manager = StreamableHTTPSessionManager(
            _server(self.tools, self), json_response=True, stateless=True
        )
        async with manager.run():
            await serve_asgi(self, manager.handle_request)

    def on_connection_close(self) -> None:
        if hasattr(self, "closed"):
            self.closed.set()

    post = get = delete = _serve


routes = [(r"/mcp", McpHandler)]
