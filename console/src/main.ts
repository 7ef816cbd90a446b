// Turnstile's web console: the sessions of the caller's tenant (#/), one session's page (#/s/ID,
// session.ts) and its transcript (#/s/ID/transcript, transcript.ts), the tenant's approvals inbox
// (#/approvals, approvals.ts), its memory (#/memory, memory.ts) and its agents (#/agents and
// #/agents/NAME, agents.ts). The bearer token and, with auth off,
// the tenant are kept in this browser's localStorage and sent with every call, exactly as `turnstile
// --token` does.

import { agentPage, agentsPage } from "./agents";
import { approvalsPage } from "./approvals";
import { client, describe, settings, when } from "./api";
import { byId, fill, h } from "./dom";
import { memoryPage } from "./memory";
import { sessionPage } from "./session";
import { transcriptPage } from "./transcript";
import { Refresh } from "./refresh";
import { SessionOrder, type SessionInfo, SessionStatus } from "@turnstile/client/browser";

let leave: (() => void) | undefined;

const DAY_MS = 86_400_000;

function header() {
  const token = h("input", { id: "token", type: "password", placeholder: "bearer token", autocomplete: "off", value: settings.token }) as HTMLInputElement;
  const tenant = h("input", { id: "tenant", placeholder: "tenant (auth off)", value: settings.tenant }) as HTMLInputElement;
  fill(byId("top"),
    h("a", { href: "#/", class: "brand" }, "Turnstile"),
    h("a", { href: "#/", id: "nav-sessions" }, "Sessions"),
    h("a", { href: "#/approvals", id: "nav-approvals" }, "Approvals"),
    h("a", { href: "#/memory", id: "memory-link" }, "Memory"),
    h("a", { href: "#/agents", id: "nav-agents" }, "Agents"),
    h("form", { id: "settings", class: "row", onsubmit: (ev: Event) => {
      ev.preventDefault();
      settings.token = token.value.trim();
      settings.tenant = tenant.value.trim();
      byId("saved").textContent = "saved";
      route();
    } }, token, tenant, h("button", { id: "save-settings", type: "submit" }, "save"), h("span", { id: "saved", class: "muted" })));
}


/// The list's filters (SPEC §16), kept while the page is open.
const filters = { status: "", agent: "", labels: "" };

