//! Per-tenant quotas (decision 0033): a request rate and a count of open Watch streams, counted across every
//! gateway of a cluster (SPEC §17, docs/decisions/0065-cluster-wide-quotas.md).
//!
//! They are checked inside the [`Gateway`](crate::Gateway)'s service methods, right after the tenancy check,
//! so the gRPC server and the console's gRPC-Web API (which wraps the same `Gateway`) are both covered. A
//! refused call is RESOURCE_EXHAUSTED before anything of it is done, with the limit and its config key in
//! the message and a retry hint in the `retry-after-ms` metadata.
//!
//! A tenant's limits are its `[tenants.NAME]` keys, else the `[limits]` ones. The rate is GCRA ([`gcra`]):
//! one request per interval sustained, `burst` at once after an idle spell, so in any window of W seconds a
//! tenant gets at most `burst + W × rate`. Its state is one time per tenant (the theoretical arrival time):
//! in this process ([`Quotas::new`]), or in the NATS KV bucket `turnstile_quotas` shared by every gateway of
//! the cluster ([`Quotas::shared`]), changed by compare-and-set so that two gateways never both take the last
//! slot. Watch slots are counted the same way: each gateway writes its own count per tenant with an expiry
//! it keeps renewing, so the streams of a gateway that died stop counting within [`WATCH_COUNT_TTL`]. When
//! the bucket cannot be reached, a call is admitted (and the failure logged): an outage of the quota store
//! must not stop every client.
//!
//! No gateway-wide lock is held across a round trip to the bucket (decision 0089). Taking a Watch slot is
//! serialized per tenant only (one tenant's opens never wait for another's): the slot is reserved in this
//! gateway's count first, then written by compare-and-set and given back if the entry shows the tenant at
//! its limit. Every other write of a count (a stream ending, the renewal) takes no lock at all: it reads
//! the count inside its compare-and-set, so the last one to land is never stale.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use turnstile_model::sync::lock;

use async_nats::jetstream::kv;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tonic::Status;
use tonic::metadata::MetadataValue;

/// The metadata key of the retry hint on a RESOURCE_EXHAUSTED answer: whole milliseconds to wait.
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// The bucket of the shared rate and Watch counts.
pub const QUOTA_BUCKET: &str = "turnstile_quotas";

/// How long a gateway's Watch count of a tenant counts without being renewed: the streams of a gateway
/// that died free their slots within this long. Renewed every third of it.
pub const WATCH_COUNT_TTL: Duration = Duration::from_secs(10);

/// The hint when no wait can be computed (a Watch slot frees when some stream of the tenant ends).
const WATCH_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Tenants remembered by the local rate state before idle ones are forgotten (the map is keyed by tenant,
/// and without auth any caller can name a new tenant).
const RETAIN_ABOVE: usize = 10_000;

/// Compare-and-set attempts on one shared entry before the call is admitted unchecked.
const CAS_ATTEMPTS: usize = 20;

/// The quota settings: `[limits]` `tenant_requests_per_minute`, `tenant_request_burst`, `tenant_max_watches`
/// for every tenant, and the `[tenants.NAME]` keys that replace them for one; 0 turns a limit off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaConfig {
    /// Requests one tenant may make per minute, sustained; 0: no rate limit.
    pub requests_per_minute: u32,
    /// Requests one tenant may make at once after being idle; 0: `requests_per_minute`.
    pub request_burst: u32,
    /// Watch streams one tenant may hold open at once; 0: no limit.
    pub max_watches: usize,
    /// Per-tenant limits that replace the ones above.
    pub tenants: BTreeMap<String, TenantQuota>,
}

/// One tenant's `[tenants.NAME]` quota keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantQuota {
    pub requests_per_s: Option<u32>,
    /// Default: `requests_per_s`.
    pub request_burst: Option<u32>,
    pub watch_limit: Option<usize>,
}

/// A request rate: one request per `interval_us` sustained, `burst` at once.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rate {
    interval_us: u64,
    burst: u32,
    /// "60 per minute (burst 10; config …)".
    describe: String,
}

