// A chat app on @turnstile/client (issue 41): it renders a session's history from its transcript
// (GetTranscript), sends each line of stdin as a followup and streams the reply with typed events, and
// answers the tool calls waiting for approval from the approvals inbox (ListPendingApprovals, Decide).
//
//   node examples/chat.mjs SESSION [--agent NAME] [--deny] < lines   # TURNSTILE_ADDR=host:port, TURNSTILE_TOKEN=...
//
// `--agent` configures a new session to run agent NAME; `--deny` denies the calls waiting for approval
// (the default approves them).
//
// Every line it prints is one of: `you: TEXT`, `assistant: TEXT` (streamed), `tool NAME(ARGS)`,
// `approval: NAME(ARGS) approved|denied`, `  -> OUTPUT`, `[turn N REASON]`; the history uses the same.

import { createInterface } from "node:readline";
import { Code, TurnstileClient, TurnstileError, textOf } from "@turnstile/client";

const [session, ...flags] = process.argv.slice(2);
if (!session) {
  console.error("usage: node chat.mjs SESSION [--agent NAME] [--deny] < lines");
  process.exit(2);
}
const approve = !flags.includes("--deny");
const agent = flags.includes("--agent") ? flags[flags.indexOf("--agent") + 1] : undefined;
const client = new TurnstileClient({
  address: process.env.TURNSTILE_ADDR ?? "127.0.0.1:7400",
  token: process.env.TURNSTILE_TOKEN,
});

/** The calls that waited for approval, by call id, so that their decision names them. */
const waited = new Map();

/**
 * One transcript item as a line (or none): the lines the live part prints for the same events.
 * @param {import("@turnstile/client").TranscriptItem} item
 */
function historyLine(item) {
  const it = item.item;
  switch (it.case) {
    case "user":
      return `you: ${textOf(it.value.message)}`;
    case "assistant":
      return it.value.text ? `assistant: ${it.value.text}` : undefined;
    case "toolCall":
      if (!it.value.awaitingApproval) return `tool ${it.value.name}(${it.value.arguments})`;
      waited.set(it.value.callId, `${it.value.name}(${it.value.arguments})`);
      return undefined;
    case "toolDecision":
      return `approval: ${waited.get(it.value.callId)} ${it.value.approved ? "approved" : "denied"}`;
    case "toolResult":
      return `  -> ${it.value.error ?? it.value.output}`;
    case "turnEnd":
      return `[turn ${item.turn} ${it.value.reason?.reason.case ?? "ended"}]`;
    default:
      return undefined;
  }
}

/** Prints the session's history, page after page; answers the seq to follow on from. */
async function history() {
  let afterSeq = 0n;
  for (;;) {
    let page;
    try {
      page = await client.getTranscript(session, { afterSeq });
    } catch (e) {
      if (e instanceof TurnstileError && e.code === Code.NotFound) {
        console.log("(a new session)");
        // Its first event: the agent it runs.
        return agent ? (await client.configureSession(session, agent)).lastSeq : 0n;
      }
      throw e;
    }
    for (const item of page.items) {
      const line = historyLine(item);
      if (line !== undefined) console.log(line);
    }
    if (page.nextSeq === 0n) return page.lastSeq;
    afterSeq = page.nextSeq;
  }
}

/** Decides every call the session's approvals inbox lists. */
async function answerApprovals() {
  const { approvals } = await client.listPendingApprovals({ session });
  for (const a of approvals) {
    await client.decide(session, a.callId, approve, { reason: approve ? "approved in chat" : "denied in chat" });
    console.log(`approval: ${a.tool}(${a.arguments}) ${approve ? "approved" : "denied"}`);
  }
}

const lastSeq = await history();
const events = client.events(session, { afterSeq: lastSeq });
await events.next(); // caught_up: the stream is open before the first line is sent
const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const text of lines) {
  if (!text.trim()) continue;
  const id = crypto.randomUUID();
  await client.followup(session, text, { id });
  console.log(`you: ${text}`);
  let turn; // the turn this line runs in: known once its message entered one
  let streaming = false;
  // next() rather than `for await`, whose `break` would close the stream the next line needs.
  for (let next = await events.next(); !next.done; next = await events.next()) {
    const event = next.value;
    if (event.type === "user" && event.id === id) turn = event.turn;
    if (turn === undefined || !("turn" in event) || event.turn !== turn) continue;
    if (event.type === "text_delta" && !event.reasoning) {
      if (!streaming) process.stdout.write("assistant: ");
      process.stdout.write(event.text);
      streaming = true;
    } else if (event.type === "message") {
      if (streaming) process.stdout.write("\n");
      else if (event.text) console.log(`assistant: ${event.text}`);
      streaming = false;
    } else if (event.type === "tool_started") {
      console.log(`tool ${event.name}(${event.arguments})`);
    } else if (event.type === "approval") {
      await answerApprovals();
    } else if (event.type === "tool_done") {
      console.log(`  -> ${event.error ?? event.output}`);
    } else if (event.type === "turn_done") {
      console.log(`[turn ${event.turn} ${event.reason}]`);
      break;
    }
  }
}
await events.return();
client.close();
