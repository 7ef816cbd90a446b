// watch() across a gateway killed with SIGKILL, on a local cluster (one worker, two gateways, one
// nats-server) that tests/tests/typescript_client.rs runs and drives through its control port
// (CONTROL_ADDR): while gateway 0 is down, a followup goes through gateway 1; gateway 0 comes back on a new
// port; the watch, whose address function now names it, reopens after the last seq it had and goes on.
// Every durable event arrives once, in order, exactly as a fresh read of the log has them.

import assert from "node:assert/strict";
import { test } from "node:test";
import { SessionStatus, TurnstileClient } from "../dist/index.js";
import { assertContiguous, bounded, control, newId, replay, replies } from "./harness.mjs";

/**
 * Appends the stream's durable events to `seen` until the idle status after the reply `text`.
 * @param {AsyncIterator<import("../dist/index.js").WatchItem>} stream
 * @param {string} text
 * @param {import("../dist/index.js").SessionEvent[]} seen
 */
async function eventsUntilReply(stream, text, seen) {
  let replied = false;
  for (;;) {
    const next = await stream.next();
    if (next.done) throw new Error("the watch ended");
    if (next.value.item.case !== "event") continue;
    const e = next.value.item.value;
    seen.push(e);
    if (e.payload.case === "assistantMessage" && e.payload.value.text === text) replied = true;
    if (replied && e.payload.case === "status" && e.payload.value.status === SessionStatus.IDLE) return;
  }
}

test("a watch resumes across a gateway killed and restarted on a new port: nothing missed, nothing repeated", async () => {
  let current = await control("gateway 0");
  const other = new TurnstileClient({ address: await control("gateway 1") });
  const client = new TurnstileClient({ address: () => current, retry: { deadlineMs: 60_000 } });
  try {
    const s = newId();
    const stream = client.watch(s);
    const first = await bounded(stream.next(), "caughtUp");
    assert.equal(first.value?.item.case, "caughtUp");
    /** @type {import("../dist/index.js").SessionEvent[]} */
    const seen = [];
    await client.followup(s, "one");
    await bounded(eventsUntilReply(stream, "echo: one", seen), "the first reply");
    const before = stream.position.afterSeq;

    // The stream is being read while the gateway is down: it notices at once and retries against the dead
    // address (connection refused) until the address function names the restarted gateway.
    const during = eventsUntilReply(stream, "echo: two", seen);
    await control("kill-gateway 0");
    // While gateway 0 is down the session goes on through gateway 1.
    await other.followup(s, "two");
    await other.whenIdle(s);
    const old = current;
    current = await control("restart-gateway 0");
    assert.notEqual(current, old, "the gateway came back on another port");
    await bounded(during, "the reply given while the gateway was down");
    await client.followup(s, "three");
    await bounded(eventsUntilReply(stream, "echo: three", seen), "the reply after the restart");
    await stream.close();

    assertContiguous(seen);
    assert.deepEqual(replies(seen), ["echo: one", "echo: two", "echo: three"]);
    assert.ok(stream.reopened >= 1, "the stream was reopened");
    assert.equal(client.target, `http://${current}`, "the client follows the gateway to its new address");
    const log = await replay(other, s);
    assert.deepEqual(
      seen.map((e) => [e.seq, e.type]),
      log.map((e) => [e.seq, e.type]),
      "exactly the log's events",
    );
    console.log(`resumed after seq ${before} from ${old} to ${current} (${stream.reopened} reopenings)`);
  } finally {
    client.close();
    other.close();
  }
});
