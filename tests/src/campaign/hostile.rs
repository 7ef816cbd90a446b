//! The hostile tenant (issue 37): a second tenant that runs beside the campaign's workload and its faults,
//! sending what no well-behaved client sends, while the campaign checks the normal tenant's invariants.
//!
//! - **Oversized fields**: followups whose `DataBlock.mime` is 2 MiB, and followups of 300,000 empty text
//!   blocks (1.2 MB on the wire): each over the 1 MiB message limit once every byte and every block
//!   counts. A bounded number of each ([`OVERSIZE_SENDS`]), so a build that still accepts them stores
//!   tens of megabytes, not gigabytes.
//! - **Stuck watchers**: [`STUCK_WATCHERS`] live `Watch` streams on the hostile tenant's busy session,
//!   opened at the start and never read until the schedule ends, while a task of the tenant sends a 256 KiB
//!   followup to that session every 150–400 ms (the scripted model echoes each one back as deltas): enough to pass
//!   a gateway's 4 MiB per watcher in a few seconds, even beside the HTTP/2 windows between the two sides.
//!   Once read, a watcher cut with the resumable status must come back: a Watch from the `after_seq` its
//!   cut named starts at the next event.
//! - **Unfoldable imports**: `ImportSessions` streams holding a lone `turn/end` (a log no fold accepts).
//!
//! What each hostile call was answered is recorded ([`HostileRecord`]). The checks of those answers are
//! this module's alone ([`Expectations`]), separate from the campaign's checker: on a build without the
//! size accounting, the bounded Watch buffers or the import validation of issue 37 the calls are simply
//! recorded; with [`Expectations::strict`] each must be refused with its typed code (a violation
//! otherwise). The campaign's own properties (the normal tenant's) are checked the same either way.
//!
//! The tenant's name sorts after the campaign's (`zz-…`): on a build from before quarantine (decision
//! 0084) that still accepts an unfoldable import, a worker's takeover stopped resuming the sessions that
//! followed such a session in its listing, which would stall the normal tenant for a reason this campaign
//! does not study; strict mode refuses the import, so the order no longer matters there.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tonic::Code;
use tonic::transport::Channel;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::content_block::Block;
use turnstile_proto::v1::export_item::Item as ExportedItem;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::turn_end_reason::Reason;
use turnstile_proto::v1::watch_item::Item;
use turnstile_proto::v1::{
    ContentBlock, DataBlock, DeliverRequest, ExportHeader, ExportItem, ExportedSession, SessionEvent,
    SessionEventGroup, SessionRef, TextBlock, TurnEnd, TurnEndReason, UserMessage, WatchItem, WatchRequest,
};

use super::workload::req;
use crate::user_msg;

/// The hostile tenant.
pub const TENANT: &str = "zz-hostile";
/// Live watchers that never read.
pub const STUCK_WATCHERS: usize = 10;
/// Oversized followups of each kind (mime, empty blocks) over a run.
pub const OVERSIZE_SENDS: usize = 12;
/// Unfoldable imports over a run.
pub const IMPORTS: usize = 4;
/// The size of the hostile tenant's busy followups (under the 1 MiB message limit).
const BUSY_TEXT: usize = 256 * 1024;

/// The codes a refusal of an oversized message may carry: INVALID_ARGUMENT (a message over the limit) or
/// RESOURCE_EXHAUSTED (a session's pending bytes over theirs).
pub const OVERSIZE_CODES: [Code; 2] = [Code::InvalidArgument, Code::ResourceExhausted];
/// The codes a stuck watcher may be cut with: resumable ones (the client comes back with `after_seq`).
pub const CUT_CODES: [Code; 4] = [Code::ResourceExhausted, Code::Aborted, Code::Unavailable, Code::OutOfRange];
/// The trailer of a cut Watch naming the seq to resume after (the gateway's `watch_buffer::RESUME_AFTER_SEQ`;
/// this crate speaks only the wire).
pub const RESUME_AFTER_SEQ: &str = "resume-after-seq";
/// The code an unfoldable import is refused with.
pub const IMPORT_CODE: Code = Code::InvalidArgument;

