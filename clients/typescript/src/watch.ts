// watch(): a Watch stream that resumes after a disconnect from the position it had reached (decision
// 0056): the last durable seq, and the byte offsets reached in the output of the step that streams (SPEC
// §14), sent as `WatchRequest.resume` so that a reply goes on where it stopped, each byte once.

import { Code } from "@connectrpc/connect";
import type { WatchItem } from "./gen/turnstile/v1/agent_pb.js";
import type { SessionRef } from "./gen/turnstile/v1/events_pb.js";
import type { CallOptions, ClientCore } from "./core.js";
import { TurnstileError, toTurnstileError } from "./errors.js";
import type { Uint64 } from "./messages.js";
import { NO_RETRY, Retries } from "./retry.js";

/** Where a watch stands: what it would ask the server for if it had to reopen now. */
export interface WatchPosition {
  /** The last durable seq received (of an `event` or a `caughtUp`); a reopened stream starts after it. */
  readonly afterSeq: bigint;
  /**
   * The step whose output was streaming and how much of it was received: the `offset` + UTF-8 byte length
   * of the last `assistantDelta` of its text and of its reasoning. A reopened stream sends it as `resume`
   * and gets only the bytes after it. Absent when no step streams (or once its durable `assistantMessage`,
   * `stepEnd` or `turnEnd` arrived, which carries the whole text).
   */
  readonly streaming?: StreamingPosition;
}

/** A place in one step's output (SPEC §14): `WatchRequest.resume`. */
export interface StreamingPosition {
  readonly turn: bigint;
  readonly step: number;
  /** The next byte of the reply text the client needs. */
  readonly textOffset: bigint;
  /** The next byte of the reasoning the client needs (its own offset space). */
  readonly reasoningOffset: bigint;
}

/** The options of `watch()`. */
export interface WatchOptions extends CallOptions {
  /** Start after this seq (default 0: the whole log). */
  afterSeq?: Uint64;
  /** `false` leaves out live events (default `true`). */
  live?: boolean;
  /** `false`: a disconnect ends the stream with UNAVAILABLE instead of reopening it (default `true`). */
  resume?: boolean;
  /**
   * Start where another stream stood (its `position`, saved across a page reload, say): after its
   * `afterSeq`, and with the rest of its streaming step only. Overrides `afterSeq`.
   */
  from?: WatchPosition;
}

const utf8 = new TextEncoder();

/**
 * A session's Watch as an async iterator of `WatchItem`s: `for await (const item of client.watch(id))`.
 *
 * The server sends the durable `event`s after `afterSeq`, one `caughtUp {seq, inbox, status}`, then the
 * live tail (`live` events and new `event`s); it never ends a Watch by itself. When the stream breaks
 * (UNAVAILABLE: a gateway stopping, killed or unreachable) it is opened again, at the address asked anew,
 * after {@link WatchStream.position}, with the client's retry policy (the deadline counted from the
 * disconnect), and a fresh `caughtUp` follows: no durable event is missed or repeated. A reply that was
 * streaming goes on from the byte offsets received (`position.streaming`, sent as `resume`): right after
 * the `caughtUp` come the bytes the caller lacks, then the live rest, so the `assistantDelta`s of a step
 * concatenate to its reply, each byte once, at contiguous offsets (SPEC §14). Other live events of the gap
 * are not replayed (they are not stored, SPEC §5).
 *
 * Leaving a `for await` loop (`break`, `return`, a throw) closes the stream; so does {@link close} or the
 * `signal` option. Any other error ends the iteration with a {@link TurnstileError}.
 */
export class WatchStream implements AsyncIterableIterator<WatchItem> {
  #afterSeq: bigint;
  #streaming: StreamingPosition | undefined;
  #reopened = 0;
  readonly #abort = new AbortController();
  readonly #items: AsyncGenerator<WatchItem, undefined, undefined>;

