// The client against a real `turnstile dev` (TURNSTILE_ADDR; its agents are in
// tests/tests/typescript_client.rs: `helper` by default with `echo` and the client tools `lookup`,
// `fails`, `where`, `wait`; `careful` gating `echo` behind approval). Every RPC of turnstile.v1.Agent is
// called here, and the last test checks that: a new RPC fails it until a test calls it.

import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { createServer } from "node:http";
import { after, test } from "node:test";
import { toBinary } from "@bufbuild/protobuf";
import {
  Agent,
  Code,
  GoalAction,
  InjectMode,
  SchedulePreset,
  SessionEventSchema,
  SessionOrder,
  SessionStatus,
  Target,
  ToolOutput,
  TurnstileClient,
  TurnstileError,
  textOf,
  toJson,
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
  startDev,
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
 * The first truthy value of `probe()`, asked every 100 ms; a failure naming `what` after the harness's bound.
 * @template T
 * @param {() => Promise<T>} probe
 * @param {string} what
 * @returns {Promise<NonNullable<T>>}
 */
async function eventually(probe, what) {
  return bounded(
    (async () => {
      for (;;) {
        const value = await probe();
        if (value) return /** @type {NonNullable<T>} */ (value);
        await new Promise((r) => setTimeout(r, 100));
      }
    })(),
    what,
  );
}

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
  const waiting = await client.listPendingApprovals({ session: s });
  assert.deepEqual(waiting.approvals.map((a) => [a.callId, a.tool, a.arguments]), [[callId, "echo", "approved text"]]);
  await client.decide(s, callId, true, { reason: "fine" });
  const twice = await failure(client.decide(s, callId, true));
  assert.equal(twice.code, Code.FailedPrecondition, "a decided call cannot be decided again");
  const notClients = await failure(client.completeToolCall(s, callId, "result"));
  assert.equal(notClients.code, Code.FailedPrecondition, "a call that is not a client tool's has no result to give");
  await client.whenIdle(s);
  const events = await replay(client, s);
  const results = events.flatMap((e) => (e.payload.case === "toolResult" ? [e.payload.value.output] : []));
  assert.deepEqual(results, ["approved text"], "the approval ran the tool");
  assert.ok(reply.turn !== undefined);

  // The transcript shows the same conversation, with the seq of each item's event, in pages of 2.
  const items = [];
  for await (const item of client.transcript(s, { pageSize: 2 })) items.push(item);
  assert.deepEqual(
    items.map((i) => i.item.case),
    ["user", "assistant", "toolCall", "toolDecision", "toolResult", "assistant", "turnEnd"],
  );
  const decision = items[3]?.item;
  assert.ok(decision?.case === "toolDecision" && decision.value.approved && decision.value.reason === "fine");
  for (const item of items) {
    assert.ok(events.some((e) => e.seq === item.seq && e.timeUnixMs === item.timeUnixMs), `an event at seq ${item.seq}`);
  }
  const page = await client.getTranscript(s, { afterSeq: items[5]?.seq });
  assert.equal(page.items.length, 1);
  assert.equal(page.nextSeq, 0n);
});

