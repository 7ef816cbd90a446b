"""Parity with the TypeScript client (issue 41): every RPC of ``turnstile.v1.Agent`` has a method here,
and every public method of the TypeScript ``ClientBase`` (clients/typescript/src/client.ts) has its twin
here, named in snake_case. A method added to one client and not the other fails this test (and its twin,
parity.test.mjs) until both have it or the exception below says why not."""

from __future__ import annotations

import re
import unittest
from pathlib import Path

import turnstile_client
from turnstile_client import AsyncClient, Client, agent_pb2

CLIENT_TS = Path(__file__).resolve().parents[2] / "typescript" / "src" / "client.ts"

#: TypeScript names with no twin here, and why.
TYPESCRIPT_ONLY = {
    "rpc": "the generated Connect client; here `stub`",
    "reconnect": "done by the retries; here the private `_reconnect`",
    "headers": "the call headers; here `metadata`",
}


def snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def typescript_methods() -> list[str]:
    body = CLIENT_TS.read_text().split("\nexport class ClientBase", 1)[1]
    names = re.findall(r"^  (?:async \*?|\*|get )?([a-z]\w*)\(", body, re.MULTILINE)
    return [n for n in dict.fromkeys(names) if n != "constructor"]


class ParityTest(unittest.TestCase):
    def test_every_rpc_has_a_method(self):
        rpcs = [m.name for m in agent_pb2.DESCRIPTOR.services_by_name["Agent"].methods]
        missing = [r for r in rpcs if not hasattr(AsyncClient, snake(r))]
        self.assertEqual(missing, [], "RPCs without a method of AsyncClient")

    def test_every_method_of_the_typescript_client_has_a_twin_here(self):
        names = typescript_methods()
        self.assertGreater(len(names), 40, names)
        missing = [n for n in names if n not in TYPESCRIPT_ONLY and not hasattr(AsyncClient, snake(n))]
        self.assertEqual(missing, [], "methods of the TypeScript client with no Python twin")

    def test_the_blocking_client_has_every_method_of_the_async_one(self):
        # The asyncio channel's parts stay on the asyncio client the blocking one wraps (``client.aio``).
        on_aio = {"stub", "metadata", "target"}
        public = [n for n in dir(AsyncClient) if not n.startswith("_") and n not in on_aio]
        missing = [n for n in public if not hasattr(Client, n)]
        self.assertEqual(missing, [], "AsyncClient methods the blocking Client lacks")

    def test_the_typed_events_are_exported(self):
        for name in ("RunResult", "TurnEvent", "WatchPosition", "text_of", "text_message"):
            self.assertTrue(hasattr(turnstile_client, name), name)


if __name__ == "__main__":
    unittest.main()
