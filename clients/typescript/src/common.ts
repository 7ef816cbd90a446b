// Everything both entry points export: the client's types and helpers and the generated turnstile.v1
// messages, enums and service descriptor.

export * from "./gen/turnstile/v1/agent_pb.js";
export * from "./gen/turnstile/v1/events_pb.js";
export { Code, ConnectError, type Interceptor, type Transport } from "@connectrpc/connect";
export {
  type Address,
  ClientBase,
  type ClientOptions,
  type Connection,
  type Connector,
  type DeliveryOptions,
  type EvaluateOptions,
  type ExportItemLike,
  type ExportOptions,
  type LabelOptions,
  type ListOptions,
  type ListSchedulesOptions,
  type RunOptions,
  type ScheduleOptions,
  type SendOptions,
  type SpliceEdit,
  type SteerOptions,
  type WebhookOptions,
} from "./client.js";
export {
  type ApprovalEvent,
  type CaughtUpEvent,
  EventFolder,
  type MessageEvent,
  type RunResult,
  type RunToolCall,
  type TextDeltaEvent,
  type TokenUsage,
  type ToolDecidedEvent,
  type ToolDoneEvent,
  type ToolStartedEvent,
  toJson,
  type TurnDoneEvent,
  type TurnEvent,
  type TurnStartedEvent,
  type UserEvent,
} from "./events.js";
export type { CallOptions, Rpc } from "./core.js";
export { codeName, TurnstileError } from "./errors.js";
export {
  type MessageLike,
  newMessageId,
  type SessionLike,
  type SourceLike,
  textMessage,
  textOf,
  type Uint64,
} from "./messages.js";
export { DEFAULT_RETRY, type RetryPolicy } from "./retry.js";
export {
  type ToolContext,
  type ToolDefinition,
  type ToolHandler,
  ToolOutput,
  type Tools,
  ToolServer,
  type ToolServerOptions,
} from "./tools.js";
export { type StreamingPosition, type WatchOptions, type WatchPosition, WatchStream } from "./watch.js";
