//! [`StoreHealth`]: since when a bucket has been failing this worker or answering it again, which decides
//! how long a held lease outlives unanswered renewals ([`super::STORE_GRACE`]) and when peers' expired
//! leases may be taken after an outage (decision 0094).

use std::time::{Duration, Instant};

/// Since when a bucket has been failing this worker, or answering it again (decision 0094).
#[derive(Debug)]
pub(super) struct StoreHealth {
    /// The first failure (no answer, no leader) since the bucket last answered; `None` while it answers.
    pub(super) failing_since: Option<Instant>,
    /// When it answered again after the last failure (or when the worker started).
    answering_since: Instant,
}

impl StoreHealth {
    pub(super) fn new() -> Self {
        Self { failing_since: None, answering_since: Instant::now() }
    }

    /// Records an answer (a refusal too) or a failure; true when an outage ended.
    pub(super) fn record(&mut self, answered: bool) -> bool {
        if answered {
            if self.failing_since.take().is_some() {
                self.answering_since = Instant::now();
                return true;
            }
        } else if self.failing_since.is_none() {
            self.failing_since = Some(Instant::now());
        }
        false
    }

    /// Answering for at least `for_at_least`.
    pub(super) fn settled(&self, for_at_least: Duration) -> bool {
        self.failing_since.is_none() && self.answering_since.elapsed() >= for_at_least
    }
}
