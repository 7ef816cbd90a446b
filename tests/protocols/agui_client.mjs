// AG-UI of Turnstile (docs/PROTOCOLS.md) through the unmodified `@ag-ui/client` HttpAgent, installed by
// scripts/setup-test-deps into .ci/node (tests/tests/agui_client.rs runs it with AGUI_NODE_MODULES naming that
// node_modules, AGUI_URL the server's base URL, TOKEN_A and TOKEN_B; on a cluster AGUI_URL_OTHER names a
// second gateway, which answers the tool call, the interrupt and the reconnect, and TOKEN_B is unset as auth is
// off). The scripted agent answers
// `echo: <text>` and obeys its directives (`[[tool:NAME ARGS]]` calls a tool, `[[delay:MS]]` streams slowly).
// Exits non-zero with the failed check's message.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createRequire } from "node:module";

const { HttpAgent } = createRequire(`${process.env.AGUI_NODE_MODULES}/`)("@ag-ui/client");

const base = process.env.AGUI_URL;
const other = process.env.AGUI_URL_OTHER ?? base;
/** The next runs of `agent` go through the other gateway (the same one off a cluster). */
const moveToOther = (agent) => {
  agent.url = agent.url.replace(base, other);
};
const agentOf = (name, { threadId = randomUUID(), token = process.env.TOKEN_A, fetch } = {}) =>
  new HttpAgent({ url: `${base}/ag-ui/${name}`, threadId, headers: { Authorization: `Bearer ${token}` }, fetch });

/** Runs `agent` once; the events it received, in order. */
async function run(agent, params = {}) {
  const events = [];
  await agent.runAgent({ runId: randomUUID(), ...params }, { onEvent: ({ event }) => events.push(event) });
  return events;
}

const types = (events) => events.map((e) => e.type);
const post = (name, body, token = process.env.TOKEN_A) =>
  fetch(`${base}/ag-ui/${name}`, {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
const say = (agent, content) => agent.addMessage({ id: randomUUID(), role: "user", content });
const last = (agent, role) => agent.messages.filter((m) => m.role === role).at(-1);

// 1. A run with text: a turn's steps and its reply, streamed; the next run resends the history, which adds
// nothing twice; a join (a new client of the same thread, nothing to send) gets the thread as a snapshot.
{
  const agent = agentOf("scripted");
  say(agent, "hello agui");
  const events = await run(agent);
  assert.deepEqual(
    types(events).filter((t) => t !== "TEXT_MESSAGE_CONTENT"),
    ["RUN_STARTED", "STEP_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_END", "STEP_FINISHED", "RUN_FINISHED"],
  );
  assert.equal(events.at(0).threadId, agent.threadId);
  assert.equal(events.at(-1).outcome.type, "success");
  assert.equal(last(agent, "assistant").content, "echo: hello agui");
  say(agent, "second");
  await run(agent);
  assert.equal(last(agent, "assistant").content, "echo: second");
  const joined = agentOf("scripted", { threadId: agent.threadId });
  const join = await run(joined);
  assert.deepEqual(types(join), ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]);
  assert.deepEqual(
    joined.messages.map((m) => [m.role, m.content]),
    [["user", "hello agui"], ["assistant", "echo: hello agui"], ["user", "second"], ["assistant", "echo: second"]],
  );
  // Another tenant's thread of the same id is another thread: it sees nothing of this one.
  if (process.env.TOKEN_B) {
    const stranger = agentOf("scripted", { threadId: agent.threadId, token: process.env.TOKEN_B });
    await run(stranger);
    assert.deepEqual(stranger.messages, []);
  }
}

// 2. A frontend tool: a client tool of the turn. The run ends with the call pending; the tool message of the
// next run answers it in the same turn, which then goes on.
{
  const tools = [{ name: "get_weather", description: "The weather in a city today.",
                   parameters: { type: "object", properties: { city: { type: "string" } } } }];
  const agent = agentOf("scripted");
  say(agent, '[[tool:get_weather {"city": "Paris"}]] weather?');
  const events = await run(agent, { tools });
  assert.deepEqual(types(events).slice(-5), ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "STEP_FINISHED",
                                              "RUN_FINISHED"]);
  const start = events.find((e) => e.type === "TOOL_CALL_START");
  assert.equal(start.toolCallName, "get_weather");
  assert.deepEqual(events.at(-1).outcome.pendingToolCallIds, [start.toolCallId]);
  const call = last(agent, "assistant").toolCalls.at(-1);
  assert.equal(call.function.arguments, '{"city": "Paris"}');
  // New input that does not answer the call is refused, naming what the thread waits for.
  const early = await post("scripted", {
    threadId: agent.threadId, runId: randomUUID(), tools,
    messages: [...agent.messages, { id: randomUUID(), role: "user", content: "never mind" }],
  });
  assert.equal(early.status, 409);
  const refusal = (await early.json()).error;
  assert.equal(refusal.param, "messages");
  assert.ok(refusal.message.includes(call.id), refusal.message);
  agent.addMessage({ id: randomUUID(), role: "tool", toolCallId: call.id, content: "sunny" });
  moveToOther(agent);
  const answered = await run(agent, { tools });
  assert.equal(answered.at(-1).type, "RUN_FINISHED");
  assert.equal(answered.at(-1).outcome.type, "success");
  assert.equal(last(agent, "assistant").content, "tool results: get_weather: sunny");
  // Only one tool message: the client's own.
  assert.equal(agent.messages.filter((m) => m.role === "tool").length, 1);
}

