//! Worker and driver configuration.

use std::time::Duration;

pub use turnstile_driver::Limits;

/// Configuration of a worker's session host.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// This worker's id, reported as the session owner.
    pub owner_id: String,
    /// The owner epoch stamped on every event (the embedded single process uses 1).
    pub epoch: u64,
    pub limits: Limits,
    /// `WhenIdle` timeout when the caller gives none.
    pub default_when_idle_timeout: Duration,
    /// A snapshot is written after this many new events (and when a session is unloaded).
    pub snapshot_every: u64,
    /// An idle session with nothing waiting is dropped from memory after this long (passivation); its next
    /// command loads it from the latest snapshot and the log after it.
    pub passivate_after: Duration,
    /// An idle session with nothing waiting stops its runner task after this long and keeps only its driver
    /// in memory ("parked", decision 0037) until a command resumes it or passivation drops it.
    pub park_after: Duration,
    /// Commands queued for one session's runner; a command that finds the queue full is refused with
    /// RESOURCE_EXHAUSTED instead of waiting (`[limits] max_queued_commands`).
    pub command_queue: usize,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            owner_id: "dev".to_owned(),
            epoch: 1,
            limits: Limits::default(),
            default_when_idle_timeout: Duration::from_secs(30),
            snapshot_every: 100,
            passivate_after: Duration::from_secs(300),
            park_after: Duration::from_millis(200),
            command_queue: 1024,
        }
    }
}
