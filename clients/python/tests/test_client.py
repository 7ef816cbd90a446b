"""The client against a real `turnstile dev`, on the embedded journal and on JetStream (`--nats`): every
delivery preset, the inbox edits, cancel, the reads, a Watch that streams a reply, retries on UNAVAILABLE
that carry the same MessageId (a lost reply is answered with the first acceptance, SPEC §2), the blocking
client, and tools served from decorated functions."""

from __future__ import annotations

import asyncio
import json
import hashlib
import hmac
import http.server
import os
import threading
import socket
import subprocess
import time
import sys
import unittest
from pathlib import Path
import uuid

import grpc
import grpc.aio

from harness import Backend, DevServer, NatsServer, bounded
from turnstile_client import AsyncClient, Client, ToolContext, ToolOutput, Tools, TurnstileError, pb, text_of

TOOLS_CONFIG = """default_agent = "helper"

[agents.helper]
tools = ["echo", "client:lookup", "client:spell", "client:where"]
"""


def new_id() -> str:
    return "py-" + uuid.uuid4().hex[:12]


async def replay(c: AsyncClient, session: str) -> list:
    """The session's durable events, read with a Watch without live events up to its `caught_up`."""
    events = []
    async for item in c.watch(session, live=False):
        if item.WhichOneof("item") == "caught_up":
            return events
        events.append(item.event)
    raise AssertionError("the Watch ended before caught_up")


async def watch_until_idle_after(stream, turn: int) -> list:
    """Items of `stream` up to the durable `agent/status idle` that follows `turn/end {turn}`."""
    items, ended = [], False
    async for item in stream:
        items.append(item)
        if item.WhichOneof("item") != "event":
            continue
        e = item.event
        if e.WhichOneof("payload") == "turn_end" and e.turn_end.turn == turn:
            ended = True
        if ended and e.WhichOneof("payload") == "status" and e.status.status == pb.SESSION_STATUS_IDLE:
            return items
    raise AssertionError("the Watch ended early")


def entered(events: list) -> list[tuple[str, str]]:
    """(MessageId, text) of every `user/message`."""
    return [(e.user_message.message.id, text_of(e.user_message.message))
            for e in events if e.WhichOneof("payload") == "user_message"]


def replies(events: list) -> list[str]:
    return [e.assistant_message.text for e in events if e.WhichOneof("payload") == "assistant_message"]


class LoseFirstReply(grpc.aio.UnaryUnaryClientInterceptor):
    """Lets the first call of `method` reach the server and be applied, then reports UNAVAILABLE as a
    dropped connection would: the reply is lost, the write is not."""

    def __init__(self, method: str):
        self.method = method
        self.lost = []

    async def intercept_unary_unary(self, continuation, details, request):
        call = await continuation(details, request)
        name = details.method.decode() if isinstance(details.method, bytes) else details.method
        if name.endswith("/" + self.method) and not self.lost:
            self.lost.append(await call)
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       "reply lost on purpose by the test")
        return call


class DevCase:
    """A fresh `turnstile dev` (on BACKEND, with CONFIG) per test."""

    BACKEND = "embedded"
    CONFIG: str | None = None

    def setUp(self) -> None:
        self.backend = Backend(self.BACKEND)
        self.dev = self.backend.start(config=self.CONFIG)

    def tearDown(self) -> None:
        self.backend.close()

    def fail_with_log(self, message: str):
        self.fail(f"{message}\nserver log:\n{self.dev.log_tail()}")