function sessionsPage(root: HTMLElement): () => void {
  const input = h("input", { id: "open-id", placeholder: "session id", pattern: "[A-Za-z0-9_\\-]{1,128}", required: true }) as HTMLInputElement;
  const status = h("select", { id: "filter-status", title: "status" },
    ["", "idle", "running"].map((s) => h("option", { value: s, selected: filters.status === s }, s || "any status"))) as HTMLSelectElement;
  const agent = h("input", { id: "filter-agent", placeholder: "agent", value: filters.agent }) as HTMLInputElement;
  const labels = h("input", { id: "filter-labels", placeholder: "labels: team=blue,!archived", value: filters.labels }) as HTMLInputElement;
  const filterForm = h("form", { id: "filters", class: "row", onsubmit: (ev: Event) => {
    ev.preventDefault();
    filters.status = status.value;
    filters.agent = agent.value.trim();
    filters.labels = labels.value.trim();
    void load();
  } }, status, agent, labels, h("button", { id: "apply-filters", type: "submit" }, "filter"));
  fill(root,
    h("section", { id: "sessions-page" },
      h("div", { class: "row" },
        h("h2", {}, "Sessions"),
        h("span", { class: "spacer" }),
        h("form", { class: "row", onsubmit: (ev: Event) => { ev.preventDefault(); window.location.hash = `#/s/${encodeURIComponent(input.value)}`; } },
          input, h("button", { id: "open", type: "submit" }, "open"))),
      h("div", { id: "tenant-usage", class: "muted" }),
      filterForm,
      h("div", { id: "list-error", class: "error" }),
      h("table", { id: "sessions" },
        h("thead", {}, h("tr", {}, ["session", "status", "last activity", "agent", "labels", "goal", "turns"].map((c) => h("th", {}, c)))),
        h("tbody", {}))));
  const page = new Refresh();
  const load = async () => {
    try {
      const all: SessionInfo[] = [];
      let pageToken = "";
      do {
        const reply = await client.listSessions({
          pageToken,
          pageSize: 500,
          tenant: settings.tenant,
          status: filters.status === "running" ? SessionStatus.RUNNING : filters.status === "idle" ? SessionStatus.IDLE : SessionStatus.UNSPECIFIED,
          agent: filters.agent,
          labelSelector: filters.labels,
          orderBy: SessionOrder.LAST_ACTIVITY,
        });
        all.push(...reply.sessions);
        pageToken = reply.nextPageToken;
      } while (pageToken && all.length < 5000);
      // The page may have been left while the list was read: then there is nothing to fill.
      const listError = root.querySelector("#list-error");
      const body = root.querySelector("#sessions tbody");
      if (!listError || !body || !page.shown()) return;
      listError.textContent = "";
      fill(body, all.length === 0
        ? h("tr", {}, h("td", { colspan: 7, class: "muted" }, filters.status || filters.agent || filters.labels
            ? "no session matches these filters"
            : "no sessions yet: open one by its id and send a followup"))
        : all.map((s) => {
            const id = s.session?.id ?? "";
            const running = s.status === SessionStatus.RUNNING;
            return h("tr", { "data-session": id },
              h("td", {}, h("a", { href: `#/s/${encodeURIComponent(id)}` }, id),
                // A spawn_agent child (SPEC §13) names its parent.
                s.parent ? h("div", { class: "muted" }, "child of ",
                  h("a", { href: `#/s/${encodeURIComponent(s.parent.id)}` }, s.parent.id)) : null),
              h("td", {}, h("span", { class: `status ${running ? "running" : "idle"}` }, running ? "running" : "idle")),
              h("td", {}, when(s.lastEventUnixMs)),
              h("td", {}, h("a", { href: `#/agents/${encodeURIComponent(s.agent)}` }, s.agentVersion > 0n ? `${s.agent} v${s.agentVersion}` : s.agent)),
              h("td", { class: "labels" }, Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).sort().join(", ")),
              h("td", {}, s.goal ? `${s.goal.state}: ${s.goal.objective}` : ""),
              h("td", {}, String(s.lastTurn)));
          }));
    } catch (e) {
      const listError = root.querySelector("#list-error");
      if (listError) listError.textContent = `ListSessions failed: ${describe(e)}`;
    }
  };
  const usage = async () => {
    const el = byId("tenant-usage");
    try {
      // Today (UTC): what the tenant's daily token budget is checked against (SPEC §17).
      const u = await client.getUsage({ tenant: settings.tenant, sinceUnixMs: BigInt(Math.floor(Date.now() / DAY_MS) * DAY_MS) });
      const budget = u.budget > 0n ? ` of its daily budget of ${u.budget}` : "";
      const models = u.models.map((m) => `${m.provider}/${m.model} ${m.inputTokens} in / ${m.outputTokens} out${m.cachedInputTokens > 0n ? ` (${m.cachedInputTokens} cached)` : ""}`);
      el.textContent = `tenant ${u.tenant}: ${u.usedToday} tokens today (UTC)${budget}, resets ${new Date(Number(u.resetsUnixMs)).toISOString()}${models.length ? ` · ${models.join(" · ")}` : ""}`;
    } catch (e) {
      el.textContent = `usage: ${describe(e)}`;
    }
  };
  return page.every(async () => {
    await usage();
    await load();
  });
}

function route() {
  leave?.();
  const root = byId("app");
  const hash = window.location.hash;
  const transcript = /^#\/s\/(.+)\/transcript$/.exec(hash);
  const session = /^#\/s\/([^/]+)$/.exec(hash);
  const agent = /^#\/agents\/([^/]+)$/.exec(hash);
  if (transcript) leave = transcriptPage(root, decodeURIComponent(transcript[1]));
  else if (session) leave = sessionPage(root, decodeURIComponent(session[1]));
  else if (hash === "#/approvals") leave = approvalsPage(root);
  else if (hash === "#/memory") leave = memoryPage(root);
  else if (hash === "#/agents") leave = agentsPage(root);
  else if (agent) leave = agentPage(root, decodeURIComponent(agent[1]));
  else leave = sessionsPage(root);
}

header();
window.addEventListener("hashchange", route);
route();
