"""A2A tasks are views of the log, answered by any gateway (SPEC §19, decision 0128): on a cluster of one
worker and two gateways (tests/tests/a2a_sdk.rs; A2A_BASE_0 and _1, auth off), a task sent with the `a2a-sdk`
client through gateway 1 is subscribed to through gateway 0; once part of its reply arrived, this script asks
the test to kill gateway 0 (it writes READY_FILE and waits for KILLED_FILE), then subscribes through gateway 1
with the last event's id as `Last-Event-ID` (the replay cursor): the two parts make the reply exactly, with no
event missed or repeated."""

import asyncio
import json
import os
import time
import unittest
import uuid

import httpx
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.types.a2a_pb2 import GetTaskRequest, Message, Part, Role, SendMessageRequest, TaskState

BASE = [os.environ["A2A_BASE_0"], os.environ["A2A_BASE_1"]]
READY, KILLED = os.environ["READY_FILE"], os.environ["KILLED_FILE"]


async def frames(g, body, last_event_id=None, until=None):
    """(id, result) of each SSE frame of one stream through gateway `g`; stops early when `until(frames)`."""
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    out = []
    async with httpx.AsyncClient(timeout=60) as h, h.stream("POST", f"{BASE[g]}/a2a/scripted", json=body,
                                                           headers=headers) as answer:
        event_id = None
        async for line in answer.aiter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                out.append((event_id, json.loads(line[6:])["result"]))
                if until and until(out):
                    return out
    return out


def text_of(events):
    return "".join(r["artifactUpdate"]["artifact"]["parts"][0]["text"] for _, r in events if "artifactUpdate" in r)


async def wait_for_file(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        await asyncio.sleep(0.02)


class AnyGateway(unittest.TestCase):
    def test_a_subscription_resumes_through_the_other_gateway_after_a_kill(self):
        asyncio.run(self.resume())

    async def resume(self):
        async with httpx.AsyncClient(timeout=60) as h:
            card = await A2ACardResolver(h, f"{BASE[1]}/a2a/scripted").get_agent_card()
            client = await create_client(card, ClientConfig(httpx_client=h, streaming=False))
            request = SendMessageRequest(message=Message(
                message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                parts=[Part(text="[[delay:3000]] one two three four five six seven eight nine ten")]))
            request.configuration.return_immediately = True
            task = [e async for e in client.send_message(request)][0].task
            body = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": task.id}}
            first = await frames(0, body, until=lambda got: sum("artifactUpdate" in r for _, r in got) >= 2)
            self.assertEqual(list(first[0][1]), ["task"], "a snapshot first")
            with open(READY, "w") as ready:
                ready.write(first[-1][0])
            await wait_for_file(KILLED)
            rest = await frames(1, body, last_event_id=first[-1][0])
            ids = [int(i) for i, _ in first + rest]
            self.assertEqual(ids, sorted(set(ids)), "no event twice, in order")
            snapshot_text = "".join(a["parts"][0]["text"] for a in first[0][1]["task"].get("artifacts", []))
            self.assertEqual(snapshot_text + text_of(first + rest),
                             "echo: one two three four five six seven eight nine ten")
            self.assertEqual(rest[-1][1]["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED")
            done = await client.get_task(GetTaskRequest(id=task.id))
            self.assertEqual(done.status.state, TaskState.TASK_STATE_COMPLETED)


if __name__ == "__main__":
    unittest.main()
