//! The durable model of Turnstile: what a session *is*, independent of who drives it.
//!
//! Everything above this crate is a projection of a session's log. Here live the values of SPEC §1
//! ([`message`]), the durable and live events of §5 ([`event`]), the inbox and its splices (§3,
//! [`inbox`]), the fold of a log into inbox, status and recovery facts ([`state`]), the conditional
//! [`SessionLog`] trait with its backends ([`embedded`], [`jetstream`]), the [`LiveBus`], the protobuf mapping
//! ([`codec`]) and the command seam between gateway and worker ([`command`]).
//!
//! Dependency direction: `proto ← journal ← worker, gateway ← cli`. Nothing here knows about drivers,
//! gRPC services or routing.

pub mod bus;
pub mod embedded;
pub mod jetstream;
pub mod log;
pub mod snapshot;

pub use bus::{LiveBus, LiveStream};
pub use embedded::{EmbeddedLog, LocalBus};
pub use jetstream::{JetStreamConfig, JetStreamLog, NatsBus};
pub use log::{EventStream, JournalError, SessionLog};