/// What the hostile load's answers must be: with `strict` (the default, [`STRICT_BY_DEFAULT`]) every
/// hostile call must be refused with its code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expectations {
    pub strict: bool,
}

/// Every campaign run checks the hostile answers, not only records them: issue 37 items 1–3 (import
/// validation, size accounting, bounded Watch buffers) are built. `TURNSTILE_CAMPAIGN_HOSTILE_STRICT=0`
/// only records them (to see what an older build answers).
pub const STRICT_BY_DEFAULT: bool = true;

impl Expectations {
    /// [`STRICT_BY_DEFAULT`], overridden by `TURNSTILE_CAMPAIGN_HOSTILE_STRICT` (`1`/`0`).
    pub fn from_env() -> Self {
        let strict = match std::env::var("TURNSTILE_CAMPAIGN_HOSTILE_STRICT").ok().as_deref() {
            Some("1" | "true") => true,
            Some("0" | "false") => false,
            _ => STRICT_BY_DEFAULT,
        };
        Self { strict }
    }
}

/// One hostile call and its answer.
#[derive(Clone, Debug)]
pub struct HostileRecord {
    /// `oversize mime`, `empty blocks`, `stuck watcher`, `unfoldable import`.
    pub kind: &'static str,
    /// `None`: accepted (or, for a watcher, never cut).
    pub code: Option<Code>,
    pub message: String,
    /// Milliseconds since the campaign started.
    pub at_ms: u64,
    /// For a stuck watcher: the items it had buffered for us when it was read at last.
    pub items: usize,
    /// For a stuck watcher: the gateway it was opened on (a restart of that gateway also ends it).
    pub gateway: Option<usize>,
    /// For a call: how long it took to its recorded answer (retries included), and the gateway it was
    /// first sent to (a bench lines its other tenant's slow calls up with these).
    pub took_ms: u64,
    pub sent_to: Option<usize>,
    /// For a stuck watcher that was cut: the `after_seq` its cut named (`resume-after-seq`), once a Watch
    /// from there started at the next event (it came back with nothing lost); `None` otherwise.
    pub resumed_after: Option<u64>,
}

/// A message with a 2 MiB mime type and no bytes.
pub fn oversize_mime(id: &str) -> UserMessage {
    let mut m = user_msg(id, "");
    m.content =
        vec![ContentBlock { block: Some(Block::Data(DataBlock { mime: "x".repeat(2 << 20), bytes: Vec::new() })) }];
    m
}

/// A message of 300,000 empty text blocks.
pub fn empty_blocks(id: &str) -> UserMessage {
    let mut m = user_msg(id, "");
    m.content = vec![ContentBlock { block: Some(Block::Text(TextBlock { text: String::new() })) }; 300_000];
    m
}

/// An export stream of one session whose log is a lone `turn/end`: well formed, but no fold accepts it.
pub fn unfoldable_import(session: &SessionRef) -> Vec<ExportItem> {
    let end = SessionEvent {
        session: Some(session.clone()),
        seq: 1,
        epoch: 1,
        time_unix_ms: super::unix_ms(),
        r#type: "turn/end".into(),
        format: 1,
        payload: Some(Payload::TurnEnd(TurnEnd {
            turn: 1,
            reason: Some(TurnEndReason { reason: Some(Reason::Completed(Default::default())) }),
        })),
        ..Default::default()
    };
    vec![
        ExportItem {
            item: Some(ExportedItem::Header(ExportHeader {
                format: 1,
                tenant: session.tenant.clone(),
                exported_unix_ms: super::unix_ms(),
            })),
        },
        ExportItem { item: Some(ExportedItem::Events(SessionEventGroup { events: vec![end] })) },
        ExportItem { item: Some(ExportedItem::End(ExportedSession { session: Some(session.clone()), last_seq: 1 })) },
    ]
}

