//! Session drivers: the single writer of each session's log.
//!
//! [`driver`] is the sans-IO state machine of SPEC §4 (commands, model and tool outcomes and the current
//! time in; durable events, live events, replies and requests for IO out). [`runner`] is the async task
//! that feeds one driver and performs its IO against the journal; [`host`] keeps one runner per loaded
//! session and implements the gateway's [`turnstile_journal::CommandRouter`] seam. [`model`], [`tools`]
//! and [`hooks`] are the pluggable parts of a step.

pub mod cluster;
pub mod config;
pub mod driver;
pub mod hooks;
pub mod host;
mod metrics;
pub mod model;
pub mod runner;
mod spans;
pub mod tools;

pub use config::{Limits, WorkerConfig};
pub use host::SessionHost;
