"""``sbx mcp config``: what to paste into an MCP client to reach the gateway.

Standard library only: printing a configuration starts no server.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

NAME = "sandbox-gateway"
# Clients whose configuration files share one shape: {"mcpServers": {name: server}}.
MCP_SERVERS_CLIENTS = ("claude-desktop", "cursor", "windsurf")
CLIENTS = (*MCP_SERVERS_CLIENTS, "vscode", "claude-code")


def sbx_command() -> str:
    """The ``sbx`` to start: the one beside this interpreter, else the one on PATH."""
    beside = Path(sys.executable).with_name("sbx")
    return str(beside) if beside.exists() else shutil.which("sbx") or "sbx"


def client_config(client: str, url: str, token: str, http: str | None) -> str:
    """The text for ``client``: over stdio (``sbx mcp`` started by the client), or ``http``."""
    if client == "claude-code":
        if http:
            header = shlex.quote(f"Authorization: Bearer {token}")
            return f"claude mcp add {NAME} --transport http {http} --header {header}"
        env = f"-e SBX_URL={shlex.quote(url)} -e SBX_TOKEN={shlex.quote(token)}"
        return f"claude mcp add {NAME} {env} -- {shlex.quote(sbx_command())} mcp"
    if http:
        server: dict[str, object] = {
            "type": "http",
            "url": http,
            "headers": {"Authorization": f"Bearer {token}"},
        }
    else:
        server = {
            "command": sbx_command(),
            "args": ["mcp"],
            "env": {"SBX_URL": url, "SBX_TOKEN": token},
        }
        if client == "vscode":
            server = {"type": "stdio", **server}
    key = "servers" if client == "vscode" else "mcpServers"
    return json.dumps({key: {NAME: server}}, indent=2)
