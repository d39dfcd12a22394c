"""memchat's memory as MCP tools (the official `mcp` SDK, an optional extra).

`server.build` makes the server: search_memory, read_notes, update_notes,
list_sessions and get_session, each acting for one verified caller under
RLS through the same use cases as the HTTP API. It is served two ways:
streamable HTTP at POST /mcp (api/routes/mcp.py, the API's JWT auth,
stateless: each request stands alone, as a Lambda invocation does) and
stdio (`memchat mcp`, cli/mcp.py) for desktop clients. The SDK is imported
here only, on first use: never on the chat function's cold start.
"""
