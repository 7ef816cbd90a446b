//! Session logs: where a session's durable events are kept, and the live events beside them.
//!
//! Place in the architecture: `model` ← `proto` ← **`journal`** ← `worker`, `gateway`. A session *is* the fold
//! of its log (`turnstile-model`); this crate stores that log and nothing about who drives it. Here live the
//! conditional, append-only [`SessionLog`] trait and its [`JournalError`]s ([`log`]) with two backends —
//! [`embedded`] (memory, or files under a data directory, for `turnstile dev`) and [`jetstream`] (NATS
//! JetStream, the cluster's) — the best-effort [`LiveBus`] ([`bus`]), [`snapshot`]s, so loading a session
//! is a snapshot plus the log's tail, and tenants' token [`usage`] counted from the logs (SPEC §17), webhook positions ([`webhook`]) and the webhooks tenants
//! register ([`webhook_registry`], SPEC §21). Events are stored in the protobuf encoding of `turnstile-proto`'s codec,
//! the same bytes the gRPC `Watch` stream returns.
//!
//! Nothing here knows about drivers, gRPC services or routing: the gateway reads these logs, the worker's
//! runner is their single writer.

pub mod agents;
pub mod bus;
pub mod embedded;
pub mod index;
pub mod jetstream;
pub mod log;
pub mod memory;
pub mod snapshot;
mod sync;
pub mod usage;
pub mod webhook;
pub mod webhook_registry;

pub use agents::{AgentOwner, AgentRecord, AgentStore, AgentVersion, MemoryAgents};
pub use bus::{LiveBus, LiveStream};
pub use embedded::{EmbeddedLog, LocalBus};
pub use index::{IndexEntry, MemoryIndex, SessionIndex};
pub use jetstream::{JetStreamConfig, JetStreamLog, NatsBus};
pub use log::{EventStream, JournalError, SentEventStream, SessionLog};
pub use memory::{LocalMemory, MemoryDocument, MemoryError, MemoryLimits, MemoryStore};
pub use usage::{MemoryUsage, UsageLedger};
pub use webhook::{MemoryPositions, WebhookPositions};
pub use webhook_registry::{MemoryWebhooks, RegisteredWebhook, TaskPush, WebhookRegistry};
