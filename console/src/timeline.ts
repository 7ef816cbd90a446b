// The session as the console shows it, folded from one Watch stream (ARCHITECTURE.md, "Watch"): turns
// with their steps, each step's entered messages, streamed and final assistant text, reasoning and tool
// calls with their decisions and results; the inbox (by the SPEC §3 projection of the durable splices);
// status, goal and pending approvals. Durable events are the truth; live deltas only fill a step until
// its durable `assistant/message` replaces them. Deltas are placed by their byte offset in the step's
// output (SPEC §14), keyed by turn/step whether or not the step's start was seen: a page reloaded mid-reply
// gets the output so far right after `caught_up`, a repeated byte is shown once, and a reopened Watch asks
// for the bytes after those shown (`resume`).

import { SessionStatus, Target, type SessionEvent, type TurnEndReason, type UserMessage, type WatchItem } from "@turnstile/client/browser";

/// A goal as `goal/change` and `GetSession` both carry it.
export interface GoalShown {
  goalId: string;
  state: string;
  objective: string;
  round: bigint;
  maxRounds: number;
  summary?: string;
  reason?: string;
}

export interface Tool {
  callId: string;
  name: string;
  args: string;
  awaiting: boolean;
  /// A client tool of the turn (SPEC §19): the client answers it with `CompleteToolCall`.
  client: boolean;
  decision?: { approved: boolean; reason: string };
  result?: { output: string; error?: string };
}

export interface Step {
  key: string; // "turn.step"
  turn: bigint;
  step: number;
  messages: UserMessage[];
  /// Live text and reasoning, until the durable assistant/message arrives, and their UTF-8 byte lengths
  /// (the offset the next delta of each continues at).
  streamed: string;
  streamedReasoning: string;
  streamedBytes: number;
  streamedReasoningBytes: number;
  /// How many live `assistant/delta`s added to this step's text or reasoning before its durable message.
  deltas: number;
  text?: string;
  reasoning?: string;
  interrupted: boolean;
  maxTokens: boolean;
  usage?: { input: bigint; output: bigint; cached: bigint };
  /// The model that answered (SPEC §17: a fallback's when the agent's model failed before its first byte).
  model?: string;
  tools: Map<string, Tool>;
  ended: boolean;
  reasoningOpen: boolean;
}

export interface Turn {
  turn: bigint;
  steps: Map<number, Step>;
  end?: string;
  /// Errors reported live (`agent/error`) during the turn.
  errors: string[];
}

/// Out-of-turn entries: `user/message` with turn 0, configuration, goal changes.
export interface Note {
  seq: bigint;
  text: string;
}

export class SessionView {
  lastSeq = 0n;
  caughtUp = false;
  status: SessionStatus = SessionStatus.UNSPECIFIED;
  nextTurn: UserMessage[] = [];
  nextStep: UserMessage[] = [];
  turns = new Map<bigint, Turn>();
  /// Turns and notes in log order, for rendering.
  order: Array<{ turn: bigint } | { note: Note }> = [];
  goal?: GoalShown;
  agent?: string;
  /// The agent version the session recorded (SPEC §20), from its `session/configured`; none: the newest.
  agentVersion?: bigint;
  /// The session's model tokens: the sum of the usage its `assistant/message`s record (SPEC §17).
  tokens = { input: 0n, output: 0n, cached: 0n };
  /// The parent session of a `spawn_agent` child (SPEC §13), from its `session/configured`.
  parent?: string;
  /// The step whose deltas came last, until its output is durable: what a reopened Watch resumes.
  private streaming?: Step;
  /// Which parts changed since the last render.
  dirty = { header: true, inbox: true, turns: new Set<bigint>(), order: true, approvals: true, schedules: true };

  apply(item: WatchItem) {
    const it = item.item;
    switch (it.case) {
      case "event":
        this.durable(it.value);
        break;
      case "caughtUp": {
        this.caughtUp = true;
        this.lastSeq = it.value.seq > this.lastSeq ? it.value.seq : this.lastSeq;
        this.status = it.value.status;
        if (it.value.inbox) {
          this.nextTurn = [...it.value.inbox.nextTurn];
          this.nextStep = [...it.value.inbox.nextStep];
        }
        this.dirty.header = this.dirty.inbox = true;
        break;
      }
      case "live": {
        const p = it.value.payload;
        if (p.case === "assistantDelta") {
          const d = p.value;
          const s = this.step(d.turn, d.step);
          if (s.text !== undefined) break;
          const placed = place(d.reasoning ? s.streamedReasoningBytes : s.streamedBytes, Number(d.offset), d.text);
          if (!placed) break;
          const [text, bytes] = placed;
          if (d.reasoning) {
            s.streamedReasoning += text;
            s.streamedReasoningBytes += bytes;
          } else {
            s.streamed += text;
            s.streamedBytes += bytes;
          }
          s.deltas++;
          this.streaming = s;
          this.dirty.turns.add(s.turn);
        } else if (p.case === "error") {
          this.turn(p.value.turn).errors.push(p.value.message);
          this.dirty.turns.add(p.value.turn);
        } else if (p.case === "status") {
          this.status = p.value.status;
          this.dirty.header = true;
        }
        break;
      }
    }
  }

