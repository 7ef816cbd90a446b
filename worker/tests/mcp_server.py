"""A tiny MCP server (the `mcp` SDK, stdio) for worker/tests/mcp_python.rs.

`wait` sleeps and, when the client cancels the call, writes "cancelled" to the marker file given as the
first argument; `fail` raises, which the SDK returns as an `isError` result.
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


server.run()
