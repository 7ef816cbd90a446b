// watch(): a Watch stream that resumes after a disconnect from the position it had reached (decision
// 0056). Today the position is the last durable seq; SPEC §14's live positions (the streaming step's
// byte offsets, sent as `WatchRequest.resume`) will join it in WatchPosition without changing this API.

import { Code } from "@connectrpc/connect";
import type { WatchItem } from "./gen/turnstile/v1/agent_pb.js";
import type { SessionRef } from "./gen/turnstile/v1/events_pb.js";
import type { CallOptions, ClientCore } from "./client.js";
import { TurnstileError, toTurnstileError } from "./errors.js";
import type { Uint64 } from "./messages.js";
import { NO_RETRY, Retries } from "./retry.js";

/** Where a watch stands: what it would ask the server for if it had to reopen now. */
export interface WatchPosition {
  /** The last durable seq received (of an `event` or a `caughtUp`); a reopened stream starts after it. */
  readonly afterSeq: bigint;
}

/** The options of `watch()`. */
export interface WatchOptions extends CallOptions {
  /** Start after this seq (default 0: the whole log). */
  afterSeq?: Uint64;
  /** `false` leaves out live events (default `true`). */
  live?: boolean;
  /** `false`: a disconnect ends the stream with UNAVAILABLE instead of reopening it (default `true`). */
  resume?: boolean;
}

/**
 * A session's Watch as an async iterator of `WatchItem`s: `for await (const item of client.watch(id))`.
 *
 * The server sends the durable `event`s after `afterSeq`, one `caughtUp {seq, inbox, status}`, then the
 * live tail (`live` events and new `event`s); it never ends a Watch by itself. When the stream breaks
 * (UNAVAILABLE: a gateway stopping, killed or unreachable) it is opened again, at the address asked anew,
 * after {@link WatchStream.position}, with the client's retry policy (the deadline counted from the
 * disconnect), and a fresh `caughtUp` follows: no durable event is missed or repeated. Live events of the
 * gap are not replayed (they are not stored, SPEC §5).
 *
 * Leaving a `for await` loop (`break`, `return`, a throw) closes the stream; so does {@link close} or the
 * `signal` option. Any other error ends the iteration with a {@link TurnstileError}.
 */
export class WatchStream implements AsyncIterableIterator<WatchItem> {
  #afterSeq: bigint;
  #reopened = 0;
  readonly #abort = new AbortController();
  readonly #items: AsyncGenerator<WatchItem, undefined, undefined>;

  /** @internal Use `client.watch()`. */
  constructor(
    private readonly client: ClientCore,
    private readonly session: SessionRef,
    private readonly options: WatchOptions,
  ) {
    this.#afterSeq = BigInt(options.afterSeq ?? 0);
    const outer = options.signal;
    if (outer) {
      if (outer.aborted) this.#abort.abort(outer.reason);
      else outer.addEventListener("abort", () => this.#abort.abort(outer.reason), { once: true });
    }
    this.#items = this.#run();
  }

  /** What a reopened stream would start after. */
  get position(): WatchPosition {
    return { afterSeq: this.#afterSeq };
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
        const request = { session: this.session, afterSeq: this.#afterSeq, live: this.options.live ?? true };
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
    const seq =
      item.item.case === "event" ? item.item.value.seq : item.item.case === "caughtUp" ? item.item.value.seq : undefined;
    if (seq !== undefined && seq > this.#afterSeq) this.#afterSeq = seq;
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
