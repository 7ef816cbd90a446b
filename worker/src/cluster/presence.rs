//! Worker presence: who among the peers still has a NATS connection (docs/decisions/0019).
//!
//! A kill -9 closes a worker's sockets at once, so nats-server drops its connection and every
//! subscription of it at once, while its shard leases stay valid until their TTL. Each worker therefore
//! answers requests on its own presence subject ([`subject`]), and every `presence_every` asks each peer:
//!
//! - an answer: the peer lives;
//! - *no responders* (the server's own status: nobody subscribes to the subject any more): its connection
//!   is gone. Twice in a row, a quarter of `presence_every` apart, and the peer counts as dead: the leases leave it
//!   out of the fair share and takes its shards by compare-and-set with the next epoch, without waiting
//!   for the lease to run out;
//! - no answer in time: unknown (a paused or overloaded peer still holds its subscription). Only the
//!   lease can tell, as before.
//!
//! A false "dead" (a live worker whose connection dropped and comes back) costs a shard move, never a
//! forked log: the taker writes under a higher epoch, the old owner's `may_write` sees that epoch in the
//! shard map and its renewal's compare-and-set fails, and the conditional append refuses any stale writer.

use std::time::Duration;

use async_nats::client::RequestErrorKind;
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use turnstile_cluster::MembershipError;

/// The presence subject of worker `id`: `turnstile.presence.<id as lowercase hex>`. Hex keeps any id
/// (dots, colons of a `worker-<address>` default) one valid subject token.
pub fn subject(id: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity("turnstile.presence.".len() + 2 * id.len());
    out.push_str("turnstile.presence.");
    for b in id.bytes() {
        // Writing into a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Answers presence probes for worker `id` until `stop`. Returns once the server has the subscription
/// (after a flush), so peers never see this worker's heartbeat before its presence.
pub async fn serve(
    client: &async_nats::Client,
    id: &str,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, MembershipError> {
    let subject = subject(id);
    let mut subscription = client
        .subscribe(subject.clone())
        .await
        .map_err(|e| MembershipError::Unavailable(format!("presence subscription {subject}: {e}")))?;
    client.flush().await.map_err(|e| MembershipError::Unavailable(format!("presence subscription {subject}: {e}")))?;
    let client = client.clone();
    Ok(tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                () = stop.cancelled() => break,
                message = subscription.next() => message,
            };
            let Some(message) = message else { break };
            if let Some(reply) = message.reply
                && let Err(e) = client.publish(reply, bytes::Bytes::new()).await
            {
                tracing::debug!(error = %e, "presence answer not sent");
            }
        }
        // Stop answering at once on a clean leave: the heartbeat is gone too, so nobody probes any more.
        let _ = subscription.unsubscribe().await;
    }))
}

/// What one probe said about a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// It answered.
    Present,
    /// The server has no subscriber for its subject: its connection is gone.
    Gone,
    /// No answer in time, or our own connection could not ask: nothing learned.
    Unknown,
}

/// Asks worker `id` once, waiting at most `timeout`.
pub async fn probe(client: &async_nats::Client, id: &str, timeout: Duration) -> Probe {
    // Disconnected, a request would wait in the client's buffer and say nothing about the peer.
    if client.connection_state() != async_nats::connection::State::Connected {
        return Probe::Unknown;
    }
    let request = async_nats::Request::new().timeout(Some(timeout));
    match client.send_request(subject(id), request).await {
        Ok(_) => Probe::Present,
        Err(e) if e.kind() == RequestErrorKind::NoResponders => Probe::Gone,
        Err(_) => Probe::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::subject;

    #[test]
    fn subjects_are_one_token_whatever_the_id() {
        assert_eq!(subject("w1"), "turnstile.presence.7731");
        let s = subject("worker-127.0.0.1:7500");
        assert_eq!(s.split('.').count(), 3, "{s}");
        assert!(s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'), "{s}");
    }
}
