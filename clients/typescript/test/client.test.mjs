// The client against a real `turnstile dev` (TURNSTILE_ADDR; its agents are in
// tests/tests/typescript_client.rs: `helper` by default with `echo` and the client tools `lookup`,
// `fails`, `where`, `wait`; `careful` gating `echo` behind approval). Every RPC of turnstile.v1.Agent is
// called here, and the last test checks that: a new RPC fails it until a test calls it.

import assert from "node:assert/strict";
import { after, test } from "node:test";
import {
  Agent,
  Code,
  GoalAction,
  InjectMode,
  SessionStatus,
  Target,
  ToolOutput,
  TurnstileClient,
  TurnstileError,
  textOf,
} from "../dist/index.js";
import {
  assertContiguous,
  bounded,
  entered,
  env,
  eventsOf,
  newId,
  refusingAddress,
  replay,
  replies,
  untilIdleAfter,
} from "./harness.mjs";

/** Every RPC any client of this file called, by its proto name. */
const called = new Set();
/** @type {import("../dist/index.js").Interceptor} */
const record = (next) => (req) => {
  called.add(req.method.name);
  return next(req);
};

const address = env("TURNSTILE_ADDR");
const client = new TurnstileClient({ address, interceptors: [record] });
after(() => client.close());

/**
 * The error `promise` rejects with, which must be a TurnstileError.
 * @param {Promise<unknown>} promise
 */
async function failure(promise) {
  const e = await promise.then(
    () => assert.fail("the call succeeded"),
    (e) => e,
  );
  assert.ok(e instanceof TurnstileError, `a TurnstileError, got ${e}`);
  return e;
}

test("a followup's reply streams through watch, from caughtUp 0 to the idle status", async () => {
  const s = newId();
  const stream = client.watch(s);
  const first = await bounded(stream.next(), "caughtUp");
  assert.equal(first.value?.item.case, "caughtUp");
  assert.equal(first.value?.item.value.seq, 0n, "a session without events is caught up at seq 0");
  const reply = await client.followup(s, "hello");
  assert.ok(reply.seq > 0n);
  assert.ok(reply.turn !== undefined, "a followup to an idle session opens a turn");
  const items = await bounded(untilIdleAfter(stream, reply.turn), "the turn's end");
  await stream.close();
  const events = eventsOf(items);
  assertContiguous(events);
  assert.deepEqual(replies(events), ["echo: hello"]);
  const deltas = items
    .flatMap((i) => (i.item.case === "live" && i.item.value.payload.case === "assistantDelta" ? [i.item.value.payload.value.text] : []))
    .join("");
  assert.equal(deltas, "echo: hello", "the live deltas concatenate to the reply");
  assert.equal(stream.position.afterSeq, events.at(-1)?.seq, "the position is the last durable seq");
  const idle = await client.whenIdle(s, { timeoutMs: 10_000 });
  assert.equal(idle.status, SessionStatus.IDLE);
  assert.equal(idle.lastSeq, events.at(-1)?.seq);
  const info = await client.getSession(s);
  assert.equal(info.lastTurn, reply.turn);
  assert.equal(info.session?.id, s);
  assert.equal(info.agent, "helper");
  const second = newId();
  await client.queue(second, "a second session");
  const listed = [];
  for await (const i of client.sessions()) listed.push(i.session?.id);
  assert.ok(listed.includes(s) && listed.includes(second), "sessions() lists both");
  const page = await client.listSessions({ pageSize: 1 });
  assert.equal(page.sessions.length, 1);
  assert.notEqual(page.nextPageToken, "", "more than one session: another page");
  const next = await client.listSessions({ pageSize: 1, pageToken: page.nextPageToken });
  assert.notEqual(next.sessions[0]?.session?.id, page.sessions[0]?.session?.id, "the next page goes on");
});

