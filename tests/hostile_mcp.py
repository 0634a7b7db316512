"""A hostile MCP server for the tools tests: run as ``python tests/hostile_mcp.py PORT``.

Its tools answer (``echo``), answer slowly (``slow``), answer hugely (``huge``),
or crash the server (``crash``).
"""

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

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


if __name__ == "__main__":
    mcp.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