/// What the hostile task hands back: its records and the stuck watchers, still unread.
pub struct Hostile {
    pub records: Vec<HostileRecord>,
    /// Each stuck watcher's gateway and stream.
    watchers: Vec<(usize, tonic::Streaming<WatchItem>)>,
    /// The session they watch, and where it runs (to resume them after a cut).
    busy: SessionRef,
    target: Target,
}

/// A new connection to gateway `g` (opened on first use).
fn channel(target: &Target, g: usize) -> Option<Channel> {
    let url = target.gateway_urls.read().ok().and_then(|u| u.get(g % u.len().max(1)).cloned())?;
    let endpoint = tonic::transport::Endpoint::from_shared(url).ok()?.connect_timeout(Duration::from_secs(2));
    Some(endpoint.connect_lazy())
}

/// Where the hostile load runs: the gateways' URLs (a restarted one's is replaced there), when to stop,
/// and the clock its records are timed on. The hostile tenant is another client: it dials connections of
/// its own (a watcher that never reads holds its connection's HTTP/2 window, which on a shared connection
/// would stall every other call on it, a stall of the test's making).
#[derive(Clone)]
pub struct Target {
    pub gateway_urls: Arc<std::sync::RwLock<Vec<String>>>,
    pub stop: Arc<AtomicBool>,
    pub started: Instant,
}

impl Target {
    fn ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// Runs the hostile tenant until `target.stop`: opens the stuck watchers, then spreads the oversized
/// followups and the imports over `duration` between busy followups to the watched session.
pub async fn run(shared: Target, seed: u64, duration: Duration, run_id: String) -> Hostile {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x4057_11e5);
    let busy = SessionRef { tenant: TENANT.into(), id: format!("busy-{run_id}") };
    let mut records = Vec::new();
    let mut watchers = Vec::new();
    // The busy session must exist before it can be watched live.
    for g in 0..2 {
        if let Some(c) = channel(&shared, g) {
            let m = user_msg(&format!("busy-{run_id}-open-{g}"), "hello");
            let _ = AgentClient::new(c)
                .followup(req(DeliverRequest { session: Some(busy.clone()), message: Some(m), output_schema: None }))
                .await;
        }
    }
    for w in 0..STUCK_WATCHERS {
        let Some(c) = channel(&shared, w) else { continue };
        let request = WatchRequest { session: Some(busy.clone()), after_seq: 0, live: true, resume: None };
        // No deadline: a live watch lasts; the stream is held and not read until the end.
        match AgentClient::new(c).watch(request).await {
            Ok(stream) => watchers.push((w % 2, stream.into_inner())),
            Err(status) => records.push(HostileRecord {
                kind: "stuck watcher",
                code: Some(status.code()),
                message: status.message().to_owned(),
                at_ms: shared.ms(),
                items: 0,
                gateway: Some(w % 2),
                took_ms: 0,
                sent_to: None,
                resumed_after: None,
            }),
        }
    }
    // Each oversized or import send at a random point of the run, between busy followups.
    let started = Instant::now();
    let mut due: Vec<(Duration, &'static str)> = Vec::new();
    for kind in ["oversize mime", "empty blocks"] {
        for _ in 0..OVERSIZE_SENDS {
            due.push((duration.mul_f64(rng.f64()), kind));
        }
    }
    for _ in 0..IMPORTS {
        due.push((duration.mul_f64(rng.f64()), "unfoldable import"));
    }
    due.sort_by_key(|(at, _)| *at);
    let mut due = due.into_iter().peekable();
    // The watched session is fed by a task of its own, so slow refusals (a 300,000-block message takes a
    // debug gateway seconds to decode) never starve it: even a short run (a bench round) passes the
    // watchers' limit.
    let feeder = tokio::spawn(feed(shared.clone(), busy.clone(), run_id.clone(), seed));
    let mut n = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        n += 1;
        let g = rng.usize(..2);
        if let Some((_, kind)) = due.next_if(|(at, _)| started.elapsed() >= *at) {
            let id = format!("h-{run_id}-{n}");
            // Like any client, again on an answer that says nothing (a gateway or worker restarting under
            // the call): what is recorded is the first definite answer.
            let mut attempts = 0;
            let sent = Instant::now();
            let answer = loop {
                attempts += 1;
                let Some(c) = channel(&shared, g + attempts) else { break Ok(()) };
                let mut client = AgentClient::new(c);
                let answer = match kind {
                    "unfoldable import" => {
                        let s = SessionRef { tenant: TENANT.into(), id: format!("import-{run_id}-{n}") };
                        let mut request = tonic::Request::new(futures::stream::iter(unfoldable_import(&s)));
                        request.set_timeout(super::CALL_DEADLINE);
                        client.import_sessions(request).await.map(|_| ())
                    }
                    _ => {
                        let s = SessionRef { tenant: TENANT.into(), id: format!("big-{run_id}-{}", n % 3) };
                        let m = if kind == "oversize mime" { oversize_mime(&id) } else { empty_blocks(&id) };
                        client
                            .followup(req(DeliverRequest { session: Some(s), message: Some(m), output_schema: None }))
                            .await
                            .map(|_| ())
                    }
                };
                match answer {
                    Err(s) if super::Outcome::Err(s.code(), String::new()).maybe() && attempts < 5 => {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    other => break other,
                }
            };
            let (code, message) = match answer {
                Ok(()) => (None, String::new()),
                Err(s) => (Some(s.code()), s.message().chars().take(300).collect()),
            };
            records.push(HostileRecord {
                kind,
                code,
                message,
                at_ms: shared.ms(),
                items: 0,
                gateway: None,
                took_ms: sent.elapsed().as_millis() as u64,
                sent_to: Some((g + 1) % 2),
                resumed_after: None,
            });
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(150..400))).await;
    }
    let _ = feeder.await;
    Hostile { records, watchers, busy, target: shared }
}

