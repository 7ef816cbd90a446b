// The session page: the live timeline (turns → steps → messages, streamed text, reasoning folded away,
// tool calls with their decisions and results), the inbox with remove and replace, pending approvals with
// approve and deny, the goal, and forms for every delivery preset and cancel. Everything it does is one
// call of the public API (api.ts); everything it shows comes from one resumable Watch (timeline.ts).

import { client, describe, sessionRef, settings, sourceOf, textOf } from "./api";
import { byId, fill, h, type Child } from "./dom";
import { SessionView, type Step, type Tool, type Turn } from "./timeline";
import { GoalAction, SessionStatus, textMessage, type UserMessage } from "@turnstile/client/browser";

/// What the console sends is typed by a person: source `user`, whatever the preset's default.
const USER = { kind: { case: "user", value: {} } } as const;

const PRESETS = ["followup", "queue", "steer", "inject", "interrupt"] as const;
type Preset = (typeof PRESETS)[number];

export function sessionPage(root: HTMLElement, id: string): () => void {
  const view = new SessionView();
  const stop = new AbortController();
  const turnEls = new Map<bigint, HTMLElement>();

  fill(
    root,
    h("section", { id: "session", "data-session": id },
      h("header", { class: "session-head" },
        h("a", { href: "#/" }, "← sessions"),
        h("h2", {}, id),
        h("a", { id: "transcript-link", href: `#/s/${encodeURIComponent(id)}/transcript` }, "transcript"),
        h("span", { id: "status", class: "status" }, "connecting"),
        h("span", { id: "agent", class: "muted" }),
        h("span", { id: "parent", class: "muted" }),
        h("span", { id: "seq", class: "muted" }),
        h("span", { id: "tokens", class: "muted", title: "model tokens of this session (input / output, cached input)" }),
      ),
      h("div", { class: "cols" },
        h("div", { class: "main" },
          h("ol", { id: "timeline" }),
          h("form", { id: "compose", onsubmit: (ev: Event) => { ev.preventDefault(); void send(); } },
            h("textarea", { id: "message", rows: 3, placeholder: "Message (Ctrl+Enter sends)", onkeydown: (ev: Event) => {
              const k = ev as KeyboardEvent;
              if (k.key === "Enter" && (k.ctrlKey || k.metaKey)) { k.preventDefault(); void send(); }
            } }),
            h("div", { class: "row" },
              h("select", { id: "preset", title: "How the message is delivered (SPEC §2)" }, PRESETS.map((p) => h("option", { value: p }, p))),
              h("button", { id: "send", type: "submit" }, "Send"),
              h("span", { class: "spacer" }),
              h("label", { title: "Cancel keeps pending messages instead of discarding them" }, h("input", { id: "keep-inbox", type: "checkbox" }), " keep inbox"),
              h("button", { id: "cancel", type: "button", class: "danger", onclick: () => void cancel() }, "Cancel turn"),
            ),
            h("div", { id: "result", class: "muted" }),
          ),
        ),
        h("aside", {},
          h("h3", {}, "Approvals"),
          h("ul", { id: "approvals", class: "list" }),
          h("h3", {}, "Inbox"),
          h("h4", {}, "next turn"),
          h("ul", { id: "inbox-next-turn", class: "list inbox" }),
          h("h4", {}, "next step"),
          h("ul", { id: "inbox-next-step", class: "list inbox" }),
          h("h3", {}, "Goal"),
          h("div", { id: "goal" }),
          h("h3", {}, "Schedules"),
          h("ul", { id: "schedules", class: "list" }),
          h("h3", {}, "Labels"),
          h("div", { id: "labels", class: "muted" }),
        ),
      ),
    ),
  );

  const result = (text: string, error = false) => {
    const el = byId("result");
    el.textContent = text;
    el.className = error ? "error" : "muted";
  };

  async function call(what: string, f: () => Promise<string>) {
    try {
      result(`${what}: ${await f()}`);
    } catch (e) {
      result(`${what} failed: ${describe(e)}`, true);
    }
  }

  async function send() {
    const box = byId<HTMLTextAreaElement>("message");
    const preset = byId<HTMLSelectElement>("preset").value as Preset;
    const text = box.value;
    if (!text.trim()) return result("write a message first", true);
    result(`${preset}: sending`);
    await call(preset, async () => {
      const reply = await client[preset](sessionRef(id), text, { source: USER });
      box.value = "";
      return `accepted at seq ${reply.seq}${reply.turn !== undefined ? `, turn ${reply.turn}` : ""}`;
    });
  }

  async function cancel() {
    const keepInbox = byId<HTMLInputElement>("keep-inbox").checked;
    await call("cancel", async () => {
      const reply = await client.cancel(sessionRef(id), { cause: { cause: { case: "user", value: {} } }, keepInbox });
      return `seq ${reply.seq}`;
    });
  }

  async function refreshInfo() {
    try {
      const info = await client.getSession(sessionRef(id));
      view.agent = info.agent;
      if (info.agentVersion > 0n) view.agentVersion = info.agentVersion;
      const labels = Object.entries(info.labels).map(([k, v]) => `${k}=${v}`).sort();
      byId("labels").textContent = labels.length ? labels.join(", ") : "none";
      if (info.parent) view.parent = info.parent.id;
      if (info.goal) view.goal = info.goal;
      view.dirty.header = true;
      schedule();
    } catch {
      // NOT_FOUND until the first write: the header says "new session" from the Watch's caught_up.
    }
  }

  // The session's schedules with their next firing (SPEC §15), read again whenever one changes.
  async function refreshSchedules() {
    try {
      // The tenant of the settings, as in every call ("" with auth: the token's), never the client's default.
      const reply = await client.listSchedules(sessionRef(id), { tenant: settings.tenant });
      const when = (ms: bigint | undefined) => (ms === undefined ? "none" : new Date(Number(ms)).toLocaleString());
      fill(byId("schedules"), reply.schedules.length === 0
        ? h("li", { class: "empty muted" }, "none")
        : reply.schedules.map((s) => h("li", { "data-schedule": s.scheduleId },
            h("div", {}, h("code", {}, s.scheduleId), " ", s.cron ? `cron "${s.cron}" ${s.timeZone}` : "once"),
            h("div", { class: "next" }, `next: ${when(s.nextFireUnixMs)}`),
            h("div", { class: "muted" }, `fired ${s.fired}, missed ${s.missed}`),
            h("button", { type: "button", class: "remove danger", onclick: () =>
              void call("delete schedule", async () => (await client.deleteSchedule(sessionRef(id), s.scheduleId)).scheduleId) }, "delete"))));
    } catch {
      // NOT_FOUND until the session's first write.
      fill(byId("schedules"), h("li", { class: "empty muted" }, "none"));
    }
  }

  let scheduled = false;
  function schedule() {
    if (scheduled) return;
    scheduled = true;
    setTimeout(() => {
      scheduled = false;
      render();
    }, 0);
  }

  function render() {
    const d = view.dirty;
    if (d.header || d.approvals) {
      // SPEC §21: a running turn that waits for a person or for its client says so.
      const st = byId("status");
      const running = view.status === SessionStatus.RUNNING;
      const waits = !running ? "" : view.pendingApprovals().length > 0 ? " · awaiting approval" : view.awaitingClient().length > 0 ? " · awaiting its client" : "";
      st.textContent = !view.caughtUp ? "connecting" : view.lastSeq === 0n ? "new session" : running ? `running${waits}` : "idle";
      st.className = `status ${running ? "running" : "idle"}`;
    }
    if (d.header) {
      const version = view.agentVersion ? ` v${view.agentVersion}` : "";
      byId("agent").textContent = view.agent ? `agent ${view.agent}${version}` : "";
      fill(byId("parent"), view.parent
        ? ["child of ", h("a", { href: `#/s/${encodeURIComponent(view.parent)}` }, view.parent)]
        : null);
      renderGoal();
      const t = view.tokens;
      byId("tokens").textContent = t.input + t.output > 0n
        ? `tokens ${t.input} in / ${t.output} out${t.cached > 0n ? ` (${t.cached} cached)` : ""}`
        : "";
    }
    byId("seq").textContent = `seq ${view.lastSeq}`;
    if (d.inbox) {
      renderInbox("inbox-next-turn", view.nextTurn);
      renderInbox("inbox-next-step", view.nextStep);
    }
    if (d.approvals) renderApprovals();
    const timeline = byId("timeline");
    for (const n of d.turns) {
      const t = view.turns.get(n);
      if (t) renderTurn(t);
    }
    if (d.order) {
      fill(timeline, view.order.map((o) => ("turn" in o ? turnEl(o.turn) : h("li", { class: "note" }, h("span", { class: "muted" }, `#${o.note.seq}`), " ", o.note.text))));
    }
    if (d.schedules) void refreshSchedules();
    view.dirty = { header: false, inbox: false, turns: new Set(), order: false, approvals: false, schedules: false };
  }

  function turnEl(n: bigint): HTMLElement {
    let el = turnEls.get(n);
    if (!el) {
      el = h("li", { class: "turn", "data-turn": String(n) });
      turnEls.set(n, el);
      const t = view.turns.get(n);
      if (t) renderTurn(t);
    }
    return el;
  }

  function renderTurn(t: Turn) {
    const el = turnEl(t.turn);
    el.classList.toggle("open", t.end === undefined);
    fill(
      el,
      h("div", { class: "turn-head" }, `Turn ${t.turn}`, h("span", { class: `turn-end ${t.end?.split(/[:{]/)[0] ?? "running"}` }, t.end ?? "running")),
      t.errors.map((e) => h("div", { class: "error" }, `agent error: ${e}`)),
      h("ol", { class: "steps" }, [...t.steps.values()].map(stepEl)),
    );
  }

  function stepEl(s: Step): HTMLElement {
    const streaming = s.text === undefined;
    const text = s.text ?? s.streamed;
    const reasoning = s.reasoning ?? s.streamedReasoning;
    const details = reasoning
      ? h("details", { class: "reasoning", open: s.reasoningOpen, ontoggle: (ev: Event) => { s.reasoningOpen = (ev.target as HTMLDetailsElement).open; } },
          h("summary", {}, "reasoning"),
          h("pre", {}, reasoning))
      : null;
    const assistant =
      text || !streaming || s.deltas > 0
        ? h("div", { class: `assistant${streaming ? " streaming" : ""}${s.interrupted ? " interrupted" : ""}`, "data-deltas": String(s.deltas) },
            h("pre", { class: "text" }, text),
            s.interrupted ? h("span", { class: "badge" }, "interrupted") : null,
            s.maxTokens ? h("span", { class: "badge" }, "max tokens") : null,
            s.usage ? h("span", { class: "muted usage" }, `${s.usage.input} in / ${s.usage.output} out tokens${s.usage.cached > 0n ? ` (${s.usage.cached} cached)` : ""}`) : null,
            s.model ? h("span", { class: "muted model" }, s.model) : null)
        : null;
    return h("li", { class: `step${s.ended ? "" : " open"}`, "data-step": s.key },
      h("div", { class: "step-head muted" }, `step ${s.key}`),
      s.messages.map(userEl),
      details,
      assistant,
      [...s.tools.values()].map(toolEl));
  }

  function userEl(m: UserMessage): Child {
    return h("div", { class: "user", "data-id": m.id }, h("span", { class: "src" }, sourceOf(m)), h("pre", {}, textOf(m)));
  }

  function toolEl(t: Tool): Child {
    const state = t.result ? (t.result.error !== undefined ? "failed" : "done") : t.awaiting && !t.decision ? "awaiting approval" : t.client ? "awaiting its client" : "running";
    return h("div", { class: `tool ${state.split(" ").join("-")}`, "data-call": t.callId },
      h("div", {}, h("code", {}, `${t.name}(${t.args})`), " ", h("span", { class: "badge" }, state)),
      t.decision ? h("div", { class: "decision muted" }, t.decision.approved ? "approved" : `denied${t.decision.reason ? `: ${t.decision.reason}` : ""}`) : null,
      t.result ? h("pre", { class: "result" }, t.result.error !== undefined ? `error: ${t.result.error}` : t.result.output) : null);
  }

  function renderInbox(listId: string, items: UserMessage[]) {
    fill(byId(listId), items.length === 0 ? h("li", { class: "empty muted" }, "empty") : items.map((m) => inboxItem(m)));
  }

  function inboxItem(m: UserMessage): HTMLElement {
    const li = h("li", { "data-id": m.id });
    const show = () =>
      fill(li,
        h("pre", { class: "text" }, textOf(m)),
        h("div", { class: "row" },
          h("span", { class: "muted" }, sourceOf(m)),
          h("span", { class: "spacer" }),
          h("button", { type: "button", class: "edit", onclick: edit }, "replace"),
          h("button", { type: "button", class: "remove danger", onclick: () => void call("remove", async () => `seq ${(await client.remove(sessionRef(id), m.id)).seq}`) }, "remove")));
    const edit = () => {
      const input = h("textarea", { class: "replacement", rows: 2, value: textOf(m) }) as HTMLTextAreaElement;
      fill(li, input,
        h("div", { class: "row" },
          h("span", { class: "spacer" }),
          h("button", { type: "button", class: "save", onclick: () =>
            // Rewriting content keeps the message's id (SPEC §1), as `turnstile replace` does.
            void call("replace", async () => `seq ${(await client.replace(sessionRef(id), m.id, textMessage(input.value, { id: m.id, source: USER }))).seq}`) }, "save"),
          h("button", { type: "button", onclick: show }, "keep")));
      input.focus();
    };
    show();
    return li;
  }

  function renderApprovals() {
    const pending = view.pendingApprovals();
    fill(byId("approvals"), pending.length === 0 ? h("li", { class: "empty muted" }, "none pending") : pending.map(({ tool }) => {
      const reason = h("input", { class: "reason", placeholder: "reason (optional)" }) as HTMLInputElement;
      const decide = (approve: boolean) =>
        void call(approve ? "approve" : "deny", async () => `seq ${(await client.decide(sessionRef(id), tool.callId, approve, { reason: reason.value })).seq}`);
      return h("li", { "data-call": tool.callId },
        h("code", {}, `${tool.name}(${tool.args})`),
        reason,
        h("div", { class: "row" },
          h("button", { type: "button", class: "approve", onclick: () => decide(true) }, "approve"),
          h("button", { type: "button", class: "deny danger", onclick: () => decide(false) }, "deny")));
    }));
  }

  function renderGoal() {
    const g = view.goal;
    const update = (action: GoalAction, label: string) =>
      h("button", { type: "button", onclick: () => void call(label, async () => (await client.updateGoal(sessionRef(id), g?.goalId ?? "", action)).state) }, label);
    const objective = h("input", { id: "goal-objective", placeholder: "objective" }) as HTMLInputElement;
    const rounds = h("input", { id: "goal-rounds", type: "number", min: 1, value: 5, title: "max rounds" }) as HTMLInputElement;
    fill(byId("goal"),
      g
        ? h("div", { class: `goal ${g.state}` },
            h("div", {}, h("span", { class: "badge" }, g.state), ` round ${g.round}/${g.maxRounds}`),
            h("pre", {}, g.objective),
            g.summary ? h("div", { class: "muted" }, g.summary) : null,
            g.reason ? h("div", { class: "muted" }, g.reason) : null,
            h("div", { class: "row" },
              g.state === "active" ? update(GoalAction.PAUSE, "pause") : null,
              g.state === "paused" ? update(GoalAction.RESUME, "resume") : null,
              g.state === "active" || g.state === "paused" ? update(GoalAction.CLEAR, "clear") : null))
        : h("div", { class: "muted" }, "no goal"),
      h("form", { class: "row", onsubmit: (ev: Event) => {
        ev.preventDefault();
        void call("set goal", async () => (await client.setGoal(sessionRef(id), objective.value, Number(rounds.value))).state);
      } }, objective, rounds, h("button", { type: "submit" }, "set goal")));
  }

  async function watch() {
    let backoff = 250;
    while (!stop.signal.aborted) {
      try {
        // From the last seq seen and the streaming reply's bytes shown: a reconnect misses nothing and
        // repeats nothing (SPEC §14).
        // The client reopens a broken stream by itself while its retry policy allows; past that, this loop does.
        const from = { afterSeq: view.lastSeq, streaming: view.resume() };
        for await (const item of client.watch(sessionRef(id), { from, signal: stop.signal })) {
          const before = view.status;
          view.apply(item);
          if (view.status !== before || item.item.case === "caughtUp") void refreshInfo();
          backoff = 250;
          schedule();
        }
      } catch (e) {
        if (stop.signal.aborted) return;
        result(`watch: ${describe(e)}; reconnecting`, true);
      }
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(backoff * 2, 5000);
    }
  }

  render();
  void watch();
  return () => stop.abort();
}