  /// What a reopened Watch asks for of the step that streams (`WatchRequest.resume`): the bytes after
  /// those shown. None once the step's message, its end or its turn's end arrived.
  resume(): { turn: bigint; step: number; textOffset: bigint; reasoningOffset: bigint } | undefined {
    const s = this.streaming;
    if (!s || s.text !== undefined || s.ended || this.turns.get(s.turn)?.end !== undefined) return undefined;
    return { turn: s.turn, step: s.step, textOffset: BigInt(s.streamedBytes), reasoningOffset: BigInt(s.streamedReasoningBytes) };
  }

  /// Calls awaiting a decision: written awaiting approval, not yet decided or ended.
  pendingApprovals(): Array<{ step: Step; tool: Tool }> {
    const out: Array<{ step: Step; tool: Tool }> = [];
    for (const t of this.turns.values())
      for (const s of t.steps.values())
        for (const tool of s.tools.values()) if (tool.awaiting && !tool.decision && !tool.result) out.push({ step: s, tool });
    return out;
  }

  /// Calls of client tools of the turn the session waits on: written awaiting the client, no result yet.
  awaitingClient(): Tool[] {
    const out: Tool[] = [];
    for (const t of this.turns.values())
      if (t.end === undefined)
        for (const s of t.steps.values()) for (const tool of s.tools.values()) if (tool.client && !tool.result) out.push(tool);
    return out;
  }

  private durable(e: SessionEvent) {
    if (e.seq <= this.lastSeq && this.caughtUp) return; // a resumed stream never repeats, but be safe
    this.lastSeq = e.seq;
    const p = e.payload;
    switch (p.case) {
      case "inboxSpliced": {
        const list = p.value.target === Target.NEXT_STEP ? this.nextStep : this.nextTurn;
        list.splice(p.value.start, p.value.removedCount, ...p.value.inserted);
        this.dirty.inbox = true;
        break;
      }
      case "status":
        this.status = p.value.status;
        this.dirty.header = true;
        break;
      case "turnStart":
        this.turn(p.value.turn);
        break;
      case "turnEnd":
        this.turn(p.value.turn).end = reason(p.value.reason);
        this.dirty.turns.add(p.value.turn);
        break;
      case "stepStart":
        this.step(p.value.turn, p.value.step);
        break;
      case "stepEnd":
        this.step(p.value.turn, p.value.step).ended = true;
        this.dirty.turns.add(p.value.turn);
        break;
      case "userMessage": {
        const m = p.value.message;
        if (!m) break;
        if (p.value.turn === 0n) this.note(e.seq, `out of turn: ${m.id}`, m);
        else {
          this.step(p.value.turn, p.value.step).messages.push(m);
          this.dirty.turns.add(p.value.turn);
        }
        break;
      }
      case "assistantMessage": {
        const s = this.step(p.value.turn, p.value.step);
        s.text = p.value.text;
        s.reasoning = p.value.reasoning;
        s.interrupted = p.value.interrupted;
        s.maxTokens = p.value.maxTokens;
        const u = p.value.usage;
        if (u) {
          s.usage = { input: u.inputTokens, output: u.outputTokens, cached: u.cachedInputTokens };
          // Every durable message is applied once (the Watch resumes after the last seq), so the sums hold.
          this.tokens.input += u.inputTokens;
          this.tokens.output += u.outputTokens;
          this.tokens.cached += u.cachedInputTokens;
          this.dirty.header = true;
        }
        if (p.value.model) s.model = `${p.value.model.provider}/${p.value.model.model}`;
        this.dirty.turns.add(s.turn);
        break;
      }
      case "toolCall": {
        const s = this.step(p.value.turn, p.value.step);
        s.tools.set(p.value.callId, { callId: p.value.callId, name: p.value.name, args: p.value.arguments, awaiting: p.value.awaitingApproval, client: p.value.awaitingClient });
        this.dirty.turns.add(s.turn);
        this.dirty.approvals = true;
        break;
      }
      case "toolDecision": {
        const tool = this.step(p.value.turn, p.value.step).tools.get(p.value.callId);
        if (tool) tool.decision = { approved: p.value.approved, reason: p.value.reason };
        this.dirty.turns.add(p.value.turn);
        this.dirty.approvals = true;
        break;
      }
      case "toolResult": {
        const s = this.step(p.value.turn, p.value.step);
        let tool = s.tools.get(p.value.callId);
        if (!tool) {
          tool = { callId: p.value.callId, name: "?", args: "", awaiting: false, client: false };
          s.tools.set(p.value.callId, tool);
        }
        tool.result = { output: p.value.output, error: p.value.error };
        this.dirty.turns.add(s.turn);
        this.dirty.approvals = true;
        break;
      }
      case "goalChange":
        this.goal = p.value;
        this.note(e.seq, `goal ${p.value.state}: ${p.value.objective} (round ${p.value.round}/${p.value.maxRounds})${p.value.summary ? ` — ${p.value.summary}` : ""}`);
        this.dirty.header = true;
        break;
      case "sessionConfigured":
        this.agent = p.value.agent;
        if (p.value.version !== undefined) this.agentVersion = p.value.version;
        if (p.value.parent) this.parent = p.value.parent.id;
        this.note(
          e.seq,
          `configured: agent ${p.value.agent}${p.value.version !== undefined ? ` v${p.value.version}` : ""}${p.value.parent ? ` (child of ${p.value.parent.id})` : ""}`,
        );
        this.dirty.header = true;
        break;
      case "scheduleChanged": {
        const c = p.value.change;
        const what =
          c.case === "created" ? `schedule ${c.value.scheduleId} created` :
          c.case === "deleted" ? `schedule ${c.value} deleted` :
          c.case === "fired" ? `schedule ${c.value.scheduleId} fired (${new Date(Number(c.value.fireUnixMs)).toLocaleString()})` :
          c.case === "skipped" ? `schedule ${c.value.scheduleId}: ${c.value.count} firing(s) skipped` : "schedule changed";
        this.note(e.seq, what);
        this.dirty.schedules = true;
        break;
      }
      case "sessionLabeled": {
        const set = Object.entries(p.value.set).map(([k, v]) => `${k}=${v}`);
        this.note(e.seq, `labels ${[...set, ...p.value.removed.map((k) => `-${k}`)].join(", ")}`);
        this.dirty.header = true;
        break;
      }
      default:
        // A type this console does not know (from a newer server): shown, never dropped silently.
        this.note(e.seq, `${e.type}`);
    }
  }

