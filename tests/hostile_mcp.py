"""A hostile MCP server for the tools tests: run as ``python tests/hostile_mcp.py PORT``.

Its tools answer (``echo``), answer slowly (``slow``), answer hugely (``huge``),
or crash the server (``crash``), or publish an output schema whose pattern
backtracks for ever on what it answers (``backtrack``).
"""

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

mcp = MCPServer("hostile")


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
def echo(text: str) -> str:
    "Echo."
    return text


@mcp.tool()
def slow(seconds: float) -> str:
    "Sleep."
    time.sleep(seconds)
    return "late"


@mcp.tool()
def huge(size: int) -> str:
    "Big."
    return "x" * size


@mcp.tool()
def crash() -> str:
    "Die."
    os._exit(1)


@mcp.tool()
def backtrack(size: int) -> CallToolResult:
    "Answer what its output schema's pattern takes time exponential in size to check."
    text = "a" * size + "!"
    return CallToolResult(content=[TextContent(text=text)], structured_content={"x": text})


# A schema published without a model: advertised as is, never checked by this server.
mcp._tool_manager.get_tool("backtrack").fn_metadata.output_schema = {
    "type": "object",
    "properties": {"x": {"type": "string", "pattern": "^(a+)+$"}},
}


if __name__ == "__main__":
    mcp.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
