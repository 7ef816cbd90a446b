// Retries after a dropped connection, against a real `turnstile dev` (TURNSTILE_ADDR) through a TCP proxy
// that holds the server's reply and then closes the connection: the server has applied the delivery, the
// client never saw the answer. The client retries with the same MessageId and gets the first acceptance
// (SPEC §2); the message enters once. A command (cancel) in the same situation is not repeated.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Code, TurnstileClient, TurnstileError } from "../dist/index.js";
import { bounded, entered, env, newId, Proxy, replay } from "./harness.mjs";

const address = env("TURNSTILE_ADDR");
const direct = new TurnstileClient({ address });
after(() => direct.close());

/**
 * Every attempt of `method` the interceptor saw: the MessageId it carried (`undefined` for a command).
 * @param {string} method
 */
function attempts(method) {
  /** @type {(string | undefined)[]} */
  const ids = [];
  /** @type {import("../dist/index.js").Interceptor} */
  const interceptor = (next) => (req) => {
    if (req.method.name === method && !req.stream) {
      ids.push(/** @type {{message?: {id: string}}} */ (req.message).message?.id);
    }
    return next(req);
  };
  return { ids, interceptor };
}

/**
 * Polls (bounded) until `check` is true.
 * @param {() => Promise<boolean>} check
 * @param {string} what
 */
async function until(check, what) {
  await bounded(
    (async () => {
      while (!(await check())) await new Promise((r) => setTimeout(r, 20));
    })(),
    what,
  );
}

test("a followup whose connection drops after the server applied it is answered, on retry, with the first acceptance", async () => {
  const proxy = new Proxy(address);
  const { ids, interceptor } = attempts("Followup");
  const client = new TurnstileClient({ address: await proxy.start(), interceptors: [interceptor] });
  try {
    const s = newId();
    await client.listSessions({ pageSize: 1 }); // the HTTP/2 connection is up before replies are held
    proxy.hold();
    const pending = client.followup(s, "once");
    // The server applied it: the splice inserting the message is in the log (read directly, not through the proxy).
    /** @type {bigint | undefined} */
    let applied;
    await until(async () => {
      const events = await replay(direct, s);
      for (const e of events) {
        if (e.payload.case === "inboxSpliced" && e.payload.value.inserted.some((m) => m.id === ids[0])) applied = e.seq;
      }
      return applied !== undefined;
    }, "the followup in the log");
    proxy.cut();
    const reply = await bounded(pending, "the retried followup");
    assert.equal(ids.length, 2, "one attempt lost with its connection, one retry");
    assert.equal(ids[1], ids[0], "the retry carried the same MessageId");
    assert.equal(reply.seq, applied, "the retry is answered with the first acceptance's seq");
    assert.equal(reply.turn, 1n, "and its turn");
    assert.ok(proxy.accepted >= 2, "the retry went over a new connection");
    await direct.whenIdle(s);
    assert.deepEqual(entered(await replay(direct, s)), [[ids[0], "once"]], "the message entered exactly once");
  } finally {
    client.close();
    proxy.close();
  }
});

test("a cancel whose connection drops is not repeated: it fails UNAVAILABLE and the caller decides", async () => {
  const proxy = new Proxy(address);
  const { ids, interceptor } = attempts("Cancel");
  const client = new TurnstileClient({ address: await proxy.start(), interceptors: [interceptor] });
  try {
    const s = newId();
    const slow = await client.followup(s, "[[delay:60000]] slow");
    proxy.hold();
    const pending = client.cancel(s);
    const ended = async () => (await replay(direct, s)).filter((e) => e.payload.case === "turnEnd");
    await until(async () => (await ended()).length > 0, "the cancel to be applied");
    proxy.cut();
    const e = await bounded(
      pending.then(
        () => assert.fail("the cancel succeeded"),
        (e) => e,
      ),
      "the cancel's failure",
    );
    assert.ok(e instanceof TurnstileError);
    assert.equal(e.code, Code.Unavailable, `a lost connection is UNAVAILABLE (${e.message})`);
    assert.equal(ids.length, 1, "one attempt: a cancel is never repeated");
    const [end] = await ended();
    assert.equal(end?.payload.case === "turnEnd" && end.payload.value.turn, slow.turn, "the turn was canceled, once");
    assert.equal((await ended()).length, 1);
  } finally {
    client.close();
    proxy.close();
  }
});

test("a tool server whose connection drops registers again and serves the next call", async () => {
  const proxy = new Proxy(address);
  const client = new TurnstileClient({ address: await proxy.start() });
  /** @type {string[][]} */
  const registrations = [];
  /** @type {() => void} */
  let again = () => {};
  const registeredAgain = new Promise((resolve) => (again = () => resolve(undefined)));
  const server = client.serveTools(
    { lookup: ({ q }) => `found ${q}` },
    {
      onRegistered: (names) => {
        registrations.push(names);
        if (registrations.length === 2) again();
      },
    },
  );
  try {
    assert.deepEqual(await bounded(server.registered, "the registration"), ["lookup"]);
    proxy.cut();
    await bounded(registeredAgain, "the registration after the connection dropped");
    const s = newId();
    await direct.followup(s, '[[tool:lookup {"q":"y"}]]');
    await direct.whenIdle(s);
    const results = (await replay(direct, s)).flatMap((e) =>
      e.payload.case === "toolResult" ? [[e.payload.value.output, e.payload.value.error]] : [],
    );
    assert.deepEqual(results, [["found y", undefined]]);
    assert.deepEqual(registrations, [["lookup"], ["lookup"]]);
  } finally {
    await server.close();
    client.close();
    proxy.close();
  }
});
