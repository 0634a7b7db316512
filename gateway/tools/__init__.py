"""Tools a session's code calls: MCP servers the gateway connects to, reached from the sandbox
through a per-session socket (docs/tools.md)."""