impl QuotaConfig {
    fn rate(&self, tenant: &str) -> Option<Rate> {
        if let Some(own) = self.tenants.get(tenant)
            && let Some(per_s) = own.requests_per_s.filter(|r| *r > 0)
        {
            let burst = own.request_burst.unwrap_or(per_s).max(1);
            return Some(Rate {
                interval_us: 1_000_000 / u64::from(per_s),
                burst,
                describe: format!(
                    "{per_s} per second (burst {burst}; config tenants.{tenant}.requests_per_s, \
                     tenants.{tenant}.request_burst)"
                ),
            });
        }
        let per_minute = self.requests_per_minute;
        (per_minute > 0).then(|| {
            let burst = if self.request_burst == 0 { per_minute } else { self.request_burst };
            Rate {
                interval_us: 60_000_000 / u64::from(per_minute),
                burst,
                describe: format!(
                    "{per_minute} per minute (burst {burst}; config limits.tenant_requests_per_minute, \
                     limits.tenant_request_burst)"
                ),
            }
        })
    }

    /// The tenant's Watch limit and the key that sets it.
    fn watch_limit(&self, tenant: &str) -> Option<(usize, String)> {
        if let Some(limit) = self.tenants.get(tenant).and_then(|t| t.watch_limit).filter(|l| *l > 0) {
            return Some((limit, format!("tenants.{tenant}.watch_limit")));
        }
        (self.max_watches > 0).then(|| (self.max_watches, "limits.tenant_max_watches".to_owned()))
    }
}

/// GCRA over the theoretical arrival time `tat_us` (µs since the Unix epoch): `Ok(the next tat)` when a
/// request at `now_us` conforms, else `Err(µs until one would)`. `burst` requests conform at once after an
/// idle spell, then one per `interval_us`.
///
/// ```
/// use turnstile_gateway::quota::gcra;
/// let (interval, burst) = (1_000, 2);
/// let tat = gcra(0, 5_000, interval, burst).unwrap();
/// let tat = gcra(tat, 5_000, interval, burst).unwrap();
/// assert_eq!(gcra(tat, 5_000, interval, burst), Err(1_000));
/// assert!(gcra(tat, 6_000, interval, burst).is_ok());
/// ```
pub fn gcra(tat_us: u64, now_us: u64, interval_us: u64, burst: u32) -> Result<u64, u64> {
    let tat = tat_us.max(now_us);
    let allowance = interval_us.saturating_mul(u64::from(burst.max(1) - 1));
    let ahead = tat - now_us;
    if ahead > allowance { Err(ahead - allowance) } else { Ok(tat.saturating_add(interval_us)) }
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The quotas of one gateway; cheap to clone (shared state).
#[derive(Clone)]
pub struct Quotas {
    inner: Arc<Inner>,
}

struct Inner {
    config: QuotaConfig,
    /// The theoretical arrival time per tenant, when counted in this process.
    tat: Mutex<HashMap<String, u64>>,
    /// Watch streams open on this gateway, per tenant.
    watches: Mutex<HashMap<String, usize>>,
    shared: Option<Shared>,
}

/// The cluster's shared counts.
struct Shared {
    store: kv::Store,
    /// This gateway's key in the Watch entries.
    gateway: String,
    /// Tenants taking a Watch slot now, one take at a time per tenant.
    takes: TenantTurns,
}

/// Per-tenant turns: what runs in one tenant's turn runs after that tenant's earlier turns and never waits
/// for another tenant's. A tenant leaves the map when its last turn ends.
#[derive(Default)]
struct TenantTurns {
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl TenantTurns {
    async fn run<T>(&self, tenant: &str, work: impl std::future::Future<Output = T>) -> T {
        let turn = lock(&self.turns).entry(tenant.to_owned()).or_default().clone();
        let out = {
            let _turn = turn.lock().await;
            work.await
        };
        // Clones are made only under the map's lock, so a count of one there means nobody else has it.
        let mut turns = lock(&self.turns);
        drop(turn);
        if turns.get(tenant).is_some_and(|t| Arc::strong_count(t) == 1) {
            turns.remove(tenant);
        }
        out
    }
}

impl std::fmt::Debug for Quotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quotas")
            .field("config", &self.inner.config)
            .field("shared", &self.inner.shared.is_some())
            .finish_non_exhaustive()
    }
}

/// One gateway's Watch count of a tenant in the shared entry.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct GatewayWatches {
    count: usize,
    expires_ms: u64,
}

