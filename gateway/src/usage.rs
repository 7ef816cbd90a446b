//! `GetUsage` (SPEC §17): a tenant's token usage per model, read from the cluster's usage ledger (counted
//! from durable `assistant/message` events, `turnstile_journal::usage`), with its daily token budget. The
//! RPC (`rpc.rs`) scopes the call and hands the ledger here; this module knows nothing of the gateway.

use tonic::Status;
use turnstile_journal::UsageLedger;
use turnstile_model::Tenant;
use turnstile_model::usage::{KEPT_DAYS, day_of, day_start_ms, split_model_key};
use turnstile_proto::v1 as pb;

use crate::status;

/// `tenant`'s usage since `since_unix_ms` (0: every day the ledger keeps) as of `now_ms`, with its daily
/// `budget` (0: none). A `since` in the future is INVALID_ARGUMENT: no usage can be counted there.
pub(crate) async fn tenant_usage(
    ledger: &dyn UsageLedger,
    tenant: &Tenant,
    since_unix_ms: u64,
    budget: u64,
    now_ms: u64,
) -> Result<pb::TenantUsage, Status> {
    if since_unix_ms > now_ms {
        return Err(Status::invalid_argument(format!(
            "since_unix_ms: {since_unix_ms} is in the future (now is {now_ms}); pass a past time, or 0 for every day \
             kept ({KEPT_DAYS} days)"
        )));
    }
    let today = day_of(now_ms);
    let since_day = if since_unix_ms == 0 { today.saturating_sub(KEPT_DAYS) } else { day_of(since_unix_ms) };
    let book = ledger.tenant_usage(tenant.as_str(), since_day).await.map_err(status::from_journal)?;
    let models = book
        .per_model_since(since_day)
        .into_iter()
        .map(|(key, u)| {
            let (provider, model) = split_model_key(&key);
            pb::ModelUsage {
                model: model.to_owned(),
                provider: provider.to_owned(),
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
                cached_input_tokens: u.cached_input_tokens,
                cache_write_tokens: u.cache_write_tokens,
            }
        })
        .collect();
    Ok(pb::TenantUsage {
        budget,
        tenant: tenant.as_str().to_owned(),
        models,
        used_today: book.used_on(today),
        resets_unix_ms: day_start_ms(today + 1),
        since_unix_ms: day_start_ms(since_day),
    })
}
