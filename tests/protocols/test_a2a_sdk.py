"""Turnstile's A2A v1.0 agents (docs/PROTOCOLS.md, `/a2a/{agent}`) through the official, unmodified `a2a-sdk`
Python client, against a real `turnstile dev` that tests/tests/a2a_sdk.rs starts with two tenants' tokens
(A2A_BASE, TOKEN_A, TOKEN_B). `scripted` answers `echo: <text>` and obeys its directives (`[[delay:MS]]` streams
slowly, `[[tool:sleep MS]]` runs a slow tool), `guarded` asks before it runs `echo`, `only-b` serves tenant B."""

import asyncio
import base64
import json
import os
import unittest
import uuid

import httpx
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

BASE = os.environ["A2A_BASE"]
TOKEN_A = os.environ["TOKEN_A"]
TOKEN_B = os.environ["TOKEN_B"]


def http(token=TOKEN_A):
    return httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)


async def client(agent="scripted", token=TOKEN_A, streaming=False):
    h = http(token)
    card = await A2ACardResolver(h, f"{BASE}/a2a/{agent}").get_agent_card()
    return await create_client(card, ClientConfig(httpx_client=h, streaming=streaming))


def message(text, context_id="", task_id="", message_id=None):
    return SendMessageRequest(message=Message(
        message_id=message_id or str(uuid.uuid4()), role=Role.ROLE_USER, context_id=context_id, task_id=task_id,
        parts=[Part(text=text)]))


async def send(c, request):
    return [event async for event in c.send_message(request)]


def run(test):
    return lambda self: asyncio.run(test(self))


