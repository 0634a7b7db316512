"""The MCP server: the gateway as tools for an agent, through the SDK."""
