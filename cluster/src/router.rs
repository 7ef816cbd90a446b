//! The command seam: how a gateway reaches the driver that owns a session.

use std::time::Duration;

use async_trait::async_trait;
use turnstile_model::{Command, CommandError, CommandReply, SessionRef};

/// Routes a command to the driver that owns the session and returns its reply.
///
/// `turnstile dev` plugs the in-process worker host in directly; in a cluster the gateway's router
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
