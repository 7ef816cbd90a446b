"""A2A push notifications (docs/PROTOCOLS.md, decision 0155) through the official, unmodified `a2a-sdk` Python
client's push configuration flow, against a real `turnstile dev` (tests/tests/a2a_sdk.rs; its configuration allows
loopback webhook targets). A receiver on loopback (port 0) takes the POSTs and checks each one's token and
signature: `X-A2A-Notification-Token` is the configuration's token and `Turnstile-Signature` the HMAC-SHA256 of
the body under it, as for every Turnstile webhook."""

import asyncio
import hashlib
import hmac
import json
import os
import threading
import unittest
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError, UnsupportedOperationError
from google.protobuf import json_format

BASE = os.environ["A2A_BASE"]
TOKEN_A = os.environ["TOKEN_A"]
TOKEN_B = os.environ["TOKEN_B"]
WAIT = 60


class Receiver:
    """An HTTP server on 127.0.0.1 (a port the kernel picks) that keeps every POST: (path, headers, body)."""

    def __init__(self):
        posts, changed = [], threading.Condition()
        self.posts, self.changed = posts, changed

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with changed:
                    posts.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    changed.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    async def until(self, what, done):
        """Waits (without blocking the event loop) until `done(posts)` holds, or fails naming `what`."""
        def wait():
            with self.changed:
                return self.changed.wait_for(lambda: done(list(self.posts)), timeout=WAIT)
        if not await asyncio.to_thread(wait):
            raise AssertionError(f"the receiver never got {what}; it got {self.posts}")
        return list(self.posts)


def checked(test, post, token):
    """The POST's body as A2A's StreamResponse, after checking its token and signature."""
    _, headers, body = post
    test.assertEqual(headers["x-a2a-notification-token"], token)
    expected = "sha256=" + hmac.new(token.encode(), body, hashlib.sha256).hexdigest()
    test.assertTrue(hmac.compare_digest(headers["turnstile-signature"], expected), "the signature checks")
    test.assertEqual(headers["content-type"], "application/json")
    return json_format.ParseDict(json.loads(body), StreamResponse())


def state_of(response):
    return response.status_update.status.state if response.HasField("status_update") else None


def on(path, task_id, state=None):
    """A condition on the posts: one to `path` for `task_id` (in `state`, if given)."""
    def done(posts):
        for p, _, body in posts:
            r = json_format.ParseDict(json.loads(body), StreamResponse())
            if p == path and r.status_update.task_id == task_id and (state is None or state_of(r) == state):
                return True
        return False
    return done


def message(text, task_id="", context_id=""):
    return SendMessageRequest(message=Message(
        message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)], task_id=task_id,
        context_id=context_id))


async def client(agent="scripted", token=TOKEN_A, push=None):
    h = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    card = await A2ACardResolver(h, f"{BASE}/a2a/{agent}").get_agent_card()
    return await create_client(card, ClientConfig(httpx_client=h, streaming=False, push_notification_config=push))


def run(test):
    return lambda self: asyncio.run(test(self))


