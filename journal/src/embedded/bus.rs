//! [`LocalBus`]: the in-process live bus of `turnstile dev`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use async_trait::async_trait;
use futures::{Stream, StreamExt as _};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use crate::bus::{LiveBus, LiveStream};
use crate::log::JournalError;
use crate::sync::lock;
use turnstile_model::event::LiveEvent;
use turnstile_model::message::SessionRef;

/// Buffered live events per session before a slow subscriber starts missing some.
pub const LIVE_CAPACITY: usize = 1024;

type Channels = Arc<Mutex<HashMap<SessionRef, broadcast::Sender<LiveEvent>>>>;

/// One broadcast channel per session with subscribers. Publishing never waits; a session nobody listens to
/// has no entry, so memory stays flat however many sessions publish.
#[derive(Clone, Debug, Default)]
pub struct LocalBus {
    channels: Channels,
}

impl LocalBus {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sessions that currently have a channel (at least one subscriber, or one that just left).
    pub fn subscribed_sessions(&self) -> usize {
        lock(&self.channels).len()
    }
}

#[async_trait]
impl LiveBus for LocalBus {
    async fn publish(&self, event: &LiveEvent) -> Result<(), JournalError> {
        let mut channels = lock(&self.channels);
        // A send error means every subscriber has gone: drop the entry.
        if let Some(sender) = channels.get(&event.session)
            && sender.send(event.clone()).is_err()
        {
            channels.remove(&event.session);
        }
        Ok(())
    }

    async fn subscribe(&self, session: &SessionRef) -> Result<LiveStream, JournalError> {
        let receiver = lock(&self.channels)
            .entry(session.clone())
            .or_insert_with(|| broadcast::channel(LIVE_CAPACITY).0)
            .subscribe();
        let events = BroadcastStream::new(receiver);
        let guard = Unsubscribe { channels: Arc::clone(&self.channels), session: session.clone() };
        Ok(Subscription { events, session: session.clone(), _guard: guard }.boxed())
    }
}

/// A subscriber's stream. Field order matters: the receiver is dropped before the guard looks at the count.
struct Subscription {
    events: BroadcastStream<LiveEvent>,
    session: SessionRef,
    _guard: Unsubscribe,
}

impl Stream for Subscription {
    type Item = LiveEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LiveEvent>> {
        loop {
            match self.events.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(event))) => return Poll::Ready(Some(event)),
                Poll::Ready(Some(Err(BroadcastStreamRecvError::Lagged(missed)))) => {
                    // Live events are best effort; the durable log has everything that matters.
                    tracing::warn!(session = %self.session, missed, "live subscriber fell behind and skipped events");
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Removes a session's channel when its last subscriber leaves.
struct Unsubscribe {
    channels: Channels,
    session: SessionRef,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let mut channels = lock(&self.channels);
        if channels.get(&self.session).is_some_and(|s| s.receiver_count() == 0) {
            channels.remove(&self.session);
        }
    }
}
