// The web console in a real browser (tests/tests/console.rs starts `turnstile dev` and chromium, then
// runs this): through the page only, as a person would, it opens a session, sends a followup and sees the
// reply stream in, changes the inbox (queue, replace, remove), cancels a running turn, and approves a
// call that waits for approval (saving a screenshot while it waits, with a followup in the inbox), denies
// another from the tenant's approvals inbox, reads the session's transcript, lists and searches the
// tenant's memory (#/memory) and reads an agent's page (#/agents/NAME: versions, sessions on each). Every
// wait is bounded (playwright's 30 s default); any failure exits non-zero with what the page showed. The last stdout line is a JSON summary the Rust
// test checks against the session's log.
//
// Env: CDP_ENDPOINT (chromium's ws:// DevTools URL), CONSOLE_URL, TURNSTILE_TOKEN, SESSION_ID (the
// session the page drives), LISTED_SESSION (one that already exists), SCREENSHOT (a .png path), AGENT_NAME
// (an API agent with versions 1 and 2), AGENT_V1_SESSION and AGENT_V2_SESSION (a session on each).

import { chromium } from "playwright-core";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (tests/tests/console.rs sets it)`);
  return v;
};
const [cdp, url, token, session, listed, screenshot, agentName, v1Session, v2Session] = [
  "CDP_ENDPOINT", "CONSOLE_URL", "TURNSTILE_TOKEN", "SESSION_ID", "LISTED_SESSION", "SCREENSHOT", "AGENT_NAME", "AGENT_V1_SESSION", "AGENT_V2_SESSION",
].map(env);
const log = (...a) => console.log("browser.mjs:", ...a);

const browser = await chromium.connectOverCDP(cdp);
const context = browser.contexts()[0] ?? (await browser.newContext());
const page = await context.newPage();
await page.setViewportSize({ width: 1280, height: 1000 });
const pageErrors = [];
page.on("pageerror", (e) => pageErrors.push(String(e)));
page.on("console", (m) => m.type() === "error" && pageErrors.push(`console: ${m.text()}`));

async function main() {
  await page.goto(url);
  // The token field: saved in this browser, sent with every call.
  await page.fill("#token", token);
  await page.click("#save-settings");
  // The tenant's sessions (the token names the tenant): the one that exists, idle, with its agent.
  const row = page.locator(`#sessions tr[data-session="${listed}"]`);
  await row.filter({ hasText: "idle" }).filter({ hasText: "careful" }).filter({ hasText: "team=blue" }).waitFor();
  if (pageErrors.length) throw new Error(`the sessions page failed: ${pageErrors.join("; ")}`);
  // The list's filters (SPEC §16): a selector the listed session does not match empties the list.
  await page.fill("#filter-labels", "team=red");
  await page.click("#apply-filters");
  await page.locator("#sessions td", { hasText: "no session matches these filters" }).waitFor();
  await page.fill("#filter-labels", "team=blue");
  await page.click("#apply-filters");
  await row.waitFor();
  // Its page shows its schedule and the next firing (SPEC §15).
  await row.locator("a").first().click();
  await page.locator('#schedules li[data-schedule="daily"] .next', { hasText: "next:" }).waitFor();
  await page.locator("#labels", { hasText: "team=blue" }).waitFor();
  await page.goto(url);
  await page.fill("#open-id", session);
  await page.click("#open");
  await page.locator("#status", { hasText: "new session" }).waitFor();

  const send = async (preset, text) => {
    await page.selectOption("#preset", preset);
    await page.fill("#message", text);
    await page.click("#send");
    await page.locator("#result", { hasText: `${preset}: accepted` }).waitFor();
  };
  const turnEnd = (turn, text) => page.locator(`.turn[data-turn="${turn}"] .turn-end`, { hasText: text }).waitFor();

  // 1. A followup whose reply streams slowly: the deltas arrive before the durable message.
  await send("followup", "[[delay:1500]] [[usage:12,3]] hello from the browser");
  const reply = page.locator('.step[data-step="1.1"] .assistant:not(.streaming)');
  await reply.waitFor();
  await turnEnd(1, "completed");
  const replyText = await reply.locator(".text").innerText();
  const deltas = Number(await reply.getAttribute("data-deltas"));
  // The step's usage and the session's tokens (SPEC §17).
  await reply.locator(".usage", { hasText: "12 in / 3 out tokens" }).waitFor();
  await page.locator("#tokens", { hasText: "tokens 12 in / 3 out" }).waitFor();
  log(`turn 1 reply after ${deltas} deltas: ${JSON.stringify(replyText)}`);

  // 2. The inbox: queue waits in next-turn; replace keeps the id with new text; remove discards.
  await send("queue", "queued first");
  const pending = page.locator("#inbox-next-turn li[data-id]");
  await pending.filter({ hasText: "queued first" }).waitFor();
  const queuedId = await pending.first().getAttribute("data-id");
  await pending.first().locator("button.edit").click();
  await pending.first().locator("textarea.replacement").fill("queued, then replaced");
  await pending.first().locator("button.save").click();
  await page.locator(`#inbox-next-turn li[data-id="${queuedId}"]`, { hasText: "queued, then replaced" }).waitFor();
  await send("queue", "queued to remove");
  const doomed = pending.filter({ hasText: "queued to remove" });
  await doomed.waitFor();
  const removedId = await doomed.getAttribute("data-id");
  await doomed.locator("button.remove").click();
  await page.locator(`#inbox-next-turn li[data-id="${removedId}"]`).waitFor({ state: "detached" });
  // A followup wakes the session: the replaced message runs as turn 2, the followup as turn 3.
  await send("followup", "after the queue");
  await turnEnd(3, "completed");
  await page.locator("#inbox-next-turn li.empty").waitFor();

  // 3. Cancel a running turn: a 60 s sleep tool call, cancelled from the page.
  await send("followup", "[[tool:sleep 60000]] a long one");
  await page.locator('.turn[data-turn="4"] .tool.running').waitFor();
  await page.click("#cancel");
  await turnEnd(4, "aborted{user}");

  // 4. Approve a call that waits for approval (the agent's profile gates `echo`).
  await send("followup", "[[tool:echo approved in the browser]] please");
  const approval = page.locator("#approvals li[data-call]");
  await approval.waitFor();
  const callId = await approval.getAttribute("data-call");
  await page.locator(`.tool.awaiting-approval[data-call="${callId}"]`).waitFor();
  await page.locator("#status", { hasText: "running · awaiting approval" }).waitFor();
  // While the call waits, a followup joins the inbox; the screenshot shows both.
  await send("followup", "and then summarise");
  await pending.filter({ hasText: "and then summarise" }).waitFor();
  if (pageErrors.length) throw new Error(`the page reported errors: ${pageErrors.join("; ")}`);
  await page.screenshot({ path: screenshot, fullPage: true });
  log(`screenshot: ${screenshot}`);
  await approval.locator("button.approve").click();
  await page.locator(`.tool.done[data-call="${callId}"] .result`, { hasText: "approved in the browser" }).waitFor();
  await turnEnd(5, "completed");
  await turnEnd(6, "completed");
  await page.locator("#approvals li.empty").waitFor();
  await page.locator("#inbox-next-turn li.empty").waitFor();
  await page.locator("#status", { hasText: "idle" }).waitFor();
  // The tenant's tokens today, on the sessions page.
  await page.click('.session-head a[href="#/"]');
  await page.locator("#tenant-usage", { hasText: "15 tokens today (UTC)" }).waitFor();

  // 5. The tenant's approvals inbox (SPEC §21): a call waiting in this session, denied from #/approvals.
  await page.goto(`${url}#/s/${encodeURIComponent(session)}`);
  await page.locator("#status", { hasText: "idle" }).waitFor();
  await send("followup", "[[tool:echo from the inbox]] once more");
  await page.locator("#approvals li[data-call]").waitFor();
  await page.click("#nav-approvals");
  const inboxRow = page.locator(`#tenant-approvals tr[data-session="${session}"]`);
  await inboxRow.filter({ hasText: "from the inbox" }).filter({ hasText: "waits for a person" }).waitFor();
  const deniedCall = await inboxRow.getAttribute("data-call");
  await inboxRow.locator("input.reason").fill("not from the inbox");
  await inboxRow.locator("button.deny").click();
  await page.locator("#tenant-approvals tr.empty", { hasText: "no call is waiting" }).waitFor();

  // 6. The transcript (SPEC §21), linked from the session's page: the denial with its reason, every turn's end.
  await page.goto(`${url}#/s/${encodeURIComponent(session)}`);
  await page.locator(".turn[data-turn=\"7\"] .turn-end", { hasText: "completed" }).waitFor();
  await page.click("#transcript-link");
  await page.locator(`#transcript li[data-kind="tool-decision"][data-call="${deniedCall}"]`, { hasText: "denied: not from the inbox" }).waitFor();
  await page.locator('#transcript li[data-kind="turn-end"]').nth(6).waitFor();
  const transcriptSeqs = await page.locator("#transcript li[data-seq]").evaluateAll((els) => els.map((e) => Number(e.getAttribute("data-seq"))));

  // 7. The tenant's memory (SPEC §20): the document the test put, listed, found by a word, and not by another.
  await page.click("#memory-link");
  const gate = page.locator('#memory tr[data-key="notes/gate"]');
  await gate.filter({ hasText: "north gate opens at dawn" }).filter({ hasText: "API" }).waitFor();
  await page.fill("#memory-query", "dawn");
  await page.click("#memory-search-button");
  await gate.waitFor();
  await page.fill("#memory-query", "zebra");
  await page.click("#memory-search-button");
  await page.locator("#memory td", { hasText: "nothing matches these words" }).waitFor();

  // 8. An agent's page (SPEC §20), from the agents list: both versions, the newest marked, each with the
  // session that recorded it.
  await page.click("#nav-agents");
  await page.locator(`#agents tr[data-agent="${agentName}"]`, { hasText: "v2" }).locator("a").click();
  await page.locator("#agent-summary", { hasText: "2 versions, put through the API" }).waitFor();
  const versionRow = (v) => page.locator(`#agent-versions tr[data-version="${v}"]`);
  await versionRow(1).locator("a.session", { hasText: v1Session }).waitFor();
  await versionRow(2).locator("a.session", { hasText: v2Session }).waitFor();
  await versionRow(2).filter({ hasText: "(newest)" }).filter({ hasText: "pin" }).waitFor();
  const onV1 = await versionRow(1).locator("a.session").allInnerTexts();
  const onV2 = await versionRow(2).locator("a.session").allInnerTexts();
  // A session's link opens its page.
  await versionRow(1).locator("a.session").first().click();
  await page.locator("#agent", { hasText: `agent ${agentName} v1` }).waitFor();
  if (pageErrors.length) throw new Error(`the page reported errors: ${pageErrors.join("; ")}`);
  console.log(JSON.stringify({ replyText, deltas, queuedId, removedId, callId, deniedCall, transcriptSeqs, onV1, onV2 }));
}

try {
  await main();
} catch (e) {
  console.error(`browser.mjs: ${e.stack ?? e}`);
  if (pageErrors.length) console.error(`page errors: ${pageErrors.join("; ")}`);
  try {
    console.error(`the page showed:\n${await page.locator("body").innerText()}`);
    await page.screenshot({ path: screenshot.replace(/\.png$/, "-failed.png"), fullPage: true });
  } catch {}
  process.exitCode = 1;
} finally {
  await browser.close();
}
