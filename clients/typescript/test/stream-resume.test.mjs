// A reply that streams on across a dropped connection (SPEC §14), against a real `turnstile dev`
// (TURNSTILE_ADDR): the watch goes through a TCP proxy that cuts every connection mid-reply; the reopened
// stream sends the streaming step's byte offsets as `resume`, and the deltas the caller saw are the durable
// `assistantMessage` text, each byte once, at contiguous offsets from 0. A stream started `from` another's
// saved position (a page reload) gets only the rest.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { TurnstileClient } from "../dist/index.js";
import { bounded, env, newId, Proxy } from "./harness.mjs";

const address = env("TURNSTILE_ADDR");
const direct = new TurnstileClient({ address });
after(() => direct.close());

/** Streamed by the scripted model in ten deltas over five seconds; multi-byte characters make byte offsets
 * differ from string lengths. */
const SLOW = "[[delay:5000]] héllo wörld, this reply streams slowly in ten pieces 🎉 across a dropped connection";
/** Cut early, so the reopened stream (a fraction of a second later) finds the step still streaming, with
 * seconds to spare on a busy machine. */
const CUT_AFTER = 2;

const utf8 = new TextEncoder();

/** @typedef {import("../dist/index.js").AssistantDelta} Delta */

/**
 * Reads `stream` until the step's `assistantMessage`, calling `onDelta` with each delta and how many came
 * before it; returns the deltas and the message's text.
 * @param {import("../dist/index.js").WatchStream} stream
 * @param {(d: Delta, n: number) => void} onDelta
 */
async function readReply(stream, onDelta = () => {}) {
  /** @type {Delta[]} */
  const deltas = [];
  for (;;) {
    const next = await stream.next();
    if (next.done) throw new Error("the watch ended");
    const it = next.value.item;
    if (it.case === "live" && it.value.payload.case === "assistantDelta") {
      onDelta(it.value.payload.value, deltas.length);
      deltas.push(it.value.payload.value);
    } else if (it.case === "event" && it.value.payload.case === "assistantMessage") {
      return { deltas, text: it.value.payload.value.text };
    }
  }
}

/**
 * Each delta starts where the previous one ended, from `start`.
 * @param {Delta[]} deltas
 */
function assertContiguousFrom(deltas, start = 0n) {
  let at = start;
  for (const d of deltas) {
    assert.equal(d.offset, at, `offsets contiguous: ${JSON.stringify(deltas.map((x) => [Number(x.offset), x.text]))}`);
    at += BigInt(utf8.encode(d.text).length);
  }
}

test("a streaming reply goes on across a dropped connection: each byte once, at contiguous offsets", async () => {
  const proxy = new Proxy(address);
  const client = new TurnstileClient({ address: await proxy.start(), retry: { deadlineMs: 30_000 } });
  try {
    const s = newId();
    const stream = client.watch(s);
    assert.equal((await bounded(stream.next(), "caughtUp")).value?.item.case, "caughtUp");
    await client.followup(s, SLOW);
    /** @type {import("../dist/index.js").WatchPosition | undefined} */
    let atCut;
    const { deltas, text } = await bounded(
      readReply(stream, (_, n) => {
        if (n === CUT_AFTER) {
          atCut = stream.position;
          proxy.cut();
        }
      }),
      "the reply",
    );
    const shown = JSON.stringify(deltas.map((d) => [Number(d.offset), d.text]));
    assert.ok(atCut?.streaming, "the position had the streaming step when the connection dropped");
    assert.deepEqual(
      { turn: atCut.streaming.turn, step: atCut.streaming.step, reasoningOffset: atCut.streaming.reasoningOffset },
      { turn: 1n, step: 1, reasoningOffset: 0n },
    );
    assertContiguousFrom(deltas);
    assert.equal(deltas.map((d) => d.text).join(""), text, `the deltas are the reply, each byte once: ${shown}`);
    assert.ok(deltas.length > CUT_AFTER + 1, `the reply went on streaming after the cut: ${shown}`);
    assert.ok(stream.reopened >= 1 && proxy.accepted >= 2, "the stream was reopened over a new connection");
    assert.equal(stream.position.streaming, undefined, "the durable message ends the streaming position");
    await stream.close();
    console.log(
      `${deltas.length} deltas, ${CUT_AFTER + 1} before the cut at byte ${atCut.streaming.textOffset} of ` +
        `${utf8.encode(text).length}; ${stream.reopened} reopening(s)`,
    );
  } finally {
    client.close();
    proxy.close();
  }
});

test("a watch started from another's saved position gets only the rest of the streaming reply", async () => {
  const s = newId();
  const first = direct.watch(s);
  await bounded(first.next(), "caughtUp");
  await direct.followup(s, SLOW);
  /** @type {import("../dist/index.js").WatchPosition | undefined} */
  let saved;
  /** @type {Delta[]} */
  const before = [];
  await bounded(
    (async () => {
      while (before.length < CUT_AFTER) {
        const next = await first.next();
        const it = next.value?.item;
        if (it?.case === "live" && it.value.payload.case === "assistantDelta") before.push(it.value.payload.value);
      }
      saved = first.position;
    })(),
    "the first deltas",
  );
  await first.close();
  assert.ok(saved?.streaming, "a position taken mid-reply names the streaming step");

  const second = direct.watch(s, { from: saved });
  try {
    const { deltas, text } = await bounded(readReply(second), "the rest of the reply");
    assertContiguousFrom(deltas, saved.streaming.textOffset);
    assert.ok(deltas.length > 0, "the rest streamed");
    assert.equal([...before, ...deltas].map((d) => d.text).join(""), text, "both streams together are the reply");
  } finally {
    await second.close();
  }
});