  /** @internal Use `client.watch()`. */
  constructor(
    private readonly client: ClientCore,
    private readonly session: SessionRef,
    private readonly options: WatchOptions,
  ) {
    this.#afterSeq = BigInt(options.from?.afterSeq ?? options.afterSeq ?? 0);
    this.#streaming = options.from?.streaming;
    const outer = options.signal;
    if (outer) {
      if (outer.aborted) this.#abort.abort(outer.reason);
      else outer.addEventListener("abort", () => this.#abort.abort(outer.reason), { once: true });
    }
    this.#items = this.#run();
  }

  /** What a reopened stream would start after. */
  get position(): WatchPosition {
    return this.#streaming ? { afterSeq: this.#afterSeq, streaming: this.#streaming } : { afterSeq: this.#afterSeq };
  }

  /** How many times the stream was reopened after a disconnect. */
  get reopened(): number {
    return this.#reopened;
  }

  async *#run(): AsyncGenerator<WatchItem, undefined, undefined> {
    const signal = this.#abort.signal;
    const retries = new Retries(this.options.resume === false ? NO_RETRY : this.client.retryPolicy, () =>
      this.client.reconnect(),
    );
    for (let attempt = 0; ; attempt++) {
      if (attempt > 0) this.#reopened += 1;
      let error: TurnstileError;
      try {
        const { agent } = await this.client.rpc();
        const request = {
          session: this.session,
          afterSeq: this.#afterSeq,
          live: this.options.live ?? true,
          resume: this.#streaming,
        };
        for await (const item of agent.watch(request, { signal, headers: this.client.headers() })) {
          this.#advance(item);
          retries.succeeded();
          yield item;
        }
        // The server never ends a Watch by itself: an end without a status is a lost connection.
        error = new TurnstileError("Watch", Code.Unavailable, "the Watch stream ended without a status");
      } catch (e) {
        if (signal.aborted) return;
        error = toTurnstileError("Watch", e, signal);
      }
      try {
        await retries.after(error, signal);
      } catch (e) {
        if (signal.aborted) return;
        throw toTurnstileError("Watch", e, signal);
      }
    }
  }

  #advance(item: WatchItem): void {
    const it = item.item;
    const seq = it.case === "event" ? it.value.seq : it.case === "caughtUp" ? it.value.seq : undefined;
    if (seq !== undefined && seq > this.#afterSeq) this.#afterSeq = seq;
    if (it.case === "live" && it.value.payload.case === "assistantDelta") {
      const d = it.value.payload.value;
      const at = this.#streaming;
      const same = at !== undefined && at.turn === d.turn && at.step === d.step;
      const end = d.offset + BigInt(utf8.encode(d.text).length);
      const text = same ? at.textOffset : 0n;
      const reasoning = same ? at.reasoningOffset : 0n;
      this.#streaming = {
        turn: d.turn,
        step: d.step,
        textOffset: !d.reasoning && end > text ? end : text,
        reasoningOffset: d.reasoning && end > reasoning ? end : reasoning,
      };
    } else if (it.case === "event" && this.#streaming) {
      // The step's durable message (or its end) holds the whole text: nothing of it to resume.
      const at = this.#streaming;
      const p = it.value.payload;
      const ended =
        ((p.case === "assistantMessage" || p.case === "stepEnd") && p.value.turn === at.turn && p.value.step === at.step) ||
        (p.case === "turnEnd" && p.value.turn === at.turn);
      if (ended) this.#streaming = undefined;
    }
  }

  next(): Promise<IteratorResult<WatchItem, undefined>> {
    return this.#items.next();
  }

  /** Called by `for await` when the loop is left: closes the stream. */
  async return(): Promise<IteratorResult<WatchItem, undefined>> {
    await this.close();
    return { done: true, value: undefined };
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  /** Ends the stream: a pending `next()` resolves `done`, the server's stream is cancelled. */
  async close(): Promise<void> {
    this.#abort.abort(new TurnstileError("Watch", Code.Canceled, "the watch was closed"));
    await this.#items.return(undefined);
  }
}
