"""The MCP server keeps nothing between requests (decision 0127): on a cluster of one worker and two gateways
(tests/tests/mcp_server.rs; MCP_URL_0 and _1, auth off), a session started by a call through one gateway goes
on through the other, an approval's elicitation round asked through one is answered through the other
(its `requestState` carries everything the retried call needs), and a call's stream cut at one gateway
resumes with `Last-Event-ID` at the other (decision 0156)."""

import os
import unittest

import anyio
import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

from cutting_proxy import CuttingProxy

URLS = [os.environ["MCP_URL_0"], os.environ["MCP_URL_1"]]


def run(test):
    return lambda self: anyio.run(test, self)


class AnyGateway(unittest.TestCase):
    @run
    async def test_a_session_goes_on_through_the_other_gateway(self):
        async with Client(URLS[0]) as a, Client(URLS[1]) as b:
            first = await a.call_tool("scripted", {"message": "one"})
            session = first.structured_content["session"]
            second = await b.call_tool("scripted", {"message": "two", "session": session})
        self.assertEqual(second.structured_content["turn"], 2)
        self.assertEqual(second.content[0].text, "echo: two")

    @run
    async def test_an_elicitation_round_is_answered_through_the_other_gateway(self):
        async with Client(URLS[0]) as a, Client(URLS[1]) as b:
            asked = await a.session.call_tool("guarded", {"message": "[[tool:echo across gateways]] go"},
                                              allow_input_required=True)
            self.assertIsInstance(asked, types.InputRequiredResult)
            [key] = asked.input_requests
            answer = {key: {"action": "accept", "content": {"approve": True}}}
            done = await b.call_tool("guarded", {"message": "[[tool:echo across gateways]] go"},
                                     input_responses=answer, request_state=asked.request_state)
        self.assertEqual(done.structured_content["status"], "completed")
        self.assertIn("tool results: echo: across gateways", done.content[0].text)


    @run
    async def test_a_stream_cut_at_one_gateway_resumes_at_the_other(self):
        proxy = CuttingProxy(URLS)
        progress = []

        async def on_progress(value, total, message):
            progress.append(message)

        try:
            transport = streamable_http_client(proxy.url, http_client=httpx2.AsyncClient(timeout=60))
            async with Client(transport, mode="legacy") as c:
                r = await c.call_tool("scripted", {"message": "[[delay:1200]] across a cut"},
                                      progress_callback=on_progress)
        finally:
            proxy.close()
        self.assertTrue(proxy.cut.is_set())
        self.assertEqual(len(proxy.resumes), 1, "resumed once, through gateway 1")
        self.assertEqual(r.structured_content["status"], "completed")
        self.assertEqual("".join(progress), "echo: across a cut", "every delta once")


if __name__ == "__main__":
    unittest.main()
