// Parity with the Python client (issue 41): every RPC of turnstile.v1.Agent has a method here, and every
// public method and helper of the Python client (clients/python) has its twin here, named in camelCase. A
// method added to one client and not the other fails this test (and its twin, test_parity.py) until both
// have it or the exception below says why not.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import * as api from "../dist/index.js";

const { Agent, ClientBase } = api;
const pythonSource = (file) => readFileSync(new URL(`../../python/src/turnstile_client/${file}`, import.meta.url), "utf8");

/** Python names with no twin here, and why. */
const PYTHON_ONLY = new Map([
  ["stub", "the generated stub; here `rpc()` gives the generated client"],
  ["metadata", "the call metadata; here `headers()`"],
  ["message", "a MessageId helper; here the exported `textMessage` and the delivery options' `id`"],
]);

const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

test("every RPC of turnstile.v1.Agent has a method", () => {
  const missing = Agent.methods.map((m) => m.localName).filter((name) => !(name in ClientBase.prototype));
  assert.deepEqual(missing, [], "RPCs without a method of ClientBase");
});

test("every public method of the Python AsyncClient has a twin here", () => {
  const body = pythonSource("_client.py").split("\nclass AsyncClient")[1];
  assert.ok(body, "_client.py defines class AsyncClient");
  const names = [...body.matchAll(/^ {4}(?:async )?def ([a-z]\w*)\(/gm)].map((m) => m[1]);
  assert.ok(names.length > 40, `found only ${names.length} methods: ${names}`);
  const missing = names.filter((n) => !PYTHON_ONLY.has(n) && !(camel(n) in ClientBase.prototype));
  assert.deepEqual(missing, [], "methods of the Python client with no TypeScript twin");
});

test("every helper the Python package exports has a twin export here", () => {
  const all = pythonSource("__init__.py").split("__all__ = [")[1].split("]")[0];
  const names = [...all.matchAll(/"(\w+)"/g)].map((m) => m[1]);
  // Modules, the blocking client and Python's own spellings of things the TypeScript package exports
  // under another name.
  const elsewhere = new Map([
    ["AsyncClient", "TurnstileClient"],
    ["Client", "TurnstileClient (async only: Node has no blocking calls)"],
    ["Address", "Address"],
    ["Tools", "Tools"],
    ["pb", "the generated messages are exported at the top level"],
    ["agent_pb2", "the generated messages are exported at the top level"],
    ["agent_pb2_grpc", "Agent, the service descriptor"],
    ["events_pb2", "the generated messages are exported at the top level"],
    ["events", "the event types are exported at the top level"],
  ]);
  // Types (interfaces) leave no value in the module: read the entry points' export lists as well.
  const exports = ["common.ts", "index.ts"].map((f) => readFileSync(new URL(`../src/${f}`, import.meta.url), "utf8")).join("\n");
  const exported = (n) => n in api || camel(n) in api || new RegExp(`\\b(type )?${camel(n)}\\b`).test(exports);
  const missing = names.filter((n) => !elsewhere.has(n) && !exported(n));
  assert.deepEqual(missing, [], "exports of the Python package with no TypeScript twin");
});
