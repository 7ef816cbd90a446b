// The public API, called the way any client calls it: the TypeScript client's browser entry
// (`@turnstile/client/browser`, gRPC-Web) to turnstile.v1.Agent on this page's own origin (decision 0029),
// with the bearer token the user saved in this browser. Deliveries are retried by the client with the same
// MessageId (SPEC §2), so nothing is sent twice.

import {
  codeName,
  type Interceptor,
  type SessionLike,
  TurnstileClient,
  TurnstileError,
  type UserMessage,
} from "@turnstile/client/browser";

const TOKEN_KEY = "turnstile.token";
const TENANT_KEY = "turnstile.tenant";

export const settings = {
  get token(): string {
    return localStorage.getItem(TOKEN_KEY) ?? "";
  },
  set token(v: string) {
    if (v) localStorage.setItem(TOKEN_KEY, v);
    else localStorage.removeItem(TOKEN_KEY);
  },
  /// Only used with auth off; with auth on the server takes the tenant from the token.
  get tenant(): string {
    return localStorage.getItem(TENANT_KEY) ?? "";
  },
  set tenant(v: string) {
    if (v) localStorage.setItem(TENANT_KEY, v);
    else localStorage.removeItem(TENANT_KEY);
  },
};

// Read on every call: the user may save another token while the page is open.
const bearer: Interceptor = (next) => async (req) => {
  const token = settings.token;
  if (token) req.header.set("authorization", `Bearer ${token}`);
  return next(req);
};

export const client = new TurnstileClient({ address: window.location.origin, interceptors: [bearer] });

/// The session `id` of the tenant in the settings (every call names it, so a changed tenant applies at once).
export function sessionRef(id: string): SessionLike {
  return { tenant: settings.tenant, id };
}

/// A call's error as one line: the gRPC code's name and the server's message.
export function describe(e: unknown): string {
  return e instanceof TurnstileError ? `${codeName(e.code)}: ${e.details}` : String(e);
}

/// The message's text blocks and a line for each data block.
export function textOf(m: UserMessage | undefined): string {
  if (!m) return "";
  return m.content
    .map((c) => (c.block.case === "text" ? c.block.value.text : c.block.case === "data" ? `[${c.block.value.mime}, ${c.block.value.bytes.length} bytes]` : ""))
    .join("\n");
}

export function sourceOf(m: UserMessage | undefined): string {
  const k = m?.source?.kind;
  switch (k?.case) {
    case undefined:
    case "user":
      return "user";
    case "plugin":
      return `plugin ${k.value.plugin}${k.value.form ? `/${k.value.form}` : ""}`;
    case "goal":
      return `goal round ${k.value.round}`;
    case "tool":
      return `tool ${k.value.callId}`;
    case "model":
      return `model ${k.value.provider}/${k.value.model}`;
    default:
      return "other";
  }
}

/// A time as the local date and how long ago it was (or how soon it comes).
export function when(ms: bigint): string {
  if (ms === 0n) return "";
  const d = new Date(Number(ms));
  const secs = Math.round((Date.now() - d.getTime()) / 1000);
  const ago = Math.abs(secs);
  const span = ago < 60 ? `${ago} s` : ago < 3600 ? `${Math.round(ago / 60)} min` : `${Math.round(ago / 3600)} h`;
  // A deadline is in the future.
  return `${d.toLocaleString()} (${secs >= 0 ? `${span} ago` : `in ${span}`})`;
}
