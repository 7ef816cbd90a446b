// Client tools (SPEC §9, ServeTools): handlers named in an object, served over one bidirectional stream.
//
// The stream: the client registers its tools, the gateway answers `registered`, then sends `call`s (each
// run here at once, answered with a `result`) and `cancel`s (the call's AbortSignal fires and nothing is
// sent: the worker has given up on it). A lost stream registers again, with the client's retry policy.

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import type {
  ClientToolSpecSchema,
  ToolCallResultSchema,
  ToolCallTask,
  ToolWorkerMessageSchema,
} from "./gen/turnstile/v1/agent_pb.js";
import { type SessionRef, SessionRefSchema } from "./gen/turnstile/v1/events_pb.js";
import type { ClientCore } from "./core.js";
import { TurnstileError, toTurnstileError } from "./errors.js";
import { Retries } from "./retry.js";

/** What a tool handler gets beside its arguments: the call it answers. */
export interface ToolContext {
  /** The session whose agent called the tool. */
  readonly session: SessionRef;
  readonly callId: string;
  /** The tool's name as registered. */
  readonly name: string;
  /** When the worker stops waiting for the result (the agent's `tool_timeout`). */
  readonly deadline: Date;
  /**
   * `<tenant>/<session>/<turn>/<step>/<callId>` (SPEC §20): the same when the call runs again after its worker
   * stopped (the agent's `retry_after_repair`), so a tool can refuse a side effect it already made.
   */
  readonly idempotencyKey: string;
  /** Aborted when the gateway cancels the call (a turn canceled, the deadline passed) or serving stops. */
  readonly signal: AbortSignal;
}

/**
 * A tool's function: gets the model's JSON arguments (parsed; `{}` when empty) and the call's context.
 * A string is the output as it is; a {@link ToolOutput} adds context messages; anything else is sent as
 * JSON. A thrown error is the call's error result (`"Error: message"`).
 */
export type ToolHandler = (args: any, context: ToolContext) => unknown;

/** A tool with its description and the JSON Schema of its arguments (default: any object). */
export interface ToolDefinition {
  handler: ToolHandler;
  description?: string;
  inputSchema?: Record<string, unknown>;
}

/** Tools by name: a handler alone, or a {@link ToolDefinition}. */
export type Tools = Record<string, ToolHandler | ToolDefinition>;

/** A result with model-visible context messages inserted after it (SPEC §9). */
export class ToolOutput {
  constructor(
    readonly output: string,
    readonly context: string[] = [],
  ) {}
}

/** The options of `serveTools()`. */
export interface ToolServerOptions {
  /** Stops serving when aborted (as `close()` does). */
  signal?: AbortSignal;
  /** Told when the gateway refused a result (its call had already ended there). */
  onRejected?: (callId: string, reason: string) => void;
  /** Told on every accepted registration: the first, and each after a lost stream. */
  onRegistered?: (names: string[]) => void;
}

type ResultInit = MessageInitShape<typeof ToolCallResultSchema>;
type Outgoing = MessageInitShape<typeof ToolWorkerMessageSchema>;

/** An unbounded queue read as an async iterable that ends when `signal` aborts: the stream's requests. */
class Outbox {
  readonly #items: Outgoing[] = [];
  #wake: (() => void) | undefined;

  push(item: Outgoing): void {
    this.#items.push(item);
    this.#wake?.();
  }

  async *drain(signal: AbortSignal): AsyncGenerator<Outgoing, void, undefined> {
    const stop = new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
    while (!signal.aborted) {
      const item = this.#items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      await Promise.race([new Promise<void>((resolve) => (this.#wake = resolve)), stop]);
      this.#wake = undefined;
    }
  }
}

function definition(tool: ToolHandler | ToolDefinition): ToolDefinition {
  return typeof tool === "function" ? { handler: tool } : tool;
}

/**
 * Serves a set of tools for one client (`client.serveTools(tools)`), from construction until
 * {@link ToolServer.close}.
 *
 * ```ts
 * const server = client.serveTools({
 *   lookup: async ({ q }) => `found ${q}`,
 *   where: { description: "Where the call came from", handler: (_args, ctx) => ctx.session.id },
 * });
 * console.log(await server.registered); // ["lookup", "where"]
 * ```
 *
 * An agent reaches a tool as `client:NAME` (listed in its `tools`). After a lost stream (UNAVAILABLE) the
 * tools are registered again; calls in flight on the lost stream fail on the server's side. A refused
 * registration (a name taken with another schema, say) rejects {@link ToolServer.registered} and
 * {@link ToolServer.done}. Needs bidirectional streams: Node (HTTP/2), not gRPC-Web in a browser.
 */
export class ToolServer {
  /** Resolves with the names the gateway accepted, on the first registration. */
  readonly registered: Promise<string[]>;
  /** Resolves when serving stopped by `close()` or the signal; rejects when it failed for good. */
  readonly done: Promise<void>;
  readonly #abort = new AbortController();
  readonly #definitions: Map<string, ToolDefinition>;
  #registered!: (names: string[]) => void;
  #failed!: (e: unknown) => void;

