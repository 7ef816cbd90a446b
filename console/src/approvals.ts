// The tenant's approvals inbox (#/approvals, SPEC §21): every tool call awaiting a decision across the
// tenant's running sessions, from `ListPendingApprovals` page after page, with its session, turn, tool,
// arguments, how long it has waited and its deadline; approve or deny is one `Decide`. Refreshed every 3 s (`refresh.ts`).

import { client, describe, sessionRef, settings, when } from "./api";
import { byId, fill, h } from "./dom";
import { Refresh } from "./refresh";
import type { PendingApproval } from "@turnstile/client/browser";

/// At most this many sessions' pages are read per refresh (a tenant with more sees the first ones).
const MAX_PAGES = 20;

export function approvalsPage(root: HTMLElement): () => void {
  fill(root,
    h("section", { id: "approvals-page" },
      h("div", { class: "row" }, h("h2", {}, "Approvals"), h("span", { id: "approvals-count", class: "muted" })),
      h("div", { class: "note" }, "Tool calls waiting for a person's decision, oldest first. A call with a deadline is decided by its agent's on_timeout when the deadline passes."),
      h("div", { id: "approvals-error", class: "error" }),
      h("table", { id: "tenant-approvals" },
        h("thead", {}, h("tr", {}, ["session", "turn", "tool", "arguments", "waiting since", "deadline", ""].map((c) => h("th", {}, c)))),
        h("tbody", {}))));
  const page = new Refresh();

  const decide = async (a: PendingApproval, approve: boolean, reason: string) => {
    try {
      await client.decide(sessionRef(a.session?.id ?? ""), a.callId, approve, { reason });
      byId("approvals-error").textContent = "";
      await load();
    } catch (e) {
      byId("approvals-error").textContent = `Decide failed: ${describe(e)}`;
    }
  };

  const row = (a: PendingApproval) => {
    const id = a.session?.id ?? "";
    const reason = h("input", { class: "reason", placeholder: "reason (optional)" }) as HTMLInputElement;
    return h("tr", { "data-call": a.callId, "data-session": id },
      h("td", {}, h("a", { href: `#/s/${encodeURIComponent(id)}` }, id)),
      h("td", {}, `${a.turn}.${a.step}`),
      h("td", {}, a.tool),
      h("td", {}, h("pre", {}, a.arguments)),
      h("td", {}, when(a.sinceUnixMs)),
      h("td", { class: "deadline" }, a.deadlineUnixMs === undefined ? "waits for a person" : when(a.deadlineUnixMs)),
      h("td", {},
        reason,
        h("div", { class: "row" },
          h("button", { class: "approve", onclick: () => void decide(a, true, reason.value) }, "approve"),
          h("button", { class: "deny danger", onclick: () => void decide(a, false, reason.value) }, "deny"))));
  };

  const load = async () => {
    try {
      const all: PendingApproval[] = [];
      let pageToken = "";
      let pages = 0;
      do {
        const reply = await client.listPendingApprovals({ tenant: settings.tenant, pageToken });
        all.push(...reply.approvals);
        pageToken = reply.nextPageToken;
        pages += 1;
      } while (pageToken && pages < MAX_PAGES);
      all.sort((x, y) => (x.sinceUnixMs < y.sinceUnixMs ? -1 : x.sinceUnixMs > y.sinceUnixMs ? 1 : 0));
      byId("approvals-error").textContent = "";
      byId("approvals-count").textContent = pageToken ? `${all.length} shown (more sessions not read)` : `${all.length} pending`;
      const body = root.querySelector("#tenant-approvals tbody");
      if (!body || !page.shown()) return;
      fill(body, all.length === 0 ? h("tr", { class: "empty" }, h("td", { colspan: 7, class: "muted" }, "no call is waiting for a decision")) : all.map(row));
    } catch (e) {
      byId("approvals-error").textContent = `ListPendingApprovals failed: ${describe(e)}`;
    }
  };
  return page.every(load);
}
