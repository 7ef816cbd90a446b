"""The MCP tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663; decision 0157) against a real `turnstile
dev` (tests/tests/mcp_server.rs: MCP_URL, TOKEN_A, TOKEN_B). The `mcp` Python SDK 2.3 has no client for tasks, so
this speaks raw JSON-RPC at 2026-07-28 with `httpx2` (the SDK's HTTP client), each request carrying its
protocol metadata as the SDK's own requests do: a call of a client that declares the extension answers with a
task at once, which is polled with `tasks/get` to its result, answered with `tasks/update` when it waits for an
approval, and ended with `tasks/cancel`."""

import os
import time
import unittest

import httpx2

URL = os.environ["MCP_URL"]
TOKEN_A = os.environ["TOKEN_A"]
TOKEN_B = os.environ["TOKEN_B"]
VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
WAIT = 60


def rpc(method, params, token=TOKEN_A, tasks=True, name=None):
    """One JSON-RPC request; its `result`, or its `error` as an exception carrying the code."""
    capabilities = {"extensions": {TASKS: {}}} if tasks else {}
    params = {**params, "_meta": {"io.modelcontextprotocol/protocolVersion": VERSION,
                                  "io.modelcontextprotocol/clientInfo": {"name": "raw-tasks-test", "version": "1"},
                                  "io.modelcontextprotocol/clientCapabilities": capabilities}}
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": VERSION, "Mcp-Method": method}
    if name is None and method.startswith("tasks/"):
        name = params.get("taskId")  # SEP-2243 mirrors it, as tools/call's tool name
    if name:
        headers["Mcp-Name"] = name
    answer = httpx2.post(URL, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                         headers=headers, timeout=60)
    body = answer.json()
    if "error" in body:
        raise RpcError(body["error"]["code"], body["error"]["message"])
    return body["result"]


class RpcError(Exception):
    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code


def call(message, agent="scripted", **options):
    return rpc("tools/call", {"name": agent, "arguments": {"message": message}}, name=agent, **options)


def poll(task_id, until, token=TOKEN_A):
    """`tasks/get` every pollIntervalMs until `until(task)` holds."""
    deadline = time.monotonic() + WAIT
    while True:
        task = rpc("tasks/get", {"taskId": task_id}, token=token)
        if until(task):
            return task
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task_id} never got there: {task}")
        time.sleep(task.get("pollIntervalMs", 500) / 1000)


class Tasks(unittest.TestCase):
    def test_a_call_becomes_a_task_polled_to_its_result(self):
        created = call("[[delay:600]] done as a task")
        self.assertEqual((created["resultType"], created["status"]), ("task", "working"))
        self.assertGreater(created["pollIntervalMs"], 0)
        task = poll(created["taskId"], lambda t: t["status"] != "working")
        self.assertEqual(task["status"], "completed")
        self.assertEqual(task["taskId"], created["taskId"])
        self.assertEqual(task["result"]["content"][0]["text"], "echo: done as a task")
        self.assertEqual(task["result"]["structuredContent"]["status"], "completed")
        # A client without the extension gets the result itself, as before.
        plain = call("no task for me", tasks=False)
        self.assertEqual(plain["content"][0]["text"], "echo: no task for me")

    def test_a_task_waiting_for_approval_is_answered_by_update(self):
        created = call("[[tool:echo approved in a task]] go", agent="guarded")
        task = poll(created["taskId"], lambda t: t["status"] != "working")
        self.assertEqual(task["status"], "input_required")
        self.assertEqual(task["inputRequests"]["approval"]["method"], "elicitation/create")
        self.assertIn("`echo`", task["statusMessage"])
        rpc("tasks/update", {"taskId": created["taskId"],
                             "inputResponses": {"approval": {"action": "accept", "content": {"approve": True}}}})
        task = poll(created["taskId"], lambda t: t["status"] not in ("working", "input_required"))
        self.assertEqual(task["status"], "completed")
        self.assertIn("tool results: echo: approved in a task", task["result"]["content"][0]["text"])
        with self.assertRaises(RpcError) as refused:
            rpc("tasks/update", {"taskId": created["taskId"], "inputResponses": {"approval": {"action": "accept"}}})
        self.assertEqual(refused.exception.code, -32602, "a task that waits for nothing takes no input")

    def test_cancel_ends_a_running_task_cancelled(self):
        created = call("[[tool:sleep 600000]] wait")
        poll(created["taskId"], lambda t: True)
        self.assertEqual(rpc("tasks/cancel", {"taskId": created["taskId"]})["resultType"], "complete")
        task = poll(created["taskId"], lambda t: t["status"] != "working")
        self.assertEqual(task["status"], "cancelled")
        with self.assertRaises(RpcError) as refused:
            rpc("tasks/cancel", {"taskId": created["taskId"]})
        self.assertEqual(refused.exception.code, -32602, "an ended task cannot be cancelled")

    def test_another_tenant_has_no_such_task_and_forged_ids_are_invalid(self):
        created = call("tenant A's task")
        for method, params in [("tasks/get", {}), ("tasks/cancel", {}),
                               ("tasks/update", {"inputResponses": {"approval": {"action": "accept"}}})]:
            with self.assertRaises(RpcError, msg=method) as refused:
                rpc(method, {"taskId": created["taskId"], **params}, token=TOKEN_B)
            self.assertEqual(refused.exception.code, -32602, method)
        for forged in ["task-1", "mcpt_!!", "mcpt_c2Vzc2lvbi4w"]:
            with self.assertRaises(RpcError, msg=forged) as refused:
                rpc("tasks/get", {"taskId": forged})
            self.assertEqual(refused.exception.code, -32602, forged)
        # Without the extension declared, tasks/* are refused as the extension requires (-32021).
        with self.assertRaises(RpcError) as refused:
            rpc("tasks/get", {"taskId": created["taskId"]}, tasks=False)
        self.assertEqual(refused.exception.code, -32021)


if __name__ == "__main__":
    unittest.main()
