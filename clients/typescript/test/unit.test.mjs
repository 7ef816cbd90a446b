// The client without a server: a method for every RPC, messages and MessageIds, error classification,
// addresses.

import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import {
  Agent,
  AssistantDeltaSchema,
  AssistantMessageSchema,
  SessionEventSchema,
  WatchItemSchema,
  ClientBase,
  Code,
  newMessageId,
  textMessage,
  textOf,
  TurnstileClient,
  TurnstileError,
  WatchStream,
} from "../dist/index.js";
import * as web from "../dist/browser.js";
import { toTurnstileError } from "../dist/errors.js";

test("the client has a method for every RPC of turnstile.v1.Agent", () => {
  const missing = Agent.methods.filter((m) => typeof ClientBase.prototype[/** @type {keyof ClientBase} */ (m.localName)] !== "function");
  assert.deepEqual(missing.map((m) => m.name), []);
  assert.ok(new TurnstileClient() instanceof ClientBase);
  assert.ok(new web.TurnstileClient() instanceof web.ClientBase, "the browser entry has the same API");
});

test("texts become one-block messages with fresh UUID MessageIds", () => {
  const a = textMessage("hi");
  const b = textMessage("hi");
  assert.match(a.id, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.notEqual(a.id, b.id);
  assert.equal(textOf(a), "hi");
  assert.equal(textMessage("x", { id: "mine" }).id, "mine");
  assert.equal(textOf(undefined), "");
  assert.match(newMessageId(), /^[0-9a-f-]{36}$/);
});

test("sessions named by id are in the client's tenant; a token leaves the tenant to the server", () => {
  assert.deepEqual(
    { ...new TurnstileClient().ref("s1") },
    { ...new TurnstileClient().ref({ tenant: "default", id: "s1" }) },
  );
  assert.equal(new TurnstileClient({ tenant: "acme" }).ref("s1").tenant, "acme");
  assert.equal(new TurnstileClient({ token: "t" }).ref("s1").tenant, "");
  assert.equal(new TurnstileClient({ token: "t" }).headers().get("authorization"), "Bearer t");
  assert.equal(new TurnstileClient({ tenant: "acme" }).headers(true).get("turnstile-tenant"), "acme");
});

test("a lost connection is UNAVAILABLE; a server's status keeps its code and message", () => {
  // What connect-node reports for a connection that closed under a call (measured: SIGKILL of the server).
  const reset = new ConnectError("http/2 stream closed with error code CANCEL (0x8)", Code.Canceled);
  assert.equal(toTurnstileError("Watch", reset).code, Code.Unavailable);
  const econnreset = new ConnectError("read ECONNRESET", Code.Aborted, undefined, undefined, Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }));
  assert.equal(toTurnstileError("Followup", econnreset).code, Code.Unavailable);
  const fetchFailed = new ConnectError("fetch failed", Code.Unknown, undefined, undefined, new TypeError("fetch failed"));
  assert.equal(toTurnstileError("Followup", fetchFailed).code, Code.Unavailable);
  const server = toTurnstileError("GetSession", new ConnectError("session t/x does not exist", Code.NotFound));
  assert.ok(server instanceof TurnstileError);
  assert.equal(server.code, Code.NotFound);
  assert.equal(server.details, "session t/x does not exist");
  assert.equal(server.message, "GetSession: NOT_FOUND: session t/x does not exist");
  // The caller's own abort is CANCELLED, never retried.
  const aborted = new AbortController();
  aborted.abort();
  assert.equal(toTurnstileError("Followup", reset, aborted.signal).code, Code.Canceled);
});

test("a bad address says what to write instead", async () => {
  const client = new TurnstileClient({ address: "ftp://example:1" });
  await assert.rejects(client.getSession("s"), /use host:port, http:\/\/host:port or https:\/\/host:port/);
});

test("an aborted signal cancels a call and its retries", async () => {
  const client = new TurnstileClient({ address: "127.0.0.1:1" });
  const controller = new AbortController();
  const call = client.followup("s", "x", { signal: controller.signal });
  setTimeout(() => controller.abort(), 100);
  const e = await call.catch((e) => e);
  assert.ok(e instanceof TurnstileError);
  assert.equal(e.code, Code.Canceled);
  client.close();
});

/** @param {number} step @param {number} offset @param {string} text */
const delta = (step, offset, text, reasoning = false) =>
  create(WatchItemSchema, {
    item: { case: "live", value: { payload: { case: "assistantDelta", value: create(AssistantDeltaSchema, { turn: 2n, step, offset: BigInt(offset), text, reasoning }) } } },
  });

test("a watch's position follows the streaming step's byte offsets and resumes with them", async () => {
  // A fake connection: the first Watch sends a step's first deltas and breaks; the second is recorded.
  /** @type {any[]} */
  const requests = [];
  const first = [
    create(WatchItemSchema, { item: { case: "caughtUp", value: { seq: 5n } } }),
    delta(1, 0, "hmm", true),
    delta(1, 0, "é🎉"),
    delta(1, 6, "!"),
  ];
  const message = create(SessionEventSchema, {
    seq: 6n,
    payload: { case: "assistantMessage", value: create(AssistantMessageSchema, { turn: 2n, step: 1, text: "é🎉!" }) },
  });
  const second = [create(WatchItemSchema, { item: { case: "caughtUp", value: { seq: 5n } } }), create(WatchItemSchema, { item: { case: "event", value: message } })];
  const core = {
    tenant: "t",
    retryPolicy: { deadlineMs: 5_000, initialBackoffMs: 1, maxBackoffMs: 1 },
    headers: () => new Headers(),
    reconnect: async () => {},
    rpc: async () => ({
      agent: {
        /** @param {any} request */
        async *watch(request) {
          requests.push(request);
          yield* requests.length === 1 ? first : second;
          if (requests.length === 1) throw new ConnectError("connection lost", Code.Unavailable);
          await new Promise(() => {});
        },
      },
    }),
  };
  const stream = new WatchStream(/** @type {any} */ (core), /** @type {any} */ ({ tenant: "t", id: "s" }), {});
  for (let i = 0; i < first.length; i++) await stream.next();
  assert.deepEqual(stream.position, { afterSeq: 5n, streaming: { turn: 2n, step: 1, textOffset: 7n, reasoningOffset: 3n } });
  await stream.next(); // the reopened stream's caughtUp
  assert.equal(stream.reopened, 1);
  assert.deepEqual(requests[1].resume, { turn: 2n, step: 1, textOffset: 7n, reasoningOffset: 3n }, "sent as resume");
  assert.equal(requests[1].afterSeq, 5n);
  await stream.next(); // the step's message: nothing of it left to resume
  assert.deepEqual(stream.position, { afterSeq: 6n });
  await stream.close();
  const resumed = new WatchStream(/** @type {any} */ (core), /** @type {any} */ ({ tenant: "t", id: "s" }), { from: { afterSeq: 4n, streaming: { turn: 2n, step: 1, textOffset: 7n, reasoningOffset: 3n } } });
  assert.deepEqual(resumed.position.streaming?.textOffset, 7n, "from: a saved position");
  await resumed.close();
});
