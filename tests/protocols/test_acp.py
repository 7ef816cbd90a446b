"""`turnstile acp` (docs/PROTOCOLS.md) driven by the official, unmodified `agent-client-protocol` Python SDK as the
editor: it spawns `turnstile acp` (TURNSTILE_BIN, against the `turnstile dev` of tests/tests/acp.rs at ADDR with
TOKEN) and speaks ACP over its stdio. `guarded` asks before it runs `echo`; the scripted model answers
`echo: <text>` and obeys its directives (`[[delay:MS]]`, `[[tool:NAME ARGS]]`)."""

import asyncio
import os
import unittest

from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.schema import AllowedOutcome, RequestPermissionResponse

BIN, ADDR, TOKEN = os.environ["TURNSTILE_BIN"], os.environ["ADDR"], os.environ["TOKEN"]


class Editor:
    """The editor's side: records every update; answers permission requests with `allow`."""

    def __init__(self, allow=True):
        self.updates, self.asked, self.allow = [], [], allow
        self.tool_called = asyncio.Event()

    async def request_permission(self, options, session_id, tool_call, **kwargs):
        self.asked.append(tool_call)
        option = "allow" if self.allow else "reject"
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=option))

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append(update)
        if update.session_update == "tool_call":
            self.tool_called.set()

    def kinds(self):
        return [u.session_update for u in self.updates]

    def agent_text(self):
        return "".join(u.content.text for u in self.updates if u.session_update == "agent_message_chunk")


def agent(editor, *args):
    return spawn_agent_process(editor, BIN, "--addr", ADDR, "--token", TOKEN, "acp", *args)


def run(test):
    return lambda self: asyncio.run(asyncio.wait_for(test(self), 120))


class Acp(unittest.TestCase):
    @run
    async def test_new_prompt_with_a_streamed_reply_then_load_in_a_fresh_process(self):
        editor = Editor()
        async with agent(editor) as (conn, _):
            init = await conn.initialize(protocol_version=PROTOCOL_VERSION)
            self.assertTrue(init.agent_capabilities.load_session)
            session = (await conn.new_session(cwd="/", mcp_servers=[])).session_id
            answer = await conn.prompt(session_id=session, prompt=[text_block("[[delay:400]] hello editor")])
            self.assertEqual(answer.stop_reason, "end_turn")
            self.assertEqual(editor.agent_text(), "echo: hello editor")
            self.assertGreater(editor.kinds().count("agent_message_chunk"), 1, "the reply streamed in chunks")
            self.assertNotIn("user_message_chunk", editor.kinds(), "the editor's own prompt is not echoed")
            answer = await conn.prompt(session_id=session, prompt=[text_block("second")])
            self.assertEqual(editor.agent_text(), "echo: hello editorecho: second")
        # A fresh process (an editor reopening the session) gets the whole history replayed.
        reopened = Editor()
        async with agent(reopened) as (conn, _):
            await conn.initialize(protocol_version=PROTOCOL_VERSION)
            await conn.load_session(cwd="/", session_id=session, mcp_servers=[])
            users = [u.content.text for u in reopened.updates if u.session_update == "user_message_chunk"]
            self.assertEqual(users, ["[[delay:400]] hello editor", "second"])
            self.assertEqual(reopened.agent_text(), "echo: hello editorecho: second")
            answer = await conn.prompt(session_id=session, prompt=[text_block("third")])
            self.assertEqual(answer.stop_reason, "end_turn")
            self.assertTrue(reopened.agent_text().endswith("echo: third"))

    @run
    async def test_a_call_awaiting_approval_asks_permission_and_the_answer_decides_it(self):
        editor = Editor()
        async with agent(editor, "--agent", "guarded") as (conn, _):
            await conn.initialize(protocol_version=PROTOCOL_VERSION)
            session = (await conn.new_session(cwd="/", mcp_servers=[])).session_id
            answer = await conn.prompt(session_id=session, prompt=[text_block("[[tool:echo approved text]] go")])
            self.assertEqual(answer.stop_reason, "end_turn")
            self.assertEqual([c.title for c in editor.asked], ["echo"])
            calls = [u for u in editor.updates if u.session_update == "tool_call"]
            self.assertEqual((calls[0].title, calls[0].status), ("echo", "pending"))
            done = [u for u in editor.updates if u.session_update == "tool_call_update" and u.status == "completed"]
            self.assertEqual(done[0].tool_call_id, calls[0].tool_call_id)
            self.assertEqual(done[0].content[0].content.text, "approved text")
        refusing = Editor(allow=False)
        async with agent(refusing, "--agent", "guarded") as (conn, _):
            await conn.initialize(protocol_version=PROTOCOL_VERSION)
            session = (await conn.new_session(cwd="/", mcp_servers=[])).session_id
            await conn.prompt(session_id=session, prompt=[text_block("[[tool:echo refused text]] go")])
            self.assertEqual(len(refusing.asked), 1)
            self.assertFalse([u for u in refusing.updates if u.session_update == "tool_call_update" and u.status == "completed"])

    @run
    async def test_cancel_ends_the_prompt_cancelled(self):
        editor = Editor()
        async with agent(editor) as (conn, _):
            await conn.initialize(protocol_version=PROTOCOL_VERSION)
            session = (await conn.new_session(cwd="/", mcp_servers=[])).session_id
            prompt = asyncio.create_task(conn.prompt(session_id=session, prompt=[text_block("[[tool:sleep 600000]] wait")]))
            await editor.tool_called.wait()
            await conn.cancel(session_id=session)
            self.assertEqual((await prompt).stop_reason, "cancelled")

    @run
    async def test_bad_input_is_an_error_naming_the_field(self):
        async with agent(Editor()) as (conn, _):
            await conn.initialize(protocol_version=PROTOCOL_VERSION)
            session = (await conn.new_session(cwd="/", mcp_servers=[])).session_id
            with self.assertRaises(RequestError) as refused:
                await conn.prompt(session_id=session, prompt=[])
            self.assertIn("prompt has no text", str(refused.exception))


if __name__ == "__main__":
    unittest.main()
