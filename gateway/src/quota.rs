//! Per-tenant quotas (issue 14, decision 0033): a request rate and a count of open Watch streams.
//!
//! They are checked inside the [`Gateway`](crate::Gateway)'s service methods, right after the tenancy check,
//! so the gRPC server and the console's gRPC-Web API (which wraps the same `Gateway`) are both covered. A
//! refused call is RESOURCE_EXHAUSTED before anything of it is done, with the limit and its config key in
//! the message and a retry hint in the `retry-after-ms` metadata. The limits are per gateway process: a
//! tenant spread over N gateways gets up to N times them.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use tonic::Status;
use tonic::metadata::MetadataValue;

/// The metadata key of the retry hint on a RESOURCE_EXHAUSTED answer: whole milliseconds to wait.
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// The hint when no wait can be computed (a Watch slot frees when some stream of the tenant ends).
const WATCH_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Tenants remembered by the rate limiter before idle ones are forgotten (the map is keyed by tenant, and
/// without auth any caller can name a new tenant).
const RETAIN_ABOVE: usize = 10_000;

/// The quota settings (config `[limits]` `tenant_requests_per_minute`, `tenant_request_burst`,
/// `tenant_max_watches`); 0 turns a limit off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaConfig {
    /// Requests one tenant may make per minute, sustained; 0: no rate limit.
    pub requests_per_minute: u32,
    /// Requests one tenant may make at once after being idle; 0: `requests_per_minute`.
    pub request_burst: u32,
    /// Watch streams one tenant may hold open at once; 0: no limit.
    pub max_watches: usize,
}

/// The quotas of one gateway process; cheap to clone (shared state).
#[derive(Clone)]
pub struct Quotas {
    config: QuotaConfig,
    rate: Option<Arc<DefaultKeyedRateLimiter<String>>>,
    watches: Arc<Mutex<HashMap<String, usize>>>,
}

impl std::fmt::Debug for Quotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quotas").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Quotas {
    pub fn new(config: QuotaConfig) -> Self {
        let rate = NonZeroU32::new(config.requests_per_minute).map(|per_minute| {
            let burst = NonZeroU32::new(config.request_burst).unwrap_or(per_minute);
            Arc::new(DefaultKeyedRateLimiter::keyed(Quota::per_minute(per_minute).allow_burst(burst)))
        });
        Self { config, rate, watches: Arc::default() }
    }

    /// Counts one request of `tenant`; RESOURCE_EXHAUSTED when the tenant is over its rate.
    pub fn admit(&self, tenant: &str) -> Result<(), Status> {
        let Some(rate) = &self.rate else { return Ok(()) };
        if rate.len() > RETAIN_ABOVE {
            rate.retain_recent();
        }
        let key = tenant.to_owned();
        rate.check_key(&key).map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            exhausted(
                format!(
                    "tenant {tenant:?} is over its request rate of {} per minute (burst {}; config \
                     limits.tenant_requests_per_minute, limits.tenant_request_burst); nothing of this request \
                     was done: retry after {} ms",
                    self.config.requests_per_minute,
                    rate_burst(&self.config),
                    retry_ms(wait)
                ),
                wait,
            )
        })
    }

    /// Takes one of `tenant`'s Watch slots for as long as the returned permit lives; RESOURCE_EXHAUSTED
    /// when all are taken.
    pub fn open_watch(&self, tenant: &str) -> Result<WatchPermit, Status> {
        let mut watches = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        let open = watches.entry(tenant.to_owned()).or_default();
        if self.config.max_watches > 0 && *open >= self.config.max_watches {
            return Err(exhausted(
                format!(
                    "tenant {tenant:?} has {open} Watch streams open, its limit (config limits.tenant_max_watches); \
                     close one, or retry after {} ms",
                    retry_ms(WATCH_RETRY_AFTER)
                ),
                WATCH_RETRY_AFTER,
            ));
        }
        *open += 1;
        Ok(WatchPermit { tenant: tenant.to_owned(), watches: self.watches.clone() })
    }

    /// Watch streams `tenant` holds open on this gateway.
    pub fn open_watches(&self, tenant: &str) -> usize {
        self.watches.lock().unwrap_or_else(PoisonError::into_inner).get(tenant).copied().unwrap_or(0)
    }
}

/// One open Watch stream of a tenant; dropping it frees the slot.
#[derive(Debug)]
pub struct WatchPermit {
    tenant: String,
    watches: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for WatchPermit {
    fn drop(&mut self) {
        let mut watches = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = watches.get_mut(&self.tenant) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                watches.remove(&self.tenant);
            }
        }
    }
}

fn rate_burst(config: &QuotaConfig) -> u32 {
    if config.request_burst == 0 { config.requests_per_minute } else { config.request_burst }
}

/// Whole milliseconds, rounded up and at least 1, so that a client waiting that long finds room.
fn retry_ms(wait: Duration) -> u128 {
    wait.as_nanos().div_ceil(1_000_000).max(1)
}

fn exhausted(message: String, wait: Duration) -> Status {
    let mut status = Status::resource_exhausted(message);
    if let Ok(value) = MetadataValue::try_from(retry_ms(wait).to_string()) {
        status.metadata_mut().insert(RETRY_AFTER_MS, value);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_admitted_and_the_next_request_is_refused_with_a_hint() {
        let quotas = Quotas::new(QuotaConfig { requests_per_minute: 1, request_burst: 2, max_watches: 0 });
        quotas.admit("t").unwrap();
        quotas.admit("t").unwrap();
        let refused = quotas.admit("t").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("limits.tenant_requests_per_minute"), "{refused:?}");
        let hint: u64 = refused.metadata().get(RETRY_AFTER_MS).unwrap().to_str().unwrap().parse().unwrap();
        assert!((1..=60_000).contains(&hint), "{hint}");
        quotas.admit("other").unwrap();
    }

    #[test]
    fn watch_slots_free_when_permits_drop() {
        let quotas = Quotas::new(QuotaConfig { max_watches: 1, ..QuotaConfig::default() });
        let permit = quotas.open_watch("t").unwrap();
        let refused = quotas.open_watch("t").unwrap_err();
        assert!(refused.message().contains("limits.tenant_max_watches"), "{refused:?}");
        assert_eq!(refused.metadata().get(RETRY_AFTER_MS).unwrap(), "1000");
        let _other = quotas.open_watch("u").unwrap();
        drop(permit);
        assert_eq!(quotas.open_watches("t"), 0);
        let _again = quotas.open_watch("t").unwrap();
    }

    #[test]
    fn zero_turns_the_limits_off() {
        let quotas = Quotas::new(QuotaConfig::default());
        let permits: Vec<_> = (0..100).map(|_| quotas.open_watch("t").unwrap()).collect();
        assert_eq!(quotas.open_watches("t"), 100);
        for _ in 0..1000 {
            quotas.admit("t").unwrap();
        }
        drop(permits);
    }
}
