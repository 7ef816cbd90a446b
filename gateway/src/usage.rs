//! `GetUsage` (SPEC §17): a tenant's token usage per model, read from the cluster's usage ledger (counted
//! from durable `assistant/message` events, `turnstile_journal::usage`), with its daily token budget.

use std::collections::BTreeMap;

use tonic::{Request, Response, Status};
use turnstile_model::SessionRef;
use turnstile_model::usage::{KEPT_DAYS, day_of, day_start_ms, split_model_key};
use turnstile_proto::v1 as pb;

use crate::auth::Caller;
use crate::service::Gateway;
use crate::status;

impl Gateway {
    pub(crate) async fn get_usage(
        &self,
        request: Request<pb::GetUsageRequest>,
    ) -> Result<Response<pb::TenantUsage>, Status> {
        let caller = self.auth.authenticate(request.metadata())?;
        let req = request.into_inner();
        let tenant = match (&caller, req.tenant.is_empty()) {
            (Caller::Tenant(own), true) => own.clone(),
            (Caller::Tenant(own), false) if req.tenant != *own => {
                return Err(Status::permission_denied(format!(
                    "your credentials are for tenant {own:?}; GetUsage reads only your tenant's usage: leave tenant \
                     empty"
                )));
            }
            (_, true) => self.config.default_tenant.clone(),
            (_, false) => req.tenant,
        };
        // The session-name rule for the tenant half.
        SessionRef::new(tenant.clone(), "x").map_err(|e| Status::invalid_argument(format!("tenant: {e}")))?;
        self.quotas.admit(&tenant).await?;
        let Some(ledger) = &self.usage else {
            return Err(Status::unimplemented(
                "this gateway was started without a usage ledger, so it cannot report usage; ask a gateway of the \
                 cluster (turnstile gateway, turnstile dev)",
            ));
        };
        let today = day_of(turnstile_ops::clock::now_ms());
        let since_day =
            if req.since_unix_ms == 0 { today.saturating_sub(KEPT_DAYS) } else { day_of(req.since_unix_ms) };
        let book = ledger.tenant_usage(&tenant, since_day.min(today)).await.map_err(status::from_journal)?;
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
        Ok(Response::new(pb::TenantUsage {
            budget: self.config.token_budgets.get(&tenant).copied().unwrap_or(0),
            tenant,
            models,
            used_today: book.used_on(today),
            resets_unix_ms: day_start_ms(today + 1),
            since_unix_ms: day_start_ms(since_day),
        }))
    }
}

/// The `[tenants.NAME] token_budget`s of a configuration, by tenant.
pub type TokenBudgets = BTreeMap<String, u64>;
