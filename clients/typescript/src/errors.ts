// Typed errors: every failed call rejects with a TurnstileError carrying the gRPC code and the server's
// message. A lost connection is reported as UNAVAILABLE whatever shape the transport gave it, because that
// is what decides whether a call may be retried (decision 0057).

import { Code, ConnectError } from "@connectrpc/connect";

/** The canonical gRPC name of each status code (`NOT_FOUND`, `UNAVAILABLE`, ...), as the server's docs use. */
const CODE_NAMES: Record<Code, string> = {
  [Code.Canceled]: "CANCELLED",
  [Code.Unknown]: "UNKNOWN",
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
  [Code.NotFound]: "NOT_FOUND",
  [Code.AlreadyExists]: "ALREADY_EXISTS",
  [Code.PermissionDenied]: "PERMISSION_DENIED",
  [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
  [Code.FailedPrecondition]: "FAILED_PRECONDITION",
  [Code.Aborted]: "ABORTED",
  [Code.OutOfRange]: "OUT_OF_RANGE",
  [Code.Unimplemented]: "UNIMPLEMENTED",
  [Code.Internal]: "INTERNAL",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.DataLoss]: "DATA_LOSS",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
};

/** `"NOT_FOUND"` for `Code.NotFound`: the gRPC name of a status code. */
export function codeName(code: Code): string {
  return CODE_NAMES[code] ?? `CODE_${code}`;
}

/**
 * A call the server (or the transport) refused.
 *
 * `code` is the gRPC status code (connect's {@link Code}, whose numbers are gRPC's), `details` the server's
 * message, which says what was wrong and what to do. A connection lost mid-call is `Code.Unavailable`.
 *
 * ```ts
 * try {
 *   await client.getSession("nope");
 * } catch (e) {
 *   if (e instanceof TurnstileError && e.code === Code.NotFound) console.log(e.details);
 * }
 * ```
 */
export class TurnstileError extends Error {
  override readonly name = "TurnstileError";
  /** The gRPC status code. */
  readonly code: Code;
  /** The server's message (or the transport's, for a lost connection). */
  readonly details: string;
  /** The RPC that failed, e.g. `"Followup"`. */
  readonly method: string;
  /** Response headers and trailers of the failed call (`retry-after-ms` with RESOURCE_EXHAUSTED, say). */
  readonly metadata: Headers;

  constructor(method: string, code: Code, details: string, options?: { cause?: unknown; metadata?: Headers }) {
    super(`${method}: ${codeName(code)}: ${details}`, { cause: options?.cause });
    this.method = method;
    this.code = code;
    this.details = details;
    this.metadata = options?.metadata ?? new Headers();
  }

  /** The gRPC name of {@link TurnstileError.code}, e.g. `"NOT_FOUND"`. */
  get codeName(): string {
    return codeName(this.code);
  }
}

/**
 * Node and undici error codes that mean the connection went away under the call (the server was killed,
 * restarted or cut off): the request may or may not have been applied, exactly as for UNAVAILABLE.
 */
const CONNECTION_LOST = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ERR_HTTP2_GOAWAY_SESSION",
  "ERR_HTTP2_INVALID_SESSION",
  "ERR_HTTP2_SESSION_ERROR",
  "ERR_HTTP2_STREAM_CANCEL",
  "ERR_HTTP2_STREAM_ERROR",
  "ERR_HTTP2_PING_CANCEL",
  "ERR_STREAM_PREMATURE_CLOSE",
  "UND_ERR_SOCKET",
  "UND_ERR_CLOSED",
]);

function causes(e: unknown): unknown[] {
  const chain: unknown[] = [];
  while (e !== undefined && e !== null && !chain.includes(e)) {
    chain.push(e);
    e = e instanceof Error ? e.cause : undefined;
  }
  return chain;
}

/**
 * Whether `e` is a connection that was lost or never made: a status the transport made up from a socket or
 * HTTP/2 error, or a fetch that failed (gRPC-Web). Not a status the server sent. (A caller's own abort is
 * told apart by its signal before this is asked.)
 */
function lostConnection(e: ConnectError): boolean {
  if (e.code === Code.DeadlineExceeded || e.code === Code.ResourceExhausted) return false;
  return causes(e).some((c) => {
    if (!(c instanceof Error)) return false;
    const code = (c as { code?: unknown }).code;
    if (typeof code === "string" && CONNECTION_LOST.has(code)) return true;
    // fetch (gRPC-Web) rejects with a bare TypeError when the network fails: "fetch failed" (Node),
    // "Failed to fetch" (Chromium), "NetworkError ..." (Firefox), "Load failed" (Safari); undici says
    // "terminated" when the body's socket closes.
    if (c.name === "TypeError" && /fetch|network|load failed|terminated/i.test(c.message)) return true;
    // node:http2 resets every open stream with CANCEL when the connection closes under it (a server killed
    // with SIGKILL): connect-node reports that as CANCELED with no cause, or INTERNAL for other reset codes.
    return /http\/2 stream closed with error code/.test(c.message);
  });
}

/**
 * The TurnstileError of any failure of `method`: a ConnectError's code and raw message, with a lost
 * connection normalised to UNAVAILABLE (see {@link TurnstileError}).
 */
export function toTurnstileError(method: string, e: unknown, signal?: AbortSignal): TurnstileError {
  if (e instanceof TurnstileError) return e;
  const ce = ConnectError.from(e);
  let code = ce.code;
  if (signal?.aborted) code = Code.Canceled;
  else if (code !== Code.Unavailable && lostConnection(ce)) code = Code.Unavailable;
  return new TurnstileError(method, code, ce.rawMessage, { cause: e, metadata: ce.metadata });
}
