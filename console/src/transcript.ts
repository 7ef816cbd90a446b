// One session's transcript (#/s/ID/transcript, SPEC §21): the conversation as `GetTranscript` folds it
// from the log — user messages with their delivery and source, replies, tool calls, decisions, results and
// turn ends with their usage — each with the seq of its event, read page after page. A static read: the
// session page (session.ts) is the live view.

import { client, describe, sessionRef, sourceOf, textOf, when } from "./api";
import { byId, fill, h } from "./dom";
import { reason } from "./timeline";
import { DeliveryKind, type TranscriptItem } from "@turnstile/client/browser";

const PAGE_SIZE = 500;

function delivery(d: DeliveryKind): string {
  switch (d) {
    case DeliveryKind.FOLLOWUP:
      return "followup";
    case DeliveryKind.QUEUE:
      return "queue";
    case DeliveryKind.STEER:
      return "steer";
    case DeliveryKind.INJECT:
      return "inject";
    default:
      return "delivered";
  }
}

function itemView(t: TranscriptItem): HTMLElement {
  const at = `${t.turn}.${t.step}`;
  const head = (kind: string, what: string) =>
    h("div", { class: "step-head muted" }, `#${t.seq} · ${kind} · turn ${at} · ${what}`);
  const it = t.item;
  switch (it.case) {
    case "user":
      return h("li", { class: "item user", "data-seq": String(t.seq), "data-kind": "user" },
        head("user", `${delivery(it.value.delivery)} from ${sourceOf(it.value.message)}`),
        h("pre", { class: "text" }, textOf(it.value.message)));
    case "assistant": {
      const u = it.value.usage;
      return h("li", { class: "item assistant", "data-seq": String(t.seq), "data-kind": "assistant" },
        head("assistant", u ? `${u.inputTokens} in / ${u.outputTokens} out tokens` : "reply"),
        it.value.reasoning ? h("details", { class: "reasoning" }, h("summary", {}, "reasoning"), h("pre", {}, it.value.reasoning)) : null,
        h("pre", { class: "text" }, it.value.text));
    }
    case "toolCall":
      return h("li", { class: "item tool", "data-seq": String(t.seq), "data-kind": "tool-call", "data-call": it.value.callId },
        head("tool call", it.value.awaitingApproval ? "awaiting approval" : it.value.awaitingClient ? "answered by the client" : "ran"),
        h("pre", {}, `${it.value.name}(${it.value.arguments})`));
    case "toolDecision":
      return h("li", { class: "item tool", "data-seq": String(t.seq), "data-kind": "tool-decision", "data-call": it.value.callId },
        head("decision", it.value.timedOut ? "by its deadline" : "by a person"),
        h("div", {}, `${it.value.approved ? "approved" : "denied"}${it.value.reason ? `: ${it.value.reason}` : ""}`));
    case "toolResult":
      return h("li", { class: "item tool", "data-seq": String(t.seq), "data-kind": "tool-result", "data-call": it.value.callId },
        head("tool result", it.value.name),
        h("pre", { class: it.value.error === undefined ? "result" : "result error" }, it.value.error ?? it.value.output));
    case "turnEnd": {
      const u = it.value.usage;
      return h("li", { class: "item turn-end-item", "data-seq": String(t.seq), "data-kind": "turn-end" },
        head("turn end", u ? `${u.inputTokens} in / ${u.outputTokens} out tokens` : ""),
        h("span", { class: "turn-end" }, reason(it.value.reason)));
    }
    default:
      return h("li", { class: "item muted", "data-seq": String(t.seq) }, head("item", "not shown by this console"));
  }
}

export function transcriptPage(root: HTMLElement, id: string): () => void {
  fill(root,
    h("section", { id: "transcript-page", "data-session": id },
      h("header", { class: "session-head" },
        h("a", { href: `#/s/${encodeURIComponent(id)}` }, "← live view"),
        h("h2", {}, `${id}: transcript`),
        h("span", { id: "transcript-count", class: "muted" })),
      h("div", { id: "transcript-error", class: "error" }),
      h("ol", { id: "transcript", class: "list" })));
  let stopped = false;
  const load = async () => {
    try {
      const items: TranscriptItem[] = [];
      let lastSeq = 0n;
      for await (const page of pages(id)) {
        items.push(...page.items);
        lastSeq = page.lastSeq;
      }
      if (stopped) return;
      const first = items[0];
      byId("transcript-count").textContent = `${items.length} items through seq ${lastSeq}${first ? `, since ${when(first.timeUnixMs)}` : ""}`;
      fill(byId("transcript"), items.length === 0 ? h("li", { class: "empty muted" }, "nothing yet") : items.map(itemView));
    } catch (e) {
      byId("transcript-error").textContent = `GetTranscript failed: ${describe(e)}`;
    }
  };
  void load();
  return () => {
    stopped = true;
  };
}

async function* pages(id: string) {
  let afterSeq = 0n;
  for (;;) {
    const page = await client.getTranscript(sessionRef(id), { afterSeq, pageSize: PAGE_SIZE });
    yield page;
    if (page.nextSeq === 0n) return;
    afterSeq = page.nextSeq;
  }
}
