//! [`NatsBus`]: the live bus on core NATS (not stored, best effort).

use async_trait::async_trait;
use futures::StreamExt as _;

use super::subjects;
use crate::bus::{LiveBus, LiveStream};
use crate::log::JournalError;
use turnstile_model::event::LiveEvent;
use turnstile_model::message::SessionRef;
use turnstile_proto::codec;

/// Live events as protobuf `LiveEvent` bodies on `turnstile.live.<tenant>.<session>.<type>`. Observers
/// outside Turnstile can subscribe with wildcards (`turnstile.live.acme.>`).
#[derive(Clone, Debug)]
pub struct NatsBus {
    client: async_nats::Client,
}

impl NatsBus {
    /// A bus on an existing connection (e.g. [`super::JetStreamLog::client`]).
    pub fn new(client: async_nats::Client) -> Self {
        Self { client }
    }

    /// Connects to `url` with a bounded connect timeout.
    pub async fn connect(url: &str) -> Result<Self, JournalError> {
        Ok(Self::new(super::connect(&super::JetStreamConfig::new(url)).await?))
    }
}

#[async_trait]
impl LiveBus for NatsBus {
    async fn publish(&self, event: &LiveEvent) -> Result<(), JournalError> {
        let subject = subjects::live_subject(&event.session, event.event_type());
        self.client
            .publish(subject, codec::encode_live(event).into())
            .await
            .map_err(|e| JournalError::Unavailable(format!("publishing a live event of {}: {e}", event.session)))
    }

    /// Returns once the server has registered the subscription, so "from now on" holds for publishers on
    /// other connections too.
    async fn subscribe(&self, session: &SessionRef) -> Result<LiveStream, JournalError> {
        let subscriber = self
            .client
            .subscribe(subjects::live_filter(session))
            .await
            .map_err(|e| JournalError::Unavailable(format!("subscribing to the live events of {session}: {e}")))?;
        barrier(&self.client).await?;
        let session = session.clone();
        Ok(subscriber
            .filter_map(move |message| {
                let decoded = match codec::decode_live(&message.payload) {
                    Ok(event) if event.session == session => Some(event),
                    Ok(event) => {
                        tracing::warn!(subject = %message.subject, other = %event.session, "skipping a live event of another session");
                        None
                    }
                    Err(e) => {
                        tracing::warn!(subject = %message.subject, error = %e, "skipping an undecodable live event");
                        None
                    }
                };
                std::future::ready(decoded)
            })
            .boxed())
    }
}

/// One round trip to the server: a request nobody answers. The server handles a connection's operations in
/// order, so its "no responders" reply proves every earlier one (a SUB) took effect. `Client::flush` only
/// proves the bytes left this process.
pub async fn barrier(client: &async_nats::Client) -> Result<(), JournalError> {
    match client.request(client.new_inbox(), bytes::Bytes::new()).await {
        Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => Ok(()),
        Ok(_) => Ok(()),
        Err(e) => Err(JournalError::Unavailable(format!("NATS did not answer a round trip: {e}"))),
    }
}
