"""`signoff mcp-proxy`: an MCP server in front of other MCP servers, whose dangerous calls
wait for a person (docs/mcp-proxy.md)."""
