//! Tenants' daily token budgets (SPEC §17): checked by the runner before each model request, against the
//! usage the journal counted from durable `assistant/message` events ([`UsageLedger`]).
//!
//! The driver stays free of IO: the check happens where the runner performs the driver's model effect
//! (`operations.rs`), and a tenant over its budget answers that effect as a failed request with the code
//! [`TENANT_BUDGET_EXHAUSTED`], which the driver records as `turn/end error` (with `step/end` and a live
//! `agent/error`) like any other failed request; the model is never called.

use std::collections::BTreeMap;
use std::sync::Arc;

use metrics::counter;
use turnstile_driver::TENANT_BUDGET_EXHAUSTED;
use turnstile_journal::UsageLedger;
use turnstile_model::time::rfc3339_utc;
use turnstile_model::usage::{day_of, day_start_ms};
use turnstile_ops::names;

/// Each budgeted tenant's `token_budget` (tokens per UTC day) and where usage is read.
#[derive(Clone)]
pub struct Budgets {
    budgets: BTreeMap<String, u64>,
    ledger: Arc<dyn UsageLedger>,
}

impl std::fmt::Debug for Budgets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budgets").field("budgets", &self.budgets).finish_non_exhaustive()
    }
}

/// Why a model request was not sent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "tenant {tenant:?} used {used} tokens today, its daily token budget is {budget} (config tenants.{tenant}.token_budget); \
     the model request was not sent; the budget resets at {resets} (UTC midnight)"
)]
pub struct BudgetExhausted {
    pub tenant: String,
    pub used: u64,
    pub budget: u64,
    /// RFC 3339, the next UTC midnight.
    pub resets: String,
}

impl BudgetExhausted {
    /// The `turn/end` error code.
    pub fn code(&self) -> &'static str {
        TENANT_BUDGET_EXHAUSTED
    }
}

impl Budgets {
    /// `budgets` by tenant, checked against the usage `ledger` reads.
    pub fn new(budgets: BTreeMap<String, u64>, ledger: Arc<dyn UsageLedger>) -> Self {
        Self { budgets, ledger }
    }

    /// Whether any tenant has a budget (without one the check costs nothing).
    pub fn is_empty(&self) -> bool {
        self.budgets.is_empty()
    }

    /// May `tenant` send a model request at `now_ms`? Its usage today must be below its budget. A ledger
    /// that cannot be read admits the request (and says so in the log): an outage of the usage store must
    /// not stop every agent.
    pub async fn admit(&self, tenant: &str, now_ms: u64) -> Result<(), BudgetExhausted> {
        let Some(&budget) = self.budgets.get(tenant) else { return Ok(()) };
        let today = day_of(now_ms);
        let used = match self.ledger.tenant_usage(tenant, today).await {
            Ok(book) => book.used_on(today),
            Err(e) => {
                tracing::warn!(%tenant, error = %e, "token budget not checked: the usage could not be read");
                return Ok(());
            }
        };
        if used < budget {
            return Ok(());
        }
        counter!(names::BUDGET_REFUSALS, "tenant" => tenant.to_owned()).increment(1);
        Err(BudgetExhausted { tenant: tenant.to_owned(), used, budget, resets: rfc3339_utc(day_start_ms(today + 1)) })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use turnstile_journal::MemoryUsage;
    use turnstile_model::usage::DAY_MS;
    use turnstile_model::{Envelope, EventPayload, SessionRef, Usage};

    fn used(tenant: &str, time_ms: u64, tokens: u64) -> Envelope {
        let mut payload = EventPayload::reply(1, 1, "");
        if let EventPayload::AssistantMessage { usage, .. } = &mut payload {
            *usage = Some(Usage { input_tokens: tokens, ..Usage::default() });
        }
        Envelope { session: SessionRef::new(tenant, "s").unwrap(), seq: 1, time_ms, epoch: 1, payload }
    }

    #[tokio::test]
    async fn a_tenant_at_its_budget_is_refused_until_the_next_utc_day() {
        let ledger = Arc::new(MemoryUsage::default());
        let budgets = Budgets::new(BTreeMap::from([("acme".to_owned(), 100)]), ledger.clone());
        let noon = 20_000 * DAY_MS + DAY_MS / 2;
        ledger.count(&[used("acme", noon, 99)]);
        budgets.admit("acme", noon).await.unwrap();
        ledger.count(&[used("acme", noon, 1), used("other", noon, 1000)]);
        let refused = budgets.admit("acme", noon).await.unwrap_err();
        assert_eq!((refused.used, refused.budget), (100, 100));
        let message = refused.to_string();
        assert!(message.contains("tenants.acme.token_budget"), "{message}");
        assert!(message.ends_with("resets at 2024-10-05T00:00:00.000Z (UTC midnight)"), "{message}");
        // Tenants without a budget, and the next day, are admitted.
        budgets.admit("other", noon).await.unwrap();
        budgets.admit("acme", noon + DAY_MS).await.unwrap();
    }
}
