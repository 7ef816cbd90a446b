//! [`FeedItem`]: one item of a session's feed, as [`crate::feed`] produces it and
//! [`crate::watch_buffer`] holds it for every watcher. Its own file so those two do not import each other.

use prost::Message as _;
use tonic::{Code, Status};
use turnstile_model::SessionRef;
use turnstile_proto::v1 as pb;

/// One item of a feed, encoded once for every subscriber.
#[derive(Debug)]
pub enum FeedItem {
    Durable {
        seq: u64,
        item: pb::WatchItem,
    },
    Live {
        after_seq: u64,
        item: pb::WatchItem,
    },
    /// The feed stopped; nothing follows.
    End(FeedEnd),
}

impl FeedItem {
    /// What a watcher sends of it (none for the end).
    pub fn watch_item(&self) -> Option<&pb::WatchItem> {
        match self {
            Self::Durable { item, .. } | Self::Live { item, .. } => Some(item),
            Self::End(_) => None,
        }
    }

    /// The seq of a durable item.
    pub fn durable_seq(&self) -> Option<u64> {
        match self {
            Self::Durable { seq, .. } => Some(*seq),
            _ => None,
        }
    }

    /// Its size as sent: what it counts for in a watcher's buffers.
    pub fn encoded_len(&self) -> usize {
        self.watch_item().map_or(0, |item| item.encoded_len())
    }
}

/// Why a feed stopped.
#[derive(Clone, Debug)]
pub enum FeedEnd {
    /// The log or the bus failed: every watcher ends with this status, as a lone Watch did.
    Failed { code: Code, message: String },
    /// The log's tail ended without an error.
    TailEnded,
}

impl FeedEnd {
    pub(crate) fn failed(status: &Status) -> Self {
        Self::Failed { code: status.code(), message: status.message().to_owned() }
    }

    /// The status a watcher of `session` that has every event up to `position` ends with.
    pub fn status(&self, session: &SessionRef, position: u64) -> Status {
        match self {
            Self::Failed { code, message } => Status::new(*code, message.clone()),
            Self::TailEnded => Status::unavailable(format!(
                "the log tail of session {session} ended; reconnect with after_seq = {position}"
            )),
        }
    }
}