class Push(unittest.TestCase):
    def setUp(self):
        self.receiver = Receiver()

    def tearDown(self):
        self.receiver.close()

    @run
    async def test_the_client_config_push_gets_each_update_signed_then_the_config_goes(self):
        token = f"tok-{uuid.uuid4().hex}"
        push = TaskPushNotificationConfig(url=f"{self.receiver.base}/hook", token=token)
        c = await client(push=push)
        self.assertTrue((await A2ACardResolver(httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN_A}"}),
                                               f"{BASE}/a2a/scripted").get_agent_card()).capabilities.push_notifications)
        [event] = [e async for e in c.send_message(message("pushed to me"))]
        task = event.task
        self.assertEqual(task.status.state, TaskState.TASK_STATE_COMPLETED)
        posts = await self.receiver.until("the task's end", on("/hook", task.id, TaskState.TASK_STATE_COMPLETED))
        responses = [checked(self, p, token) for p in posts]
        states = [state_of(r) for r in responses if r.HasField("status_update")]
        self.assertEqual(states, [TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_COMPLETED], "in order, once")
        text = "".join(r.artifact_update.artifact.parts[0].text for r in responses if r.HasField("artifact_update"))
        self.assertEqual(text, "echo: pushed to me")
        self.assertTrue(all(r.status_update.task_id in ("", task.id) for r in responses))
        self.assertEqual(len({p[1]["turnstile-delivery"] for p in posts}), len(posts), "a delivery id each")
        # The configuration served its task, which has ended: it is gone.
        deadline = asyncio.get_running_loop().time() + WAIT
        while (await c.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task.id))).configs:
            self.assertLess(asyncio.get_running_loop().time(), deadline, "the ended task's configuration stays")
            await asyncio.sleep(0.05)

    @run
    async def test_configs_of_a_waiting_task_are_created_read_listed_deleted_and_only_the_kept_one_is_called(self):
        c = await client("guarded")
        [event] = [e async for e in c.send_message(message("[[tool:echo pushed text]] go"))]
        task = event.task
        self.assertEqual(task.status.state, TaskState.TASK_STATE_INPUT_REQUIRED)
        kept = await c.create_task_push_notification_config(TaskPushNotificationConfig(
            task_id=task.id, id="kept", url=f"{self.receiver.base}/kept", token="kept-token",
            authentication=AuthenticationInfo(scheme="Bearer", credentials="receiver-secret")))
        self.assertEqual((kept.id, kept.task_id, kept.token), ("kept", task.id, "kept-token"))
        self.assertEqual(kept.authentication.scheme, "Bearer")
        self.assertEqual(kept.authentication.credentials, "", "credentials are not shown again")
        gone = await c.create_task_push_notification_config(TaskPushNotificationConfig(
            task_id=task.id, url=f"{self.receiver.base}/gone", token="gone-token"))
        self.assertTrue(gone.id, "an id is minted when none is given")
        got = await c.get_task_push_notification_config(GetTaskPushNotificationConfigRequest(task_id=task.id, id="kept"))
        self.assertEqual(got.url, f"{self.receiver.base}/kept")
        listed = await c.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=task.id))
        self.assertEqual(sorted(x.id for x in listed.configs), sorted(["kept", gone.id]))
        await c.delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest(task_id=task.id, id=gone.id))
        with self.assertRaises(TaskNotFoundError):
            await c.get_task_push_notification_config(GetTaskPushNotificationConfigRequest(task_id=task.id, id=gone.id))
        with self.assertRaises(TaskNotFoundError):
            await c.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task.id, id=gone.id))
        # The approval: the kept configuration is told the task works again, then that it completed.
        [event] = [e async for e in c.send_message(message("yes", task_id=task.id))]
        self.assertEqual(event.task.status.state, TaskState.TASK_STATE_COMPLETED)
        posts = await self.receiver.until("the end at /kept", on("/kept", task.id, TaskState.TASK_STATE_COMPLETED))
        for post in posts:
            self.assertEqual(post[0], "/kept", "the deleted configuration was never called")
            self.assertEqual(post[1]["authorization"], "Bearer receiver-secret")
            checked(self, post, "kept-token")
        states = [state_of(checked(self, p, "kept-token")) for p in posts]
        self.assertEqual([s for s in states if s is not None],
                         [TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_COMPLETED])

    @run
    async def test_another_tenant_cannot_see_or_configure_a_task_and_bad_configs_are_refused(self):
        c = await client("guarded")
        [event] = [e async for e in c.send_message(message("[[tool:echo private]] go"))]
        task_id = event.task.id
        await c.create_task_push_notification_config(TaskPushNotificationConfig(
            task_id=task_id, id="mine", url=f"{self.receiver.base}/mine"))
        b = await client("scripted", token=TOKEN_B)
        with self.assertRaises(TaskNotFoundError):
            await b.create_task_push_notification_config(TaskPushNotificationConfig(
                task_id=task_id, url=f"{self.receiver.base}/b"))
        with self.assertRaises(TaskNotFoundError):
            await b.get_task_push_notification_config(GetTaskPushNotificationConfigRequest(task_id=task_id, id="mine"))
        with self.assertRaises(TaskNotFoundError):
            await b.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=task_id))
        with self.assertRaises(TaskNotFoundError):
            await b.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="mine"))
        for bad in ["", "ftp://example.com/x", "not a url"]:
            with self.assertRaises(InvalidParamsError, msg=bad):
                await c.create_task_push_notification_config(TaskPushNotificationConfig(task_id=task_id, url=bad))
        with self.assertRaises(InvalidParamsError):
            await c.create_task_push_notification_config(TaskPushNotificationConfig(
                task_id=task_id, url=f"{self.receiver.base}/x", authentication=AuthenticationInfo(scheme="Bearer")))
        # A task that ended takes no configuration.
        [done] = [e async for e in c.send_message(message("no", task_id=task_id))]
        self.assertEqual(done.task.status.state, TaskState.TASK_STATE_COMPLETED)
        with self.assertRaises(UnsupportedOperationError):
            await c.create_task_push_notification_config(TaskPushNotificationConfig(
                task_id=task_id, url=f"{self.receiver.base}/late"))


if __name__ == "__main__":
    unittest.main()
