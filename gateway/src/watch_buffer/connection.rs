//! The connection's side of a watcher: its send queue read as a stream of Watch items, either as
//! messages ([`ItemStream`]) or as the bytes the feed encoded once ([`EncodedItemStream`], decision 0178).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use tonic::Status;
use turnstile_proto::v1 as pb;

use super::{End, Outgoing, Watcher};

/// The connection's side of one watcher.
struct Connection(Arc<Watcher>);

/// The stream a new watcher's connection reads.
pub(super) fn item_stream(watcher: Arc<Watcher>) -> ItemStream {
    let connection = Connection(watcher);
    let stream = futures::stream::unfold(connection, |c| async move { c.next().await.map(|next| (next, c)) });
    ItemStream(Box::pin(stream))
}

impl Connection {
    async fn next(&self) -> Option<Result<Outgoing, Status>> {
        let watcher = &self.0;
        loop {
            let notified = watcher.to_connection.notified();
            let next = {
                let mut state = watcher.lock();
                match state.queue.pop_front() {
                    Some(out) => {
                        state.queue_bytes -= out.bytes();
                        // Under the lock that a cut takes too: its position includes this item.
                        if let Some(seq) = out.durable_seq() {
                            state.taken = state.taken.max(seq);
                        }
                        Some(out)
                    }
                    None => match &mut state.end {
                        End::Open => None,
                        End::Finished(status) => return status.take().map(Err),
                        End::Gone => return None,
                    },
                }
            };
            if let Some(out) = next {
                watcher.to_task.notify_one();
                // Made into what is sent outside the lock (`ItemStream`): the feed and the task never wait
                // for it.
                return Some(Ok(out));
            }
            notified.await;
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let dropped = {
            let mut state = self.0.lock();
            state.end = End::Gone;
            state.drain()
        };
        drop(dropped);
        self.0.to_task.notify_one();
    }
}

/// What a connection takes from its send queue, before it is made into a message.
type Queued = Pin<Box<dyn Stream<Item = Result<Outgoing, Status>> + Send>>;

/// The items of one Watch stream, as its connection reads them (the `WatchStream` of the service).
pub struct ItemStream(Queued);

impl std::fmt::Debug for ItemStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ItemStream")
    }
}

impl ItemStream {
    /// The same stream as encoded messages: a feed item's bytes are the ones encoded when the feed made it,
    /// shared by every watcher (the gRPC Watch sends these, decision 0178).
    pub fn into_encoded(self) -> EncodedItemStream {
        EncodedItemStream(self.0)
    }
}

impl Stream for ItemStream {
    type Item = Result<pb::WatchItem, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        poll_made(&mut self.0, cx, Outgoing::into_item)
    }
}

/// [`ItemStream`] as encoded `WatchItem` messages ([`crate::encoded`] sends them as they are).
pub struct EncodedItemStream(Queued);

impl std::fmt::Debug for EncodedItemStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EncodedItemStream")
    }
}

impl Stream for EncodedItemStream {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        poll_made(&mut self.0, cx, Outgoing::into_encoded)
    }
}

/// The next of `queued`'s outputs as `make` makes it into what is sent. An output it makes nothing of (a
/// feed's end is no message: the status follows) is passed over.
fn poll_made<T>(
    queued: &mut Queued,
    cx: &mut Context<'_>,
    make: fn(Outgoing) -> Option<T>,
) -> Poll<Option<Result<T, Status>>> {
    loop {
        let Some(out) = std::task::ready!(queued.as_mut().poll_next(cx)) else {
            return Poll::Ready(None);
        };
        if let Some(sent) = out.map(make).transpose() {
            return Poll::Ready(Some(sent));
        }
    }
}