  /** @internal Use `client.serveTools()`. */
  constructor(
    private readonly client: ClientCore,
    tools: Tools,
    private readonly options: ToolServerOptions,
  ) {
    this.#definitions = new Map(Object.entries(tools).map(([name, tool]) => [name, definition(tool)]));
    this.registered = new Promise((resolve, reject) => {
      this.#registered = resolve;
      this.#failed = reject;
    });
    const outer = options.signal;
    if (outer?.aborted) this.#abort.abort(outer.reason);
    else outer?.addEventListener("abort", () => this.#abort.abort(outer.reason), { once: true });
    this.done = this.#run();
    this.done.then(
      () => this.#failed(new TurnstileError("ServeTools", Code.Canceled, "serving stopped before the registration")),
      (e) => this.#failed(e),
    );
    // Awaiting either is the caller's choice; an unobserved failure must not end the process.
    this.registered.catch(() => {});
    this.done.catch(() => {});
  }

  /** The specs sent in `register`. */
  #specs(): MessageInitShape<typeof ClientToolSpecSchema>[] {
    return [...this.#definitions].map(([name, d]) => ({
      name,
      description: d.description ?? "",
      inputSchemaJson: JSON.stringify(d.inputSchema ?? { type: "object" }),
    }));
  }

  async #run(): Promise<void> {
    const signal = this.#abort.signal;
    const retries = new Retries(this.client.retryPolicy, () => this.client.reconnect());
    for (;;) {
      let error: TurnstileError;
      try {
        if (await this.#serveOnce(() => retries.succeeded())) return;
        error = new TurnstileError("ServeTools", Code.Unavailable, "the ServeTools stream ended");
      } catch (e) {
        if (signal.aborted) return;
        error = toTurnstileError("ServeTools", e, signal);
      }
      try {
        await retries.after(error, signal);
      } catch (e) {
        if (signal.aborted) return;
        throw toTurnstileError("ServeTools", e, signal);
      }
    }
  }

  /** One stream, from `register` to its end; `true` when it ended because serving stopped. */
  async #serveOnce(onRegistered: () => void): Promise<boolean> {
    const { agent, bidiStreams } = await this.client.rpc();
    if (!bidiStreams) {
      throw new TurnstileError(
        "ServeTools",
        Code.Unimplemented,
        "serving tools needs a bidirectional stream, which gRPC-Web cannot carry; serve them from Node",
      );
    }
    // This stream's own end: serving stopped, or the stream failed (its calls are abandoned with it).
    const stream = new AbortController();
    const stopStream = () => stream.abort(this.#abort.signal.reason);
    this.#abort.signal.addEventListener("abort", stopStream, { once: true });
    const outbox = new Outbox();
    outbox.push({ message: { case: "register", value: { tools: this.#specs() } } });
    const running = new Map<string, AbortController>();
    try {
      const tasks = agent.serveTools(outbox.drain(stream.signal), {
        signal: stream.signal,
        headers: this.client.headers(true),
      });
      for await (const task of tasks) {
        switch (task.task.case) {
          case "registered":
            this.#registered(task.task.value.tools);
            onRegistered();
            this.options.onRegistered?.(task.task.value.tools);
            break;
          case "call": {
            const call = task.task.value;
            const controller = new AbortController();
            running.set(call.callId, controller);
            void this.#answer(call, controller.signal).then((result) => {
              // A canceled call sends nothing: the worker has given up on it.
              if (running.delete(call.callId) && !controller.signal.aborted) {
                outbox.push({ message: { case: "result", value: result } });
              }
            });
            break;
          }
          case "cancel": {
            const id = task.task.value.callId;
            running.get(id)?.abort(new TurnstileError("ServeTools", Code.Canceled, `call ${id} was canceled`));
            running.delete(id);
            break;
          }
          case "rejected":
            this.options.onRejected?.(task.task.value.callId, task.task.value.reason);
            break;
        }
      }
      return this.#abort.signal.aborted;
    } finally {
      this.#abort.signal.removeEventListener("abort", stopStream);
      for (const c of running.values()) c.abort(new TurnstileError("ServeTools", Code.Unavailable, "the stream ended"));
      stream.abort();
    }
  }

  /** Runs one call; any failure is the call's error result. */
  async #answer(call: ToolCallTask, signal: AbortSignal): Promise<ResultInit> {
    const d = this.#definitions.get(call.name);
    if (!d) return { callId: call.callId, error: `this executor serves no tool ${JSON.stringify(call.name)}` };
    try {
      const text = call.argumentsJson.trim();
      const args: unknown = text === "" ? {} : JSON.parse(text);
      if (typeof args !== "object" || args === null || Array.isArray(args)) {
        throw new TypeError(`arguments must be a JSON object, got ${call.argumentsJson}`);
      }
      const context: ToolContext = {
        session: call.session ?? create(SessionRefSchema),
        callId: call.callId,
        name: call.name,
        deadline: new Date(Number(call.deadlineUnixMs)),
        idempotencyKey: call.idempotencyKey,
        signal,
      };
      const value = await d.handler(args, context);
      if (value instanceof ToolOutput) return { callId: call.callId, output: value.output, context: value.context };
      const output = typeof value === "string" ? value : value === undefined ? "" : JSON.stringify(value);
      return { callId: call.callId, output };
    } catch (e) {
      const error = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
      return { callId: call.callId, error };
    }
  }

  /** Stops serving: the stream ends, running calls' signals abort. Resolves once stopped. */
  async close(): Promise<void> {
    this.#abort.abort(new TurnstileError("ServeTools", Code.Canceled, "the tool server was closed"));
    try {
      await this.done;
    } catch {
      // A failure before close is reported through `done` and `registered`.
    }
  }
}
