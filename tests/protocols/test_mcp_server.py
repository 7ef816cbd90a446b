"""Turnstile's MCP server (docs/PROTOCOLS.md, `/mcp`, Streamable HTTP) through the official, unmodified `mcp`
Python SDK client, against a real `turnstile dev` that tests/tests/mcp_server.rs starts with two tenants' tokens
(MCP_URL, TOKEN_A, TOKEN_B). Agents are tools: `scripted` answers `echo: <text>` and obeys its directives
(`[[delay:MS]]` streams slowly, `[[tool:sleep MS]]` runs a slow tool), `guarded` asks before it runs `echo`,
`only-b` is confined to tenant B."""

import os
import unittest
import uuid

import anyio
import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

URL = os.environ["MCP_URL"]
TOKEN_A = os.environ["TOKEN_A"]
TOKEN_B = os.environ["TOKEN_B"]


def client(token=TOKEN_A, **options):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Client(streamable_http_client(URL, http_client=http), **options)


def run(test):
    """Runs an async test body (unittest's IsolatedAsyncioTestCase would share one loop across anyio's)."""
    return lambda self: anyio.run(test, self)


class McpServer(unittest.TestCase):
    @run
    async def test_each_agent_the_tenant_may_run_is_a_tool(self):
        async with client() as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
        self.assertEqual(sorted(tools), ["guarded", "scripted"], "only-b is tenant B's alone")
        self.assertEqual(tools["guarded"].description, "Echoes, but asks before it runs echo.")
        schema = tools["scripted"].input_schema
        self.assertEqual(schema["required"], ["message"])
        self.assertEqual(sorted(schema["properties"]), ["message", "session"])
        async with client(TOKEN_B) as c:
            self.assertIn("only-b", [t.name for t in (await c.list_tools()).tools])

    @run
    async def test_a_call_runs_a_turn_and_progress_carries_its_deltas(self):
        progress = []

        async def on_progress(value, total, message):
            progress.append((value, message))

        async with client() as c:
            r = await c.call_tool("scripted", {"message": "[[delay:400]] streamed slowly"},
                                  progress_callback=on_progress)
        self.assertFalse(r.is_error)
        self.assertEqual(r.content[0].text, "echo: streamed slowly")
        self.assertEqual(r.structured_content["status"], "completed")
        self.assertEqual(r.structured_content["turn"], 1)
        self.assertGreater(len(progress), 1, "the reply came in several deltas")
        self.assertEqual("".join(m for _, m in progress), "echo: streamed slowly")
        values = [v for v, _ in progress]
        self.assertEqual(values, sorted(set(values)), "progress rises")

    @run
    async def test_a_named_session_continues_and_a_new_one_is_made_without(self):
        session = f"mcp-test-{uuid.uuid4().hex}"
        async with client() as c:
            first = await c.call_tool("scripted", {"message": "one", "session": session})
            second = await c.call_tool("scripted", {"message": "two", "session": session})
            fresh = await c.call_tool("scripted", {"message": "three"})
        self.assertEqual((first.structured_content["session"], first.structured_content["turn"]), (session, 1))
        self.assertEqual((second.structured_content["session"], second.structured_content["turn"]), (session, 2))
        self.assertNotEqual(fresh.structured_content["session"], session)
        self.assertEqual(fresh.structured_content["turn"], 1)

    @run
    async def test_an_approval_is_asked_by_elicitation_and_decides_the_call(self):
        asked = []

        async def approve(context, params):
            asked.append(params.message)
            return types.ElicitResult(action="accept", content={"approve": True})

        async with client(elicitation_callback=approve) as c:
            r = await c.call_tool("guarded", {"message": "[[tool:echo approved text]] go"})
        self.assertEqual(len(asked), 1)
        self.assertIn("`echo`", asked[0])
        self.assertEqual(r.structured_content["status"], "completed")
        self.assertIn("tool results: echo: approved text", r.content[0].text)

        async def deny(context, params):
            return types.ElicitResult(action="accept", content={"approve": False, "reason": "not today"})

        async with client(elicitation_callback=deny) as c:
            r = await c.call_tool("guarded", {"message": "[[tool:echo refused text]] go"})
        self.assertEqual(r.structured_content["status"], "completed")
        self.assertNotIn("tool results: echo: refused text", r.content[0].text)

    @run
    async def test_cancelling_the_call_cancels_the_turn(self):
        """The cancelled session is written to MCP_CANCELLED, where the Rust side watches its turn end `aborted`
        (the server learns of the cancellation when the call's stream closes, after this client moved on)."""
        session = f"mcp-cancel-{uuid.uuid4().hex}"
        started = anyio.Event()

        async def on_progress(value, total, message):
            started.set()

        async with client() as c:
            async with anyio.create_task_group() as tasks:
                async def slow():
                    await c.call_tool("scripted", {"message": "[[tool:sleep 600000]] wait", "session": session},
                                      progress_callback=on_progress)

                tasks.start_soon(slow)
                await started.wait()
                tasks.cancel_scope.cancel()
        with open(os.environ["MCP_CANCELLED"], "w") as report:
            report.write(session)

    @run
    async def test_tenants_see_only_their_own_sessions_and_agents(self):
        session = f"mcp-tenancy-{uuid.uuid4().hex}"
        async with client() as c:
            await c.call_tool("scripted", {"message": "secret of A", "session": session})
            with self.assertRaises(MCPError) as refused:
                await c.call_tool("only-b", {"message": "hi"})
            self.assertEqual(refused.exception.error.code, types.INVALID_PARAMS)
            self.assertIn("guarded, scripted", refused.exception.error.message)
        async with client(TOKEN_B) as c:
            # The same id in tenant B is B's own, new session: nothing of A's shows.
            r = await c.call_tool("scripted", {"message": "hello", "session": session})
        self.assertEqual(r.structured_content["turn"], 1)
        self.assertEqual(r.content[0].text, "echo: hello")

    @run
    async def test_bad_input_and_bad_tokens_are_refused(self):
        async with client() as c:
            with self.assertRaises(MCPError) as refused:
                await c.call_tool("scripted", {"message": "x", "session": "not a session id"})
            self.assertEqual(refused.exception.error.code, types.INVALID_PARAMS)
            self.assertIn("session id", refused.exception.error.message)
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer wrong"}) as http:
            answer = await http.post(URL, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                     headers={"Accept": "application/json, text/event-stream"})
        self.assertEqual(answer.status_code, 401)
        self.assertEqual(answer.headers["www-authenticate"], "Bearer")


if __name__ == "__main__":
    unittest.main()