test("outputSchema: a reply that matches completes, one that does not ends invalid_output after a retry", async () => {
  const s = newId();
  const outputSchema = { name: "city", schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } };
  // The scripted model answers a structured turn with the text it was sent (API.md).
  await client.followup(s, '{"city": "Paris"}', { outputSchema });
  await client.whenIdle(s);
  await client.followup(s, "Paris, I think", { outputSchema });
  await client.whenIdle(s);
  /** @type {import("../dist/index.js").TranscriptItem[]} */
  const items = [];
  for await (const item of client.transcript(s)) items.push(item);
  const ends = items.flatMap((i) => (i.item.case === "turnEnd" ? [i.item.value.reason?.reason] : []));
  assert.equal(ends.length, 2);
  assert.equal(ends[0]?.case, "completed");
  assert.equal(ends[1]?.case === "error" && ends[1].value.code, "invalid_output");
  const replies2 = items.filter((i) => i.turn === 2n && i.item.case === "assistant").length;
  assert.equal(replies2, 2, "the bad reply was retried once");
  const bad = await failure(client.followup(s, "x", { outputSchema: { schema: "not json" } }));
  assert.equal(bad.code, Code.InvalidArgument);
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
  // The scripted model reports no usage unless told: the turn adds what `[[usage]]` said. (Earlier tests
  // of this server cancelled steps, which count too (decision 0086), so the figure is read before and after.)
  const scripted = (u) => u.models.find((m) => m.provider === "scripted")?.inputTokens ?? 0n;
  const before = scripted(await client.getUsage());
  await client.followup(other, "[[usage:7,2]] metered");
  await client.whenIdle(other);
  const usage = await client.getUsage();
  assert.equal(scripted(usage) - before, 7n, "GetUsage counts the durable usage");
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

test("setLabels and listSessions' filters; createSchedule, listSchedules, deleteSchedule; a one-shot schedule fires", async () => {
  const [s, other] = [newId(), newId()];
  const run = newId("run");
  for (const id of [s, other]) {
    await client.followup(id, "labelled");
    await client.whenIdle(id);
  }
  const started = Date.now();
  let info = await client.setLabels(s, { run, team: "blue", tier: "gold" });
  assert.deepEqual({ ...info.labels }, { run, team: "blue", tier: "gold" });
  await client.setLabels(other, { run, team: "red" });
  info = await client.setLabels(s, { x: "1" }, { remove: ["tier", "not-there"] });
  assert.deepEqual({ ...info.labels }, { run, team: "blue", x: "1" }, "set and removed");
  assert.deepEqual({ ...(await client.getSession(s)).labels }, { ...info.labels });
  const badLabel = await failure(client.setLabels(s, { "Not A Key": "v" }));
  assert.equal(badLabel.code, Code.InvalidArgument);
  /** @param {import("../dist/index.js").ListOptions} filters */
  const ids = async (filters) => {
    const listed = [];
    for await (const i of client.sessions(filters)) listed.push(i.session?.id);
    return listed;
  };
  // The index follows the log (it may lag by a write): wait until it has the last labels.
  await eventually(async () => (await ids({ labelSelector: `run=${run},x=1` })).length === 1, "the index to have the labels");
  assert.deepEqual(await ids({ labelSelector: `run=${run},team=blue` }), [s], "only the match");
  assert.deepEqual(await ids({ labelSelector: `run=${run},team!=blue` }), [other]);
  assert.deepEqual(await ids({ labelSelector: `run=${run},!x` }), [other]);
  assert.deepEqual((await ids({ labelSelector: `run=${run},tier` })), [], "a removed label matches nothing");
  const both = await ids({
    labelSelector: `run=${run}`,
    status: SessionStatus.IDLE,
    agent: "helper",
    updatedAfterUnixMs: started - 60_000,
    orderBy: SessionOrder.LAST_ACTIVITY,
  });
  assert.deepEqual(both, [s, other], "newest activity first: `s` was labelled last");
  assert.deepEqual(await ids({ labelSelector: `run=${run}`, agent: "careful" }), []);
  assert.deepEqual(await ids({ labelSelector: `run=${run}`, updatedBeforeUnixMs: started - 60_000 }), []);

  // Schedules: a one-shot 1.5 s ahead and a cron one.
  const at = Date.now() + 1_500;
  const once = await client.createSchedule(s, "once", "scheduled hello", { atUnixMs: at });
  assert.equal(once.scheduleId, "once");
  assert.equal(once.atUnixMs, BigInt(at));
  assert.equal(once.nextFireUnixMs, BigInt(at));
  assert.equal(once.preset, SchedulePreset.FOLLOWUP);
  const hourly = await client.createSchedule(s, "hourly", "tick", { cron: "0 * * * *", timeZone: "Europe/Berlin", preset: SchedulePreset.QUEUE });
  assert.equal(hourly.cron, "0 * * * *");
  assert.equal(hourly.timeZone, "Europe/Berlin");
  assert.ok((hourly.nextFireUnixMs ?? 0n) > BigInt(Date.now()), "the next firing is ahead");
  assert.equal(textOf(hourly.message), "tick");
  const again = await client.createSchedule(s, "hourly", "tick", { cron: "0 * * * *", timeZone: "Europe/Berlin", preset: SchedulePreset.QUEUE });
  assert.equal(again.nextFireUnixMs, hourly.nextFireUnixMs, "the same schedule again is answered as it is");
  const clash = await failure(client.createSchedule(s, "hourly", "other text", { cron: "0 * * * *" }));
  assert.equal(clash.code, Code.AlreadyExists);
  const badCron = await failure(client.createSchedule(s, "bad", "x", { cron: "61 * * * *" }));
  assert.equal(badCron.code, Code.InvalidArgument);
  assert.equal(badCron.method, "CreateSchedule");
  assert.match(badCron.details, /minute/, "the message names the field");
  await assert.rejects(client.createSchedule(s, "neither", "x", {}), TypeError);
  const listed = await client.listSchedules(s);
  assert.deepEqual(listed.schedules.map((x) => x.scheduleId).sort(), ["hourly", "once"]);
  const tenantWide = [];
  for (let page = await client.listSchedules(undefined, { pageSize: 1000 }); ; ) {
    tenantWide.push(...page.schedules.filter((x) => x.session?.id === s).map((x) => x.scheduleId));
    if (page.nextPageToken === "") break;
    page = await client.listSchedules(undefined, { pageSize: 1000, pageToken: page.nextPageToken });
  }
  assert.deepEqual(tenantWide.sort(), ["hourly", "once"], "without a session: every session of the tenant");
  const deleted = await client.deleteSchedule(s, "hourly");
  assert.equal(deleted.scheduleId, "hourly");
  const twice = await failure(client.deleteSchedule(s, "hourly"));
  assert.equal(twice.code, Code.NotFound, "a second delete answers NOT_FOUND");
  assert.deepEqual((await client.listSchedules(s)).schedules.map((x) => x.scheduleId), ["once"]);

  // The one-shot fires: its followup shows in the log, with the firing's MessageId and source.
  const stream = client.watch(s);
  /** @type {import("../dist/index.js").UserMessage | undefined} */
  let fired;
  await bounded(
    (async () => {
      for await (const item of stream) {
        if (item.item.case !== "event" || item.item.value.payload.case !== "userMessage") continue;
        const m = item.item.value.payload.value.message;
        if (m?.id.startsWith("once@")) {
          fired = m;
          return;
        }
      }
    })(),
    "the one-shot schedule's followup",
  );
  await stream.close();
  assert.equal(fired?.id, `once@${at}`);
  assert.equal(textOf(fired), "scheduled hello");
  assert.equal(fired?.source?.kind.case, "schedule");
  assert.ok(Date.now() >= at, "not before its time");
  await client.whenIdle(s);
  assert.deepEqual(replies(await replay(client, s)).at(-1), "echo: scheduled hello", "the followup ran a turn");
  await eventually(async () => (await client.listSchedules(s)).schedules.length === 0, "the fired one-shot to be gone");
  assert.equal((await failure(client.deleteSchedule(s, "once"))).code, Code.NotFound);
});

test("exportSessions and importSessions into a second turnstile dev: the same events, then ALREADY_EXISTS", async () => {
  const [s, piped] = [newId(), newId()];
  for (const id of [s, piped]) {
    await client.followup(id, `exported ${id}`);
    await client.whenIdle(id);
  }
  await client.setLabels(s, { exported: "yes" });
  const source = await client.getSession(s);
  /** @type {import("../dist/index.js").ExportItem[]} */
  const items = [];
  for await (const item of client.exportSessions([s])) items.push(item);
  assert.equal(items[0]?.item.case, "header");
  assert.equal(items[0]?.item.case === "header" && items[0].item.value.format, 1);
  assert.equal(items[0]?.item.case === "header" && items[0].item.value.tenant, "default");
  const end = items.at(-1);
  assert.equal(end?.item.case, "end");
  assert.equal(end?.item.case === "end" && end.item.value.session?.id, s);
  assert.equal(end?.item.case === "end" && end.item.value.lastSeq, source.lastSeq);
  const middle = items.slice(1, -1);
  assert.ok(middle.length > 0 && middle.every((i) => i.item.case === "events"), "events groups between header and end");
  const exported = middle.flatMap((i) => (i.item.case === "events" ? i.item.value.events : []));
  assertContiguous(exported);
  assert.equal(exported.at(-1)?.seq, source.lastSeq);
  const missing = await failure((async () => {
    for await (const _ of client.exportSessions([newId()])) {
      // Nothing: the first item is refused.
    }
  })());
  assert.equal(missing.code, Code.NotFound, "a listed session without events");
  assert.equal(missing.method, "ExportSessions");

  const second = await startDev();
  const there = new TurnstileClient({ address: second.address, interceptors: [record] });
  try {
    assert.equal((await failure(there.getSession(s))).code, Code.NotFound, "the second server does not have it");
    const imported = await there.importSessions(items);
    assert.equal(imported.sessions, 1n);
    assert.equal(imported.events, source.lastSeq);
    const before = await replay(client, s);
    const after = await replay(there, s);
    const shape = (/** @type {import("../dist/index.js").SessionEvent[]} */ events) => events.map((e) => [e.seq, e.payload.case]);
    assert.deepEqual(shape(after), shape(before), "the same events (seq, type) from 0");
    assert.deepEqual(
      after.map((e) => Buffer.from(toBinary(SessionEventSchema, e)).toString("base64")),
      before.map((e) => Buffer.from(toBinary(SessionEventSchema, e)).toString("base64")),
      "the same bytes",
    );
    assert.deepEqual({ ...(await there.getSession(s)).labels }, { exported: "yes" }, "labels are events: they came along");
    const again = await failure(there.importSessions(items));
    assert.equal(again.code, Code.AlreadyExists, "importing again");
    assert.equal(again.method, "ImportSessions");
    // An export's iterator piped straight into an import.
    const piping = await there.importSessions(client.exportSessions([piped]));
    assert.equal(piping.sessions, 1n);
    assert.deepEqual(shape(await replay(there, piped)), shape(await replay(client, piped)));
    // An imported session takes new work: its next turn follows the imported ones.
    const next = await there.followup(piped, "after the import");
    assert.ok(next.seq > piping.events);
    await there.whenIdle(piped);
    assert.deepEqual(replies(await replay(there, piped)).at(-1), "echo: after the import");
  } finally {
    there.close();
    await second.close();
  }
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

test("run: the reply, tool calls and usage of the turn the message ran in; JSON-safe with toJson", async () => {
  const s = newId();
  const plain = await bounded(client.run(s, "hello run", { timeoutMs: 20_000 }), "run");
  assert.equal(plain.turn, 1n);
  assert.equal(plain.text, "echo: hello run");
  assert.equal(plain.reason, "completed");
  assert.deepEqual(plain.toolCalls, []);
  const page = await client.getTranscript(s);
  const end = page.items.find((i) => i.item.case === "turnEnd")?.item;
  assert.ok(end?.case === "turnEnd");
  assert.deepEqual(
    [plain.usage.inputTokens, plain.usage.outputTokens],
    [end.value.usage?.inputTokens ?? 0n, end.value.usage?.outputTokens ?? 0n],
    "the usage the transcript sums for the turn",
  );
  const tools = await bounded(client.run(s, "[[tool:echo from a tool]]", { timeoutMs: 20_000 }), "run with a tool");
  assert.equal(tools.turn, 2n);
  assert.deepEqual(
    tools.toolCalls.map((c) => [c.name, c.arguments, c.output, c.awaitedApproval]),
    [["echo", "from a tool", "from a tool", false]],
  );
  assert.equal(tools.messages.length, 2, "one model message calling the tool, one after its result");
  assert.ok(tools.text.includes("from a tool"), tools.text);
  // JSON.stringify throws on a bigint; toJson writes them as strings, as the protobuf JSON mapping does.
  assert.throws(() => JSON.stringify(tools), TypeError);
  const json = JSON.parse(JSON.stringify(toJson(tools)));
  assert.equal(json.turn, "2");
  assert.equal(json.usage.outputTokens, String(tools.usage.outputTokens));
  const ended = await failure(client.run(newId(), "[[delay:5000]] slow", { timeoutMs: 200 }));
  assert.equal(ended.code, Code.DeadlineExceeded, "a turn that outlasts timeoutMs");
});

test("events: typed text deltas, an approval decided from the stream, tool done and turn done; turnOf a steer", async () => {
  const s = newId();
  await client.configureSession(s, "careful");
  const stream = client.events(s);
  // The generator opens the Watch on its first next(): the configuration is history, then caught_up.
  const opened = await bounded(stream.next(), "caught_up");
  assert.ok(!opened.done);
  /** @type {import("../dist/index.js").TurnEvent[]} */
  const seen = [opened.value];
  const reply = await client.followup(s, "[[tool:echo typed]]");
  for await (const e of stream) {
    seen.push(e);
    if (e.type === "approval") await client.decide(s, e.callId, true);
    if (e.type === "turn_done") break;
  }
  const types = /** @type {string[]} */ (seen.map((e) => e.type));
  assert.equal(types[0], "caught_up");
  for (const t of ["user", "turn_started", "message", "approval", "tool_decided", "tool_done", "turn_done"]) {
    assert.ok(types.includes(t), `a ${t} event in ${types}`);
  }
  const done = seen.find((e) => e.type === "tool_done");
  assert.equal(done?.type === "tool_done" && done.output, "typed");
  const deltas = seen.filter((e) => e.type === "text_delta").map((e) => e.type === "text_delta" && e.text);
  const messages = seen.filter((e) => e.type === "message").map((e) => e.type === "message" && e.text);
  assert.equal(deltas.join(""), messages.join(""), "the deltas concatenate to the messages");
  const last = seen.at(-1);
  assert.ok(last?.type === "turn_done" && last.turn === reply.turn && last.reason === "completed");
  assert.ok(JSON.stringify(toJson(seen)).includes('"type":"turn_done"'));

  // A steer into a running turn gets no turn in its reply; turnOf tells where it ran.
  const r = newId();
  const first = await client.followup(r, "[[delay:1500]] long");
  const id = `steer-${newId()}`;
  const steer = await client.steer(r, "in the same turn", { id });
  assert.equal(steer.turn, undefined, "the reply names no turn for a steer into a running turn");
  assert.equal(await bounded(client.turnOf(r, id, { afterSeq: steer.seq }), "turnOf"), first.turn);
});

test("createWebhook, listWebhooks, deleteWebhook: a signed POST of the tenant's turn/end to a local receiver", async () => {
  /** @type {{ body: string, signature: string, delivery: string }[]} */
  const received = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      received.push({
        body,
        signature: String(req.headers["turnstile-signature"]),
        delivery: String(req.headers["turnstile-delivery"]),
      });
      res.end();
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", () => r(undefined)));
  try {
    const { port } = /** @type {import("node:net").AddressInfo} */ (server.address());
    const s = newId();
    await client.setLabels(s, { hooked: "yes" });
    const hook = await client.createWebhook(`http://127.0.0.1:${port}/hook`, { labelSelector: "hooked=yes" });
    assert.match(hook.id, /^wh_[0-9a-f]{16}$/);
    assert.match(hook.secret, /^whsec_/);
    const listed = await client.listWebhooks();
    assert.ok(listed.webhooks.some((w) => w.id === hook.id && w.secret === ""), "listed without its secret");
    const bad = await failure(client.createWebhook("ftp://example.com/x"));
    assert.equal(bad.code, Code.InvalidArgument);
    assert.ok(bad.details.startsWith("url: "), bad.details);
    await client.run(s, "hello hook", { timeoutMs: 20_000 });
    const post = await eventually(async () => received.find((x) => x.delivery.includes(`/${s}/`)), "a POST");
    const expected = `sha256=${createHmac("sha256", hook.secret).update(post.body).digest("hex")}`;
    assert.equal(post.signature, expected, "signed with the secret createWebhook returned");
    assert.equal(JSON.parse(post.body).event.type, "turn/end");
    const deleted = await client.deleteWebhook(hook.id);
    assert.equal(deleted.id, hook.id);
    assert.equal((await failure(client.deleteWebhook(hook.id))).code, Code.NotFound);
  } finally {
    server.close();
  }
});

test("configureSession with the overrides the agent allows", async () => {
  const name = `ts-${newId().slice(0, 8)}`;
  await client.putAgent(name, { system: "Base.", tools: ["echo", "clock"], overrides: { system_prompt: true, tools: true } });
  const s = newId();
  const refused = await failure(client.configureSession(s, name, { overrides: { model: "large" } }));
  assert.equal(refused.code, Code.FailedPrecondition);
  assert.ok(refused.details.startsWith("overrides.model:"), refused.details);
  const invalid = await failure(client.configureSession(s, name, { overrides: { tools: ["sleep"] } }));
  assert.equal(invalid.code, Code.InvalidArgument);
  const info = await client.configureSession(s, name, { overrides: { systemPrompt: "Extra.", tools: ["echo"] } });
  assert.equal(info.overrides?.systemPrompt, "Extra.");
  assert.deepEqual(info.overrides?.tools?.tools, ["echo"]);
  await client.followup(s, "[[system]] who?");
  await client.whenIdle(s);
  const events = await replay(client, s);
  const reply = events.findLast((e) => e.payload.case === "assistantMessage");
  assert.equal(reply?.payload.case === "assistantMessage" && reply.payload.value.text, "system: Base.\n\nExtra.");
});

test("putAgent, getAgent, listAgents, listAgentVersions, migrateSessions and deleteAgent", async () => {
  const name = `ts-${newId().slice(0, 8)}`;
  const v1 = await client.putAgent(name, 'system = "You are v1."\nversion_policy = "pin"');
  assert.equal(v1.version, 1n);
  assert.equal(v1.versionPolicy, "pin");
  const s = newId();
  assert.equal((await client.configureSession(s, name)).agentVersion, 1n);
  const v2 = await client.putAgent(name, { system: "You are v2.", version_policy: "pin" });
  assert.equal(v2.version, 2n);
  assert.deepEqual((await client.listAgentVersions(name)).versions.map((v) => v.version), [1n, 2n]);
  assert.ok((await client.listAgents()).agents.some((a) => a.name === name));
  assert.equal((await client.getAgent(name, { version: 1n })).definition, '{"system":"You are v1.","version_policy":"pin"}');
  const bad = await failure(client.putAgent(name, { modle: "scripted" }));
  assert.equal(bad.code, Code.InvalidArgument);
  assert.ok(bad.details.startsWith(`agents.${name}.modle: unknown key`), bad.details);
  const moved = await client.migrateSessions(name, 2n, { sessions: [s] });
  assert.deepEqual(moved.migrated.map((x) => x.id), [s]);
  assert.equal((await client.getSession(s)).agentVersion, 2n);
  await client.deleteAgent(name);
  assert.equal((await failure(client.getAgent(name))).code, Code.NotFound);
});

test("memory: put, get, list, search, delete in the tenant's namespaces (SPEC §20)", async () => {
  const ns = `ts${Date.now()}`;
  const put = await client.putMemory(ns, "pets/ada", { fact: "Ada's cat is Turing" });
  assert.equal(put.key, "pets/ada");
  assert.equal(JSON.parse((await client.getMemory(ns, "pets/ada")).document).fact, "Ada's cat is Turing");
  assert.deepEqual((await client.listMemory({ namespace: ns, prefix: "pets/" })).documents.map((d) => d.key), ["pets/ada"]);
  const hits = (await client.searchMemory("turing", { namespaces: [ns] })).hits;
  assert.equal(hits[0]?.document?.key, "pets/ada");
  assert.equal((await client.deleteMemory(ns, "pets/ada")).key, "pets/ada");
  assert.equal((await failure(client.getMemory(ns, "pets/ada"))).code, Code.NotFound);
  assert.equal((await failure(client.putMemory("bad.ns", "k", 1))).code, Code.InvalidArgument);
});

test("evaluate: recorded turns rerun on a changed pinned version, old beside new, scratch sessions gone (SPEC §20)", async () => {
  const name = `ts-eval-${newId().slice(0, 8)}`;
  await client.putAgent(name, 'system = "You are v1."\nversion_policy = "pin"');
  const s = newId();
  await client.configureSession(s, name);
  await client.setLabels(s, { suite: name });
  for (const text of ["[[system]] who?", "plain"]) {
    await client.followup(s, text);
    await client.whenIdle(s, { timeoutMs: 10_000 });
  }
  await client.putAgent(name, 'system = "You are v2."\nversion_policy = "pin"');
  const items = [];
  for await (const item of client.evaluate(name, { labelSelector: `suite=${name}` })) items.push(item.item);
  assert.deepEqual(items.map((i) => i.case), ["started", "row", "row", "summary"]);
  const rows = items.filter((i) => i.case === "row").map((i) => i.value).sort((a, b) => a.index - b.index);
  assert.equal(rows[0].recorded?.text, "system: You are v1.");
  assert.equal(rows[0].candidate?.text, "system: You are v2.");
  assert.equal(rows[0].candidate?.score?.value, 0);
  assert.equal(rows[1].candidate?.text, "echo: plain");
  assert.equal(rows[1].candidate?.score?.passed, true);
  const summary = items[3];
  assert.equal(summary?.case === "summary" && summary.value.scratchDeleted, 2);
  assert.deepEqual((await client.listSessions({ labelSelector: "turnstile/eval" })).sessions, []);
  const bad = await failure((async () => { for await (const _ of client.evaluate("")) { /* none */ } })());
  assert.equal(bad.code, Code.InvalidArgument);
});

test("every RPC of turnstile.v1.Agent was called by the tests above", () => {
  const all = Agent.methods.map((m) => m.name);
  assert.deepEqual(
    all.filter((m) => !called.has(m)),
    [],
    "RPCs no test called",
  );
  assert.equal(all.length, 50);
});