test("inbox edits and reads: queue, inject, send, replace, remove, splice, clear", async () => {
  const s = newId();
  const notFound = await failure(client.getSession(s));
  assert.equal(notFound.code, Code.NotFound);
  assert.equal(notFound.codeName, "NOT_FOUND");
  assert.equal(notFound.method, "GetSession");
  assert.match(notFound.details, /does not exist/, "the server's message");
  const a = await client.queue(s, "a", { id: "msg-a" });
  assert.equal(a.turn, undefined, "a non-waking delivery opens no turn");
  await client.queue(s, "b", { id: "msg-b" });
  await client.inject(s, "context", { id: "msg-c" });
  await client.send(s, "step input", { id: "msg-d", target: Target.NEXT_STEP, wakeup: false });
  let inbox = await client.getInbox(s);
  assert.deepEqual(inbox.nextTurn.map((m) => m.id), ["msg-a", "msg-b"]);
  assert.deepEqual(inbox.nextStep.map((m) => m.id), ["msg-c", "msg-d"]);
  assert.equal(inbox.nextStep[0]?.source?.kind.case, "plugin", "inject's default source");
  await client.replace(s, "msg-a", { id: "msg-a2", content: [{ block: { case: "text", value: { text: "a2" } } }] });
  await client.remove(s, "msg-b");
  const gone = await failure(client.remove(s, "msg-b"));
  assert.equal(gone.code, Code.NotFound);
  await client.splice(s, { target: Target.NEXT_STEP, start: 0, deleteCount: 1, inserted: ["spliced in"] });
  inbox = await client.getInbox(s);
  assert.deepEqual(
    inbox.nextTurn.map((m) => [m.id, textOf(m)]),
    [["msg-a2", "a2"]],
  );
  assert.deepEqual(inbox.nextStep.map(textOf), ["spliced in", "step input"]);
  assert.notEqual(inbox.nextStep[0]?.id, "", "a MessageId was minted for the spliced text");
  const cleared = await client.clear(s);
  assert.ok(cleared.seq > inbox.seq);
  inbox = await client.getInbox(s);
  assert.deepEqual([inbox.nextTurn.length, inbox.nextStep.length], [0, 0]);
  // The same id with other content is not a retry.
  const reused = await failure(client.queue(s, "other", { id: "msg-a" }));
  assert.equal(reused.code, Code.AlreadyExists);
  // Bad input names what was wrong.
  const bad = await failure(client.followup("not a valid id!", "x"));
  assert.equal(bad.code, Code.InvalidArgument);
  assert.match(bad.details, /session/);
});

test("steer with expectedTurn, interrupt and cancel of a running turn", async () => {
  const s = newId();
  const stream = client.watch(s);
  await bounded(stream.next(), "caughtUp");
  const slow = await client.followup(s, "[[delay:60000]] slow");
  assert.ok(slow.turn !== undefined);
  const steered = await client.steer(s, "more", { expectedTurn: slow.turn });
  assert.ok(steered.seq > slow.seq);
  const late = await failure(client.steer(s, "late", { expectedTurn: slow.turn + 5n }));
  assert.equal(late.code, Code.FailedPrecondition);
  const interrupted = await client.interrupt(s, "now");
  assert.ok(interrupted.seq > steered.seq);
  let events = eventsOf(await bounded(untilIdleAfter(stream, slow.turn + 1n), "the interrupt's turn"));
  const ends = new Map(events.flatMap((e) => (e.payload.case === "turnEnd" ? [[e.payload.value.turn, e.payload.value.reason?.reason.case]] : [])));
  assert.equal(ends.get(slow.turn), "aborted");
  assert.match(replies(events).at(-1) ?? "", /now/, "the interrupt's message runs next");
  const again = await client.followup(s, "[[delay:60000]] slow again");
  const canceled = await client.cancel(s);
  assert.ok(canceled.seq > again.seq);
  events = eventsOf(await bounded(untilIdleAfter(stream, again.turn ?? 0n), "the canceled turn's end"));
  await stream.close();
  const end = events.findLast((e) => e.payload.case === "turnEnd");
  assert.equal(end?.payload.case === "turnEnd" && end.payload.value.reason?.reason.case, "aborted");
  const cause = end?.payload.case === "turnEnd" && end.payload.value.reason?.reason.case === "aborted" ? end.payload.value.reason.reason.value.cause.case : undefined;
  assert.equal(cause, "user");
});

