// The public API, called the way any client calls it: gRPC-Web to turnstile.v1.Agent on this page's own
// origin (decision 0029), with the bearer token the user saved in this browser.

import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { Agent } from "../gen/turnstile/v1/agent_pb";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { SessionRefSchema, UserMessage, UserMessageSchema } from "../gen/turnstile/v1/events_pb";

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

const bearer: Interceptor = (next) => async (req) => {
  const token = settings.token;
  if (token) req.header.set("authorization", `Bearer ${token}`);
  return next(req);
};

export const api: Client<typeof Agent> = createClient(
  Agent,
  createGrpcWebTransport({ baseUrl: window.location.origin, interceptors: [bearer] }),
);

export function sessionRef(id: string): MessageInitShape<typeof SessionRefSchema> {
  return { tenant: settings.tenant, id };
}

/// A client-minted MessageId (SPEC §1): a UUID v4 from getRandomValues, which, unlike randomUUID, also
/// works on a page that is not a secure context (the console on a non-loopback plain-HTTP address).
export function messageId(): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export function textMessage(id: string, text: string): MessageInitShape<typeof UserMessageSchema> {
  return { id, content: [{ block: { case: "text", value: { text } } }], source: { kind: { case: "user", value: {} } } };
}

/// A delivery retried with the same MessageId while the server answers UNAVAILABLE (a shard moving): the
/// server treats the retry as the same delivery (SPEC §2), so nothing is sent twice.
export async function retrying<T>(call: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (e) {
      if (attempt >= 4 || ConnectError.from(e).code !== Code.Unavailable) throw e;
      await new Promise((r) => setTimeout(r, 250 * attempt));
    }
  }
}

/// A call's error as one line: the gRPC code's name and the server's message.
export function describe(e: unknown): string {
  const err = ConnectError.from(e);
  return `${Code[err.code] ?? err.code}: ${err.rawMessage}`;
}

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
