//! Session drivers: the single writer of each session's log.
//!
//! Place in the architecture: gateway → **worker** → driver → journal. The driver itself is the sans-IO
//! state machine of `turnstile-driver`; this crate does its IO. [`runner`] is the async task that feeds
//! one driver (each input stamped with the time it arrived) and performs its effects against the
//! journal; [`host`] keeps one runner per loaded session and implements the gateway's
//! [`turnstile_cluster::CommandRouter`] seam; [`cluster`] holds shard leases and serves the internal API.
//! [`model`], [`tools`] and [`hooks`] are the pluggable parts of a step; [`agents`] builds the models, tools
//! and agent catalog of a configuration file.

pub mod agents;
pub mod cluster;
pub mod config;
pub mod hooks;
pub mod host;
mod metrics;
pub mod model;
pub mod runner;
mod seen;
mod spans;
pub mod tools;

pub use config::{AgentCatalog, Limits, WorkerConfig};
pub use host::SessionHost;