test("configureSession, a call awaiting approval and decide", async () => {
  const s = newId();
  const info = await client.configureSession(s, "careful", { injectMode: InjectMode.PENDING });
  assert.equal(info.agent, "careful");
  const stream = client.watch(s);
  const reply = await client.followup(s, "[[tool:echo approved text]]");
  /** @type {string | undefined} */
  let callId;
  for await (const item of stream) {
    if (item.item.case === "event" && item.item.value.payload.case === "toolCall" && item.item.value.payload.value.awaitingApproval) {
      callId = item.item.value.payload.value.callId;
      break;
    }
  }
  assert.ok(callId, "a tool/call awaiting approval");
  await client.decide(s, callId, true, { reason: "fine" });
  const twice = await failure(client.decide(s, callId, true));
  assert.equal(twice.code, Code.FailedPrecondition, "a decided call cannot be decided again");
  await client.whenIdle(s);
  const events = await replay(client, s);
  const results = events.flatMap((e) => (e.payload.case === "toolResult" ? [e.payload.value.output] : []));
  assert.deepEqual(results, ["approved text"], "the approval ran the tool");
  assert.ok(reply.turn !== undefined);
});

test("setGoal and updateGoal: pause, resume, clear", async () => {
  const s = newId();
  // A running turn keeps the goal's rounds from starting (they start once the session is idle).
  const running = await client.followup(s, "[[delay:60000]] busy");
  const goal = await client.setGoal(s, "count to three", 3);
  assert.equal(goal.state, "active");
  assert.equal(goal.maxRounds, 3);
  const paused = await client.updateGoal(s, goal.goalId, GoalAction.PAUSE);
  assert.equal(paused.state, "paused");
  const resumed = await client.updateGoal(s, goal.goalId, GoalAction.RESUME);
  assert.equal(resumed.state, "active");
  const cleared = await client.updateGoal(s, goal.goalId, GoalAction.CLEAR);
  assert.equal(cleared.state, "cleared");
  const unknown = await failure(client.updateGoal(s, "no-such-goal", GoalAction.PAUSE));
  assert.equal(unknown.code, Code.NotFound);
  const bad = await failure(client.setGoal(s, "", 3));
  assert.equal(bad.code, Code.InvalidArgument, "an empty objective");
  await client.cancel(s);
  assert.equal((await client.getSession(s)).goal?.state, "cleared");
  assert.ok(running.turn !== undefined);
});

test("compact, forkSession, referenceSession, getUsage and deleteSession", async () => {
  const [s, fork, other] = [newId(), newId(), newId()];
  for (const text of ["one", "two"]) {
    await client.followup(s, text);
    await client.whenIdle(s);
  }
  await client.compact(s);
  const kinds = (await replay(client, s)).map((e) => e.payload.case);
  assert.equal(kinds.filter((k) => k === "contextCompacted").length, 1, "Compact wrote one context/compacted");
  const forked = await client.forkSession(s, 1, fork);
  assert.equal(forked.session?.id, fork);
  assert.equal((await replay(client, fork))[0]?.payload.case, "sessionForked");
  const exists = await failure(client.forkSession(s, 1n, fork));
  assert.equal(exists.code, Code.AlreadyExists, "the fork exists now");
  await client.referenceSession(other, s, { uptoTurn: 1, id: "ref-1" });
  const inbox = await client.getInbox(other);
  assert.deepEqual(inbox.nextStep.map((m) => m.id), ["ref-1"]);
  assert.equal(inbox.nextStep[0]?.source?.kind.case, "session");
  assert.match(textOf(inbox.nextStep[0]), /one/, "the reference carries turn 1's transcript");
  // The scripted model reports no usage unless told: the tenant's tokens are what `[[usage]]` said.
  await client.followup(other, "[[usage:7,2]] metered");
  await client.whenIdle(other);
  const usage = await client.getUsage();
  assert.equal(usage.models.find((m) => m.provider === "scripted")?.inputTokens, 7n, "GetUsage counts the durable usage");
  assert.ok(usage.usedToday >= 9n && usage.resetsUnixMs > 0n);
  const last = (await client.getSession(s)).lastSeq;
  const deleted = await client.deleteSession(s);
  assert.equal(deleted.seq, last, "a delete answers the last seq the log had");
  assert.equal((await failure(client.getSession(s))).code, Code.NotFound);
  assert.equal((await replay(client, fork))[0]?.payload.case, "sessionForked", "the fork outlives its source");
});

