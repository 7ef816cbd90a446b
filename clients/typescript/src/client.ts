// The client: one method for every RPC of turnstile.v1.Agent, over any Connect transport. The entry
// points (index.ts for Node, browser.ts for browsers) only choose the transport; everything else is here.

import type { MessageInitShape } from "@bufbuild/protobuf";
import { type Client, createClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { Code } from "@connectrpc/connect";
import {
  Agent,
  type AgentInfo,
  DefinitionFormat,
  type ListAgentsReply,
  type ListAgentVersionsReply,
  type MigrateSessionsReply,
  type ListMemoryReply,
  type MemoryDocument,
  type SearchMemoryReply,
  type CancelReply,
  type EditReply,
  type EvalScorerSchema,
  type EvaluateItem,
  type ExportItem,
  type ExportItemSchema,
  type GoalAction,
  type GetTranscriptReply,
  type GoalInfo,
  type ImportReply,
  type InboxSnapshot,
  type ListPendingApprovalsReply,
  type ListSchedulesReply,
  type ListSessionsReply,
  type ListWebhooksReply,
  type Schedule,
  type SendReply,
  type SessionInfo,
  type SessionOrder,
  type TenantUsage,
  type TranscriptItem,
  type Webhook,
} from "./gen/turnstile/v1/agent_pb.js";
import {
  type CancelCauseSchema,
  type InjectMode,
  type OnDeadline,
  SchedulePreset,
  type SessionRef,
  type SessionStatus,
  Target,
} from "./gen/turnstile/v1/events_pb.js";
import { TurnstileError, toTurnstileError } from "./errors.js";
import {
  type MessageLike,
  type SessionLike,
  type SourceLike,
  sessionRef,
  toUserMessage,
  type Uint64,
  newMessageId,
} from "./messages.js";
import type { CallOptions, ClientCore, Rpc } from "./core.js";
import { DEFAULT_RETRY, NO_RETRY, Retries, type RetryPolicy } from "./retry.js";
import { type Tools, ToolServer, type ToolServerOptions } from "./tools.js";
import { WatchStream, type WatchOptions } from "./watch.js";
import { EventFolder, RunFolder, type RunResult, type TurnEvent } from "./events.js";

/**
 * Where the server is: `"host:port"`, `"http://host:port"`, `"https://host:port"` (TLS), or a function
 * returning one, asked again after every UNAVAILABLE, so a client follows a gateway that came back on
 * another address.
 */
export type Address = string | (() => string | Promise<string>);

/** One dialled server: the transport calls go through, and how to let go of it. */
export interface Connection {
  readonly transport: Transport;
  /** Whether the transport carries bidirectional streams (HTTP/2 does; gRPC-Web in a browser does not). */
  readonly bidiStreams: boolean;
  /** Closes the connection, ending the calls still open on it. */
  close(): void;
}

/** Dials `baseUrl` (`http://host:port` or `https://host:port`) with `interceptors` on every call. */
export type Connector = (baseUrl: string, interceptors: Interceptor[]) => Connection;

/** The options of a client. Every one has a default. */
export interface ClientOptions {
  /** The server; default `"127.0.0.1:7400"` (`turnstile dev`). See {@link Address}. */
  address?: Address;
  /**
   * The tenant of sessions named by id: default `"default"`, or, with `token`, the token's tenant (sent as
   * `""`, which the server fills in).
   */
  tenant?: string;
  /** A bearer token (`--auth-tokens`, a JWT), sent as `authorization: Bearer TOKEN`. */
  token?: string;
  /** How UNAVAILABLE is retried; see {@link RetryPolicy}. */
  retry?: Partial<RetryPolicy>;
  /** Connect interceptors, run on every call (logging, extra headers, tests that drop replies). */
  interceptors?: Interceptor[];
  /** How to dial; the entry point's default (HTTP/2 in Node, gRPC-Web in browsers). */
  connector?: Connector;
}

/** The options of a delivery. */
export interface DeliveryOptions extends CallOptions {
  /** The MessageId to use instead of the message's own or a fresh one. */
  id?: string;
  /** The message's source; unset, the preset's default (`user`; `plugin{""}` for inject). */
  source?: SourceLike;
}

/**
 * The JSON Schema the final reply of the turn a delivery opens must match (SPEC §20: sent to the model as
 * its response format; a reply that does not validate is retried once, then the turn ends
 * `error{invalid_output}`). Wins over the agent's own `output`.
 */
export interface OutputSchemaLike {
  /** `[A-Za-z0-9_-]`, 1 to 64 bytes. Default `output`. */
  name?: string;
  /** The schema: a JSON object, or its JSON text. */
  schema: object | string;
  /** Ask OpenAI-compatible providers for strict adherence; replies are validated either way. */
  strict?: boolean;
}

/** The options of `followup`, `queue`, `inject` and `interrupt`. */
export interface DeliverOptions extends DeliveryOptions {
  /** The schema the reply of the turn this message opens must match (SPEC §20). */
  outputSchema?: OutputSchemaLike;
}

function outputSchemaOf(o: OutputSchemaLike | undefined) {
  if (o === undefined) return undefined;
  const schemaJson = typeof o.schema === "string" ? o.schema : JSON.stringify(o.schema);
  return { name: o.name ?? "output", schemaJson, strict: o.strict ?? false };
}

/** The options of `send`, the delivery primitive. */
export interface SendOptions extends DeliveryOptions {
  /** `Target.NEXT_TURN` (default) or `Target.NEXT_STEP`. */
  target?: Target;
  /** Whether the delivery starts the agent when idle. Default `true`. */
  wakeup?: boolean;
}

/** The options of `steer`. */
export interface SteerOptions extends DeliveryOptions {
  /** Refused (FAILED_PRECONDITION) unless the session is running this turn. */
  expectedTurn?: Uint64;
  /** A steer still pending this long after acceptance triggers `onDeadline` (1 ms .. 7 days). */
  deadlineMs?: Uint64;
  /** `OnDeadline.INTERRUPT` (the default with a deadline) or `OnDeadline.DROP`; only with `deadlineMs`. */
  onDeadline?: OnDeadline;
}

/** An inbox splice: replace `deleteCount` messages of `target` from `start` with `inserted`. */
export interface SpliceEdit {
  target: Target;
  start: number;
  deleteCount: number;
  inserted?: MessageLike[];
}

/**
 * The filters, order and page of `listSessions` (SPEC §16). Filters combine: a session is listed when it
 * passes every one given. They are served from the session index, which follows each log (it may lag by a
 * write, never lead).
 */
export interface ListOptions extends CallOptions {
  /** Only this tenant's sessions (default: the client's; with auth, the token's). */
  tenant?: string;
  /** Only the `spawn_agent` children of this session id. */
  parent?: string;
  /** Only sessions with this status (default `SessionStatus.UNSPECIFIED`: any). */
  status?: SessionStatus;
  /** Only sessions running this agent. */
  agent?: string;
  /** Only sessions that recorded this version of `agent` (SPEC §20); 0 or unset: any. */
  agentVersion?: Uint64;
  /**
   * Only sessions whose labels match: `k=v`, `k!=v`, `k` (has `k`), `!k` (has no `k`), joined by commas,
   * every requirement must hold (a session without `k` matches `k!=v`). E.g. `"team=blue,!archived"`.
   */
  labelSelector?: string;
  /** Only sessions whose last activity (their last durable event) is after this Unix time in ms. */
  updatedAfterUnixMs?: Uint64;
  /** Only sessions whose last activity is before this Unix time in ms. */
  updatedBeforeUnixMs?: Uint64;
  /** `SessionOrder.ID` (the default, by tenant and id) or `SessionOrder.LAST_ACTIVITY` (newest first). */
  orderBy?: SessionOrder;
  pageToken?: string;
  /** 0 (default) means 100; at most 1000. */
  pageSize?: number;
}

/** When and how a schedule delivers (`createSchedule`, SPEC §15): exactly one of `atUnixMs` and `cron`. */
export interface ScheduleOptions extends CallOptions {
  /** Once, at this Unix time in ms (in the future); the schedule is gone after it fired. */
  atUnixMs?: Uint64;
  /**
   * A 5-field cron pattern, `minute hour day-of-month month day-of-week` (lists, ranges, steps, month and
   * weekday names), e.g. `"0 9 * * mon-fri"`.
   */
  cron?: string;
  /** The IANA time zone `cron` is evaluated in (default UTC), e.g. `"Europe/Berlin"`. */
  timeZone?: string;
  /** How each firing delivers: `SchedulePreset.FOLLOWUP` (the default), `QUEUE`, `STEER` or `INJECT`. */
  preset?: SchedulePreset;
  /** No firing after this Unix time in ms; the schedule is gone after its last firing. */
  notAfterUnixMs?: Uint64;
  /**
   * How late a firing missed while no worker owned the session may still be delivered (default 0: the
   * server's 60 000 ms); a later one is skipped and counted in `missed`.
   */
  catchupMs?: Uint64;
}

/** The page and scope of `listSchedules`. */
export interface ListSchedulesOptions extends CallOptions {
  /** Without a session: the tenant whose schedules to list (default: the client's; with auth, the token's). */
  tenant?: string;
  pageToken?: string;
  /** 0 (default) means 100; at most 1000. */
  pageSize?: number;
}

/** The options of `setLabels`. */
export interface LabelOptions extends CallOptions {
  /** Label keys to remove (a key the session does not have is ignored). */
  remove?: readonly string[];
}

/** What `exportSessions` exports. */
export interface ExportOptions extends CallOptions {
  /** The tenant to export (default: the client's; with auth, the token's). */
  tenant?: string;
}

/** How `run()` delivers its message and how long it waits. */
export interface RunOptions extends DeliveryOptions {
  /**
   * `"followup"` (default: a new turn, or the next one if a turn runs), `"steer"` (the running turn's next
   * step; a turn of its own when idle) or `"interrupt"` (cancels the running turn; the message heads the next).
   */
  preset?: "followup" | "steer" | "interrupt";
  /** Rejects with DEADLINE_EXCEEDED when the turn has not ended this many ms after the call (0: no bound). */
  timeoutMs?: number;
}

/** What `createWebhook` registers (SPEC §21). */
export interface WebhookOptions extends CallOptions {
  /** The durable event types delivered (default `["turn/end"]`). */
  events?: readonly string[];
  /** Only sessions whose labels match (`listSessions`' syntax); default every session of the tenant. */
  labelSelector?: string;
  /** How long an event is retried before it is given up on (0 or unset: 24 h; at most a week). */
  maxAgeMs?: Uint64;
  /** The tenant (default: the client's; with auth, the token's). */
  tenant?: string;
}

/** What `evaluate` reruns and how it scores (SPEC §20; the fields of `EvaluateRequest`). */
export interface EvaluateOptions extends CallOptions {
  /** The sessions to take turns from (default: those `labelSelector` selects). */
  sessions?: readonly string[];
  /** A label selector choosing the sessions (`k=v,k!=v,k,!k`); empty: every session of the tenant. */
  labelSelector?: string;
  /** The turns taken of each session: from `firstTurn` (default 1) through `lastTurn` (default its last ended). */
  firstTurn?: Uint64;
  lastTurn?: Uint64;
  /** The agent's version to run (default its newest; an older one must pin). */
  version?: Uint64;
  /** How each reply is scored (default `{ kind: { case: "exact", value: {} } }`). */
  scorer?: MessageInitShape<typeof EvalScorerSchema>;
  /** Turns run at once (default 4, at most 16 and the tenant's request burst). */
  parallel?: number;
  /** The most turns taken (default 100, at most 1000). */
  maxTurns?: number;
  /** How long one turn may run (default 120000 ms). */
  turnTimeoutMs?: Uint64;
  /** The tenant (default: the client's; with auth, the token's). */
  tenant?: string;
}

/** An `ExportItem`, as `exportSessions` yields it or as a plain object (read from a file, say). */
export type ExportItemLike = MessageInitShape<typeof ExportItemSchema>;

/** The header naming an executor's tenant when the server runs without auth (ServeTools names no session). */
const TENANT_HEADER = "turnstile-tenant";

function normalise(address: string): string {
  const a = address.trim().replace(/\/+$/, "");
  if (/^https?:\/\//.test(a)) return a;
  if (a.startsWith("grpc://")) return `http://${a.slice("grpc://".length)}`;
  if (a.includes("://")) {
    throw new TypeError(`address ${JSON.stringify(address)}: use host:port, http://host:port or https://host:port`);
  }
  return `http://${a}`;
}

const u64 = (n: Uint64 | undefined): bigint | undefined => (n === undefined ? undefined : BigInt(n));

/** `items` as an async iterable (what a client stream sends). */
async function* asAsync<T>(items: AsyncIterable<T> | Iterable<T>): AsyncGenerator<T, void, undefined> {
  yield* items;
}

/**
 * A client of one Turnstile deployment (a gateway or `turnstile dev`).
 *
 * Every RPC of `turnstile.v1.Agent` has a method returning the reply message (the generated types, whose
 * uint64 fields are `bigint`s). Sessions are ids in {@link ClientBase.tenant} or `SessionRef`s; messages
 * are texts or `UserMessage`s, with MessageIds minted for you. Deliveries and reads are retried on
 * UNAVAILABLE (a delivery with the same MessageId, so a reply lost on the way back is answered with the
 * first acceptance and nothing is written twice); everything else fails at once. Failures reject with a
 * {@link TurnstileError}.
 *
 * Use the entry point's `TurnstileClient` (this class with the platform's transport).
 */
export class ClientBase implements ClientCore {
  /** The tenant of sessions named by id. */
  readonly tenant: string;
  /** The retry policy of this client's calls and streams. */
  readonly retryPolicy: RetryPolicy;
  readonly #address: Address;
  readonly #connector: Connector;
  readonly #interceptors: Interceptor[];
  readonly #authorization: string | undefined;
  #current: { target: string; connection: Connection; rpc: Rpc } | undefined;
  #dialing: Promise<void> | undefined;
  // Connections left when the address moved: not closed, since streams may still be open on them (they end
  // by themselves when their server is gone); closed with the client.
  #retired: Connection[] = [];
  #closed = false;

  constructor(options: ClientOptions, defaultConnector: Connector) {
    this.#address = options.address ?? "127.0.0.1:7400";
    this.tenant = options.tenant ?? (options.token ? "" : "default");
    this.#authorization = options.token ? `Bearer ${options.token}` : undefined;
    this.retryPolicy = { ...DEFAULT_RETRY, ...options.retry };
    this.#interceptors = options.interceptors ?? [];
    this.#connector = options.connector ?? defaultConnector;
  }

  // --- connection ----------------------------------------------------------------------------------------

  /** The base URL the client dials now (`undefined` before the first call). */
  get target(): string | undefined {
    return this.#current?.target;
  }

  async #resolve(): Promise<string> {
    const a = this.#address;
    return normalise(typeof a === "function" ? await a() : a);
  }

  async #dial(target: string): Promise<void> {
    if (this.#current?.target === target) return;
    if (this.#current) this.#retired.push(this.#current.connection);
    const connection = this.#connector(target, this.#interceptors);
    const rpc = { agent: createClient(Agent, connection.transport), bidiStreams: connection.bidiStreams };
    this.#current = { target, connection, rpc };
  }

  /**
   * The generated connect client of the current connection, for RPCs newer than this client (pass
   * `{headers: client.headers()}`). Dials on first use.
   */
  async rpc(): Promise<Rpc> {
    if (this.#closed) throw new TypeError("this TurnstileClient is closed");
    if (!this.#current) await this.reconnect();
    // Set by reconnect (which throws otherwise).
    return this.#current!.rpc;
  }

  /** Asks the address again and dials anew if it moved. Concurrent callers share one resolution. */
  async reconnect(): Promise<void> {
    this.#dialing ??= this.#resolve()
      .then((target) => this.#dial(target))
      .finally(() => {
        this.#dialing = undefined;
      });
    return this.#dialing;
  }

  /** The headers every call carries: the bearer token, or, for ServeTools without one, the tenant. */
  headers(forTools = false): Headers {
    const h = new Headers();
    if (this.#authorization) h.set("authorization", this.#authorization);
    else if (forTools) h.set(TENANT_HEADER, this.tenant);
    return h;
  }

  /** Closes every connection; open streams end. The client cannot be used afterwards. */
  close(): void {
    this.#closed = true;
    for (const c of [...this.#retired, this.#current?.connection]) c?.close();
    this.#retired = [];
    this.#current = undefined;
  }

  async #unary<R>(
    method: string,
    retry: boolean,
    options: CallOptions | undefined,
    call: (agent: Client<typeof Agent>, opts: { signal?: AbortSignal; headers: Headers }) => Promise<R>,
  ): Promise<R> {
    const signal = options?.signal;
    const retries = new Retries(retry ? this.retryPolicy : NO_RETRY, () => this.reconnect());
    for (;;) {
      let error;
      try {
        const { agent } = await this.rpc();
        return await call(agent, { signal, headers: this.headers() });
      } catch (e) {
        error = toTurnstileError(method, e, signal);
      }
      try {
        await retries.after(error, signal);
      } catch (e) {
        throw toTurnstileError(method, e, signal);
      }
    }
  }

  /** A `SessionRef` for `session`: an id in this client's tenant, or the given ref. */
  ref(session: SessionLike): SessionRef {
    return sessionRef(session, this.tenant);
  }

  // --- deliveries (retried with the same MessageId) -------------------------------------------------------

  /** The delivery primitive (SPEC §2): `target` next-turn (default) or next-step, `wakeup` (default true). */
  send(session: SessionLike, message: MessageLike, options: SendOptions = {}): Promise<SendReply> {
    const request = {
      session: this.ref(session),
      message: toUserMessage(message, options),
      target: options.target ?? Target.NEXT_TURN,
      wakeup: options.wakeup ?? true,
    };
    return this.#unary("Send", true, options, (a, o) => a.send(request, o));
  }

  /** next-turn, wakeup: a new turn; starts the agent if idle. */
  followup(session: SessionLike, message: MessageLike, options: DeliverOptions = {}): Promise<SendReply> {
    const request = {
      session: this.ref(session),
      message: toUserMessage(message, options),
      outputSchema: outputSchemaOf(options.outputSchema),
    };
    return this.#unary("Followup", true, options, (a, o) => a.followup(request, o));
  }

  /** next-turn, no wakeup: a turn that waits for a later waking delivery. */
  queue(session: SessionLike, message: MessageLike, options: DeliverOptions = {}): Promise<SendReply> {
    const request = {
      session: this.ref(session),
      message: toUserMessage(message, options),
      outputSchema: outputSchemaOf(options.outputSchema),
    };
    return this.#unary("Queue", true, options, (a, o) => a.queue(request, o));
  }

  /** next-step, no wakeup: model-visible context for the next step (default source `plugin{""}`). */
  inject(session: SessionLike, message: MessageLike, options: DeliverOptions = {}): Promise<SendReply> {
    const request = {
      session: this.ref(session),
      message: toUserMessage(message, options),
      outputSchema: outputSchemaOf(options.outputSchema),
    };
    return this.#unary("Inject", true, options, (a, o) => a.inject(request, o));
  }

  /** Cancels the running turn keeping the inbox, then follows up with `message` at the head. */
  interrupt(session: SessionLike, message: MessageLike, options: DeliverOptions = {}): Promise<SendReply> {
    const request = {
      session: this.ref(session),
      message: toUserMessage(message, options),
      outputSchema: outputSchemaOf(options.outputSchema),
    };
    return this.#unary("Interrupt", true, options, (a, o) => a.interrupt(request, o));
  }

  /** next-step, wakeup: input for the running turn's next step (opens a turn when idle). */
  steer(session: SessionLike, message: MessageLike, options: SteerOptions = {}): Promise<SendReply> {
    const request = {
      session: this.ref(session),
      message: toUserMessage(message, options),
      expectedTurn: u64(options.expectedTurn),
      deadlineMs: u64(options.deadlineMs),
      onDeadline: options.onDeadline,
    };
    return this.#unary("Steer", true, options, (a, o) => a.steer(request, o));
  }

  /**
   * Injects `fromSession`'s transcript (through `uptoTurn`, or all of it) into `session` as one message with
   * a `session` source (SPEC §13). A delivery: retried with the same MessageId (`id`, or a fresh one).
   */
  referenceSession(
    session: SessionLike,
    fromSession: SessionLike,
    options: CallOptions & { uptoTurn?: Uint64; id?: string } = {},
  ): Promise<SendReply> {
    const request = {
      session: this.ref(session),
      fromSession: this.ref(fromSession),
      uptoTurn: u64(options.uptoTurn),
      messageId: options.id ?? newMessageId(),
    };
    return this.#unary("ReferenceSession", true, options, (a, o) => a.referenceSession(request, o));
  }

  // --- commands and edits (never retried: a repeat could act twice) ---------------------------------------

  /** Cancels the running turn (cause `user` unless given); `keepInbox` keeps the pending messages. */
  cancel(
    session: SessionLike,
    options: CallOptions & { cause?: MessageInitShape<typeof CancelCauseSchema>; keepInbox?: boolean } = {},
  ): Promise<CancelReply> {
    const request = { session: this.ref(session), cause: options.cause, keepInbox: options.keepInbox ?? false };
    return this.#unary("Cancel", false, options, (a, o) => a.cancel(request, o));
  }

  /** Replaces pending message `id` with `message` (NOT_FOUND when `id` is not pending). */
  replace(session: SessionLike, id: string, message: MessageLike, options: CallOptions = {}): Promise<EditReply> {
    const request = { session: this.ref(session), id, message: toUserMessage(message) };
    return this.#unary("Replace", false, options, (a, o) => a.replace(request, o));
  }

  /** Removes pending message `id` (NOT_FOUND when it is not pending). */
  remove(session: SessionLike, id: string, options: CallOptions = {}): Promise<EditReply> {
    const request = { session: this.ref(session), id };
    return this.#unary("Remove", false, options, (a, o) => a.remove(request, o));
  }

  /** The general inbox edit: `deleteCount` messages of `target` from `start` replaced with `inserted`. */
  splice(session: SessionLike, edit: SpliceEdit, options: CallOptions = {}): Promise<EditReply> {
    const request = {
      session: this.ref(session),
      target: edit.target,
      start: edit.start,
      deleteCount: edit.deleteCount,
      inserted: (edit.inserted ?? []).map((m) => toUserMessage(m)),
    };
    return this.#unary("Splice", false, options, (a, o) => a.splice(request, o));
  }

  /** Removes every pending message of both inbox targets. */
  clear(session: SessionLike, options: CallOptions = {}): Promise<EditReply> {
    return this.#unary("Clear", false, options, (a, o) => a.clear({ session: this.ref(session) }, o));
  }

  /**
   * Sets the session's agent and inject mode from the next turn on (SPEC §8); only while idle. `overrides`
   * are what the agent allows (`[agents.NAME.overrides]`, SPEC §20): `systemPrompt` sent after the agent's,
   * `model` from its list, `tools` a subset of its tools (`[]`: none); all at once, one left out is no override.
   */
  configureSession(
    session: SessionLike,
    agent: string,
    options: CallOptions & {
      injectMode?: InjectMode;
      version?: Uint64;
      overrides?: { systemPrompt?: string; model?: string; tools?: string[] };
    } = {},
  ): Promise<SessionInfo> {
    const o = options.overrides;
    const overrides = o && {
      systemPrompt: o.systemPrompt,
      model: o.model,
      tools: o.tools === undefined ? undefined : { tools: o.tools },
    };
    const request = { session: this.ref(session), agent, injectMode: options.injectMode, version: u64(options.version), overrides };
    return this.#unary("ConfigureSession", false, options, (a, o) => a.configureSession(request, o));
  }

  /** Approves or denies a tool call awaiting approval (SPEC §9); denied gives `denied: <reason>`. */
  decide(
    session: SessionLike,
    callId: string,
    approve: boolean,
    options: CallOptions & { reason?: string } = {},
  ): Promise<EditReply> {
    const request = { session: this.ref(session), callId, approve, reason: options.reason ?? "" };
    return this.#unary("Decide", false, options, (a, o) => a.decide(request, o));
  }

  /**
   * Answers the call of a client tool of the turn (`tool/call {awaitingClient}`, SPEC §19) with its result:
   * durable `tool/result`, then the turn goes on. `error` marks the call failed.
   */
  completeToolCall(
    session: SessionLike,
    callId: string,
    output: string,
    options: CallOptions & { error?: string } = {},
  ): Promise<EditReply> {
    const request = { session: this.ref(session), callId, output, error: options.error };
    return this.#unary("CompleteToolCall", false, options, (a, o) => a.completeToolCall(request, o));
  }

  /** Starts a goal (SPEC §10), or revises the session's active or paused one. */
  setGoal(session: SessionLike, objective: string, maxRounds: number, options: CallOptions = {}): Promise<GoalInfo> {
    const request = { session: this.ref(session), objective, maxRounds };
    return this.#unary("SetGoal", false, options, (a, o) => a.setGoal(request, o));
  }

  /** Pauses, resumes or clears the session's goal `goalId`. */
  updateGoal(session: SessionLike, goalId: string, action: GoalAction, options: CallOptions = {}): Promise<GoalInfo> {
    const request = { session: this.ref(session), goalId, action };
    return this.#unary("UpdateGoal", false, options, (a, o) => a.updateGoal(request, o));
  }

  // --- history (SPEC §13) and deletion (§12) ------------------------------------------------------------

  /**
   * Summarizes the finished turns not yet summarized (durable `context/compacted`); only while idle.
   * Nothing to summarize writes nothing and answers the last seq.
   */
  compact(session: SessionLike, options: CallOptions = {}): Promise<EditReply> {
    return this.#unary("Compact", false, options, (a, o) => a.compact({ session: this.ref(session) }, o));
  }

  /**
   * Creates `newSession` (same tenant) from `session`'s transcript through the end of `atTurn`. Not
   * retried: a repeat of a fork that landed answers ALREADY_EXISTS.
   */
  forkSession(session: SessionLike, atTurn: Uint64, newSession: string, options: CallOptions = {}): Promise<SessionInfo> {
    const request = { session: this.ref(session), atTurn: BigInt(atTurn), newSession };
    return this.#unary("ForkSession", false, options, (a, o) => a.forkSession(request, o));
  }

  /**
   * Deletes the session (a running turn ends `aborted{disposed}`); answers the last seq the log had. Not
   * retried: a repeat of a delete that landed answers NOT_FOUND.
   */
  deleteSession(session: SessionLike, options: CallOptions = {}): Promise<EditReply> {
    return this.#unary("DeleteSession", false, options, (a, o) => a.deleteSession({ session: this.ref(session) }, o));
  }

  // --- reads (retried) -------------------------------------------------------------------------------------

  /** The pending messages of both inbox targets and the last seq folded. */
  getInbox(session: SessionLike, options: CallOptions = {}): Promise<InboxSnapshot> {
    return this.#unary("GetInbox", true, options, (a, o) => a.getInbox({ session: this.ref(session) }, o));
  }

  /** The session's status, last seq and turn, owner, agent, goal and parent. NOT_FOUND without events. */
  getSession(session: SessionLike, options: CallOptions = {}): Promise<SessionInfo> {
    return this.#unary("GetSession", true, options, (a, o) => a.getSession({ session: this.ref(session) }, o));
  }

  /**
   * One page of the session's transcript (SPEC §21): items with a seq above `afterSeq` (default 0), at most
   * `pageSize` (0 or unset: 100; at most 1000). `nextSeq` is the next page's `afterSeq` (0 at the end);
   * `lastSeq` is where a `watch` that follows the conversation starts. NOT_FOUND without events.
   */
  getTranscript(
    session: SessionLike,
    options: CallOptions & { afterSeq?: Uint64; pageSize?: number } = {},
  ): Promise<GetTranscriptReply> {
    const request = { session: this.ref(session), afterSeq: u64(options.afterSeq), pageSize: options.pageSize ?? 0 };
    return this.#unary("GetTranscript", true, options, (a, o) => a.getTranscript(request, o));
  }

  /**
   * The session's conversation, oldest first, page after page: user messages (with `delivery` and source),
   * assistant messages, tool calls, decisions, results and turn ends with usage, each with its `seq`.
   */
  async *transcript(
    session: SessionLike,
    options: CallOptions & { afterSeq?: Uint64; pageSize?: number } = {},
  ): AsyncGenerator<TranscriptItem, void, undefined> {
    let afterSeq = u64(options.afterSeq);
    for (;;) {
      const page = await this.getTranscript(session, { ...options, afterSeq });
      yield* page.items;
      if (page.nextSeq === 0n) return;
      afterSeq = page.nextSeq;
    }
  }

  /**
   * The approvals inbox (SPEC §21): the tool calls awaiting a decision, of `options.session`, or of a page of
   * the tenant's running sessions (`pageSize` sessions; follow `nextPageToken` until it is empty, a page may
   * hold no call). Each names its session, turn, call, tool, arguments and since when it waits.
   */
  listPendingApprovals(
    options: CallOptions & { session?: SessionLike; tenant?: string; pageToken?: string; pageSize?: number } = {},
  ): Promise<ListPendingApprovalsReply> {
    const request = {
      session: options.session === undefined ? undefined : this.ref(options.session),
      tenant: options.tenant ?? this.tenant,
      pageToken: options.pageToken ?? "",
      pageSize: options.pageSize ?? 0,
    };
    return this.#unary("ListPendingApprovals", true, options, (a, o) => a.listPendingApprovals(request, o));
  }

  /**
   * Puts agent `name` of the caller's tenant (SPEC §20): `definition` holds the keys of an `[agents.NAME]`
   * table, as TOML text or a JSON object (an object is sent as JSON). A changed definition is a new
   * version; a bad one is INVALID_ARGUMENT naming the key, as the configuration file would.
   */
  putAgent(name: string, definition: string | object, options: CallOptions = {}): Promise<AgentInfo> {
    const json = typeof definition !== "string";
    const request = {
      name,
      definition: json ? JSON.stringify(definition) : definition,
      format: json ? DefinitionFormat.JSON : DefinitionFormat.UNSPECIFIED,
    };
    return this.#unary("PutAgent", true, options, (a, o) => a.putAgent(request, o));
  }

  /** Agent `name` at `options.version` (default: its newest). NOT_FOUND for one the caller cannot see. */
  getAgent(name: string, options: CallOptions & { version?: Uint64 } = {}): Promise<AgentInfo> {
    const request = { name, version: u64(options.version) };
    return this.#unary("GetAgent", true, options, (a, o) => a.getAgent(request, o));
  }

  /** The agents the caller's sessions may run, newest versions. */
  listAgents(options: CallOptions = {}): Promise<ListAgentsReply> {
    return this.#unary("ListAgents", true, options, (a, o) => a.listAgents({}, o));
  }

  /** Every version of agent `name`, oldest first. */
  listAgentVersions(name: string, options: CallOptions = {}): Promise<ListAgentVersionsReply> {
    return this.#unary("ListAgentVersions", true, options, (a, o) => a.listAgentVersions({ name }, o));
  }

  /** Deletes the caller's agent `name`: no new session may use it; its sessions keep their version. */
  deleteAgent(name: string, options: CallOptions = {}): Promise<AgentInfo> {
    return this.#unary("DeleteAgent", false, options, (a, o) => a.deleteAgent({ name }, o));
  }

  /**
   * Moves the sessions running `agent` (`options.sessions`, or those `options.labelSelector` selects) to
   * `toVersion` (0: the newest) from their next turn, durably.
   */
  migrateSessions(
    agent: string,
    toVersion: Uint64,
    options: CallOptions & { sessions?: SessionLike[]; labelSelector?: string } = {},
  ): Promise<MigrateSessionsReply> {
    const request = {
      agent,
      toVersion: u64(toVersion),
      sessions: (options.sessions ?? []).map((s) => this.ref(s)),
      labelSelector: options.labelSelector ?? "",
    };
    return this.#unary("MigrateSessions", true, options, (a, o) => a.migrateSessions(request, o));
  }

  /**
   * Writes `document` (any JSON value; a string is sent as the JSON text it holds when `options.raw`) at
   * `key` of `namespace` in the tenant's memory (SPEC §20), replacing what was there.
   */
  putMemory(
    namespace: string,
    key: string,
    document: unknown,
    options: CallOptions & { tenant?: string; raw?: boolean } = {},
  ): Promise<MemoryDocument> {
    const text = options.raw && typeof document === "string" ? document : JSON.stringify(document);
    const request = { tenant: options.tenant ?? this.tenant, namespace, key, document: text };
    return this.#unary("PutMemory", true, options, (a, o) => a.putMemory(request, o));
  }

  /** The document at `key` of `namespace` (its JSON text in `document`); NOT_FOUND when there is none. */
  getMemory(namespace: string, key: string, options: CallOptions & { tenant?: string } = {}): Promise<MemoryDocument> {
    const request = { tenant: options.tenant ?? this.tenant, namespace, key };
    return this.#unary("GetMemory", true, options, (a, o) => a.getMemory(request, o));
  }

  /** A page of the tenant's documents whose keys start with `options.prefix`, in (namespace, key) order. */
  listMemory(
    options: CallOptions & { tenant?: string; namespace?: string; prefix?: string; pageSize?: number; pageToken?: string } = {},
  ): Promise<ListMemoryReply> {
    const request = {
      tenant: options.tenant ?? this.tenant,
      namespace: options.namespace ?? "",
      prefix: options.prefix ?? "",
      pageSize: options.pageSize ?? 0,
      pageToken: options.pageToken ?? "",
    };
    return this.#unary("ListMemory", true, options, (a, o) => a.listMemory(request, o));
  }

  /** The documents that best match the words of `query` (BM25), best first. */
  searchMemory(
    query: string,
    options: CallOptions & { tenant?: string; namespaces?: string[]; limit?: number } = {},
  ): Promise<SearchMemoryReply> {
    const request = {
      tenant: options.tenant ?? this.tenant,
      namespaces: options.namespaces ?? [],
      query,
      limit: options.limit ?? 0,
    };
    return this.#unary("SearchMemory", true, options, (a, o) => a.searchMemory(request, o));
  }

  /** Deletes the document at `key` of `namespace` and answers it; NOT_FOUND when there is none. */
  deleteMemory(namespace: string, key: string, options: CallOptions & { tenant?: string } = {}): Promise<MemoryDocument> {
    const request = { tenant: options.tenant ?? this.tenant, namespace, key };
    return this.#unary("DeleteMemory", false, options, (a, o) => a.deleteMemory(request, o));
  }

  /**
   * Resolves when the session is idle with nothing latched; DEADLINE_EXCEEDED after `timeoutMs` (0 or
   * unset: the server's default, 30 s).
   */
  whenIdle(session: SessionLike, options: CallOptions & { timeoutMs?: Uint64 } = {}): Promise<SessionInfo> {
    const request = { session: this.ref(session), timeoutMs: u64(options.timeoutMs) };
    return this.#unary("WhenIdle", true, options, (a, o) => a.whenIdle(request, o));
  }

  /** One page of the tenant's sessions (or of one session's children); see {@link ClientBase.sessions}. */
  listSessions(options: ListOptions = {}): Promise<ListSessionsReply> {
    const request = {
      tenant: options.tenant ?? this.tenant,
      parent: options.parent ?? "",
      status: options.status,
      agent: options.agent ?? "",
      agentVersion: u64(options.agentVersion),
      labelSelector: options.labelSelector ?? "",
      updatedAfterUnixMs: u64(options.updatedAfterUnixMs),
      updatedBeforeUnixMs: u64(options.updatedBeforeUnixMs),
      orderBy: options.orderBy,
      pageToken: options.pageToken ?? "",
      pageSize: options.pageSize ?? 0,
    };
    return this.#unary("ListSessions", true, options, (a, o) => a.listSessions(request, o));
  }

  /**
   * The tenant's model tokens per model from the UTC day of `sinceUnixMs` on (0 or unset: every day kept),
   * counted cluster-wide from the durable `assistant/message`s, with its daily token budget, the tokens
   * used today and when that count resets (SPEC §17). `tenant` defaults to the client's (a token's tenant
   * with auth on).
   */
  getUsage(options: CallOptions & { tenant?: string; sinceUnixMs?: Uint64 } = {}): Promise<TenantUsage> {
    const request = { tenant: options.tenant ?? this.tenant, sinceUnixMs: u64(options.sinceUnixMs) };
    return this.#unary("GetUsage", true, options, (a, o) => a.getUsage(request, o));
  }

  /**
   * The schedules of `session`, or, without one, a page of those of every session of the tenant (SPEC §15).
   * A one-shot schedule that fired, or one past its `notAfterUnixMs`, is no longer listed.
   */
  listSchedules(session?: SessionLike, options: ListSchedulesOptions = {}): Promise<ListSchedulesReply> {
    const request = {
      session: session === undefined ? undefined : this.ref(session),
      tenant: options.tenant ?? this.tenant,
      pageToken: options.pageToken ?? "",
      pageSize: options.pageSize ?? 0,
    };
    return this.#unary("ListSchedules", true, options, (a, o) => a.listSchedules(request, o));
  }

  /** Every session of the tenant (or every child of `parent`) that passes the filters, page after page. */
  async *sessions(options: Omit<ListOptions, "pageToken"> = {}): AsyncGenerator<SessionInfo, void, undefined> {
    let pageToken = "";
    do {
      const page = await this.listSessions({ ...options, pageToken });
      yield* page.sessions;
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
  }

  // --- schedules (SPEC §15) and labels (§16) ----------------------------------------------------------

  /**
   * Stores schedule `scheduleId` on the session (durable `schedule/changed`; a session without events is
   * created): once at `atUnixMs`, or by the 5-field `cron` pattern in `timeZone` (default UTC). Each firing
   * delivers `message`'s content with `preset` (default followup), MessageId `<scheduleId>@<fireUnixMs>`
   * and source `schedule {scheduleId, fireUnixMs}`; the message's own id and source are not used.
   * Retried on UNAVAILABLE: the same schedule again answers it as it is, while the same id with other
   * content is ALREADY_EXISTS. A bad cron pattern (naming the field and what it allows), an unknown time
   * zone or an `atUnixMs` in the past is INVALID_ARGUMENT.
   *
   * ```ts
   * await client.createSchedule("s1", "daily-report", "write the report", { cron: "0 9 * * *", timeZone: "Europe/Berlin" });
   * ```
   */
  createSchedule(session: SessionLike, scheduleId: string, message: MessageLike, options: ScheduleOptions): Promise<Schedule> {
    if ((options.atUnixMs === undefined) === (options.cron === undefined)) {
      return Promise.reject(new TypeError("createSchedule: give exactly one of atUnixMs and cron"));
    }
    const timing =
      options.cron !== undefined
        ? { case: "cron" as const, value: options.cron }
        : { case: "atUnixMs" as const, value: BigInt(options.atUnixMs!) };
    const request = {
      session: this.ref(session),
      scheduleId,
      preset: options.preset ?? SchedulePreset.FOLLOWUP,
      message: { content: toUserMessage(message, { id: "" }).content },
      timing,
      timeZone: options.timeZone ?? "",
      notAfterUnixMs: u64(options.notAfterUnixMs),
      catchupMs: u64(options.catchupMs),
    };
    return this.#unary("CreateSchedule", true, options, (a, o) => a.createSchedule(request, o));
  }

  /**
   * Deletes the session's schedule `scheduleId` (durable `schedule/changed`) and answers it as it was.
   * NOT_FOUND when the session has none by that id (a one-shot that fired is gone). Not retried: a repeat
   * of a delete that landed answers NOT_FOUND.
   */
  deleteSchedule(session: SessionLike, scheduleId: string, options: CallOptions = {}): Promise<Schedule> {
    const request = { session: this.ref(session), scheduleId };
    return this.#unary("DeleteSchedule", false, options, (a, o) => a.deleteSchedule(request, o));
  }

  /**
   * Sets `labels` on the session and removes the keys in `remove` (durable `session/labeled`, only what
   * changes); answers the session with its labels. Keys are `[a-z0-9_.-/]{1,63}`, values at most 256
   * bytes, at most 32 labels per session (INVALID_ARGUMENT otherwise). Retried: setting the same labels
   * again changes nothing. Find sessions by label with `listSessions({ labelSelector })`.
   */
  setLabels(session: SessionLike, labels: Record<string, string> = {}, options: LabelOptions = {}): Promise<SessionInfo> {
    const request = { session: this.ref(session), labels, removeKeys: [...(options.remove ?? [])] };
    return this.#unary("SetLabels", true, options, (a, o) => a.setLabels(request, o));
  }

  // --- evaluation (SPEC §20) ------------------------------------------------------------------------------

  /**
   * Reruns recorded turns on `agent` (at `options.version`) in scratch sessions and scores each new reply
   * beside its recording: yields `started`, one `row` per turn as it finishes, then `summary`. Stopping the
   * iteration (or aborting `options.signal`) stops the run; its scratch sessions are deleted either way.
   * Not retried: a second run would rerun every turn again.
   */
  async *evaluate(agent: string, options: EvaluateOptions = {}): AsyncGenerator<EvaluateItem, void, undefined> {
    const request = {
      tenant: options.tenant ?? this.tenant,
      sessions: (options.sessions ?? []).map((s) => this.ref(s)),
      labelSelector: options.labelSelector ?? "",
      firstTurn: u64(options.firstTurn) ?? 0n,
      lastTurn: u64(options.lastTurn) ?? 0n,
      agent,
      version: u64(options.version) ?? 0n,
      scorer: options.scorer,
      parallel: options.parallel ?? 0,
      maxTurns: options.maxTurns ?? 0,
      turnTimeoutMs: u64(options.turnTimeoutMs) ?? 0n,
    };
    try {
      const { agent: rpc } = await this.rpc();
      yield* rpc.evaluate(request, { signal: options.signal, headers: this.headers() });
    } catch (e) {
      throw toTurnstileError("Evaluate", e, options.signal);
    }
  }

  // --- export and import (SPEC §18; admin only with auth) -------------------------------------------------

  /**
   * The whole logs of `sessions` of the tenant (every session it has when empty) as `ExportItem`s: a
   * `header {format, tenant}`, then per session its events from seq 1 in order as `events` groups, closed
   * by `end {session, lastSeq}`. Schedules and labels are events, so they come along. Feed the items to
   * {@link ClientBase.importSessions} of another deployment, or keep them (`sizeDelimitedEncode(ExportItemSchema,
   * item)` of `@bufbuild/protobuf/wire` for each is `turnstile export`'s file).
   *
   * Opening the stream is retried on UNAVAILABLE until its first item; a stream that breaks later fails
   * (an import of the part received is refused as cut short: export again). NOT_FOUND for a listed
   * session without events, PERMISSION_DENIED for a token that is not an administrator's.
   */
  async *exportSessions(sessions: readonly string[] = [], options: ExportOptions = {}): AsyncGenerator<ExportItem, void, undefined> {
    const signal = options.signal;
    const request = { tenant: options.tenant ?? this.tenant, sessions: [...sessions] };
    const retries = new Retries(this.retryPolicy, () => this.reconnect());
    for (;;) {
      let received = false;
      let error;
      try {
        const { agent } = await this.rpc();
        for await (const item of agent.exportSessions(request, { signal, headers: this.headers() })) {
          received = true;
          yield item;
        }
        return;
      } catch (e) {
        error = toTurnstileError("ExportSessions", e, signal);
      }
      if (received) throw error;
      try {
        await retries.after(error, signal);
      } catch (e) {
        throw toTurnstileError("ExportSessions", e, signal);
      }
    }
  }

  /**
   * Writes an export (the items of {@link ClientBase.exportSessions}, as an array or an async iterable, so
   * `b.importSessions(a.exportSessions())` copies a tenant from `a` to `b`) into this deployment, keeping
   * every seq, time, epoch and MessageId: a watch from 0 of an imported session shows the same events, and
   * a retry of an old delivery is recognised. Answers the sessions and events written. ALREADY_EXISTS for
   * a session that has events here (the sessions before it stay imported); INVALID_ARGUMENT for a stream
   * that is not a whole export. Not retried: the items are consumed, and a repeat answers ALREADY_EXISTS.
   * Needs a client stream: from Node, not over gRPC-Web (UNIMPLEMENTED in a browser).
   */
  importSessions(items: AsyncIterable<ExportItemLike> | Iterable<ExportItemLike>, options: CallOptions = {}): Promise<ImportReply> {
    return this.#unary("ImportSessions", false, options, async (a, o) => {
      if (!(await this.rpc()).bidiStreams) {
        throw new TurnstileError(
          "ImportSessions",
          Code.Unimplemented,
          "importing needs a client stream, which gRPC-Web cannot carry; import from Node",
        );
      }
      return a.importSessions(asAsync(items), o);
    });
  }

  // --- webhooks (SPEC §21) ---------------------------------------------------------------------------------

  /**
   * Registers a webhook for the tenant: the owner of each of its sessions whose labels match POSTs their
   * durable events of `events` types written from now on to `url`, signed (`Turnstile-Signature: sha256=`
   * the hex HMAC-SHA256 of the body, keyed by the reply's `secret`, which is shown only here), retried and
   * in seq order per session. A URL resolving to a loopback, private, link-local or metadata address is
   * INVALID_ARGUMENT unless the server allows it (`[webhooks] allow_private`). Not retried: a repeat would
   * register a second webhook.
   */
  createWebhook(url: string, options: WebhookOptions = {}): Promise<Webhook> {
    const request = {
      tenant: options.tenant ?? this.tenant,
      url,
      events: [...(options.events ?? ["turn/end"])],
      labelSelector: options.labelSelector ?? "",
      maxAgeMs: u64(options.maxAgeMs),
    };
    return this.#unary("CreateWebhook", false, options, (a, o) => a.createWebhook(request, o));
  }

  /** The tenant's webhooks, oldest first, without their secrets. */
  listWebhooks(options: CallOptions & { tenant?: string } = {}): Promise<ListWebhooksReply> {
    const request = { tenant: options.tenant ?? this.tenant };
    return this.#unary("ListWebhooks", true, options, (a, o) => a.listWebhooks(request, o));
  }

  /** Deletes webhook `id`: no POST starts after it. NOT_FOUND for an id the tenant does not have. */
  deleteWebhook(id: string, options: CallOptions & { tenant?: string } = {}): Promise<Webhook> {
    const request = { tenant: options.tenant ?? this.tenant, id };
    return this.#unary("DeleteWebhook", false, options, (a, o) => a.deleteWebhook(request, o));
  }

  // --- high-level helpers ---------------------------------------------------------------------------------

  /**
   * Sends `message` (a followup unless `preset` says otherwise), waits for the turn it runs in to end and
   * answers what that turn produced: its number, the reply (`text`, the turn's last model message), every
   * model message, the tool calls with their decisions and results, the tokens and how it ended.
   *
   * ```ts
   * const { text, usage } = await client.run("s1", "What is the capital of France?");
   * ```
   *
   * The delivery is retried like `followup` (same MessageId), then the session's durable events are read
   * from the delivery on (a steer's result holds what came after it entered the running turn). A turn
   * that ends `error`, `blocked` or otherwise still resolves: check `reason`. `timeoutMs` or `signal`
   * bound the wait; a message removed from the inbox before it ran never resolves without them.
   */
  async run(session: SessionLike, message: MessageLike, options: RunOptions = {}): Promise<RunResult> {
    const msg = toUserMessage(message, options);
    const preset = options.preset ?? "followup";
    const delivery = { ...options, id: msg.id };
    const reply =
      preset === "steer"
        ? await this.steer(session, msg, delivery)
        : preset === "interrupt"
          ? await this.interrupt(session, msg, delivery)
          : await this.followup(session, msg, delivery);
    const bound = options.timeoutMs ? AbortSignal.timeout(options.timeoutMs) : undefined;
    // Either signal ends the wait (by hand: AbortSignal.any needs Node 20.3).
    const either = new AbortController();
    for (const s of [bound, options.signal]) {
      if (s?.aborted) either.abort(s.reason);
      else s?.addEventListener("abort", () => either.abort(s.reason), { once: true });
    }
    const signal = either.signal;
    const events = new EventFolder();
    let turn: RunFolder | undefined;
    const stream = this.watch(session, { afterSeq: reply.seq - 1n, live: false, signal });
    try {
      for await (const item of stream) {
        for (const event of events.fold(item)) {
          if (!turn && event.type === "user" && event.id === msg.id && event.turn > 0n) turn = new RunFolder(event.turn);
          turn?.add(event);
          if (turn?.result) return turn.result;
        }
      }
    } finally {
      await stream.close();
    }
    if (bound?.aborted) {
      throw new TurnstileError("Run", Code.DeadlineExceeded, `the turn did not end within timeoutMs (${options.timeoutMs} ms)`);
    }
    throw new TurnstileError("Run", Code.Canceled, "run was cancelled by its signal");
  }

  /**
   * The turn the delivered message `messageId` runs in, once it has entered one (0: it entered history
   * between turns, an idle inject). A reply's `turn` says it at once for a delivery that opened a turn; a
   * steer into a running turn, an interrupt or a queued followup learn it here, as soon as it is known:
   * `reply.turn ?? await client.turnOf(s, id, { afterSeq: reply.seq })`.
   */
  async turnOf(session: SessionLike, messageId: string, options: CallOptions & { afterSeq?: Uint64 } = {}): Promise<bigint> {
    const afterSeq = u64(options.afterSeq) ?? 0n;
    const stream = this.watch(session, { afterSeq: afterSeq > 0n ? afterSeq - 1n : 0n, live: false, signal: options.signal });
    const events = new EventFolder();
    try {
      for await (const item of stream) {
        for (const event of events.fold(item)) {
          if (event.type === "user" && event.id === messageId) return event.turn;
        }
      }
    } finally {
      await stream.close();
    }
    throw new TurnstileError("TurnOf", Code.Canceled, "turnOf was cancelled by its signal");
  }

  /**
   * The session's typed events ({@link TurnEvent}: `user`, `text_delta`, `message`, `tool_started`,
   * `approval`, `tool_decided`, `tool_done`, `turn_started`, `turn_done`, `caught_up`), read from `watch()`
   * with the same options (and its resumption). Leaving the `for await` loop closes the stream.
   *
   * ```ts
   * for await (const e of client.events("s1", { afterSeq: transcript.lastSeq })) {
   *   if (e.type === "text_delta") process.stdout.write(e.text);
   *   else if (e.type === "approval") await client.decide("s1", e.callId, true);
   *   else if (e.type === "turn_done") break;
   * }
   * ```
   */
  async *events(session: SessionLike, options: WatchOptions = {}): AsyncGenerator<TurnEvent, void, undefined> {
    const stream = this.watch(session, options);
    const folder = new EventFolder();
    try {
      for await (const item of stream) yield* folder.fold(item);
    } finally {
      await stream.close();
    }
  }

  // --- streams --------------------------------------------------------------------------------------------

  /**
   * The session's `WatchItem`s: durable `event`s after `afterSeq`, one `caughtUp`, then the live tail.
   * After a disconnect the stream reopens from the last durable seq received (a fresh `caughtUp` follows):
   * no durable event is missed or repeated. See {@link WatchStream}.
   */
  watch(session: SessionLike, options: WatchOptions = {}): WatchStream {
    return new WatchStream(this, this.ref(session), options);
  }

  /**
   * Serves `tools` to the agents of this client's tenant (`client:NAME` in an agent's `tools`) until
   * `close()`. See {@link ToolServer}.
   */
  serveTools(tools: Tools, options: ToolServerOptions = {}): ToolServer {
    return new ToolServer(this, tools, options);
  }
}
