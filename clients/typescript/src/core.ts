// What the client's parts share without importing the client: the options every call takes and the
// view of a client its streams (watch.ts, tools.ts) use. client.ts implements it; nothing here imports
// client.ts, so the streams and the client do not import each other.

import type { Client } from "@connectrpc/connect";
import type { Agent } from "./gen/turnstile/v1/agent_pb.js";
import type { RetryPolicy } from "./retry.js";

/** What every method accepts: an AbortSignal that cancels the call and its retries. */
export interface CallOptions {
  signal?: AbortSignal;
}

/** The current connection as callers of the generated code see it. */
export interface Rpc {
  /** The generated Connect client of `turnstile.v1.Agent` on this connection. */
  readonly agent: Client<typeof Agent>;
  /** Whether the connection carries bidirectional streams (ServeTools). */
  readonly bidiStreams: boolean;
}

/**
 * The parts of a client that its streams (`watch`, `serveTools`) use.
 * @internal
 */
export interface ClientCore {
  readonly tenant: string;
  readonly retryPolicy: RetryPolicy;
  rpc(): Promise<Rpc>;
  reconnect(): Promise<void>;
  headers(forTools?: boolean): Headers;
}
