//! `tail`: replay from memory, then follow appends.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use futures::StreamExt as _;
use tokio::sync::watch;

use super::Slot;
use crate::log::EventStream;
use turnstile_model::event::Envelope;

/// Events read from memory per refill.
const PAGE: usize = 256;

struct Cursor {
    /// Weak, so a tail does not keep a dropped log alive: the stream ends with it.
    slot: Weak<Slot>,
    last: watch::Receiver<u64>,
    next_seq: u64,
    buffer: VecDeque<Envelope>,
}

/// Every event with seq > `after_seq`, then each new one. The watch only says "something changed"; the
/// events always come from memory by seq, so a slow reader can neither skip nor repeat one.
pub(super) fn follow(slot: &Arc<Slot>, after_seq: u64) -> EventStream {
    let cursor = Cursor {
        slot: Arc::downgrade(slot),
        last: slot.last.subscribe(),
        next_seq: after_seq.saturating_add(1),
        buffer: VecDeque::new(),
    };
    futures::stream::unfold(cursor, |mut cursor| async move {
        loop {
            if let Some(event) = cursor.buffer.pop_front() {
                return Some((Ok(event), cursor));
            }
            // Mark the current value seen *before* reading, so an append after the read wakes `changed`.
            cursor.last.borrow_and_update();
            let page = cursor.slot.upgrade()?.read(cursor.next_seq, PAGE);
            if let Some(last) = page.last() {
                cursor.next_seq = last.seq + 1;
                cursor.buffer.extend(page);
                continue;
            }
            // An error means the slot, and so the log, is gone.
            cursor.last.changed().await.ok()?;
        }
    })
    .boxed()
}
