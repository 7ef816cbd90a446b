"""A `tools/call` stream cut before its answer and resumed with `Last-Event-ID` (decision 0156), with the
official, unmodified `mcp` Python SDK client over Streamable HTTP at 2025-11-25 (`mode="legacy"`: at 2026-07-28
closing a call's stream is its cancellation and the protocol has no resume). A TCP proxy on loopback (a port the
kernel picks) between the client and `turnstile dev` cuts the connection once the first progress event went
through; the SDK reconnects with `GET /mcp` and `Last-Event-ID`, and the server rebuilds the rest of the stream
from the session's log. tests/tests/mcp_server.rs starts the server (MCP_URL, TOKEN_A, TOKEN_B)."""

import os
import unittest

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from cutting_proxy import CuttingProxy

URL = os.environ["MCP_URL"]
TOKEN_A = os.environ["TOKEN_A"]
TOKEN_B = os.environ["TOKEN_B"]


def http(token=TOKEN_A):
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)


def run(test):
    return lambda self: anyio.run(test, self)


class Resume(unittest.TestCase):
    def setUp(self):
        self.proxy = CuttingProxy([URL])

    def tearDown(self):
        self.proxy.close()

    @run
    async def test_a_cut_stream_resumes_with_nothing_missed_or_twice_and_the_turn_goes_on(self):
        progress = []

        async def on_progress(value, total, message):
            progress.append((value, message))

        async with Client(streamable_http_client(self.proxy.url, http_client=http()), mode="legacy") as c:
            r = await c.call_tool("scripted", {"message": "[[delay:1200]] resumed after a cut"},
                                  progress_callback=on_progress)
        self.assertTrue(self.proxy.cut.is_set(), "the proxy cut the call's stream")
        self.assertEqual(len(self.proxy.resumes), 1, "the SDK resumed once, with Last-Event-ID")
        self.assertFalse(r.is_error, r)
        self.assertEqual(r.structured_content["status"], "completed", "a cut is not a cancellation here")
        self.assertEqual(r.content[0].text, "echo: resumed after a cut")
        self.assertEqual("".join(m for _, m in progress), "echo: resumed after a cut", "every delta once")
        self.assertEqual([v for v, _ in progress], sorted(v for v, _ in progress))
        self.assertGreaterEqual(len(progress), 2, "one delta before the cut, the rest after")

        # The cursor names a session of tenant A: to tenant B it is not there; to A it replays the rest.
        cursor = self.proxy.resumes[0]
        headers = {"Accept": "text/event-stream", "Last-Event-ID": cursor}
        async with http(TOKEN_B) as h:
            self.assertEqual((await h.get(URL, headers=headers)).status_code, 404)
        async with http() as h:
            self.assertEqual((await h.get(URL, headers={**headers, "Last-Event-ID": "forged"})).status_code, 404)
            answer = await h.get(URL, headers=headers)
        self.assertEqual(answer.status_code, 200)
        frames = [line for line in answer.text.splitlines() if line.startswith("data: ")]
        self.assertIn("echo: resumed after a cut", frames[-1], "the replay ends with the call's answer")


if __name__ == "__main__":
    unittest.main()