/// The shared Watch entry of a tenant: each gateway's count.
#[derive(Debug, Default, Serialize, Deserialize)]
struct WatchEntry {
    gateways: BTreeMap<String, GatewayWatches>,
}

impl WatchEntry {
    fn others(&self, me: &str, now_ms: u64) -> usize {
        self.gateways.iter().filter(|(id, g)| id.as_str() != me && g.expires_ms > now_ms).map(|(_, g)| g.count).sum()
    }

    /// Sets gateway `me`'s count, alive for [`WATCH_COUNT_TTL`] from `now_ms`.
    fn set(&mut self, me: &str, count: usize, now_ms: u64) {
        let expires_ms = now_ms + WATCH_COUNT_TTL.as_millis() as u64;
        self.gateways.insert(me.to_owned(), GatewayWatches { count, expires_ms });
    }
}

impl Quotas {
    /// Quotas counted in this process only (one gateway, `turnstile dev`, tests).
    pub fn new(config: QuotaConfig) -> Self {
        Self::build(config, None)
    }

    /// Quotas counted across every gateway on the NATS at `client` (the bucket [`QUOTA_BUCKET`], created
    /// with `replicas` if missing). Starts the task that keeps this gateway's Watch counts alive.
    pub async fn shared(config: QuotaConfig, client: &async_nats::Client, replicas: usize) -> Result<Self, String> {
        let store = turnstile_journal::jetstream::open_bucket(
            client,
            QUOTA_BUCKET,
            "Turnstile per-tenant request rate and Watch counts, shared by the gateways",
            replicas,
        )
        .await
        .map_err(|e| e.to_string())?;
        let gateway = format!("gw-{}", uuid::Uuid::new_v4().simple());
        let quotas = Self::build(config, Some(Shared { store, gateway, takes: TenantTurns::default() }));
        let weak = Arc::downgrade(&quotas.inner);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(WATCH_COUNT_TTL / 3);
            loop {
                every.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let tenants: Vec<String> = lock(&inner.watches).keys().cloned().collect();
                for tenant in tenants {
                    Quotas { inner: inner.clone() }.write_watch_count(&tenant).await;
                }
            }
        });
        Ok(quotas)
    }

    fn build(config: QuotaConfig, shared: Option<Shared>) -> Self {
        Self { inner: Arc::new(Inner { config, tat: Mutex::default(), watches: Mutex::default(), shared }) }
    }

    /// Whether the counts are shared with the cluster's other gateways.
    pub fn is_shared(&self) -> bool {
        self.inner.shared.is_some()
    }

    /// The requests `tenant` may make at once when it has a request rate (an evaluation runs no more turns
    /// at once than that); `None` without a rate.
    pub fn burst_of(&self, tenant: &str) -> Option<u32> {
        self.inner.config.rate(tenant).map(|rate| rate.burst)
    }

    /// Counts one request of `tenant`; RESOURCE_EXHAUSTED when the tenant is over its rate.
    pub async fn admit(&self, tenant: &str) -> Result<(), Status> {
        let Some(rate) = self.inner.config.rate(tenant) else { return Ok(()) };
        let verdict = match &self.inner.shared {
            None => Some(self.admit_here(tenant, &rate)),
            Some(shared) => shared.admit(tenant, &rate).await,
        };
        match verdict {
            None | Some(Ok(())) => Ok(()),
            Some(Err(wait_us)) => {
                let wait = Duration::from_micros(wait_us);
                let across = if self.is_shared() { ", counted across all gateways" } else { "" };
                Err(exhausted(
                    format!(
                        "tenant {tenant:?} is over its request rate of {}{across}; nothing of this request was done: \
                         retry after {} ms",
                        rate.describe,
                        retry_ms(wait)
                    ),
                    wait,
                ))
            }
        }
    }

    fn admit_here(&self, tenant: &str, rate: &Rate) -> Result<(), u64> {
        let now = now_us();
        let mut tats = lock(&self.inner.tat);
        if tats.len() > RETAIN_ABOVE {
            // A tenant whose time has passed is back to a full burst: forgetting it changes nothing.
            tats.retain(|_, tat| *tat > now);
        }
        let tat = tats.get(tenant).copied().unwrap_or(0);
        let next = gcra(tat, now, rate.interval_us, rate.burst)?;
        tats.insert(tenant.to_owned(), next);
        Ok(())
    }

    /// Takes one of `tenant`'s Watch slots for as long as the returned permit lives; RESOURCE_EXHAUSTED
    /// when all are taken.
    pub async fn open_watch(&self, tenant: &str) -> Result<WatchPermit, Status> {
        let limit = self.inner.config.watch_limit(tenant);
        match (&self.inner.shared, &limit) {
            (Some(shared), Some((limit, key))) => {
                if let Some(open) = self.take_shared_slot(shared, tenant, *limit).await {
                    return Err(self.watch_refused(tenant, open, key));
                }
            }
            (Some(_), None) => {
                *lock(&self.inner.watches).entry(tenant.to_owned()).or_default() += 1;
                self.write_watch_count(tenant).await;
            }
            (None, limit) => {
                let mut watches = lock(&self.inner.watches);
                let open = watches.entry(tenant.to_owned()).or_default();
                if let Some((_, key)) = limit.as_ref().filter(|(limit, _)| *open >= *limit) {
                    return Err(self.watch_refused(tenant, *open, key));
                }
                *open += 1;
            }
        }
        Ok(WatchPermit { tenant: tenant.to_owned(), quotas: self.clone() })
    }

    fn watch_refused(&self, tenant: &str, open: usize, key: &str) -> Status {
        let across = if self.is_shared() { " across the cluster's gateways" } else { "" };
        exhausted(
            format!(
                "tenant {tenant:?} has {open} Watch streams open{across}, its limit (config {key}); close one, or \
                 retry after {} ms",
                retry_ms(WATCH_RETRY_AFTER)
            ),
            WATCH_RETRY_AFTER,
        )
    }

    /// Takes a slot in the shared entry, in `tenant`'s turn: reserves it in this gateway's count (so a
    /// concurrent write of the count includes it), then one compare-and-set that checks the other gateways'
    /// live counts plus this one's against `limit` and writes this one's count, so two gateways never both
    /// take the last slot. `Some(open)` when all `limit` are taken (the reservation given back); a store
    /// that cannot be reached admits.
    async fn take_shared_slot(&self, shared: &Shared, tenant: &str, limit: usize) -> Option<usize> {
        shared.takes.run(tenant, self.take_in_turn(shared, tenant, limit)).await
    }

    async fn take_in_turn(&self, shared: &Shared, tenant: &str, limit: usize) -> Option<usize> {
        *lock(&self.inner.watches).entry(tenant.to_owned()).or_default() += 1;
        let taken = shared
            .change_watches(tenant, |entry, now| {
                let mine = self.open_watches(tenant);
                let open = entry.others(&shared.gateway, now) + mine;
                if open > limit {
                    // Without this request's own reservation: what the tenant holds.
                    return ControlFlow::Break(Some(open - 1));
                }
                entry.set(&shared.gateway, mine, now);
                ControlFlow::Continue(None)
            })
            .await;
        match taken {
            Some(Some(open)) => {
                self.release_local(tenant);
                Some(open)
            }
            // Taken, or unchecked (the store could not be used: counted here, written at the next renewal).
            Some(None) | None => None,
        }
    }

    /// Gives back one of `tenant`'s slots on this gateway.
    fn release_local(&self, tenant: &str) {
        let mut watches = lock(&self.inner.watches);
        if let Some(open) = watches.get_mut(tenant) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                watches.remove(tenant);
            }
        }
    }

    /// Writes this gateway's Watch count of `tenant` into the shared entry, renewing its expiry; a count of 0
    /// takes this gateway out of the entry. Concurrent writes need no lock: each reads the local count
    /// inside its compare-and-set, so whichever lands last wrote a count read after every write before it.
    async fn write_watch_count(&self, tenant: &str) {
        let Some(shared) = &self.inner.shared else { return };
        let written = shared
            .change_watches(tenant, |entry, now| {
                let count = self.open_watches(tenant);
                if count == 0 && entry.gateways.remove(&shared.gateway).is_none() {
                    return ControlFlow::Break(());
                }
                if count > 0 {
                    entry.set(&shared.gateway, count, now);
                }
                ControlFlow::Continue(())
            })
            .await;
        if written.is_none() {
            tracing::warn!(%tenant, "the shared Watch count was not written; it is at the next renewal");
        }
    }

    /// Watch streams `tenant` holds open on this gateway.
    pub fn open_watches(&self, tenant: &str) -> usize {
        lock(&self.inner.watches).get(tenant).copied().unwrap_or(0)
    }
}