// 3. An approval: the run ends with an interrupt outcome; the next run's `resume` answers it, and the tool
// runs in the same turn.
{
  const agent = agentOf("guarded");
  say(agent, "[[tool:echo approved text]] go");
  const events = await run(agent);
  const outcome = events.at(-1).outcome;
  assert.equal(outcome.type, "interrupt");
  assert.equal(outcome.interrupts.length, 1);
  const interrupt = outcome.interrupts[0];
  assert.equal(interrupt.reason, "tool_approval");
  assert.deepEqual(agent.pendingInterrupts.map((i) => i.id), [interrupt.id]);
  moveToOther(agent);
  const resumed = await run(agent, {
    resume: [{ interruptId: interrupt.id, status: "resolved", payload: { approved: true } }],
  });
  const result = resumed.find((e) => e.type === "TOOL_CALL_RESULT");
  assert.equal(result.toolCallId, interrupt.toolCallId);
  assert.equal(result.content, "approved text");
  assert.equal(resumed.at(-1).outcome.type, "success");
  assert.equal(last(agent, "assistant").content, "tool results: echo: approved text");
}

// 4. A reconnect mid-run: the connection ends after the first text delta (a fetch that cuts the body there),
// and the same run is asked for again with the last SSE id as `Last-Event-ID`: the rest arrives, nothing lost
// and nothing twice.
{
  let lastId;
  const cutting = async (url, init) => {
    const response = await fetch(url, init);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    const body = new ReadableStream({
      async pull(controller) {
        const { done, value } = await reader.read();
        if (done) return controller.close();
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, end + 2);
          buffer = buffer.slice(end + 2);
          controller.enqueue(new TextEncoder().encode(frame));
          const id = frame.match(/^id: (.*)$/m);
          if (id) lastId = id[1];
          if (frame.includes('"TEXT_MESSAGE_CONTENT"')) {
            // The connection ends here, before the run does.
            reader.cancel();
            return controller.close();
          }
        }
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
  const threadId = randomUUID();
  const agent = agentOf("scripted", { threadId, fetch: cutting });
  say(agent, "[[delay:1500]] a reply long enough to be cut in the middle");
  const runId = randomUUID();
  const cut = [];
  await agent.runAgent({ runId }, { onEvent: ({ event }) => cut.push(event) });
  assert.equal(cut.at(-1).type, "TEXT_MESSAGE_CONTENT");
  const partial = last(agent, "assistant").content;
  assert.ok(partial.length > 0 && partial.length < "echo: a reply long enough to be cut in the middle".length,
            `partial: ${partial}`);
  assert.ok(lastId, "the stream carries SSE ids");
  const again = agentOf("scripted", { threadId });
  moveToOther(again);
  again.messages = agent.messages;
  again.headers = { ...again.headers, "Last-Event-ID": lastId };
  const rest = [];
  await again.runAgent({ runId }, { onEvent: ({ event }) => rest.push(event) });
  assert.equal(rest[0].type, "RUN_STARTED");
  assert.equal(rest.at(-1).type, "RUN_FINISHED");
  assert.equal(last(again, "assistant").content, "echo: a reply long enough to be cut in the middle");
  assert.equal(again.messages.filter((m) => m.role === "assistant").length, 1);
}

// 5. Bad input: the field at fault is named.
{
  const response = await post("scripted", { runId: "r", messages: [] });
  assert.equal(response.status, 400);
  assert.equal((await response.json()).error.param, "threadId");
  const badRole = await post("scripted", { threadId: randomUUID(), runId: "r", messages: [{ id: "m", role: "robot" }] });
  assert.equal(badRole.status, 400);
  assert.equal((await badRole.json()).error.param, "messages[0].role");
  const unknown = await post("nope", { threadId: "t", runId: "r", messages: [] });
  assert.equal(unknown.status, 404);
  if (process.env.TOKEN_B) {
    const badToken = await post("scripted", { threadId: "t", runId: "r", messages: [] }, "not-a-token");
    assert.equal(badToken.status, 401);
  }
}

console.log("all checks passed");
