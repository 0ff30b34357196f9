"""Agents' way in: an MCP server whose tools list, search and fetch what a caller's key may read
(``ragserve.agent.server``), served at ``/mcp`` (streamable HTTP) and by ``ragserve mcp`` (stdio)."""
