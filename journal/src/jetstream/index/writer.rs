//! The writer task: puts the queued entries a window at a time, concurrently across sessions, and queues
//! the failed ones again after a growing pause.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::StreamExt as _;

use super::mirror::OwnPuts;
use super::{PendingWrites, key};

/// Puts in flight at once, across sessions.
const MAX_CONCURRENT_PUTS: usize = 64;

/// The pause after a batch with failed puts, doubling up to [`MAX_RETRY_PAUSE`] while puts keep failing.
const RETRY_PAUSE: Duration = Duration::from_millis(250);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);

/// Puts the queued entries: `window` after the first entry of a batch, everything queued is taken at
/// once (the latest per session), written concurrently, then the next batch; the failed ones go back in
/// the queue and wait out a pause that grows while puts keep failing. Ends when the index is dropped and
/// its last writes are put (or failed once).
pub(super) async fn writer_task(store: kv::Store, queue: Arc<PendingWrites>, own: Arc<OwnPuts>, window: Duration) {
    let mut pause = RETRY_PAUSE;
    while let Some((batch, generation)) = queue.next_batch(window).await {
        let failed = Mutex::new(Vec::new());
        futures::stream::iter(batch)
            .for_each_concurrent(MAX_CONCURRENT_PUTS, |(session, pending)| {
                let (store, failed, own) = (store.clone(), &failed, &own);
                async move {
                    if pending.is_held() {
                        // The bucket holds this very entry (its activity came back to it): nothing to put.
                        return;
                    }
                    let key = key(&session);
                    let result = match &pending.entry {
                        Some(indexed) => match serde_json::to_vec(indexed) {
                            Ok(bytes) => {
                                let bytes = Bytes::from(bytes);
                                // Known before the put, so an echo that beats the ack is skipped too.
                                own.put(&key, bytes.clone());
                                store.put(key, bytes).await.map(|_| ()).map_err(|e| e.to_string())
                            }
                            // Not retried: the same entry would fail the same way.
                            Err(e) => {
                                tracing::warn!(%session, error = %e, "session index entry not encodable; skipped");
                                return;
                            }
                        },
                        None => {
                            own.forget(&key);
                            store.purge(key).await.map_err(|e| e.to_string())
                        }
                    };
                    if let Err(e) = result {
                        tracing::debug!(%session, error = %e, "session index not written; queued again");
                        failed.lock().unwrap_or_else(PoisonError::into_inner).push((session, pending));
                    }
                }
            })
            .await;
        queue.written(generation);
        let failed = failed.into_inner().unwrap_or_else(PoisonError::into_inner);
        if failed.is_empty() {
            pause = RETRY_PAUSE;
            continue;
        }
        if queue.closed.load(Ordering::SeqCst) {
            tracing::warn!(
                failed = failed.len(),
                "session index writes failed as the index closed; written at next load"
            );
            return;
        }
        tracing::warn!(
            failed = failed.len(),
            retry_in_ms = pause.as_millis() as u64,
            "session index writes failed; retrying"
        );
        for (session, pending) in failed {
            queue.retry(session, pending);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_RETRY_PAUSE);
    }
}
