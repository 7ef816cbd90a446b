//! The live-event bus: best-effort, not stored (SPEC §5 live types). Core NATS subjects in the cluster;
//! an in-process broadcast in `turnstile dev`.

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::log::JournalError;
use turnstile_model::event::LiveEvent;
use turnstile_model::message::SessionRef;

/// A stream of live events of one session, in publication order.
pub type LiveStream = BoxStream<'static, LiveEvent>;

#[async_trait]
pub trait LiveBus: Send + Sync + 'static {
    /// Publishes one live event. Best effort: subscribers that are not listening miss it, and a slow
    /// subscriber may miss some. An error means the bus itself is unreachable.
    async fn publish(&self, event: &LiveEvent) -> Result<(), JournalError>;

    /// Live events of `session` published from now on.
    async fn subscribe(&self, session: &SessionRef) -> Result<LiveStream, JournalError>;
}