/// Sends a [`BUSY_TEXT`] followup to the watched session every 150–400 ms until `target.stop`.
async fn feed(target: Target, busy: SessionRef, run_id: String, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xfeed);
    let mut n = 0u64;
    while !target.stop.load(Ordering::Relaxed) {
        n += 1;
        let Some(c) = channel(&target, rng.usize(..2)) else { break };
        let m = user_msg(&format!("busy-{run_id}-{n}"), &"z".repeat(BUSY_TEXT));
        let _ = AgentClient::new(c)
            .followup(req(DeliverRequest { session: Some(busy.clone()), message: Some(m), output_schema: None }))
            .await;
        tokio::time::sleep(Duration::from_millis(rng.u64(150..400))).await;
    }
}

impl Hostile {
    /// Reads each stuck watcher at last: whatever it buffered, until it ends with a status (cut) or has
    /// nothing more within `quiet`; a cut one is then resumed from the `after_seq` its status names
    /// ([`resume`]). One record each.
    pub async fn read_watchers(&mut self, started: Instant, quiet: Duration) {
        let busy = self.busy.clone();
        for (gateway, mut stream) in std::mem::take(&mut self.watchers) {
            let mut items = 0;
            let cut = loop {
                match tokio::time::timeout(quiet, stream.message()).await {
                    Ok(Ok(Some(_))) => items += 1,
                    // Ended without a status: the server closed it cleanly (not a cut).
                    Ok(Ok(None)) => break None,
                    Ok(Err(status)) => break Some(status),
                    Err(_) => break None,
                }
            };
            let resumed_after = match &cut {
                Some(status) => resume(&self.target, gateway, &busy, status, quiet).await,
                None => None,
            };
            let (code, message) =
                cut.map_or((None, String::new()), |s| (Some(s.code()), s.message().chars().take(300).collect()));
            self.records.push(HostileRecord {
                kind: "stuck watcher",
                code,
                message,
                at_ms: started.elapsed().as_millis() as u64,
                items,
                gateway: Some(gateway),
                took_ms: 0,
                sent_to: None,
                resumed_after,
            });
        }
    }
}