impl Shared {
    /// Reads `tenant`'s Watch entry (expired counts dropped), lets `change` edit it — `Continue(v)`: write
    /// it and answer `v`; `Break(v)`: answer `v` without writing — and writes it by compare-and-set, again
    /// while another gateway writes first. `None` when the store cannot be used.
    async fn change_watches<T>(
        &self,
        tenant: &str,
        mut change: impl FnMut(&mut WatchEntry, u64) -> ControlFlow<T, T>,
    ) -> Option<T> {
        let key = watch_key(tenant);
        for _ in 0..CAS_ATTEMPTS {
            let (mut entry, revision) = match self.store.entry(key.as_str()).await {
                Ok(Some(e)) => (serde_json::from_slice::<WatchEntry>(&e.value).unwrap_or_default(), e.revision),
                Ok(None) => (WatchEntry::default(), 0),
                Err(e) => {
                    tracing::warn!(%tenant, error = %e, "the shared Watch counts could not be read");
                    return None;
                }
            };
            let now = now_ms();
            entry.gateways.retain(|_, g| g.expires_ms > now);
            let answer = match change(&mut entry, now) {
                ControlFlow::Break(answer) => return Some(answer),
                ControlFlow::Continue(answer) => answer,
            };
            let value = serde_json::to_vec(&entry).ok()?;
            if cas(&self.store, &key, value.into(), revision).await {
                return Some(answer);
            }
        }
        None
    }

