// The browser entry (gRPC-Web over fetch), run in Node against the HTTP port of a real `turnstile dev`
// (TURNSTILE_HTTP_ADDR), where the console's gRPC-Web API is served: the same API, a watch streaming a
// reply, typed errors; serveTools is refused with a clear error.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Code, TurnstileClient, TurnstileError } from "../dist/browser.js";
import { bounded, env, eventsOf, newId, replies, untilIdleAfter } from "./harness.mjs";

test("over gRPC-Web: a followup, its streamed reply, a typed error; no client tools", async () => {
  const client = new TurnstileClient({ address: `http://${env("TURNSTILE_HTTP_ADDR")}` });
  try {
    const s = newId("web");
    const stream = client.watch(s);
    assert.equal((await bounded(stream.next(), "caughtUp")).value?.item.case, "caughtUp");
    const reply = await client.followup(s, "from a browser");
    const items = await bounded(untilIdleAfter(stream, reply.turn ?? 0n), "the reply");
    await stream.close();
    assert.deepEqual(replies(eventsOf(items)), ["echo: from a browser"]);
    const missing = await client.getSession(newId("web")).catch((e) => e);
    assert.ok(missing instanceof TurnstileError);
    assert.equal(missing.code, Code.NotFound);
    const server = client.serveTools({ t: () => "x" });
    const refused = await server.registered.catch((e) => e);
    assert.ok(refused instanceof TurnstileError);
    assert.equal(refused.code, Code.Unimplemented);
    assert.match(refused.details, /serve them from Node/);
  } finally {
    client.close();
  }
});
