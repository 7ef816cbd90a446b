// Typed events (SPEC §21, issue 41): what an application renders, read from a session's Watch, and the
// `run()` result folded from them. Every value here is JSON-safe through `toJson` (BigInt → string).

import type { WatchItem } from "./gen/turnstile/v1/agent_pb.js";
import type { SessionStatus, TurnEndReason, UserMessage } from "./gen/turnstile/v1/events_pb.js";
import { textOf } from "./messages.js";

/** Tokens of a model request or a turn. */
export interface TokenUsage {
  inputTokens: bigint;
  outputTokens: bigint;
}

/** A user message entered a turn (or history, between turns: `turn` 0). */
export interface UserEvent {
  type: "user";
  seq: bigint;
  turn: bigint;
  step: number;
  /** Its MessageId. */
  id: string;
  text: string;
  message: UserMessage;
}

/** A piece of a reply (or of its reasoning) as the model writes it: live, not stored. */
export interface TextDeltaEvent {
  type: "text_delta";
  turn: bigint;
  step: number;
  text: string;
  /** Of the reasoning rather than the reply. */
  reasoning: boolean;
}

/** A model step's whole reply, durable (its deltas concatenate to `text`). */
export interface MessageEvent {
  type: "message";
  seq: bigint;
  turn: bigint;
  step: number;
  text: string;
  usage: TokenUsage;
}

/** A tool call started (a call that waits for a decision is an {@link ApprovalEvent} instead). */
export interface ToolStartedEvent {
  type: "tool_started";
  seq: bigint;
  turn: bigint;
  step: number;
  callId: string;
  name: string;
  /** The model's arguments, as JSON text. */
  arguments: string;
}

/** A tool call waits for `decide(session, callId, approve)` (it is in `listPendingApprovals`). */
export interface ApprovalEvent {
  type: "approval";
  seq: bigint;
  turn: bigint;
  step: number;
  callId: string;
  name: string;
  arguments: string;
}

/** A decision on a call that waited: by a person, or by its deadline (`timedOut`). */
export interface ToolDecidedEvent {
  type: "tool_decided";
  seq: bigint;
  turn: bigint;
  step: number;
  callId: string;
  approved: boolean;
  reason: string;
  timedOut: boolean;
}

/** A tool call's result: `output`, or `error` when it failed (a denied call's is `denied: REASON`). */
export interface ToolDoneEvent {
  type: "tool_done";
  seq: bigint;
  turn: bigint;
  step: number;
  callId: string;
  output: string;
  error?: string;
}

/** A turn began. */
export interface TurnStartedEvent {
  type: "turn_started";
  seq: bigint;
  turn: bigint;
}

/** A turn ended: `reason` is `completed`, `blocked`, `max_tokens`, `aborted`, `error` or `interrupted`. */
export interface TurnDoneEvent {
  type: "turn_done";
  seq: bigint;
  turn: bigint;
  reason: string;
  /** What a blocked or failed turn's reason says (the hook's reason, the error's message). */
  detail: string;
  /** The tokens of the turn's model requests that this stream saw (all of them when it saw the turn start). */
  usage: TokenUsage;
  end: TurnEndReason | undefined;
}

/** The stream has read the stored history: what follows is new. */
export interface CaughtUpEvent {
  type: "caught_up";
  seq: bigint;
  status: SessionStatus;
}

/** One typed event of a session ({@link ClientBase.events}). Switch on `type`. */
export type TurnEvent =
  | UserEvent
  | TextDeltaEvent
  | MessageEvent
  | ToolStartedEvent
  | ApprovalEvent
  | ToolDecidedEvent
  | ToolDoneEvent
  | TurnStartedEvent
  | TurnDoneEvent
  | CaughtUpEvent;

/** A tool call of a {@link RunResult}: what was asked, decided and answered. */
export interface RunToolCall {
  callId: string;
  name: string;
  arguments: string;
  /** Whether it waited for a decision; `approved` is the decision. */
  awaitedApproval: boolean;
  approved?: boolean;
  output?: string;
  error?: string;
}

/** What `run()` answers: the turn the message ran in and what it produced. */
export interface RunResult {
  turn: bigint;
  /** The reply: the turn's last model message (the text after its tool calls). */
  text: string;
  /** Every model message of the turn, in order. */
  messages: string[];
  toolCalls: RunToolCall[];
  usage: TokenUsage;
  /** How the turn ended (`completed`, `blocked`, ...; see {@link TurnDoneEvent}). */
  reason: string;
  detail: string;
  /** The seq of its `turn/end`: `watch({afterSeq})` from here follows what came next. */
  seq: bigint;
}

const ZERO: TokenUsage = { inputTokens: 0n, outputTokens: 0n };

/** `snake_case` of a TurnEndReason case (`maxTokens` → `max_tokens`). */
function reasonName(end: TurnEndReason | undefined): { reason: string; detail: string } {
  const r = end?.reason;
  if (r === undefined || r.case === undefined) return { reason: "unknown", detail: "" };
  const reason = r.case.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
  let detail = "";
  if (r.case === "blocked") detail = r.value.reason ?? "";
  else if (r.case === "error") detail = r.value.message;
  else if (r.case === "aborted") detail = r.value.cause.case ?? "";
  return { reason, detail };
}

/**
 * Turns Watch items into {@link TurnEvent}s. Keeps the usage of the turn it is in, so that a `turn_done`
 * carries it. Items that an application does not render (inbox splices, step bounds, goals, labels, ...)
 * give no event.
 */
