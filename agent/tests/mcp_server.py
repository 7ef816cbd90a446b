"""A tiny MCP server (the `mcp` SDK, stdio) for agent/tests/mcp_python.rs.

`wait` sleeps and, when the client cancels the call, writes "cancelled" to the marker file given as the
first argument; `fail` raises, which the SDK returns as an `isError` result; a third tool's name is too long
for a model once prefixed with the server name.
"""

import asyncio
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

marker = sys.argv[1]
server = MCPServer("turnstile-test")


@server.tool()
async def wait(seconds: float) -> str:
    """Waits SECONDS, then answers "waited"."""
    try:
        await asyncio.sleep(seconds)
        return "waited"
    except asyncio.CancelledError:
        with open(marker, "w") as f:
            f.write("cancelled")
        raise


@server.tool()
async def fail() -> str:
    """Always fails."""
    raise ToolError("it broke")


# `py__` + 61 characters is 65: one more than a model accepts as a tool name.
LONG_NAME = "a_tool_whose_name_is_longer_than_what_any_model_provider_accepts"[:61].ljust(61, "x")


@server.tool(name=LONG_NAME)
async def long_named() -> str:
    """A tool the worker must not offer to a model."""
    return "never"


server.run()
