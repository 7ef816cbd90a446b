//! Cross-process test harness for Turnstile.
//!
//! Where this sits: every other crate is tested from the inside (the driver's sans-IO state machine, the
//! journal's fold). This crate tests the *assembled system* from the outside, the way a client sees it:
//! it starts real `turnstile` processes on loopback ports and talks to them only through the public gRPC
//! API (`turnstile.v1.Agent`), reading what happened through `Watch`. It depends on `turnstile-proto` and
//! nothing else of the workspace, so a test here cannot reach around the API.
//!
//! Layout, so that later clusters (nats-server, several gateways and workers) slot in beside `dev`:
//! - [`binary`] locates (and builds, once per test process) the `turnstile` binary;
//! - [`ports`] reads back the ports a process bound (every process binds port 0 and reports them);
//! - [`process`] owns a spawned child: log file, readiness, SIGKILL / graceful stop;
//! - [`nats`] is a real nats-server with JetStream (store dir kept across restarts);
//! - [`dev`] is `turnstile dev` (gateway + worker in one process, embedded journal or `--nats`), with
//!   [`Backend`] and [`backend_tests!`] to run a scenario on both journals;
//! - [`cluster`] is a real cluster: `turnstile worker` and `turnstile gateway` processes on one
//!   nats-server (or several), with kill -9, SIGSTOP/SIGCONT and SIGTERM of workers and gateways, and
//!   optionally one worker inside a [`netns`] network namespace that the test creates (partitions);
//! - [`pki`] makes throwaway CAs and the cluster's mTLS certificates;
//! - [`campaign`] is the fault campaign: a seeded fault schedule, a client workload, its history and
//!   the checker (issue 14 part 5);
//! - [`otlp`] is a test OTLP trace collector (what the processes' spans were);
//! - [`session`] is a small client DSL for one session (presets, edits, reads);
//! - [`msg`] builds messages and sources;
//! - [`watch`] records a `Watch` stream and reduces it to comparable lines;
//! - [`fold`] is an independent inbox projection, to compare with the server's;
//! - [`tool_executor`] is a client tool executor over `ServeTools` (tonic).
//! - [`hook_server`] is a remote pre-step hook (`turnstile.hooks.v1.PreStepHook`) whose answers a test sets.
//! - [`browser`] is a real headless chromium and the node scripts that drive it (the web console's test).

pub mod binary;
pub mod browser;
pub mod campaign;
pub mod cluster;
pub mod config;
pub mod dev;
pub mod fold;
pub mod hook_server;
pub mod llama;
pub mod msg;
pub mod nats;
pub mod netns;
pub mod otlp;
pub mod pki;
pub mod ports;
pub mod process;
pub mod protocol_clients;
pub mod proxy;
pub mod served;
pub mod session;
mod sync;
pub mod tool_executor;
pub mod watch;

use std::time::Duration;

pub use cluster::{Cluster, ClusterOptions};
pub use dev::{Backend, DevOptions, DevServer};
pub use fold::Projection;
pub use hook_server::{Behaviour, HookServer, PythonHookServer};
pub use msg::{data_msg, new_session_ref, plugin_msg, source_msg, text_of, user_msg};
pub use nats::NatsServer;
pub use served::{Deployment, Served};
pub use session::Session;
pub use watch::{WatchRecorder, assert_lines, line_of, lines_of};

pub use turnstile_proto::v1;

/// How long any bounded wait of the harness waits by default. Generous: a wait that expires is a failure,
/// never a timing assertion, so it only has to be longer than anything a passing run can take.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// Everything the harness can fail with. Messages carry what a reader of a failed test needs (log tails,
/// the lines recorded so far).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("i/o error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("building the turnstile binary failed: {0}")]
    Build(String),
    #[error("{what} did not come up within {waited:?}; log tail:\n{log_tail}")]
    StartTimeout { what: String, waited: Duration, log_tail: String },
    #[error("{what} exited early ({status}); log tail:\n{log_tail}")]
    Exited { what: String, status: String, log_tail: String },
    /// A model server that died: like [`HarnessError::Exited`], with what the death means and what to do.
    #[error("{what} died ({status}): {hint}; log tail:\n{log_tail}")]
    ModelServerDied { what: String, status: String, hint: &'static str, log_tail: String },
    #[error("gRPC transport error: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("gRPC call failed: {0}")]
    Status(#[from] tonic::Status),
    #[error("timed out after {waited:?} waiting for {what}; recorded so far:\n{recorded}")]
    WaitTimeout { what: String, waited: Duration, recorded: String },
    #[error("watch stream is inconsistent: {0}")]
    Inconsistent(String),
}

impl HarnessError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io { context: context.into(), source }
    }
}
