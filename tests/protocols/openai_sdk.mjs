// The OpenAI Responses API of Turnstile through the official `openai` npm package, unmodified
// installed by scripts/setup-test-deps into .ci/node (tests/tests/openai_sdk.rs runs it with OPENAI_NODE_MODULES
// naming that node_modules, OPENAI_BASE_URL, TOKEN_A, TOKEN_B). Exits non-zero with the failed check's message.
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const OpenAI = createRequire(`${process.env.OPENAI_NODE_MODULES}/`)("openai");

const client = (token = process.env.TOKEN_A) =>
  new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: token, maxRetries: 0 });

const models = [];
for await (const m of client().models.list()) models.push(m.id);
assert.ok(models.includes("scripted"), `models: ${models}`);

const r = await client().responses.create({ model: "scripted", input: "hello from node" });
assert.equal(r.status, "completed");
assert.equal(r.output_text, "echo: hello from node");

// A stream's text deltas make the reply; sequence numbers rise and are safe JavaScript integers.
const stream = await client().responses.create({ model: "scripted", input: "[[delay:200]] node stream", stream: true });
let text = "";
let last = -1;
let final;
for await (const event of stream) {
  assert.ok(Number.isSafeInteger(event.sequence_number) && event.sequence_number > last, `${event.sequence_number}`);
  last = event.sequence_number;
  if (event.type === "response.output_text.delta") text += event.delta;
  if (event.type === "response.completed") final = event.response;
}
assert.equal(text, "echo: node stream");
assert.equal(final.output[0].content[0].text, text);

// Resume a background response after its first delta: the rest, once.
const bg = await client().responses.create({ model: "scripted", input: "[[delay:800]] resumed in node", background: true });
const firstPart = [];
for await (const event of await client().responses.retrieve(bg.id, { stream: true })) {
  firstPart.push(event);
  if (event.type === "response.output_text.delta") break;
}
const rest = [];
const after = firstPart.at(-1).sequence_number;
for await (const event of await client().responses.retrieve(bg.id, { stream: true, starting_after: after })) rest.push(event);
const all = [...firstPart, ...rest];
const deltas = all.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join("");
assert.equal(deltas, "echo: resumed in node");
assert.equal(all.at(-1).type, "response.completed");

// Errors in OpenAI's shape become the SDK's typed errors.
await assert.rejects(client().responses.create({ model: "nope", input: "x" }), (e) => e.status === 404 && e.code === "model_not_found");
await assert.rejects(client("bad-token").responses.create({ model: "scripted", input: "x" }), (e) => e.status === 401);
await assert.rejects(client(process.env.TOKEN_B).responses.retrieve(r.id), (e) => e.status === 404);

// Conversations.
const conv = await client().conversations.create({ metadata: { app: "node" } });
await client().responses.create({ model: "scripted", input: "in a conversation", conversation: conv.id });
const items = await client().conversations.items.list(conv.id, { order: "asc" });
assert.deepEqual(items.data.map((i) => i.content[0].text), ["in a conversation", "echo: in a conversation"]);

// A function tool round trip: the response ends at the call, the next request's output answers it.
const tools = [{ type: "function", name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } }];
const asked = await client().responses.create({ model: "scripted", tools, input: '[[tool:get_weather {"city": "Rome"}]] go' });
const fc = asked.output.at(-1);
assert.equal(fc.type, "function_call");
assert.equal(fc.name, "get_weather");
const answered = await client().responses.create({
  model: "scripted",
  previous_response_id: asked.id,
  input: [{ type: "function_call_output", call_id: fc.call_id, output: "warm" }],
});
assert.equal(answered.output_text, "tool results: get_weather: warm");

console.log("openai npm: all checks passed");