    /// `None`: the shared state could not be used (the call is admitted unchecked).
    async fn admit(&self, tenant: &str, rate: &Rate) -> Option<Result<(), u64>> {
        let key = rate_key(tenant);
        for _ in 0..CAS_ATTEMPTS {
            let (tat, revision) = match self.store.entry(key.as_str()).await {
                Ok(Some(e)) => {
                    (std::str::from_utf8(&e.value).ok().and_then(|v| v.parse().ok()).unwrap_or(0), e.revision)
                }
                Ok(None) => (0, 0),
                Err(e) => {
                    tracing::warn!(%tenant, error = %e, "request rate not checked: the shared rate could not be read");
                    return None;
                }
            };
            let next = match gcra(tat, now_us(), rate.interval_us, rate.burst) {
                Ok(next) => next,
                Err(wait) => return Some(Err(wait)),
            };
            if cas(&self.store, &key, Bytes::from(next.to_string()), revision).await {
                return Some(Ok(()));
            }
        }
        tracing::warn!(%tenant, "request rate not checked: the shared rate kept changing");
        None
    }
}

/// Writes `value` at `key` if the entry is still at `revision` (0: absent).
async fn cas(store: &kv::Store, key: &str, value: Bytes, revision: u64) -> bool {
    if revision == 0 {
        store.create(key, value).await.is_ok()
    } else {
        store.update(key, value, revision).await.is_ok()
    }
}

fn rate_key(tenant: &str) -> String {
    format!("rate.{tenant}")
}

fn watch_key(tenant: &str) -> String {
    format!("watch.{tenant}")
}

fn now_ms() -> u64 {
    now_us() / 1000
}

/// One open Watch stream of a tenant; dropping it frees the slot.
#[derive(Debug)]
pub struct WatchPermit {
    tenant: String,
    quotas: Quotas,
}