test("client tools called by the agent: results, context, errors, the call's context, cancel aborts", async () => {
  /** @type {(signal: AbortSignal) => void} */
  let waitStarted = () => {};
  const started = new Promise((resolve) => (waitStarted = resolve));
  const server = client.serveTools({
    lookup: {
      description: "Looks a word up.",
      inputSchema: { type: "object", properties: { q: { type: "string" } }, required: ["q"] },
      handler: async ({ q }) => new ToolOutput(`found ${q}`, ["ctx from typescript"]),
    },
    fails: () => {
      throw new RangeError("no such word");
    },
    where: (_args, ctx) => ({ session: ctx.session.id, name: ctx.name, future: ctx.deadline.getTime() > Date.now() }),
    wait: (_args, ctx) =>
      new Promise((_resolve, reject) => {
        waitStarted(ctx.signal);
        ctx.signal.addEventListener("abort", () => reject(ctx.signal.reason));
      }),
  });
  try {
    assert.deepEqual((await bounded(server.registered, "the registration")).sort(), ["fails", "lookup", "wait", "where"]);
    const s = newId();
    for (const text of ['[[tool:lookup {"q":"x"}]]', "[[tool:fails {}]]", "[[tool:where {}]]"]) {
      await client.followup(s, text);
      await client.whenIdle(s);
    }
    const events = await replay(client, s);
    const results = events.flatMap((e) =>
      e.payload.case === "toolResult" ? [[e.payload.value.output, e.payload.value.error]] : [],
    );
    assert.deepEqual(results, [
      ["found x", undefined],
      ["", "RangeError: no such word"],
      [JSON.stringify({ session: s, name: "where", future: true }), undefined],
    ]);
    assert.ok(
      entered(events).some(([, text]) => text === "ctx from typescript"),
      "the ToolOutput's context entered the next step",
    );
    // A turn canceled while the tool runs: the gateway cancels the call and its AbortSignal fires.
    const w = newId();
    await client.followup(w, "[[tool:wait {}]]");
    const signal = /** @type {AbortSignal} */ (await bounded(started, "the wait tool's call"));
    assert.equal(signal.aborted, false);
    await client.cancel(w);
    await bounded(
      new Promise((resolve) => (signal.aborted ? resolve(undefined) : signal.addEventListener("abort", resolve))),
      "the call's AbortSignal",
    );
    await client.whenIdle(w);
  } finally {
    await server.close();
  }
  await server.done;
});

test("an address function is asked again after UNAVAILABLE and the delivery goes through", async () => {
  const dead = await refusingAddress();
  let asked = 0;
  const moving = new TurnstileClient({ address: () => (++asked === 1 ? dead : address), interceptors: [record] });
  try {
    const s = newId();
    const reply = await moving.followup(s, "through");
    assert.ok(asked >= 2, "the address was asked again");
    assert.equal(moving.target, `http://${address}`);
    await moving.whenIdle(s);
    assert.deepEqual(entered(await replay(moving, s)).map(([, t]) => t), ["through"]);
    assert.ok(reply.seq > 0n);
  } finally {
    moving.close();
  }
});

test("a command is not retried: UNAVAILABLE at once when nothing listens", async () => {
  const dead = await refusingAddress();
  let asked = 0;
  const nowhere = new TurnstileClient({ address: () => (asked++, dead), retry: { deadlineMs: 500 } });
  try {
    const e = await failure(nowhere.cancel(newId()));
    assert.equal(e.code, Code.Unavailable);
    assert.equal(asked, 1, "a cancel is never retried");
    const read = await failure(nowhere.getInbox(newId()));
    assert.equal(read.code, Code.Unavailable, "a read is retried until the deadline, then fails");
    assert.ok(asked > 2, `the read asked the address again on each retry (${asked})`);
  } finally {
    nowhere.close();
  }
});

test("every RPC of turnstile.v1.Agent was called by the tests above", () => {
  const all = Agent.methods.map((m) => m.name);
  assert.deepEqual(
    all.filter((m) => !called.has(m)),
    [],
    "RPCs no test called",
  );
  assert.equal(all.length, 26);
});