  private turn(n: bigint): Turn {
    let t = this.turns.get(n);
    if (!t) {
      t = { turn: n, steps: new Map(), errors: [] };
      this.turns.set(n, t);
      this.order.push({ turn: n });
      this.dirty.order = true;
    }
    this.dirty.turns.add(n);
    return t;
  }

  private step(turn: bigint, step: number): Step {
    const t = this.turn(turn);
    let s = t.steps.get(step);
    if (!s) {
      s = {
        key: `${turn}.${step}`, turn, step, messages: [], streamed: "", streamedReasoning: "", streamedBytes: 0, streamedReasoningBytes: 0,
        deltas: 0, interrupted: false, maxTokens: false, tools: new Map(), ended: false, reasoningOpen: false,
      };
      t.steps.set(step, s);
    }
    return s;
  }

  private note(seq: bigint, text: string, m?: UserMessage) {
    const body = m ? `${text} ${m.content.map((c) => (c.block.case === "text" ? c.block.value.text : "")).join(" ")}` : text;
    this.order.push({ note: { seq, text: body } });
    this.dirty.order = true;
  }
}

const utf8 = new TextEncoder();
const fromUtf8 = new TextDecoder();

/// A delta of `text` at byte `offset` of an output of which `have` bytes are shown: the text to add and its
/// byte length, or nothing when it only repeats bytes shown or would leave a hole (bytes this page never
/// got, which only the step's durable message can bring).
export function place(have: number, offset: number, text: string): [string, number] | undefined {
  if (offset > have) return undefined;
  const bytes = utf8.encode(text);
  if (offset + bytes.length <= have) return undefined;
  return offset === have ? [text, bytes.length] : [fromUtf8.decode(bytes.subarray(have - offset)), offset + bytes.length - have];
}

/// `completed`, `blocked: why`, `max-tokens`, `aborted{user}`, `error: message`, `interrupted`.
export function reason(r: TurnEndReason | undefined): string {
  const v = r?.reason;
  switch (v?.case) {
    case "completed":
      return "completed";
    case "blocked":
      return v.value.reason ? `blocked: ${v.value.reason}` : "blocked";
    case "maxTokens":
      return "max-tokens";
    case "aborted": {
      const c = v.value.cause;
      const cause = c.case === "hook" ? `hook: ${c.value.reason}` : c.case === "steerDeadline" ? "steer-deadline" : (c.case ?? "unknown");
      return `aborted{${cause}}`;
    }
    case "error":
      return `error: ${v.value.message}${v.value.code ? ` (${v.value.code})` : ""}`;
    case "interrupted":
      return "interrupted";
    default:
      return "ended";
  }
}