export class EventFolder {
  #usage = new Map<bigint, TokenUsage>();

  /** The events one Watch item gives (none, or one). */
  fold(item: WatchItem): TurnEvent[] {
    const it = item.item;
    if (it.case === "caughtUp") return [{ type: "caught_up", seq: it.value.seq, status: it.value.status }];
    if (it.case === "live") {
      const p = it.value.payload;
      if (p.case !== "assistantDelta") return [];
      const d = p.value;
      return [{ type: "text_delta", turn: d.turn, step: d.step, text: d.text, reasoning: d.reasoning }];
    }
    if (it.case !== "event") return [];
    const seq = it.value.seq;
    const p = it.value.payload;
    switch (p.case) {
      case "userMessage": {
        const m = p.value;
        return [
          { type: "user", seq, turn: m.turn, step: m.step, id: m.message?.id ?? "", text: textOf(m.message), message: m.message! },
        ];
      }
      case "assistantMessage": {
        const a = p.value;
        const usage = { inputTokens: a.usage?.inputTokens ?? 0n, outputTokens: a.usage?.outputTokens ?? 0n };
        const sum = this.#usage.get(a.turn) ?? ZERO;
        this.#usage.set(a.turn, {
          inputTokens: sum.inputTokens + usage.inputTokens,
          outputTokens: sum.outputTokens + usage.outputTokens,
        });
        return [{ type: "message", seq, turn: a.turn, step: a.step, text: a.text, usage }];
      }
      case "toolCall": {
        const c = p.value;
        const base = { seq, turn: c.turn, step: c.step, callId: c.callId, name: c.name, arguments: c.arguments };
        return [c.awaitingApproval ? { type: "approval", ...base } : { type: "tool_started", ...base }];
      }
      case "toolDecision": {
        const d = p.value;
        return [
          {
            type: "tool_decided",
            seq,
            turn: d.turn,
            step: d.step,
            callId: d.callId,
            approved: d.approved,
            reason: d.reason,
            timedOut: d.timedOut,
          },
        ];
      }
      case "toolResult": {
        const r = p.value;
        const done: ToolDoneEvent = { type: "tool_done", seq, turn: r.turn, step: r.step, callId: r.callId, output: r.output };
        if (r.error !== undefined) done.error = r.error;
        return [done];
      }
      case "turnStart":
        this.#usage.set(p.value.turn, ZERO);
        return [{ type: "turn_started", seq, turn: p.value.turn }];
      case "turnEnd": {
        const usage = this.#usage.get(p.value.turn) ?? ZERO;
        this.#usage.delete(p.value.turn);
        return [{ type: "turn_done", seq, turn: p.value.turn, ...reasonName(p.value.reason), usage, end: p.value.reason }];
      }
      default:
        return [];
    }
  }
}

/**
 * Folds the events of one turn into a {@link RunResult}: feed it events in order; `done` once the turn
 * ended.
 */
export class RunFolder {
  readonly turn: bigint;
  #messages: string[] = [];
  #calls = new Map<string, RunToolCall>();
  result: RunResult | undefined;

  constructor(turn: bigint) {
    this.turn = turn;
  }

  add(event: TurnEvent): void {
    if (!("turn" in event) || event.turn !== this.turn || event.type === "text_delta") return;
    switch (event.type) {
      case "message":
        this.#messages.push(event.text);
        return;
      case "tool_started":
      case "approval":
        this.#calls.set(event.callId, {
          callId: event.callId,
          name: event.name,
          arguments: event.arguments,
          awaitedApproval: event.type === "approval",
        });
        return;
      case "tool_decided": {
        const call = this.#calls.get(event.callId);
        if (call) call.approved = event.approved;
        return;
      }
      case "tool_done": {
        const call = this.#calls.get(event.callId);
        if (call) {
          call.output = event.output;
          if (event.error !== undefined) call.error = event.error;
        }
        return;
      }
      case "turn_done":
        this.result = {
          turn: this.turn,
          text: this.#messages.at(-1) ?? "",
          messages: this.#messages,
          toolCalls: [...this.#calls.values()],
          usage: event.usage,
          reason: event.reason,
          detail: event.detail,
          seq: event.seq,
        };
        return;
      default:
        return;
    }
  }
}

/**
 * A JSON-safe copy of any value of this package (a {@link TurnEvent}, a {@link RunResult}, a reply message):
 * `bigint`s become decimal strings (as the protobuf JSON mapping writes uint64), `Uint8Array`s base64 and
 * the generated messages' `$typeName` is left out. `JSON.stringify` throws on a `bigint`; this does not:
 *
 * ```ts
 * console.log(JSON.stringify(toJson(event)));
 * ```
 *
 * For the protobuf JSON mapping of a generated message (field names and enums as the API documents them),
 * use `toJson(Schema, message)` of `@bufbuild/protobuf` instead (e.g. `toJson(WatchItemSchema, item)`).
 */
export function toJson(value: unknown): unknown {
  if (typeof value === "bigint") return value.toString();
  if (value instanceof Uint8Array) return btoa(String.fromCharCode(...value));
  if (Array.isArray(value)) return value.map(toJson);
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) {
      if (k !== "$typeName" && v !== undefined) out[k] = toJson(v);
    }
    return out;
  }
  return value;
}
