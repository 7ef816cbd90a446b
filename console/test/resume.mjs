// The web console keeps a streaming reply across a page reload and a dropped connection (SPEC §14), in a
// real browser (tests/tests/console.rs starts `turnstile dev` and chromium, then runs this). The page is
// served through a TCP proxy started here, so the script can cut the page's connections. It sends a slow
// followup; mid-reply it reloads the page, which must show the partial text at once (the server sends the
// output so far right after caught_up) and keep streaming; then it cuts the connections, and the page's
// reopened Watch must go on from the bytes it shows: every text the step ever showed is a prefix of the
// durable reply (nothing repeated, nothing skipped). Every wait is bounded (playwright's 30 s default).
// The last stdout line is a JSON summary the Rust test checks against the session's log.
//
// Env: CDP_ENDPOINT (chromium's ws:// DevTools URL), CONSOLE_URL (the dev server's HTTP address), SESSION_ID.

import net from "node:net";
import { chromium } from "playwright-core";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (tests/tests/console.rs sets it)`);
  return v;
};
const [cdp, consoleUrl, session] = ["CDP_ENDPOINT", "CONSOLE_URL", "SESSION_ID"].map(env);
const log = (...a) => console.log("resume.mjs:", ...a);
/** Streamed by the scripted model in ten deltas over eight seconds: time for a reload and a reconnect, with
 * seconds to spare on a busy machine. */
const REPLY = "[[delay:8000]] héllo wörld, a reply that streams across a reload and a dropped connection 🎉";

/** A TCP proxy in front of the dev server's HTTP port; `cut()` destroys every connection it carries. */
function proxy(target) {
  const { hostname, port } = new URL(target);
  const sockets = new Set();
  let accepted = 0;
  const server = net.createServer((down) => {
    accepted += 1;
    const up = net.connect(Number(port), hostname);
    for (const s of [down, up]) {
      sockets.add(s);
      s.on("error", () => {});
      s.on("close", () => {
        sockets.delete(s);
        down.destroy();
        up.destroy();
      });
    }
    down.pipe(up);
    up.pipe(down);
  });
  return {
    start: () => new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(`http://127.0.0.1:${server.address().port}/`))),
    cut: () => sockets.forEach((s) => s.destroy()),
    accepted: () => accepted,
    close: () => {
      sockets.forEach((s) => s.destroy());
      server.close();
    },
  };
}

// Records every state of step 1.1's reply as the page shows it (reset by each load of the page).
const record = () => {
  window.__shown = [];
  new MutationObserver(() => {
    const el = document.querySelector('.step[data-step="1.1"] .assistant');
    if (!el) return;
    const shown = { text: el.querySelector(".text")?.textContent ?? "", streaming: el.classList.contains("streaming") };
    const last = window.__shown.at(-1);
    if (!last || last.text !== shown.text || last.streaming !== shown.streaming) window.__shown.push(shown);
  }).observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
};

const relay = proxy(consoleUrl);
const url = await relay.start();
const browser = await chromium.connectOverCDP(cdp);
const context = browser.contexts()[0] ?? (await browser.newContext());
const page = await context.newPage();
const pageErrors = [];
page.on("pageerror", (e) => pageErrors.push(String(e)));
await page.addInitScript(record);

const streamingReply = page.locator('.step[data-step="1.1"] .assistant.streaming');
const finalReply = page.locator('.step[data-step="1.1"] .assistant:not(.streaming)');
const streamedText = async () => (await streamingReply.locator(".text").textContent()) ?? "";
/** Waits (bounded) until the streaming reply shows more than `n` characters; returns what it shows. */
async function longerThan(n, what) {
  await page.waitForFunction(
    (n) => (document.querySelector('.step[data-step="1.1"] .assistant.streaming .text')?.textContent?.length ?? 0) > n,
    n,
    { timeout: 30_000 },
  ).catch((e) => {
    throw new Error(`${what}: ${e.message}`);
  });
  return streamedText();
}

async function main() {
  await page.goto(`${url}#/s/${encodeURIComponent(session)}`);
  await page.locator("#status", { hasText: "new session" }).waitFor();
  await page.selectOption("#preset", "followup");
  await page.fill("#message", REPLY);
  await page.click("#send");
  await page.locator("#result", { hasText: "followup: accepted" }).waitFor();

  // Mid-reply: three deltas shown, then a reload.
  await page.waitForFunction(() => Number(document.querySelector('.step[data-step="1.1"] .assistant.streaming')?.getAttribute("data-deltas") ?? 0) >= 3);
  const beforeReload = await streamedText();
  log(`before the reload: ${JSON.stringify(beforeReload)}`);
  await page.reload();
  await streamingReply.waitFor();
  const afterReload = await page.evaluate(() => window.__shown.find((s) => s.text !== "")?.text ?? "");
  log(`first text after the reload: ${JSON.stringify(afterReload)}`);

  // One more live delta, then the page's connections are cut: its Watch reopens with what it shows.
  const beforeCut = await longerThan(afterReload.length, "a live delta after the reload");
  const acceptedBeforeCut = relay.accepted();
  relay.cut();
  log(`cut at ${JSON.stringify(beforeCut)}`);
  const afterCut = await longerThan(beforeCut.length, "the reply streaming on after the cut");
  log(`streaming after the cut: ${JSON.stringify(afterCut)}`);
  await finalReply.waitFor();
  const replyText = (await finalReply.locator(".text").textContent()) ?? "";
  const shown = await page.evaluate(() => window.__shown);
  if (pageErrors.length) throw new Error(`the page reported errors: ${pageErrors.join("; ")}`);
  console.log(
    JSON.stringify({ beforeReload, afterReload, beforeCut, afterCut, replyText, shown, reconnected: relay.accepted() > acceptedBeforeCut }),
  );
}

try {
  await main();
} catch (e) {
  console.error(`resume.mjs: ${e.stack ?? e}`);
  if (pageErrors.length) console.error(`page errors: ${pageErrors.join("; ")}`);
  try {
    console.error(`the page showed:\n${await page.locator("body").innerText()}`);
    console.error(`states of the reply since the last load: ${JSON.stringify(await page.evaluate(() => window.__shown))}`);
  } catch {}
  process.exitCode = 1;
} finally {
  await browser.close();
  relay.close();
}
