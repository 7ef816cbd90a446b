// The tenant's agents (#/agents, SPEC §20): each with its newest version, and one agent's page
// (#/agents/NAME): every version (oldest first) with its policy, hash and definition, and the sessions that
// recorded it (`ListSessions` by agent and version), so a change can be watched rolling out (docs/how-to/
// change-an-agent-safely.md). Sessions that recorded no version run the newest of a `latest` agent.

import { client, describe, settings, when } from "./api";
import { byId, fill, h } from "./dom";
import { Refresh } from "./refresh";
import type { AgentInfo, SessionInfo } from "@turnstile/client/browser";

/// At most this many sessions are listed per version (the count says when there are more).
const SHOWN = 50;

function agentLink(name: string) {
  return h("a", { href: `#/agents/${encodeURIComponent(name)}` }, name);
}

export function agentsPage(root: HTMLElement): () => void {
  fill(root,
    h("section", { id: "agents-page" },
      h("h2", {}, "Agents"),
      h("div", { id: "agents-error", class: "error" }),
      h("table", { id: "agents" },
        h("thead", {}, h("tr", {}, ["agent", "newest version", "policy", "from", "created"].map((c) => h("th", {}, c)))),
        h("tbody", {}))));
  void (async () => {
    try {
      const reply = await client.listAgents();
      const body = root.querySelector("#agents tbody");
      if (!body) return;
      fill(body, reply.agents.length === 0
        ? h("tr", {}, h("td", { colspan: 5, class: "muted" }, "no agents"))
        : reply.agents.map((a) => h("tr", { "data-agent": a.name },
            h("td", {}, agentLink(a.name)),
            h("td", {}, `v${a.version}`),
            h("td", {}, a.versionPolicy),
            h("td", {}, a.fromFile ? "configuration file" : "API"),
            h("td", {}, when(a.createdUnixMs)))));
    } catch (e) {
      byId("agents-error").textContent = `ListAgents failed: ${describe(e)}`;
    }
  })();
  return () => {};
}

/// Up to `SHOWN` sessions that recorded `version` of `name`, and whether there are more.
async function sessionsOn(name: string, version: bigint): Promise<{ sessions: SessionInfo[]; more: boolean }> {
  const reply = await client.listSessions({ tenant: settings.tenant, agent: name, agentVersion: version, pageSize: SHOWN });
  return { sessions: reply.sessions, more: reply.nextPageToken !== "" };
}

function versionRow(v: AgentInfo, on: { sessions: SessionInfo[]; more: boolean }) {
  const sessions = on.sessions.map((s) => h("a", { href: `#/s/${encodeURIComponent(s.session?.id ?? "")}`, class: "session" }, s.session?.id ?? ""));
  const count = `${on.sessions.length}${on.more ? "+" : ""} session${on.sessions.length === 1 && !on.more ? "" : "s"}`;
  return h("tr", { "data-version": String(v.version) },
    h("td", {}, `v${v.version}`, v.version === v.latestVersion ? h("span", { class: "muted" }, " (newest)") : null),
    h("td", {}, v.versionPolicy),
    h("td", {}, h("code", { title: v.hash }, v.hash.slice(0, 12))),
    h("td", {}, when(v.createdUnixMs)),
    h("td", {}, h("details", {}, h("summary", {}, "definition"), h("pre", {}, v.definition))),
    h("td", { class: "sessions" }, h("span", { class: "count" }, count), sessions.length ? h("div", {}, sessions) : null));
}

export function agentPage(root: HTMLElement, name: string): () => void {
  fill(root,
    h("section", { id: "agent-page", "data-agent": name },
      h("div", { class: "row" }, h("a", { href: "#/agents" }, "agents"), h("h2", {}, name), h("span", { id: "agent-summary", class: "muted" })),
      h("div", { id: "agent-error", class: "error" }),
      h("table", { id: "agent-versions" },
        h("thead", {}, h("tr", {}, ["version", "policy", "hash", "created", "", "sessions on it"].map((c) => h("th", {}, c)))),
        h("tbody", {}))));
  const page = new Refresh();
  const load = async () => {
    try {
      const versions = (await client.listAgentVersions(name)).versions;
      const on = await Promise.all(versions.map((v) => sessionsOn(name, v.version)));
      const body = root.querySelector("#agent-versions tbody");
      if (!body || !page.shown()) return;
      fill(body, versions.map((v, i) => versionRow(v, on[i])));
      const newest = versions[versions.length - 1];
      byId("agent-summary").textContent = newest
        ? `${versions.length} version${versions.length === 1 ? "" : "s"}, ${newest.fromFile ? "from the configuration file" : "put through the API"}${newest.deleted ? ", deleted" : ""}`
        : "";
      byId("agent-error").textContent = "";
    } catch (e) {
      // The page may have been left while the versions were read: then there is nothing to say it on.
      const error = root.querySelector("#agent-error");
      if (error && page.shown()) error.textContent = `ListAgentVersions failed: ${describe(e)}`;
    }
  };
  return page.every(load);
}
