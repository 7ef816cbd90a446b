//! [`UsageLedger`]: every tenant's token usage, counted from the durable `assistant/message` events of the
//! log (SPEC §17; the counting rule is `turnstile_model::usage`).
//!
//! The embedded journal counts each event when its append succeeds (and every held session's events when
//! it opens a data directory); the JetStream journal folds the event streams into a KV bucket
//! ([`crate::jetstream::UsageFold`], docs/decisions/0063-usage-folded-from-the-log.md). Either way a count
//! follows from a durable event, so it survives restarts and failover and a retried step is counted once.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use turnstile_model::Envelope;
use turnstile_model::usage::UsageBook;

use crate::log::JournalError;
use crate::sync;

/// Reads the token usage of tenants.
#[async_trait]
pub trait UsageLedger: Send + Sync + 'static {
    /// What `tenant` used, per UTC day and model, on the days from `since_day` on (days since the Unix
    /// epoch). A tenant that used nothing has an empty book.
    async fn tenant_usage(&self, tenant: &str, since_day: u64) -> Result<UsageBook, JournalError>;
}

/// Usage counted in this process, from the events its journal holds: the embedded journal's ledger.
#[derive(Debug, Default)]
pub struct MemoryUsage {
    tenants: Mutex<BTreeMap<String, UsageBook>>,
}

impl MemoryUsage {
    /// Counts what `events` (durable, of one session) record.
    pub fn count(&self, events: &[Envelope]) {
        let mut tenants = sync::lock(&self.tenants);
        for event in events {
            if let Some((day, model, usage)) = turnstile_model::usage::counted(event) {
                tenants.entry(event.session.tenant.clone()).or_default().count(day, &model, &usage);
            }
        }
    }
}

#[async_trait]
impl UsageLedger for MemoryUsage {
    async fn tenant_usage(&self, tenant: &str, since_day: u64) -> Result<UsageBook, JournalError> {
        Ok(sync::lock(&self.tenants).get(tenant).map(|book| book.since(since_day)).unwrap_or_default())
    }
}