class A2a(unittest.TestCase):
    @run
    async def test_each_agent_has_a_card_with_its_skill(self):
        async with http() as h:
            card = await A2ACardResolver(h, f"{BASE}/a2a/guarded").get_agent_card()
            self.assertEqual(card.name, "guarded")
            self.assertEqual(card.description, "Echoes, but asks before it runs echo.")
            self.assertEqual(card.supported_interfaces[0].url, f"{BASE}/a2a/guarded")
            self.assertEqual(card.supported_interfaces[0].protocol_binding, "JSONRPC")
            self.assertTrue(card.capabilities.streaming)
            self.assertEqual([s.id for s in card.skills], ["guarded"])
            # An agent confined to tenant B is not there for tenant A.
            missing = await h.get(f"{BASE}/a2a/only-b/.well-known/agent-card.json")
            self.assertEqual(missing.status_code, 404)
        async with http(TOKEN_B) as h:
            card = await A2ACardResolver(h, f"{BASE}/a2a/only-b").get_agent_card()
            self.assertEqual(card.name, "only-b")

    @run
    async def test_send_answers_the_completed_task_and_get_reads_it(self):
        c = await client()
        [event] = await send(c, message("hello a2a"))
        task = event.task
        self.assertEqual(task.status.state, TaskState.TASK_STATE_COMPLETED)
        self.assertEqual(task.artifacts[0].parts[0].text, "echo: hello a2a")
        self.assertEqual(task.history[0].parts[0].text, "hello a2a")
        again = await c.get_task(GetTaskRequest(id=task.id))
        self.assertEqual((again.id, again.context_id), (task.id, task.context_id))
        self.assertEqual(again.artifacts[0].parts[0].text, "echo: hello a2a")
        # The context goes on: a second message there is turn 2 of the same session.
        [event] = await send(c, message("second", context_id=task.context_id))
        self.assertEqual(event.task.context_id, task.context_id)
        self.assertEqual(event.task.metadata["turnstile"]["turn"], 2)

    @run
    async def test_a_resent_message_is_the_same_task(self):
        c = await client()
        request = message("only once", message_id=f"resend-{uuid.uuid4()}", context_id=f"a2a-resend-{uuid.uuid4().hex}")
        [first] = await send(c, request)
        [second] = await send(c, request)
        self.assertEqual(first.task.id, second.task.id)

    @run
    async def test_stream_gives_the_task_then_its_reply_in_chunks_then_its_end(self):
        c = await client(streaming=True)
        events = await send(c, message("[[delay:400]] streamed slowly"))
        kinds = [e.WhichOneof("payload") for e in events]
        self.assertEqual(kinds[0], "task")
        self.assertIn("artifact_update", kinds)
        chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
        self.assertGreater(len(chunks), 1)
        self.assertFalse(chunks[0].append)
        self.assertTrue(all(chunk.append for chunk in chunks[1:]))
        self.assertEqual("".join(chunk.artifact.parts[0].text for chunk in chunks), "echo: streamed slowly")
        self.assertEqual(events[-1].status_update.status.state, TaskState.TASK_STATE_COMPLETED)

    @run
    async def test_an_approval_is_input_required_and_the_next_message_answers_it(self):
        c = await client("guarded")
        [event] = await send(c, message("[[tool:echo approved text]] go"))
        task = event.task
        self.assertEqual(task.status.state, TaskState.TASK_STATE_INPUT_REQUIRED)
        self.assertIn("`echo`", task.status.message.parts[0].text)
        [event] = await send(c, message("yes", task_id=task.id, context_id=task.context_id))
        self.assertEqual(event.task.id, task.id)
        self.assertEqual(event.task.status.state, TaskState.TASK_STATE_COMPLETED)
        self.assertIn("tool results: echo: approved text", "".join(a.parts[0].text for a in event.task.artifacts))
        # A refusal: anything but yes, given to the agent as the reason.
        [event] = await send(c, message("[[tool:echo refused text]] go"))
        [event] = await send(c, message("no, not that", task_id=event.task.id))
        self.assertEqual(event.task.status.state, TaskState.TASK_STATE_COMPLETED)
        self.assertNotIn("tool results: echo: refused text", "".join(a.parts[0].text for a in event.task.artifacts))
        # A task that waits for nothing takes no answer.
        with self.assertRaises(UnsupportedOperationError):
            await send(c, message("yes", task_id=event.task.id))

    @run
    async def test_cancel_ends_a_running_task_canceled(self):
        c = await client()
        request = message("[[tool:sleep 600000]] wait")
        request.configuration.return_immediately = True
        [event] = await send(c, request)
        cancelled = await c.cancel_task(CancelTaskRequest(id=event.task.id))
        self.assertEqual(cancelled.status.state, TaskState.TASK_STATE_CANCELED)
        with self.assertRaises(TaskNotCancelableError):
            await c.cancel_task(CancelTaskRequest(id=event.task.id))

    @run
    async def test_subscribe_gives_the_task_then_its_changes_and_the_cursor_replays_the_rest(self):
        c = await client(streaming=True)
        request = message("[[delay:1500]] watched from afar")
        request.configuration.return_immediately = True
        plain = await client()
        [event] = await send(plain, request)
        task_id = event.task.id
        events = [e async for e in c.subscribe(SubscribeToTaskRequest(id=task_id))]
        self.assertEqual(events[0].WhichOneof("payload"), "task")
        self.assertEqual(events[-1].status_update.status.state, TaskState.TASK_STATE_COMPLETED)
        # The replay cursor: the task's whole stream again from Last-Event-ID 0 (its start), then from any of
        # its events' ids, is exactly the rest.
        body = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": task_id}}
        whole = await sse(body, "0")
        self.assertGreater(len(whole), 2, whole)
        self.assertIn("COMPLETED", whole[-1][1])
        for i, (event_id, _) in enumerate(whole):
            rest = await sse(body, event_id)
            self.assertEqual(rest, whole[i + 1:], f"after {event_id}")
        text = "".join(json.loads(data)["result"]["artifactUpdate"]["artifact"]["parts"][0]["text"]
                       for _, data in whole if "artifactUpdate" in data)
        self.assertEqual(text, "echo: watched from afar")

    @run
    async def test_list_pages_the_tenants_tasks_of_this_agent(self):
        c = await client()
        context = f"a2a-list-{uuid.uuid4().hex}"
        for i in range(3):
            await send(c, message(f"number {i}", context_id=context))
        page = await c.list_tasks(ListTasksRequest(context_id=context, page_size=2))
        self.assertEqual((len(page.tasks), page.total_size), (2, 3))
        rest = await c.list_tasks(ListTasksRequest(context_id=context, page_size=2, page_token=page.next_page_token))
        self.assertEqual(len(rest.tasks), 1)
        self.assertEqual(rest.next_page_token, "")
        texts = [t.history[0].parts[0].text for t in list(page.tasks) + list(rest.tasks)]
        self.assertEqual(sorted(texts), ["number 0", "number 1", "number 2"])
        everything = await c.list_tasks(ListTasksRequest(page_size=100))
        self.assertIn(context, {t.context_id for t in everything.tasks})

    @run
    async def test_tenants_see_only_their_own_tasks(self):
        a = await client()
        context = f"a2a-tenancy-{uuid.uuid4().hex}"
        [event] = await send(a, message("secret of A", context_id=context))
        b = await client(token=TOKEN_B)
        with self.assertRaises(TaskNotFoundError):
            await b.get_task(GetTaskRequest(id=event.task.id))
        with self.assertRaises(TaskNotFoundError):
            await b.cancel_task(CancelTaskRequest(id=event.task.id))
        listed = await b.list_tasks(ListTasksRequest(page_size=100))
        self.assertNotIn(context, {t.context_id for t in listed.tasks})
        self.assertEqual((await b.list_tasks(ListTasksRequest(context_id=context))).total_size, 0)

    @run
    async def test_bad_input_is_refused_naming_the_field(self):
        c = await client()
        with self.assertRaises(InvalidParamsError) as refused:
            await send(c, message("x", context_id="not a context"))
        self.assertIn("contextId", str(refused.exception))
        with self.assertRaises(TaskNotFoundError):
            await c.get_task(GetTaskRequest(id="task-nonsense"))
        # A well-formed id past the end of a real context's log: not found (after the wait for a lagging log).
        [event] = await send(c, message("exists"))
        forged = "task-" + base64.urlsafe_b64encode(f"{event.task.context_id}.999999".encode()).decode().rstrip("=")
        with self.assertRaises(TaskNotFoundError):
            await c.get_task(GetTaskRequest(id=forged))
        async with httpx.AsyncClient(headers={"Authorization": "Bearer wrong"}) as h:
            answer = await h.get(f"{BASE}/a2a/scripted/.well-known/agent-card.json")
        self.assertEqual(answer.status_code, 401)

    @run
    async def test_a_push_url_inside_the_network_is_refused_by_the_egress_rule(self):
        # This server does not allow internal webhook targets ([webhooks] allow_private): a push
        # configuration is held to the rule of CreateWebhook, in a send and on its own.
        c = await client()
        request = message("push me home")
        request.configuration.task_push_notification_config.url = "http://127.0.0.1:9/hook"
        with self.assertRaises(InvalidParamsError) as refused:
            await send(c, request)
        self.assertIn("configuration.taskPushNotificationConfig.url", str(refused.exception))
        [event] = await send(await client("guarded"), message("[[tool:echo x]] wait for me"))
        for url in ["http://169.254.169.254/latest", "http://[::1]:9/x", "http://10.0.0.1/x"]:
            with self.assertRaises(InvalidParamsError, msg=url):
                await c.create_task_push_notification_config(TaskPushNotificationConfig(task_id=event.task.id, url=url))
        # Nothing was stored: the task has no configuration.
        listed = await c.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=event.task.id))
        self.assertEqual(list(listed.configs), [])


async def sse(body, last_event_id):
    """The (id, data) frames of one SubscribeToTask stream, read raw, from `last_event_id` on."""
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    frames = []
    async with http() as h, h.stream("POST", f"{BASE}/a2a/scripted", json=body, headers=headers) as answer:
        event_id, data = None, None
        async for line in answer.aiter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and data is not None:
                frames.append((event_id, data))
                event_id, data = None, None
    return frames


if __name__ == "__main__":
    unittest.main()