class Scenarios(DevCase):

    async def test_a_followup_streams_its_reply_and_every_seq_once(self):
        async with AsyncClient(self.dev.address) as c:
            s = new_id()
            stream = c.watch(s)
            first = await bounded(anext(stream), "the first WatchItem")
            self.assertEqual(first.WhichOneof("item"), "caught_up")
            self.assertEqual(first.caught_up.seq, 0, "a session with no events yet is caught up at 0")
            reply = await c.followup(s, "hello")
            self.assertGreater(reply.seq, 0)
            self.assertTrue(reply.HasField("turn"), "a followup to an idle session opens a turn")
            items = await bounded(watch_until_idle_after(stream, reply.turn), "the turn's end")
            await stream.aclose()
            events = [i.event for i in items if i.WhichOneof("item") == "event"]
            self.assertEqual([e.seq for e in events], list(range(1, len(events) + 1)))
            self.assertEqual(replies(events), ["echo: hello"])
            deltas = "".join(i.live.assistant_delta.text for i in items
                             if i.WhichOneof("item") == "live" and i.live.WhichOneof("payload") == "assistant_delta")
            self.assertEqual(deltas, "echo: hello", "the live deltas concatenate to the reply")
            info = await c.when_idle(s)
            self.assertEqual(info.status, pb.SESSION_STATUS_IDLE)
            self.assertEqual(info.last_seq, events[-1].seq)
            self.assertEqual((await c.get_session(s)).last_turn, reply.turn)
            listed = [i.session.id async for i in c.sessions()]
            self.assertIn(s, listed)
            # The transcript: the followup (delivered as one), the reply and the turn's end, with their seqs.
            items = [i async for i in c.transcript(s, page_size=1)]
            self.assertEqual([i.WhichOneof("item") for i in items], ["user", "assistant", "turn_end"])
            self.assertEqual(items[0].user.delivery, pb.DELIVERY_KIND_FOLLOWUP)
            self.assertEqual(items[1].assistant.text, "echo: hello")
            by_seq = {e.seq: e for e in events}
            self.assertEqual([by_seq[i.seq].WhichOneof("payload") for i in items],
                             ["user_message", "assistant_message", "turn_end"])
            # Nothing waits for a decision in an idle session (the TypeScript suite lists a waiting call).
            self.assertEqual(list((await c.list_pending_approvals(s)).approvals), [])
            self.assertEqual(list((await c.list_pending_approvals(page_size=1000)).approvals), [])
            page = await c.get_transcript(s, after_seq=items[-1].seq)
            self.assertEqual((len(page.items), page.next_seq, page.last_seq), (0, 0, info.last_seq))

    async def test_a_lost_reply_is_retried_with_the_same_id_and_answered_with_the_first_acceptance(self):
        lose = LoseFirstReply("Followup")
        async with AsyncClient(self.dev.address, interceptors=[lose]) as c:
            s = new_id()
            reply = await c.followup(s, "once")
            self.assertEqual(len(lose.lost), 1, "the first attempt was applied and its reply dropped")
            self.assertEqual(reply.seq, lose.lost[0].seq, "the retry returns the original acceptance")
            self.assertEqual(reply.turn, lose.lost[0].turn)
            await c.when_idle(s)
            events = await replay(c, s)
            self.assertEqual([text for _, text in entered(events)], ["once"], "entered exactly once")

    async def test_an_unreachable_address_is_asked_again_and_the_delivery_goes_through(self):
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        dead = "127.0.0.1:%d" % closed.getsockname()[1]
        asked = []

        def address() -> str:
            asked.append(1)
            return dead if len(asked) == 1 else self.dev.address

        try:
            async with AsyncClient(address) as c:
                s = new_id()
                reply = await c.followup(s, "through")
                self.assertGreaterEqual(len(asked), 2)
                self.assertEqual(c.target, self.dev.address)
                await c.when_idle(s)
                self.assertEqual([t for _, t in entered(await replay(c, s))], ["through"])
                self.assertGreater(reply.seq, 0)
        finally:
            closed.close()

    async def test_the_inbox_edits_and_reads(self):
        async with AsyncClient(self.dev.address) as c:
            s = new_id()
            with self.assertRaises(TurnstileError) as e:
                await c.get_session(s)
            self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
            a = await c.queue(s, "a", id="msg-a")
            self.assertFalse(a.HasField("turn"), "a non-waking delivery opens no turn")
            await c.queue(s, "b", id="msg-b")
            await c.inject(s, "context", id="msg-c")
            inbox = await c.get_inbox(s)
            self.assertEqual([m.id for m in inbox.next_turn], ["msg-a", "msg-b"])
            self.assertEqual([m.id for m in inbox.next_step], ["msg-c"])
            self.assertEqual(inbox.next_step[0].source.WhichOneof("kind"), "plugin", "inject's default source")
            await c.replace(s, "msg-a", c.message("a2", id="msg-a2"))
            await c.remove(s, "msg-b")
            with self.assertRaises(TurnstileError) as e:
                await c.remove(s, "msg-b")
            self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
            inbox = await c.get_inbox(s)
            self.assertEqual([(m.id, text_of(m)) for m in inbox.next_turn], [("msg-a2", "a2")])
            cleared = await c.clear(s)
            self.assertGreater(cleared.seq, inbox.seq)
            inbox = await c.get_inbox(s)
            self.assertEqual((len(inbox.next_turn), len(inbox.next_step)), (0, 0))
            # The same id with other content is not a retry.
            with self.assertRaises(TurnstileError) as e:
                await c.queue(s, "other", id="msg-a")
            self.assertEqual(e.exception.code, grpc.StatusCode.ALREADY_EXISTS)

    async def test_compact_fork_reference_and_delete(self):
        async with AsyncClient(self.dev.address) as c:
            s, fork, other = new_id(), new_id(), new_id()
            for text in ("one", "two"):
                await c.followup(s, text)
                await c.when_idle(s)
            await c.compact(s)
            kinds = [e.WhichOneof("payload") for e in await replay(c, s)]
            self.assertEqual(kinds.count("context_compacted"), 1, "Compact wrote one context/compacted")
            info = await c.fork_session(s, 1, fork)
            self.assertEqual(info.session.id, fork)
            first = (await replay(c, fork))[0]
            self.assertEqual(first.WhichOneof("payload"), "session_forked")
            self.assertEqual(first.session_forked.at_turn, 1)
            with self.assertRaises(TurnstileError) as e:
                await c.fork_session(s, 1, fork)
            self.assertEqual(e.exception.code, grpc.StatusCode.ALREADY_EXISTS, "the fork exists now")
            await c.reference_session(other, s, upto_turn=1, id="ref-1")
            inbox = await c.get_inbox(other)
            self.assertEqual([m.id for m in inbox.next_step], ["ref-1"])
            self.assertEqual(inbox.next_step[0].source.WhichOneof("kind"), "session")
            self.assertIn("one", text_of(inbox.next_step[0]), "the reference carries turn 1's transcript")
            # The scripted model reports usage only when told: the tenant's tokens are what [[usage]] said.
            await c.followup(other, "[[usage:7,2]] metered")
            await c.when_idle(other)
            # On NATS the workers fold the streams into usage after the append (SPEC §17): it may lag a moment.
            deadline = asyncio.get_running_loop().time() + 20
            while True:
                usage = await c.get_usage()
                scripted = [m for m in usage.models if m.provider == "scripted"]
                if scripted or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            self.assertEqual([m.input_tokens for m in scripted], [7], "GetUsage counts the durable usage")
            self.assertGreaterEqual(usage.used_today, 9)
            last = (await c.get_session(s)).last_seq
            deleted = await c.delete_session(s)
            self.assertEqual(deleted.seq, last, "a delete answers the last seq the log had")
            with self.assertRaises(TurnstileError) as e:
                await c.get_session(s)
            self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
            self.assertEqual((await replay(c, fork))[0].WhichOneof("payload"), "session_forked",
                             "the fork outlives its deleted source")

    async def test_schedules_and_labels(self):
        async with AsyncClient(self.dev.address) as c:
            s = new_id()
            at = int(time.time() * 1000) + 1500
            created = await c.create_schedule(s, "once", "wake up", at_unix_ms=at)
            self.assertEqual(created.next_fire_unix_ms, at)
            await c.create_schedule(s, "daily", "report", cron="0 9 * * MON-FRI", time_zone="Europe/Paris")
            listed = await c.list_schedules(s)
            self.assertEqual(sorted(x.schedule_id for x in listed.schedules), ["daily", "once"])
            with self.assertRaises(TurnstileError) as e:
                await c.create_schedule(s, "bad", "x", cron="0 25 * * *")
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("field 2 (hour)", e.exception.details)
            deleted = await c.delete_schedule(s, "daily")
            self.assertEqual(deleted.schedule_id, "daily")
            for _ in range(100):
                ids = [m for m, _ in entered(await replay(c, s))]
                if ids:
                    break
                await asyncio.sleep(0.1)
            self.assertEqual(ids, [f"once@{at}"], "the one-shot fired once with its firing's id")
            self.assertEqual(len((await c.list_schedules(s)).schedules), 0)
            info = await c.set_labels(s, {"team": "blue"})
            self.assertEqual(dict(info.labels), {"team": "blue"})
            page = await c.list_sessions(label_selector="team=blue")
            self.assertIn(s, [x.session.id for x in page.sessions])
            info = await c.set_labels(s, remove=["team"])
            self.assertEqual(dict(info.labels), {})

    async def test_memory_is_put_got_listed_searched_and_deleted(self):
        async with AsyncClient(self.dev.address) as c:
            ns = "py" + new_id()[:8]
            put = await c.put_memory(ns, "pets/ada", {"fact": "Ada's cat is Turing"})
            self.assertEqual(put.key, "pets/ada")
            self.assertEqual(json.loads((await c.get_memory(ns, "pets/ada")).document)["fact"], "Ada's cat is Turing")
            listed = await c.list_memory(namespace=ns, prefix="pets/")
            self.assertEqual([d.key for d in listed.documents], ["pets/ada"])
            hits = (await c.search_memory("turing", namespaces=[ns])).hits
            self.assertEqual(hits[0].document.key, "pets/ada")
            self.assertEqual((await c.delete_memory(ns, "pets/ada")).key, "pets/ada")
            with self.assertRaises(TurnstileError) as e:
                await c.get_memory(ns, "pets/ada")
            self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)

    async def test_an_output_schema_judges_the_reply_of_its_turn(self):
        async with AsyncClient(self.dev.address) as c:
            s = new_id()
            schema = {"name": "city", "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
            # The scripted model answers a structured turn with the text it was sent (API.md).
            await c.followup(s, '{"city": "Paris"}', output_schema=schema)
            await c.when_idle(s)
            await c.followup(s, "Paris, I think", output_schema=schema)
            await c.when_idle(s)
            items = (await c.get_transcript(s, page_size=1000)).items
            ends = [i.turn_end.reason for i in items if i.WhichOneof("item") == "turn_end"]
            self.assertEqual([r.WhichOneof("reason") for r in ends], ["completed", "error"])
            self.assertEqual(ends[1].error.code, "invalid_output")
            self.assertEqual(len([i for i in items if i.turn == 2 and i.WhichOneof("item") == "assistant"]), 2, "retried once")
            with self.assertRaises(TurnstileError) as e:
                await c.followup(s, "x", output_schema={"schema": "not json"})
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

    async def test_agents_are_put_versioned_and_sessions_migrated(self):
        async with AsyncClient(self.dev.address) as c:
            name = "py-" + new_id()[:8]
            v1 = await c.put_agent(name, 'system = "You are v1."\nversion_policy = "pin"')
            self.assertEqual((v1.version, v1.version_policy), (1, "pin"))
            s = new_id()
            self.assertEqual((await c.configure_session(s, name)).agent_version, 1)
            v2 = await c.put_agent(name, {"system": "You are v2.", "version_policy": "pin"})
            self.assertEqual(v2.version, 2)
            self.assertEqual([v.version for v in (await c.list_agent_versions(name)).versions], [1, 2])
            self.assertIn(name, [a.name for a in (await c.list_agents()).agents])
            self.assertEqual((await c.get_agent(name, version=1)).definition, '{"system":"You are v1.","version_policy":"pin"}')
            with self.assertRaises(TurnstileError) as e:
                await c.put_agent(name, {"modle": "scripted"})
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertTrue(e.exception.details.startswith(f"agents.{name}.modle: unknown key"), e.exception.details)
            # The session index follows the log and may lag by a write: wait (bounded) until it lists s.
            for _ in range(200):
                on_v1 = [x.session.id for x in (await c.list_sessions(agent=name, agent_version=1)).sessions]
                if on_v1:
                    break
                await asyncio.sleep(0.05)
            self.assertEqual(on_v1, [s])
            moved = await c.migrate_sessions(name, 2, sessions=[s])
            self.assertEqual([x.id for x in moved.migrated], [s])
            self.assertEqual((await c.get_session(s)).agent_version, 2)
            await c.delete_agent(name)
            with self.assertRaises(TurnstileError) as e:
                await c.get_agent(name)
            self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)

    async def test_recorded_turns_are_evaluated_on_a_changed_version(self):
        async with AsyncClient(self.dev.address) as c:
            name = "py-eval-" + new_id()[:8]
            await c.put_agent(name, 'system = "You are v1."\nversion_policy = "pin"')
            s = new_id()
            await c.configure_session(s, name)
            await c.set_labels(s, {"suite": name})
            for text in ("[[system]] who?", "plain"):
                await c.followup(s, text)
                await c.when_idle(s, timeout_ms=10_000)
            await c.put_agent(name, 'system = "You are v2."\nversion_policy = "pin"')
            contains = pb.EvalScorer(contains=pb.ContainsScorer(texts=["v2"]))
            items = [i async for i in c.evaluate(name, label_selector=f"suite={name}", scorer=contains)]
            self.assertEqual([i.WhichOneof("item") for i in items], ["started", "row", "row", "summary"])
            rows = sorted((i.row for i in items[1:3]), key=lambda r: r.index)
            self.assertEqual((rows[0].recorded.text, rows[0].candidate.text), ("system: You are v1.", "system: You are v2."))
            self.assertEqual((rows[0].recorded.score.value, rows[0].candidate.score.value), (0.0, 1.0))
            self.assertEqual(rows[1].candidate.text, "echo: plain")
            self.assertEqual(items[3].summary.scratch_deleted, 2)
            self.assertEqual(list((await c.list_sessions(label_selector="turnstile/eval")).sessions), [])
            with self.assertRaises(TurnstileError) as e:
                [i async for i in c.evaluate("")]
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

    async def test_configure_session_with_the_overrides_the_agent_allows(self):
        async with AsyncClient(self.dev.address) as c:
            name = "py-" + new_id()[:8]
            await c.put_agent(
                name, {"system": "Base.", "tools": ["echo", "clock"], "overrides": {"system_prompt": True, "tools": True}}
            )
            s = new_id()
            with self.assertRaises(TurnstileError) as e:
                await c.configure_session(s, name, model="large")
            self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertTrue(e.exception.details.startswith("overrides.model:"), e.exception.details)
            with self.assertRaises(TurnstileError) as e:
                await c.configure_session(s, name, tools=["sleep"])
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            info = await c.configure_session(s, name, system_prompt="Extra.", tools=["echo"])
            self.assertEqual((info.overrides.system_prompt, list(info.overrides.tools.tools)), ("Extra.", ["echo"]))
            await c.followup(s, "[[system]] who?")
            await c.when_idle(s)
            self.assertEqual(replies(await replay(c, s))[-1], "system: Base.\n\nExtra.")

    async def test_steer_interrupt_and_cancel_a_running_turn(self):
        async with AsyncClient(self.dev.address) as c:
            s = new_id()
            stream = c.watch(s)
            await bounded(anext(stream), "caught_up")
            slow = await c.followup(s, "[[delay:60000]] slow")
            steered = await c.steer(s, "more", expected_turn=slow.turn)
            self.assertGreater(steered.seq, slow.seq)
            with self.assertRaises(TurnstileError) as e:
                await c.steer(s, "late", expected_turn=slow.turn + 5)
            self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            interrupted = await c.interrupt(s, "now")
            self.assertGreater(interrupted.seq, steered.seq)
            # The interrupted turn ends aborted{user}; the interrupt's message runs next.
            items = await bounded(watch_until_idle_after(stream, slow.turn + 1), "the interrupt's turn")
            events = [i.event for i in items if i.WhichOneof("item") == "event"]
            ends = {e.turn_end.turn: e.turn_end.reason.WhichOneof("reason")
                    for e in events if e.WhichOneof("payload") == "turn_end"}
            self.assertEqual(ends[slow.turn], "aborted")
            self.assertIn("now", replies(events)[-1])
            again = await c.followup(s, "[[delay:60000]] slow again")
            cancelled = await c.cancel(s)
            self.assertGreater(cancelled.seq, again.seq)
            items = await bounded(watch_until_idle_after(stream, again.turn), "the cancelled turn's end")
            await stream.aclose()
            end = [i.event.turn_end for i in items if i.WhichOneof("item") == "event"
                   and i.event.WhichOneof("payload") == "turn_end"][-1]
            self.assertEqual(end.reason.aborted.WhichOneof("cause"), "user")

    def test_the_blocking_client(self):
        with Client(self.dev.address) as c:
            s = new_id()
            reply = c.followup(s, "sync hello")
            seen = []
            for item in c.watch(s):
                if item.WhichOneof("item") == "event":
                    seen.append(item.event)
                    if item.event.WhichOneof("payload") == "turn_end" and item.event.turn_end.turn == reply.turn:
                        break
            self.assertEqual(replies(seen), ["echo: sync hello"])
            self.assertEqual(c.when_idle(s).status, pb.SESSION_STATUS_IDLE)
            self.assertIn(s, [i.session.id for i in c.sessions()])
            self.assertEqual([i.WhichOneof("item") for i in c.transcript(s)], ["user", "assistant", "turn_end"])


