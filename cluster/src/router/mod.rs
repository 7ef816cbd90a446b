//! The command seam and the internal hop behind it: how a command reaches the driver that owns its session.
//!
//! [`CommandRouter`] is the seam; `turnstile dev` plugs the in-process worker host in directly, and in a
//! cluster [`ClusterRouter`] routes each command to its shard's owner over the internal API
//! ([`transport`]), retrying while shards move. Gateways route through it, and so do workers for the
//! child sessions of `spawn_agent`.

mod shard;
mod stream;
pub mod transport;

use std::time::Duration;

use async_trait::async_trait;
use turnstile_model::{Command, CommandError, CommandReply, SessionRef};

pub use shard::{ClusterRouter, ClusterRouterConfig};
pub use transport::{GrpcTransport, WorkerTransport};

/// Routes a command to the driver that owns the session and returns its reply.
///
/// `turnstile dev` plugs the in-process worker host in directly; in a cluster the [`ClusterRouter`]
/// puts the internal gRPC hop and shard routing behind the same trait, so the gateway never imports the
/// worker and the worker never imports the gateway.
#[async_trait]
pub trait CommandRouter: Send + Sync + 'static {
    /// Executes `command` on `session`'s driver. `timeout` bounds `WhenIdle` (and routing retries).
    async fn execute(
        &self,
        session: &SessionRef,
        command: Command,
        timeout: Option<Duration>,
    ) -> Result<CommandReply, CommandError>;

    /// The id of the worker that owns `session`, when this router knows it.
    async fn owner(&self, _session: &SessionRef) -> Option<String> {
        None
    }
}
