//! The campaign's checker: each session's log and projections read through every gateway, and the
//! properties the campaign proves from them and the history (see [`super`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tonic::{Request, Status};
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::turn_end_reason::Reason;
use turnstile_proto::v1::watch_item::Item;
use turnstile_proto::v1::{
    GetInboxRequest, GetSessionRequest, InboxSnapshot, SessionEvent, SessionInfo, SessionRef, SessionStatus,
    SpliceOutcome, Target, WatchRequest, WhenIdleRequest,
};

use super::history::{CallRecord, FaultRecord, Outcome};
use super::workload::req;
use super::{CALL_DEADLINE, GRACE, NATS_KILL_WAIT_BOUND, NATS_KILLS, NODE_CUT, TAKEOVER_BOUND};
use crate::Projection;

/// What the end of the campaign read of one session.
#[derive(Debug, Default)]
pub struct SessionView {
    pub reference: SessionRef,
    pub events: Vec<SessionEvent>,
    /// `GetInbox` and `GetSession` through each gateway.
    pub inboxes: Vec<Result<InboxSnapshot, String>>,
    pub infos: Vec<Result<SessionInfo, String>>,
    /// Whether `WhenIdle` said idle.
    pub idle: bool,
}

/// Retries `f` while it answers a retryable status, bounded by `bound` and by the end of the check phase.
pub(super) async fn retried<T, F, Fut>(what: &str, bound: Duration, until: Instant, mut f: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let deadline = (Instant::now() + bound).min(until);
    loop {
        let result = tokio::time::timeout(CALL_DEADLINE + GRACE, f()).await;
        match result {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(s)) if !Outcome::Err(s.code(), String::new()).maybe() || Instant::now() >= deadline => {
                return Err(format!("{what}: {:?} {}", s.code(), s.message()));
            }
            Err(_) if Instant::now() >= deadline => return Err(format!("{what}: hung past its deadline")),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Reads a session at the end: waits until idle, replays the log, asks each gateway for the projection.
pub(super) async fn view(gateways: &[Channel], reference: SessionRef, until: Instant) -> SessionView {
    let mut v = SessionView { reference: reference.clone(), ..Default::default() };
    let client = AgentClient::new(gateways[0].clone());
    let when_idle = retried("WhenIdle", Duration::from_secs(120), until, || {
        let (mut c, s) = (client.clone(), reference.clone());
        async move {
            let r = WhenIdleRequest { session: Some(s), timeout_ms: 5_000 };
            let mut request = Request::new(r);
            request.set_timeout(CALL_DEADLINE);
            let info = c.when_idle(request).await?.into_inner();
            if info.status == SessionStatus::Idle as i32 { Ok(info) } else { Err(Status::unavailable("still running")) }
        }
    })
    .await;
    v.idle = when_idle.is_ok();
    let replay = retried("replay", Duration::from_secs(60), until, || {
        let (mut c, s) = (client.clone(), reference.clone());
        async move {
            let mut stream = c
                .watch(req(WatchRequest { session: Some(s), after_seq: 0, live: false, resume: None }))
                .await?
                .into_inner();
            let mut events = Vec::new();
            while let Some(item) = stream.message().await? {
                match item.item {
                    Some(Item::Event(e)) => events.push(e),
                    Some(Item::CaughtUp(_)) => return Ok(events),
                    _ => {}
                }
            }
            Err(Status::unavailable("watch ended before caught_up"))
        }
    })
    .await;
    v.events = replay.unwrap_or_default();
    for channel in gateways {
        let client = AgentClient::new(channel.clone());
        v.inboxes.push(
            retried("GetInbox", Duration::from_secs(60), until, || {
                let (mut c, s) = (client.clone(), reference.clone());
                async move { c.get_inbox(req(GetInboxRequest { session: Some(s) })).await.map(tonic::Response::into_inner) }
            })
            .await,
        );
        v.infos.push(
            retried("GetSession", Duration::from_secs(60), until, || {
                let (mut c, s) = (client.clone(), reference.clone());
                async move {
                    c.get_session(req(GetSessionRequest { session: Some(s) })).await.map(tonic::Response::into_inner)
                }
            })
            .await,
        );
    }
    v
}

/// What the checker counted, besides the violations.
#[derive(Debug, Default)]
pub struct Counts {
    pub acknowledged: usize,
    pub admitted: usize,
    pub pending: usize,
    pub canceled: usize,
    pub maybe_ids: usize,
    pub events: usize,
    pub turns: usize,
    /// Acknowledged ids claimed by a turn that a cancel aborted before they were entered (SPEC §4).
    pub lost_to_cancel: usize,
}

/// Whether a call of `kind` delivers a new message (its id is the message's).
pub(super) fn is_delivery(kind: &str) -> bool {
    !matches!(kind, "cancel" | "cancel(keep_inbox)" | "replace" | "remove" | "clear" | "get_inbox" | "get_session")
}

/// The checker: the campaign's properties from the history, the fault records and what [`view`] read.
pub fn check(history: &[CallRecord], faults: &[FaultRecord], views: &[SessionView]) -> (Counts, Vec<String>) {
    let mut counts = Counts::default();
    let mut violations = Vec::new();
    // A cut of a NATS node with its worker ends with the other workers owning every shard.
    for f in faults.iter().filter(|f| f.kind == NODE_CUT && f.takeover_ms.is_none()) {
        violations.push(format!(
            "the shards of worker #{} were not taken over within {} s of its cut with its NATS node at {} ms",
            f.target,
            TAKEOVER_BOUND.as_secs(),
            f.start_ms
        ));
    }
    // No delivery that started during a nats-server kill waited longer than the bound for its answer.
    for (f, wait, id) in nats_kill_waits(history, faults) {
        if wait > NATS_KILL_WAIT_BOUND.as_millis() as u64 {
            violations.push(format!(
                "delivery {id} waited {wait} ms for its answer (bound {} ms), started during the {} at {} ms",
                NATS_KILL_WAIT_BOUND.as_millis(),
                f.kind,
                f.start_ms
            ));
        }
    }
    // No call outlived deadline + grace, unless its gateway was stopped while it ran.
    for call in history.iter().filter(|c| c.outcome == Outcome::Hung) {
        let excused = faults.iter().any(|f| {
            f.kind == "gateway SIGSTOP/SIGCONT"
                && f.target == call.gateway
                && f.start_ms <= call.end_ms
                && call.start_ms <= f.end_ms
        });
        if !excused {
            violations.push(format!(
                "call hung past its deadline: {} {:?} on session {} via gateway {} at {} ms",
                call.kind, call.id, call.session, call.gateway, call.start_ms
            ));
        }
    }
    for (si, v) in views.iter().enumerate() {
        let name = &v.reference.id;
        let calls: Vec<&CallRecord> = history.iter().filter(|c| c.session == si).collect();
        let acked: HashSet<&str> = calls
            .iter()
            .filter(|c| is_delivery(c.kind))
            .filter(|c| matches!(c.outcome, Outcome::Ok(_)))
            .filter_map(|c| c.id.as_deref())
            .collect();
        let maybe: HashSet<&str> = calls
            .iter()
            .filter(|c| is_delivery(c.kind))
            .filter(|c| c.outcome.maybe())
            .filter_map(|c| c.id.as_deref())
            .filter(|id| !acked.contains(id))
            .collect();
        counts.acknowledged += acked.len();
        counts.maybe_ids += maybe.len();
        if !v.idle {
            violations.push(format!("session {name}: never became idle after the faults healed"));
        }
        // Seqs contiguous from 1, epochs never decreasing.
        let (mut epoch, mut gap) = (0, false);
        for (i, e) in v.events.iter().enumerate() {
            if e.seq != i as u64 + 1 && !gap {
                violations.push(format!("session {name}: seq {} at position {} (not contiguous)", e.seq, i + 1));
                gap = true;
            }
            if e.epoch < epoch {
                violations.push(format!("session {name}: seq {} of epoch {} after epoch {epoch}", e.seq, e.epoch));
            }
            epoch = epoch.max(e.epoch);
        }
        counts.events += v.events.len();
        // Admissions, pending, canceled removals (with the splice's time), turns.
        let mut admitted: HashMap<&str, usize> = HashMap::new();
        let mut canceled: HashMap<String, u64> = HashMap::new();
        let mut open_turns: BTreeMap<u64, u64> = BTreeMap::new();
        // Ids claimed by the open turn, and those a turn claimed but ended aborted before entering them (SPEC
        // §4: "a claimed message never returns to the inbox implicitly (reject, failure or cancel lose it)"),
        // with the time of that `turn/end`.
        let (mut current_turn, mut claimed): (u64, Vec<String>) = (0, Vec::new());
        let mut lost_to_abort: HashMap<String, u64> = HashMap::new();
        let mut projection = Projection::default();
        let (mut status, mut last_turn) = (SessionStatus::Idle as i32, 0u64);
        for e in &v.events {
            match &e.payload {
                Some(Payload::UserMessage(m)) => {
                    if let Some(m) = &m.message {
                        *admitted.entry(m.id.as_str()).or_default() += 1;
                    }
                }
                Some(Payload::InboxSpliced(s)) if s.outcome == SpliceOutcome::None as i32 && s.inserted.is_empty() => {
                    let list =
                        if s.target == Target::NextStep as i32 { &projection.next_step } else { &projection.next_turn };
                    let (start, n) = (s.start as usize, s.removed_count as usize);
                    claimed.extend(list.iter().skip(start).take(n).map(|m| m.id.clone()));
                }
                Some(Payload::InboxSpliced(s)) if s.outcome == SpliceOutcome::Canceled as i32 => {
                    let list =
                        if s.target == Target::NextStep as i32 { &projection.next_step } else { &projection.next_turn };
                    let (start, n) = (s.start as usize, s.removed_count as usize);
                    for m in list.iter().skip(start).take(n) {
                        if !s.inserted.iter().any(|i| i.id == m.id) {
                            canceled.insert(m.id.clone(), e.time_unix_ms);
                        }
                    }
                }
                Some(Payload::TurnStart(t)) => {
                    (current_turn, claimed) = (t.turn, Vec::new());
                    open_turns.insert(t.turn, e.seq);
                    last_turn = last_turn.max(t.turn);
                    counts.turns += 1;
                }
                Some(Payload::TurnEnd(t)) => {
                    let aborted = matches!(t.reason.as_ref().and_then(|r| r.reason.as_ref()), Some(Reason::Aborted(_)));
                    if aborted && t.turn == current_turn {
                        for id in claimed.drain(..) {
                            if !admitted.contains_key(id.as_str()) {
                                lost_to_abort.insert(id, e.time_unix_ms);
                            }
                        }
                    }
                    if open_turns.remove(&t.turn).is_none() {
                        violations.push(format!(
                            "session {name}: turn/end {} at seq {} without its turn/start",
                            t.turn, e.seq
                        ));
                    }
                }
                Some(Payload::Status(s)) => status = s.status,
                _ => {}
            }
            if let Err(err) = projection.apply(e) {
                violations.push(format!("session {name}: the log does not fold: {err}"));
                break;
            }
        }
        for (turn, seq) in &open_turns {
            violations.push(format!("session {name}: turn {turn} (started at seq {seq}) never closed"));
        }
        if status != SessionStatus::Idle as i32 {
            violations.push(format!("session {name}: the log ends running"));
        }
        let pending: HashSet<&str> =
            projection.next_turn.iter().chain(&projection.next_step).map(|m| m.id.as_str()).collect();
        for id in &acked {
            let n = admitted.get(id).copied().unwrap_or(0);
            let (p, c) = (pending.contains(id), canceled.get(*id));
            match (n, p, c) {
                (1, false, _) => counts.admitted += 1,
                (0, true, _) => counts.pending += 1,
                (0, false, None) if lost_to_abort.contains_key(*id) => {
                    counts.lost_to_cancel += 1;
                    let at = lost_to_abort[*id];
                    // The abort needs a recorded cause: a cancel, clear or interrupt of the session that started
                    // before the turn ended (1 s of clock slack).
                    let explained = calls.iter().any(|c| {
                        matches!(c.kind, "cancel" | "cancel(keep_inbox)" | "clear" | "interrupt")
                            && c.start_unix_ms <= at + 1000
                    });
                    if !explained {
                        violations.push(format!(
                            "session {name}: {id} claimed by a turn that ended aborted, which no recorded call explains"
                        ));
                    }
                }
                (0, false, Some(at)) => {
                    counts.canceled += 1;
                    // A canceled removal needs a recorded cause: a cancel or clear of the session, or a remove
                    // of this id, that started before the splice was written (1 s of clock slack).
                    let explained = calls.iter().any(|c| {
                        (matches!(c.kind, "cancel" | "clear") || (c.kind == "remove" && c.id.as_deref() == Some(*id)))
                            && c.start_unix_ms <= at + 1000
                    });
                    if !explained {
                        violations.push(format!(
                            "session {name}: {id} removed by a canceled splice no recorded call explains"
                        ));
                    }
                }
                _ => violations.push(format!(
                    "session {name}: acknowledged {id} admitted {n}x, pending {p}, canceled {}",
                    c.is_some()
                )),
            }
        }
        for (id, n) in &admitted {
            if !acked.contains(id) && !maybe.contains(id) {
                violations.push(format!("session {name}: {id} admitted {n}x but never acknowledged"));
            } else if *n > 1 && maybe.contains(id) {
                violations.push(format!("session {name}: {id} (answered only 'maybe') admitted {n}x"));
            }
        }
        // Every gateway's projection equals the fold.
        let last = v.events.last();
        for (g, inbox) in v.inboxes.iter().enumerate() {
            match inbox {
                Ok(inbox) if projection.matches(inbox) && inbox.seq == projection.seq => {}
                Ok(inbox) => violations.push(format!(
                    "session {name}: GetInbox via gateway {g} (seq {}, {} + {} pending) differs from the fold of the log (seq {}, {} + {})",
                    inbox.seq,
                    inbox.next_turn.len(),
                    inbox.next_step.len(),
                    projection.seq,
                    projection.next_turn.len(),
                    projection.next_step.len()
                )),
                Err(e) if v.events.is_empty() && e.contains("NotFound") => {}
                Err(e) => violations.push(format!("session {name}: gateway {g}: {e}")),
            }
        }
        for (g, info) in v.infos.iter().enumerate() {
            match (info, last) {
                (Ok(info), Some(last))
                    if info.last_seq == last.seq
                        && info.status == status
                        && info.last_turn == last_turn
                        && info.epoch >= last.epoch => {}
                (Ok(info), _) => violations.push(format!(
                    "session {name}: GetSession via gateway {g} (last_seq {}, status {}, last_turn {}, epoch {}) differs from the fold (last_seq {:?}, status {status}, last_turn {last_turn}, epoch {:?})",
                    info.last_seq,
                    info.status,
                    info.last_turn,
                    info.epoch,
                    last.map(|e| e.seq),
                    last.map(|e| e.epoch)
                )),
                (Err(e), _) if v.events.is_empty() && e.contains("NotFound") => {}
                (Err(e), _) => violations.push(format!("session {name}: gateway {g}: {e}")),
            }
        }
    }
    (counts, violations)
}

/// Each delivery whose first attempt started while a nats-server was killed ([`NATS_KILLS`], from the kill
/// to the restarted member's rejoining), with its wait: first attempt → its last answer (the accepted one,
/// or the last "maybe" when its retries ran out). Deliveries that reach into another fault are left out:
/// that fault has its own bounds.
pub(super) fn nats_kill_waits<'a>(
    history: &'a [CallRecord],
    faults: &'a [FaultRecord],
) -> Vec<(&'a FaultRecord, u64, String)> {
    let mut spans: BTreeMap<(usize, &str), (u64, u64)> = BTreeMap::new();
    for c in history.iter().filter(|c| is_delivery(c.kind)) {
        let Some(id) = c.id.as_deref() else { continue };
        let span = spans.entry((c.client, id)).or_insert((c.start_ms, c.end_ms));
        span.0 = span.0.min(c.start_ms);
        span.1 = span.1.max(c.end_ms);
    }
    let mut out = Vec::new();
    for ((_, id), (first, last)) in spans {
        let Some(f) = faults.iter().find(|f| NATS_KILLS.contains(&f.kind) && (f.start_ms..=f.end_ms).contains(&first))
        else {
            continue;
        };
        let other = faults.iter().any(|o| !std::ptr::eq(o, f) && o.start_ms <= last && first <= o.end_ms);
        if !other {
            out.push((f, last - first, id.to_owned()));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    //! The checker must not be vacuous: each property is shown failing on a log made to break it.

    use turnstile_proto::v1::session_event::Payload;
    use turnstile_proto::v1::{
        InboxSpliced, SessionEvent, SessionRef, SessionStatus, StatusChanged, Target, TurnEnd, TurnEndReason,
        TurnStart, UserMessageEvent,
    };

    use super::{CallRecord, Outcome, SessionView, check};
    use crate::user_msg;

    pub(super) fn event(seq: u64, epoch: u64, payload: Payload) -> SessionEvent {
        SessionEvent { seq, epoch, time_unix_ms: 1000 + seq, payload: Some(payload), ..Default::default() }
    }

    pub(super) fn insert(id: &str) -> Payload {
        Payload::InboxSpliced(InboxSpliced {
            target: Target::NextTurn as i32,
            inserted: vec![user_msg(id, "hi")],
            ..Default::default()
        })
    }

    pub(super) fn claim() -> Payload {
        Payload::InboxSpliced(InboxSpliced { target: Target::NextTurn as i32, removed_count: 1, ..Default::default() })
    }

    pub(super) fn admit(id: &str) -> Payload {
        Payload::UserMessage(UserMessageEvent { message: Some(user_msg(id, "hi")), turn: 1, step: 1 })
    }

    pub(super) fn status(s: SessionStatus) -> Payload {
        Payload::Status(StatusChanged { status: s as i32 })
    }

    pub(super) fn turn_end(turn: u64) -> Payload {
        Payload::TurnEnd(TurnEnd {
            turn,
            reason: Some(TurnEndReason {
                reason: Some(turnstile_proto::v1::turn_end_reason::Reason::Completed(Default::default())),
            }),
        })
    }

    pub(super) fn acked(id: &str) -> CallRecord {
        CallRecord {
            client: 0,
            session: 0,
            kind: "followup",
            id: Some(id.into()),
            gateway: 0,
            start_ms: 0,
            end_ms: 1,
            start_unix_ms: 0,
            deadline_ms: 8000,
            outcome: Outcome::Ok(1),
        }
    }

    /// One idle session whose log is `payloads` (seq from 1, epoch 1), read consistently through one gateway.
    pub(super) fn view(payloads: Vec<Payload>) -> SessionView {
        let events: Vec<SessionEvent> =
            payloads.into_iter().enumerate().map(|(i, p)| event(i as u64 + 1, 1, p)).collect();
        view_of(events)
    }

    pub(super) fn view_of(events: Vec<SessionEvent>) -> SessionView {
        let last = events.last().cloned().unwrap_or_default();
        let projection = crate::Projection::fold(&events).unwrap_or_default();
        let last_turn = events
            .iter()
            .filter_map(|e| match &e.payload {
                Some(Payload::TurnStart(t)) => Some(t.turn),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        SessionView {
            reference: SessionRef { tenant: "t".into(), id: "s".into() },
            inboxes: vec![Ok(turnstile_proto::v1::InboxSnapshot {
                seq: projection.seq,
                next_turn: projection.next_turn,
                next_step: projection.next_step,
            })],
            infos: vec![Ok(turnstile_proto::v1::SessionInfo {
                last_seq: last.seq,
                status: SessionStatus::Idle as i32,
                last_turn,
                epoch: last.epoch,
                ..Default::default()
            })],
            events,
            idle: true,
        }
    }

    pub(super) fn one_turn(id: &str) -> Vec<Payload> {
        vec![
            insert(id),
            status(SessionStatus::Running),
            Payload::TurnStart(TurnStart { turn: 1 }),
            claim(),
            admit(id),
            turn_end(1),
            status(SessionStatus::Idle),
        ]
    }

    #[test]
    pub(super) fn a_clean_log_has_no_violation() {
        let (counts, violations) = check(&[acked("a")], &[], &[view(one_turn("a"))]);
        assert_eq!(violations, Vec::<String>::new());
        assert_eq!((counts.acknowledged, counts.admitted), (1, 1));
    }

    #[test]
    pub(super) fn each_broken_property_is_reported() {
        // Admitted twice.
        let mut twice = one_turn("a");
        twice.insert(5, admit("a"));
        let (_, v) = check(&[acked("a")], &[], &[view(twice)]);
        assert!(v.iter().any(|v| v.contains("admitted 2x")), "{v:?}");
        // Acknowledged but never inserted: lost.
        let (_, v) = check(&[acked("a"), acked("b")], &[], &[view(one_turn("a"))]);
        assert!(v.iter().any(|v| v.contains("acknowledged b admitted 0x")), "{v:?}");
        // Admitted but never acknowledged.
        let (_, v) = check(&[], &[], &[view(one_turn("a"))]);
        assert!(v.iter().any(|v| v.contains("never acknowledged")), "{v:?}");
        // A turn left open and the log ending running.
        let mut open = one_turn("a");
        open.truncate(5);
        let (_, v) = check(&[acked("a")], &[], &[view(open)]);
        assert!(v.iter().any(|v| v.contains("never closed")), "{v:?}");
        assert!(v.iter().any(|v| v.contains("ends running")), "{v:?}");
        // An epoch going back, and a gap in the seqs.
        let mut events: Vec<SessionEvent> =
            one_turn("a").into_iter().enumerate().map(|(i, p)| event(i as u64 + 1, 2, p)).collect();
        events[6].epoch = 1;
        events[3].seq = 40;
        let (_, v) = check(&[acked("a")], &[], &[view_of(events)]);
        assert!(v.iter().any(|v| v.contains("of epoch 1 after epoch 2")), "{v:?}");
        assert!(v.iter().any(|v| v.contains("not contiguous")), "{v:?}");
        // A gateway whose inbox differs from the fold.
        let mut stale = view(one_turn("a"));
        if let Some(Ok(inbox)) = stale.inboxes.first_mut() {
            inbox.next_turn.push(user_msg("ghost", "boo"));
        }
        let (_, v) = check(&[acked("a")], &[], &[stale]);
        assert!(v.iter().any(|v| v.contains("differs from the fold")), "{v:?}");
        // A call that hung with no stopped gateway to explain it.
        let mut hung = acked("a");
        hung.outcome = Outcome::Hung;
        let (_, v) = check(&[acked("a"), hung], &[], &[view(one_turn("a"))]);
        assert!(v.iter().any(|v| v.contains("hung past its deadline")), "{v:?}");
        // A cut of a NATS node with its worker whose shards nobody took over.
        let cut = super::FaultRecord {
            kind: "partition nats node + worker",
            target: 1,
            start_ms: 10,
            end_ms: 40_000,
            takeover_ms: None,
            inner_owned_at_heal: Some(11),
        };
        let (_, v) = check(&[acked("a")], std::slice::from_ref(&cut), &[view(one_turn("a"))]);
        assert!(v.iter().any(|v| v.contains("were not taken over")), "{v:?}");
        let taken = super::FaultRecord { takeover_ms: Some(2_500), ..cut };
        let (_, v) = check(&[acked("a")], &[taken], &[view(one_turn("a"))]);
        assert_eq!(v, Vec::<String>::new());
    }
}
