// Values a caller passes as plain strings: messages (a text becomes a one-block UserMessage with a fresh
// MessageId) and sessions (an id in the client's tenant).

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  MessageSourceSchema,
  type SessionRef,
  SessionRefSchema,
  type UserMessage,
  UserMessageSchema,
} from "./gen/turnstile/v1/events_pb.js";

/** A message: a text (one text block), or a whole `UserMessage` (its id is minted when empty). */
export type MessageLike = string | MessageInitShape<typeof UserMessageSchema>;

/** A session: its id (in the client's tenant) or a `SessionRef` `{tenant, id}`. */
export type SessionLike = string | MessageInitShape<typeof SessionRefSchema>;

/** A message's source (`{kind: {case: "plugin", value: {plugin: "x"}}}`, say); unset: the preset's default. */
export type SourceLike = MessageInitShape<typeof MessageSourceSchema>;

/** A uint64 of the API: a number or a bigint (replies carry bigints). */
export type Uint64 = number | bigint;

/**
 * A fresh MessageId: a random UUID. `crypto.randomUUID` exists in Node and in secure browser contexts; a
 * page served over plain HTTP from a non-loopback address has only `getRandomValues`, which gives the
 * same 122 random bits here.
 */
export function newMessageId(): string {
  const c = globalThis.crypto;
  if (typeof c.randomUUID === "function") return c.randomUUID();
  const hex = [...c.getRandomValues(new Uint8Array(16))].map((b) => b.toString(16).padStart(2, "0"));
  // RFC 9562 version 4, variant 10.
  hex[6] = `4${hex[6]!.slice(1)}`;
  hex[8] = ((parseInt(hex[8]!, 16) & 0x3f) | 0x80).toString(16);
  const s = hex.join("");
  return `${s.slice(0, 8)}-${s.slice(8, 12)}-${s.slice(12, 16)}-${s.slice(16, 20)}-${s.slice(20)}`;
}

/** A `UserMessage` of one text block, with a fresh MessageId unless `id` is given. */
export function textMessage(text: string, options: { id?: string; source?: SourceLike } = {}): UserMessage {
  return create(UserMessageSchema, {
    id: options.id ?? newMessageId(),
    content: [{ block: { case: "text", value: { text } } }],
    source: options.source,
  });
}

/**
 * A `UserMessage` with a MessageId: `id` if given, else the message's own, else a fresh UUID. The client's
 * helpers call this once per call, so every retry of that call carries the same id.
 */
export function toUserMessage(message: MessageLike, options: { id?: string; source?: SourceLike } = {}): UserMessage {
  if (typeof message === "string") return textMessage(message, options);
  const out = create(UserMessageSchema, message);
  if (options.id !== undefined) out.id = options.id;
  else if (out.id === "") out.id = newMessageId();
  if (options.source !== undefined) out.source = create(MessageSourceSchema, options.source);
  return out;
}

/** The text blocks of a message, joined by newlines (`""` for none or `undefined`). */
export function textOf(message: UserMessage | undefined): string {
  return (message?.content ?? [])
    .flatMap((b) => (b.block.case === "text" ? [b.block.value.text] : []))
    .join("\n");
}

/** A `SessionRef`: an id in `tenant`, or the given ref. */
export function sessionRef(session: SessionLike, tenant: string): SessionRef {
  return typeof session === "string" ? create(SessionRefSchema, { tenant, id: session }) : create(SessionRefSchema, session);
}