class ToolScenarios(DevCase):
    CONFIG = TOOLS_CONFIG

    async def test_decorated_functions_serve_the_model_s_tool_calls(self):
        tools = Tools()

        @tools.tool
        async def lookup(q: str) -> ToolOutput:
            """Looks a word up."""
            return ToolOutput(f"found {q}", context=["ctx from python"])

        @tools.tool(name="spell")
        def spell_it(word: str, loud: bool = False) -> dict:
            """Spells a word (a plain function: runs in a thread)."""
            if word == "xyzzy":
                raise ValueError("no such word")
            return {"letters": list(word.upper() if loud else word)}

        @tools.tool
        async def where(ctx: ToolContext) -> str:
            return f"{ctx.session.id} {ctx.name}"

        schema = tools.tools["spell"].input_schema
        self.assertEqual(schema["required"], ["word"])
        self.assertEqual(schema["properties"]["loud"], {"type": "boolean"})
        self.assertEqual(tools.tools["where"].input_schema["properties"], {}, "the context is not an argument")
        async with AsyncClient(self.dev.address) as c:
            async with c.serve_tools(tools) as server:
                self.assertEqual(sorted(server.registered), ["lookup", "spell", "where"])
                s = new_id()
                for text in ['[[tool:lookup {"q":"x"}]]', '[[tool:spell {"word":"ab","loud":true}]]',
                             '[[tool:spell {"word":"xyzzy"}]]', "[[tool:where {}]]"]:
                    await c.followup(s, text)
                    await c.when_idle(s)
                events = await replay(c, s)
        results = [(e.tool_result.output, e.tool_result.error if e.tool_result.HasField("error") else None)
                   for e in events if e.WhichOneof("payload") == "tool_result"]
        self.assertEqual(results, [
            ("found x", None),
            ('{"letters": ["A", "B"]}', None),
            ("", "ValueError: no such word"),
            (f"{s} where", None),
        ])
        self.assertIn("ctx from python", [t for _, t in entered(events)])