/// Comes back after a cut as a client would: a Watch of `busy` from the `resume-after-seq` the cut's
/// `status` carries must start at the next event (or, with nothing after it yet, be caught up at once).
/// The `after_seq` when it does; `None` when the status names none, the Watch starts anywhere else, or it
/// does not come back within [`RESUME_WITHIN`].
///
/// Like any client it tries again on an answer that says nothing, whether the call itself or the stream's
/// first message carries it (a gateway reading the log right after a NATS node's restart answers
/// UNAVAILABLE from inside the stream), and on a first message slower than `wait`: slowness under the
/// campaign's faults is not a lost event. Only a Watch that starts at the wrong place is judged at once.
async fn resume(
    target: &Target,
    gateway: usize,
    busy: &SessionRef,
    status: &tonic::Status,
    wait: Duration,
) -> Option<u64> {
    let after_seq: u64 = status.metadata().get(RESUME_AFTER_SEQ)?.to_str().ok()?.parse().ok()?;
    let request = WatchRequest { session: Some(busy.clone()), after_seq, live: false, resume: None };
    let give_up = Instant::now() + RESUME_WITHIN;
    let retryable = |s: &tonic::Status| super::Outcome::Err(s.code(), String::new()).maybe();
    for attempt in 0.. {
        if attempt > 0 {
            if Instant::now() >= give_up {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let mut stream = match AgentClient::new(channel(target, gateway + attempt)?).watch(request.clone()).await {
            Ok(stream) => stream.into_inner(),
            Err(s) if retryable(&s) => continue,
            Err(_) => return None,
        };
        let first = match tokio::time::timeout(wait, stream.message()).await {
            Ok(Ok(Some(first))) => first,
            Ok(Err(s)) if retryable(&s) => continue,
            // Slow (the deadline is `give_up`'s to judge), or ended without a word: as a client, again.
            Err(_) | Ok(Ok(None)) => continue,
            Ok(Err(_)) => return None,
        };
        return match first.item? {
            Item::Event(event) if event.seq == after_seq + 1 => Some(after_seq),
            Item::CaughtUp(_) => Some(after_seq),
            _ => None,
        };
    }
    None
}

/// How long a cut watcher has to come back before the check says it did not: long enough to outlast a NATS
/// node's restart at the end of a schedule (its meta layer recovering takes seconds), short next to a run.
const RESUME_WITHIN: Duration = Duration::from_secs(30);

/// The hostile answers against `expect`: violations only in strict mode. Every kind must have been tried.
/// A stuck watcher on a gateway in `restarted` is not judged: the restart ended it, cut or not.
pub fn check(records: &[HostileRecord], expect: Expectations, restarted: &[usize]) -> Vec<String> {
    let mut violations = Vec::new();
    if !expect.strict {
        return violations;
    }
    for kind in ["oversize mime", "empty blocks", "stuck watcher", "unfoldable import"] {
        if !records.iter().any(|r| r.kind == kind) {
            violations.push(format!("hostile: no {kind} was tried"));
        }
    }
    let judged = records.iter().filter(|r| r.gateway.is_none_or(|g| !restarted.contains(&g)));
    for r in judged {
        let allowed: &[Code] = match r.kind {
            "oversize mime" | "empty blocks" => &OVERSIZE_CODES,
            "stuck watcher" => &CUT_CODES,
            _ => std::slice::from_ref(&IMPORT_CODE),
        };
        if !r.code.is_some_and(|c| allowed.contains(&c)) {
            violations.push(format!(
                "hostile: {} at {} ms answered {} (expected {allowed:?}){}",
                r.kind,
                r.at_ms,
                r.code.map_or_else(|| "OK / never cut".to_owned(), |c| format!("{c:?}: {}", r.message)),
                if r.kind == "stuck watcher" { format!(" after {} items", r.items) } else { String::new() }
            ));
        } else if r.kind == "stuck watcher" && r.resumed_after.is_none() {
            violations.push(format!(
                "hostile: a stuck watcher cut at {} ms ({:?}: {}) did not come back: no `{RESUME_AFTER_SEQ}` \
                 trailer, or a Watch from it did not start at the next event",
                r.at_ms, r.code, r.message
            ));
        }
    }
    violations
}

/// One line per kind: how the hostile calls were answered.
pub fn summary(records: &[HostileRecord]) -> String {
    let mut by: std::collections::BTreeMap<(&str, String), usize> = std::collections::BTreeMap::new();
    for r in records {
        let mut answer = r.code.map_or_else(|| "OK".to_owned(), |c| format!("{c:?}"));
        if r.kind == "stuck watcher" && r.code.is_some() {
            answer += if r.resumed_after.is_some() { " (resumed)" } else { " (not resumed)" };
        }
        *by.entry((r.kind, answer)).or_default() += 1;
    }
    by.iter().map(|((kind, code), n)| format!("{kind} {code} ×{n}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: &'static str, code: Option<Code>) -> HostileRecord {
        let gateway = (kind == "stuck watcher").then_some(0);
        let resumed_after = (kind == "stuck watcher" && code.is_some()).then_some(7);
        HostileRecord {
            kind,
            code,
            message: String::new(),
            at_ms: 0,
            items: 0,
            gateway,
            took_ms: 0,
            sent_to: None,
            resumed_after,
        }
    }

    #[test]
    fn strict_mode_wants_every_kind_refused_with_its_code() {
        let refused = vec![
            record("oversize mime", Some(Code::InvalidArgument)),
            record("empty blocks", Some(Code::ResourceExhausted)),
            record("stuck watcher", Some(Code::ResourceExhausted)),
            record("unfoldable import", Some(Code::InvalidArgument)),
        ];
        assert_eq!(check(&refused, Expectations { strict: true }, &[]), Vec::<String>::new());
        let mut accepted = refused.clone();
        accepted[0].code = None;
        accepted[2].code = None;
        accepted[3].code = Some(Code::Internal);
        let v = check(&accepted, Expectations { strict: true }, &[]);
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v.iter().any(|v| v.contains("oversize mime")), "{v:?}");
        assert!(v.iter().any(|v| v.contains("stuck watcher")), "{v:?}");
        assert!(v.iter().any(|v| v.contains("unfoldable import")), "{v:?}");
        // A kind never tried is a violation too; lenient mode records only.
        let v = check(&refused[..3], Expectations { strict: true }, &[]);
        assert!(v.iter().any(|v| v.contains("no unfoldable import was tried")), "{v:?}");
        assert_eq!(check(&accepted, Expectations { strict: false }, &[]), Vec::<String>::new());
        // A watcher whose gateway restarted is not judged.
        let v = check(&accepted, Expectations { strict: true }, &[0]);
        assert!(!v.iter().any(|v| v.contains("stuck watcher")), "{v:?}");
        // A cut watcher must come back from the seq its cut named.
        let mut lost = refused.clone();
        lost[2].resumed_after = None;
        let v = check(&lost, Expectations { strict: true }, &[]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("did not come back"), "{v:?}");
    }

    #[test]
    fn the_oversized_messages_are_over_the_limit_on_the_wire_and_under_grpc_s() {
        use prost::Message as _;
        for m in [oversize_mime("a"), empty_blocks("b")] {
            let len = m.encoded_len();
            assert!(len > 1024 * 1024 && len < 4 * 1024 * 1024, "{len}");
        }
    }
}
