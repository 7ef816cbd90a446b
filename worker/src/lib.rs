//! Hosting sessions: the async runner around each session's driver, shard ownership, presence and the
//! internal gRPC service. The single writer of each session's log runs here.
//!
//! Place in the architecture: gateway → **worker** → driver → journal, with `turnstile-agent` plugged in
//! behind [`agent`]. The driver itself is the sans-IO state machine of `turnstile-driver`; this crate does
//! its IO. The `runner` is the async task that feeds one driver (each input stamped with the time it arrived)
//! and performs its effects against the journal; [`host`] keeps one runner per loaded session and implements
//! the gateway's [`turnstile_cluster::CommandRouter`] seam; [`cluster`] holds shard leases and serves the
//! internal API. A step's pre-step hooks, model request and tool calls go through the [`agent`] seam
//! ([`agent::Model`], [`agent::Tools`], [`agent::PreStepHook`]), which `turnstile-agent` implements and the
//! node hands in as [`Agents`]: this crate knows no provider, tool or hook by name.

pub mod agent;
pub mod budget;
pub mod cluster;
mod command;
pub mod config;
mod deps;
pub mod host;
mod load;
mod metrics;
mod operations;
pub mod ownership;
mod park;
mod runner;
mod seen;
mod spans;
mod sync;
mod wakes;
pub mod webhooks;

pub use agent::Agents;
pub use config::{Limits, WorkerConfig};
pub use host::{SessionHost, SessionHostBuilder};