class ExampleTest(DevCase, unittest.TestCase):
    """The README's example runs as written."""

    def test_every_python_block_of_the_readme_is_valid_python(self):
        # A block that cannot even be compiled (an `async with` outside a coroutine) cannot run as written.
        readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
        blocks = [part.split("```", 1)[0] for part in readme.split("```python\n")[1:]]
        self.assertGreaterEqual(len(blocks), 2)
        for block in blocks:
            compile(block, "clients/python/README.md", "exec")

    def test_the_readme_s_run_and_events_example_prints_what_it_shows(self):
        readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
        section = readme.split("\n## Run a turn, follow its events\n", 1)[1]
        code = section.split("```python\n", 1)[1].split("```", 1)[0]
        shown = section.split("```python\n", 1)[1].split("```", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
        env = dict(os.environ, TURNSTILE_ADDR=self.dev.address)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), shown.strip())

    def test_the_quickstart_prints_the_streamed_reply(self):
        example = Path(__file__).resolve().parent.parent / "examples" / "quickstart.py"
        env = dict(os.environ, TURNSTILE_ADDR=self.dev.address)
        out = subprocess.run([sys.executable, str(example), "hello there"], env=env, capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertEqual(lines[0], "accepted at seq 1, turn 1")
        self.assertEqual(lines[1], "echo: hello there")
        self.assertEqual(lines[2], "turn 1 ended: completed")
        self.assertRegex(lines[3], r"^session quickstart-\w+: SESSION_STATUS_IDLE, last seq \d+$")


APP_CONFIG = """default_agent = "helper"

[agents.helper]
tools = ["echo"]

[agents.careful]
tools = ["echo"]
approval = ["echo"]

# The webhook test's receiver listens on loopback.
[webhooks]
allow_private = true
"""


class Receiver:
    """A webhook receiver on loopback: records each POST's headers and body, answers 200."""

    def __init__(self) -> None:
        received = self.received = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                received.append((self.headers, body))  # case-insensitive lookups
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


class AppScenarios(DevCase):
    """What an application reaches for (issue 41): run(), typed events, turn_of, webhooks, the filters of
    sessions(), watch(from_=...), export and import."""

    CONFIG = APP_CONFIG

    async def test_run_answers_the_reply_tool_calls_and_usage_of_its_turn(self):
        async with AsyncClient(self.dev.address) as c:
            s = new_id()
            plain = await bounded(c.run(s, "hello run", timeout=20), "run")
            self.assertEqual((plain.turn, plain.text, plain.reason, plain.tool_calls), (1, "echo: hello run", "completed", []))
            end = [i for i in (await c.get_transcript(s)).items if i.WhichOneof("item") == "turn_end"][0]
            self.assertEqual((plain.usage.input_tokens, plain.usage.output_tokens),
                             (end.turn_end.usage.input_tokens, end.turn_end.usage.output_tokens))
            tools = await bounded(c.run(s, "[[tool:echo from a tool]]", timeout=20), "run with a tool")
            self.assertEqual(tools.turn, 2)
            self.assertEqual([(t.name, t.arguments, t.output, t.awaited_approval) for t in tools.tool_calls],
                             [("echo", "from a tool", "from a tool", False)])
            self.assertEqual(len(tools.messages), 2)
            with self.assertRaises(TurnstileError) as e:
                await c.run(new_id(), "[[delay:5000]] slow", timeout=0.2)
            self.assertEqual(e.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        with Client(self.dev.address) as blocking:
            self.assertEqual(blocking.run(new_id(), "sync run", timeout=20).text, "echo: sync run")

    async def test_typed_events_an_approval_from_the_stream_and_the_turn_of_a_steer(self):
        async with AsyncClient(self.dev.address) as c:
            s = new_id()
            await c.configure_session(s, "careful")
            stream = c.events(s)
            seen = [await bounded(anext(stream), "caught_up")]
            self.assertEqual(seen[0].type, "caught_up")
            reply = await c.followup(s, "[[tool:echo typed]]")
            async for e in stream:
                seen.append(e)
                if e.type == "approval":
                    await c.decide(s, e.call_id, True)
                if e.type == "turn_done":
                    break
            await stream.aclose()
            types = [e.type for e in seen]
            for t in ("user", "turn_started", "message", "approval", "tool_decided", "tool_done", "turn_done"):
                self.assertIn(t, types)
            self.assertEqual([e.output for e in seen if e.type == "tool_done"], ["typed"])
            deltas = "".join(e.text for e in seen if e.type == "text_delta")
            self.assertEqual(deltas, "".join(e.text for e in seen if e.type == "message"))
            self.assertEqual((seen[-1].turn, seen[-1].reason), (reply.turn, "completed"))
            # A steer into a running turn gets no turn in its reply; turn_of tells where it ran.
            r = new_id()
            first = await c.followup(r, "[[delay:1500]] long")
            steer_id = "steer-" + new_id()
            steer = await c.steer(r, "in the same turn", id=steer_id)
            self.assertFalse(steer.HasField("turn"))
            self.assertEqual(await bounded(c.turn_of(r, steer_id, after_seq=steer.seq), "turn_of"), first.turn)

    async def test_webhooks_are_created_listed_signed_and_deleted(self):
        receiver = Receiver()
        self.addCleanup(receiver.close)
        async with AsyncClient(self.dev.address) as c:
            s = new_id()
            await c.set_labels(s, {"hooked": "yes"})
            hook = await c.create_webhook(receiver.url, label_selector="hooked=yes")
            self.assertRegex(hook.id, r"^wh_[0-9a-f]{16}$")
            self.assertTrue(hook.secret.startswith("whsec_"))
            listed = (await c.list_webhooks()).webhooks
            self.assertEqual([(w.id, w.secret) for w in listed], [(hook.id, "")])
            with self.assertRaises(TurnstileError) as e:
                await c.create_webhook("ftp://example.com/x")
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertTrue(e.exception.details.startswith("url: "), e.exception.details)
            await c.run(s, "hello hook", timeout=20)
            for _ in range(200):
                posts = [(h, b) for h, b in receiver.received if f"/{s}/" in h.get("Turnstile-Delivery", "")]
                if posts:
                    break
                await asyncio.sleep(0.05)
            self.assertTrue(posts, "a POST of the session's turn/end")
            headers, body = posts[0]
            expected = "sha256=" + hmac.new(hook.secret.encode(), body, hashlib.sha256).hexdigest()
            self.assertEqual(headers["Turnstile-Signature"], expected)
            self.assertEqual((await c.delete_webhook(hook.id)).id, hook.id)
            with self.assertRaises(TurnstileError) as e:
                await c.delete_webhook(hook.id)
            self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_the_chat_example_renders_history_streams_replies_and_answers_approvals(self):
        """examples/chat.py: a first chat configures a new session with `careful`, streams its replies and
        approves the call of its second line from the approvals inbox; a second shows that history (from
        the transcript) and denies a call; a third, with nothing to say, prints exactly what the second did."""
        example = Path(__file__).resolve().parent.parent / "examples" / "chat.py"
        env = dict(os.environ, TURNSTILE_ADDR=self.dev.address)

        def chat(*args: str, lines: str = "") -> str:
            out = subprocess.run([sys.executable, str(example), "chat-1", *args], input=lines, env=env,
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            return out.stdout

        first = chat("--agent", "careful", lines="hello\n[[tool:echo from the inbox]]\n")
        second = chat("--deny", lines="[[tool:echo no way]]\n")
        history = chat()
        first_lines = first.splitlines()
        self.assertEqual(first_lines[0], "(a new session)")
        for line in ("you: hello", "assistant: echo: hello", "[turn 1 completed]",
                     "approval: echo(from the inbox) approved"):
            self.assertIn(line, first_lines)
        for line in ("approval: echo(no way) denied", "  -> denied: denied in chat", "[turn 3 completed]"):
            self.assertIn(line, second.splitlines())
        self.assertTrue(second.startswith("\n".join(first_lines[1:])), second)
        self.assertEqual(history, second, "the history prints what the chats printed")

    async def test_sessions_filters_watch_from_a_position_and_export_import(self):
        async with AsyncClient(self.dev.address) as c:
            blue, red = new_id(), new_id()
            await c.set_labels(blue, {"team": "blue"})
            await c.set_labels(red, {"team": "red"})
            found = [i.session.id async for i in c.sessions(label_selector="team=blue")]
            self.assertIn(blue, found)
            self.assertNotIn(red, found)
            with self.assertRaises(TypeError):
                [i async for i in c.sessions(page_token="x")]
            await c.run(blue, "first", timeout=20)
            stream = c.watch(blue, live=False)
            async for item in stream:
                if item.WhichOneof("item") == "caught_up":
                    break
            position = stream.position
            await stream.aclose()
            self.assertEqual(position.after_seq, (await c.get_session(blue)).last_seq)
            await c.run(blue, "second", timeout=20)
            later = c.watch(blue, from_=position, live=False)
            first = await bounded(anext(later), "the first event after the position")
            await later.aclose()
            self.assertEqual(first.event.seq, position.after_seq + 1, "from_ goes on after the saved seq")
            items = [i async for i in c.export_sessions([blue])]
            self.assertEqual(items[0].WhichOneof("item"), "header")
            other = DevServer()
            self.addCleanup(other.close)
            async with AsyncClient(other.address) as d:
                imported = await d.import_sessions(items)
                self.assertEqual(imported.sessions, 1)
                self.assertEqual(replies(await replay(d, blue)), replies(await replay(c, blue)))


SUBJECTS_MD = Path(__file__).resolve().parents[3] / "docs" / "SUBJECTS.md"


def doc_block(heading: str, fence: str) -> str:
    """The first ``` block opened with `fence` under `heading` of docs/SUBJECTS.md."""
    section = SUBJECTS_MD.read_text().split(heading, 1)[1]
    return section.split(fence + "\n", 1)[1].split("```", 1)[0]


class ObserverTest(unittest.TestCase):
    """docs/SUBJECTS.md: the observer example, run as a user with exactly the page's permissions block on a
    nats-server under `turnstile dev --nats`, prints the page's durable lines, follows a deletion, and a user
    of the same block cannot read another tenant's log."""

    def setUp(self) -> None:
        permissions = doc_block("## Permissions for observers", "```conf")
        config = (
            "no_auth_user: turnstile\n"
            "accounts { TURNSTILE { jetstream: enabled\n users = [\n { user: turnstile }\n"
            "  { user: observer-acme, password: observer-secret,\n" + permissions + "\n }\n ] } }\n"
        )
        self.nats = NatsServer(config)
        self.addCleanup(self.nats.close)
        self.dev = DevServer(nats_url=self.nats.url)
        self.addCleanup(self.dev.close)
        self.observer_url = self.nats.url.replace("nats://", "nats://observer-acme:observer-secret@")
        self.example = Path(__file__).resolve().parent.parent / "examples" / "observer.py"

    def observe(self, tenant: str, session: str, *args: str) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, str(self.example), self.observer_url, tenant, session, "--inbox-prefix",
             "_INBOX_acme", "--timeout", "30", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: process.poll() is None and process.kill())
        return process

    def test_the_observer_follows_a_tenants_session_and_its_deletion(self):
        session = "obs-" + uuid.uuid4().hex[:8]
        observer = self.observe("acme", session, "--until-idle", "2")
        first = observer.stdout.readline()
        self.assertEqual(first, f"observing turnstile.ev.0.acme.{session} in TURNSTILE_EVENTS_0\n",
                         observer.stderr.read() if observer.poll() is not None else "")
        with Client(self.dev.address, tenant="acme") as c:
            c.followup(session, "hi there")
            c.when_idle(session)
            c.delete_session(session)
            c.followup(session, "hi there")
            c.when_idle(session)
        out, err = observer.communicate(timeout=60)
        self.assertEqual(observer.returncode, 0, err)
        lines = out.splitlines()
        durable = [line for line in lines if line.startswith(("#", "=="))]
        documented = [line for line in doc_block("## An observer", "```").splitlines() if line.startswith("#")]
        self.assertEqual(len(documented), 10, "the page shows one followup's ten events")
        self.assertEqual(durable, documented + [
            f"== session acme/{session} was deleted; a new log starts"] + documented)
        self.assertIn("~ agent/inbox/inserted after #1", lines)

    def test_another_tenants_log_is_refused(self):
        with Client(self.dev.address, tenant="globex") as c:
            c.followup("s1", "secret")
            c.when_idle("s1")
        observer = self.observe("globex", "s1", "--until-idle")
        observer.stdout.readline()  # nothing: the consumer cannot be created
        out, err = observer.communicate(timeout=60)
        self.assertNotEqual(observer.returncode, 0, out)
        self.assertNotIn("#1", out)
        log = self.nats.process.log.read_text(errors="replace")
        self.assertIn('Publish Violation - Subject "$JS.API.CONSUMER.CREATE.TURNSTILE_EVENTS_0.', log)


class EmbeddedTest(Scenarios, unittest.IsolatedAsyncioTestCase):
    BACKEND = "embedded"


class NatsTest(Scenarios, unittest.IsolatedAsyncioTestCase):
    BACKEND = "nats"


class EmbeddedAppTest(AppScenarios, unittest.IsolatedAsyncioTestCase):
    BACKEND = "embedded"


class EmbeddedToolsTest(ToolScenarios, unittest.IsolatedAsyncioTestCase):
    BACKEND = "embedded"


class NatsToolsTest(ToolScenarios, unittest.IsolatedAsyncioTestCase):
    BACKEND = "nats"


if __name__ == "__main__":
    unittest.main()