impl Drop for WatchPermit {
    fn drop(&mut self) {
        self.quotas.release_local(&self.tenant);
        if self.quotas.is_shared()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (quotas, tenant) = (self.quotas.clone(), std::mem::take(&mut self.tenant));
            runtime.spawn(async move { quotas.write_watch_count(&tenant).await });
        }
    }
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

    #[tokio::test]
    async fn a_burst_is_admitted_and_the_next_request_is_refused_with_a_hint() {
        let quotas = Quotas::new(QuotaConfig { requests_per_minute: 1, request_burst: 2, ..QuotaConfig::default() });
        quotas.admit("t").await.unwrap();
        quotas.admit("t").await.unwrap();
        let refused = quotas.admit("t").await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("limits.tenant_requests_per_minute"), "{refused:?}");
        let hint: u64 = refused.metadata().get(RETRY_AFTER_MS).unwrap().to_str().unwrap().parse().unwrap();
        assert!((1..=60_000).contains(&hint), "{hint}");
        quotas.admit("other").await.unwrap();
    }

    #[tokio::test]
    async fn a_tenant_table_replaces_the_limits_for_that_tenant() {
        let own = TenantQuota { requests_per_s: Some(1000), request_burst: Some(3), watch_limit: Some(1) };
        let config = QuotaConfig {
            requests_per_minute: 1,
            max_watches: 5,
            tenants: BTreeMap::from([("big".to_owned(), own)]),
            ..QuotaConfig::default()
        };
        let quotas = Quotas::new(config);
        for _ in 0..3 {
            quotas.admit("big").await.unwrap();
        }
        let refused = quotas.admit("big").await.unwrap_err();
        assert!(
            refused.message().contains("1000 per second (burst 3; config tenants.big.requests_per_s"),
            "{refused:?}"
        );
        quotas.admit("small").await.unwrap();
        assert!(quotas.admit("small").await.is_err());
        let _one = quotas.open_watch("big").await.unwrap();
        let refused = quotas.open_watch("big").await.unwrap_err();
        assert!(refused.message().contains("tenants.big.watch_limit"), "{refused:?}");
    }

    #[test]
    fn gcra_allows_the_burst_then_one_per_interval() {
        let (interval, burst) = (100, 3);
        let mut tat = 0;
        for _ in 0..3 {
            tat = gcra(tat, 1_000, interval, burst).unwrap();
        }
        assert_eq!(gcra(tat, 1_000, interval, burst), Err(100));
        assert_eq!(gcra(tat, 1_050, interval, burst), Err(50));
        let tat = gcra(tat, 1_100, interval, burst).unwrap();
        assert!(gcra(tat, 1_100, interval, burst).is_err());
        // In any window of W µs at most burst + W / interval conform.
        let (mut tat, mut admitted) = (0, 0);
        for now in (10_000..20_000).step_by(7) {
            if let Ok(next) = gcra(tat, now, interval, burst) {
                tat = next;
                admitted += 1;
            }
        }
        assert!(admitted <= 3 + 10_000 / 100, "{admitted}");
    }

    #[tokio::test]
    async fn watch_slots_free_when_permits_drop() {
        let quotas = Quotas::new(QuotaConfig { max_watches: 1, ..QuotaConfig::default() });
        let permit = quotas.open_watch("t").await.unwrap();
        let refused = quotas.open_watch("t").await.unwrap_err();
        assert!(refused.message().contains("limits.tenant_max_watches"), "{refused:?}");
        assert_eq!(refused.metadata().get(RETRY_AFTER_MS).unwrap(), "1000");
        let _other = quotas.open_watch("u").await.unwrap();
        drop(permit);
        assert_eq!(quotas.open_watches("t"), 0);
        let _again = quotas.open_watch("t").await.unwrap();
    }

    #[tokio::test]
    async fn a_tenant_turn_waits_only_for_the_same_tenant() {
        let turns = TenantTurns::default();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        // Tenant a's turn is taken by work that waits (a round trip that does not come back).
        let held = turns.run("a", async {
            let _ = released.await;
        });
        tokio::pin!(held);
        assert!(futures::poll!(held.as_mut()).is_pending());
        // Another tenant's turn runs at once; a second turn of a waits for the first.
        let other = turns.run("b", async { 7 });
        tokio::pin!(other);
        assert_eq!(futures::poll!(other.as_mut()), std::task::Poll::Ready(7), "b does not wait for a");
        let second = turns.run("a", async { 8 });
        tokio::pin!(second);
        assert!(futures::poll!(second.as_mut()).is_pending(), "a's second turn waits for its first");
        release.send(()).unwrap();
        held.await;
        assert_eq!(second.await, 8);
        assert!(lock(&turns.turns).is_empty(), "tenants leave the map with their last turn");
    }

    #[tokio::test]
    async fn zero_turns_the_limits_off() {
        let quotas = Quotas::new(QuotaConfig::default());
        let mut permits = Vec::new();
        for _ in 0..100 {
            permits.push(quotas.open_watch("t").await.unwrap());
        }
        assert_eq!(quotas.open_watches("t"), 100);
        for _ in 0..1000 {
            quotas.admit("t").await.unwrap();
        }
        drop(permits);
    }
}
