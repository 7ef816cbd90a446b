//! Random command sequences against the driver in the simulated runner: the log stays a valid,
//! self-consistent history, and every accepted MessageId has exactly one fate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use support::{Rec, Sim, error_kind, msg, render_durable, render_live};
use turnstile_model::{
    CancelCause, Command, CommandReply, Envelope, EventPayload, GoalAction, Inbox, LivePayload, MessageSource,
    SpliceOutcome, Status, Target, TurnEndReason, UserMessage,
};

const DIRECTIVES: [&str; 12] = [
    "",
    "[[tool:sleep 50]]",
    "[[tool:echo x]]",
    "[[reject]]",
    "[[drop]]",
    "[[fail]]",
    "[[max-tokens]]",
    "[[hook-fail]]",
    "[[delay:100]]",
    "[[delay:100]] [[tool:sleep 10]]",
    "[[rewrite:clean]]",
    "[[tool:echo a]] [[tool:sleep 20]]",
];

/// Ids `m0..m13`; each id has its own directive, and `variant` gives the same id other content.
fn message(id: u8, variant: bool) -> UserMessage {
    let text = if variant {
        format!("other {id}")
    } else {
        format!("{} text{id}", DIRECTIVES[id as usize % DIRECTIVES.len()])
    };
    msg(&format!("m{id}"), &text)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Preset {
    Followup,
    Queue,
    Steer,
    Inject,
}

impl Preset {
    fn routing(self) -> (Target, bool) {
        match self {
            Self::Followup => (Target::NextTurn, true),
            Self::Queue => (Target::NextTurn, false),
            Self::Steer => (Target::NextStep, true),
            Self::Inject => (Target::NextStep, false),
        }
    }
}

#[derive(Clone, Debug)]
enum Action {
    /// `expected`: for steer, `Some(0)` names the running turn, `Some(n)` turn n.
    Deliver {
        preset: Preset,
        id: u8,
        variant: bool,
        expected: Option<u8>,
    },
    Interrupt {
        id: u8,
        variant: bool,
    },
    Replace {
        old: u8,
        new: u8,
        variant: bool,
    },
    Remove {
        id: u8,
    },
    Splice {
        next_step: bool,
        start: u8,
        delete: u8,
        insert: Vec<u8>,
    },
    Clear,
    Cancel {
        cause: u8,
        keep_inbox: bool,
    },
    FinishTools,
    StreamDelta,
    FinishModel,
    DeliverAborts,
    DecidePreSteps,
    Advance(u16),
    WhenIdle,
    /// SetGoal with a fresh goal id (a revision while one is active or paused).
    SetGoal {
        max_rounds: u8,
        slow: bool,
    },
    /// UpdateGoal on the session's goal: pause, resume or clear.
    UpdateGoal {
        action: u8,
    },
}

fn action() -> impl Strategy<Value = Action> {
    let id = 0u8..14;
    let preset = prop_oneof![Just(Preset::Followup), Just(Preset::Queue), Just(Preset::Steer), Just(Preset::Inject)];
    prop_oneof![
        12 => (preset, id.clone(), prop::bool::weighted(0.15), prop::option::weighted(0.2, 0u8..3))
            .prop_map(|(preset, id, variant, expected)| Action::Deliver { preset, id, variant, expected }),
        2 => (id.clone(), prop::bool::weighted(0.1)).prop_map(|(id, variant)| Action::Interrupt { id, variant }),
        2 => (id.clone(), 0u8..20, any::<bool>()).prop_map(|(old, new, variant)| Action::Replace { old, new, variant }),
        1 => id.clone().prop_map(|id| Action::Remove { id }),
        1 => (any::<bool>(), 0u8..3, 0u8..3, prop::collection::vec(0u8..20, 0..3))
            .prop_map(|(next_step, start, delete, insert)| Action::Splice { next_step, start, delete, insert }),
        1 => Just(Action::Clear),
        3 => (0u8..4, any::<bool>()).prop_map(|(cause, keep_inbox)| Action::Cancel { cause, keep_inbox }),
        4 => Just(Action::FinishTools),
        3 => Just(Action::StreamDelta),
        4 => Just(Action::FinishModel),
        2 => Just(Action::DeliverAborts),
        3 => Just(Action::DecidePreSteps),
        1 => (1u16..80).prop_map(Action::Advance),
        1 => Just(Action::WhenIdle),
        1 => (1u8..4, any::<bool>()).prop_map(|(max_rounds, slow)| Action::SetGoal { max_rounds, slow }),
        1 => (0u8..3).prop_map(|action| Action::UpdateGoal { action }),
    ]
}

#[derive(Clone, Debug)]
struct Case {
    hold_presteps: bool,
    delay_aborts: bool,
    actions: Vec<Action>,
}

fn case() -> impl Strategy<Value = Case> {
    (any::<bool>(), any::<bool>(), prop::collection::vec(action(), 1..40))
        .prop_map(|(hold_presteps, delay_aborts, actions)| Case { hold_presteps, delay_aborts, actions })
}

/// What became of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fate {
    Pending,
    Claimed { turn: u64, text: String },
    Admitted { turn: u64 },
    Discarded,
    Lost { turn: u64, reason: String },
}

/// How a delivery was first accepted: what a retry must repeat and what it gets back.
#[derive(Clone, Debug)]
struct Accepted {
    message: UserMessage,
    target: Target,
    wakeup: bool,
    seq: u64,
    turn: Option<u64>,
}

/// Follows the log event by event and checks every transition.
#[derive(Default)]
struct Tracker {
    cursor: usize,
    inbox: Inbox,
    fate: BTreeMap<String, Fate>,
    open_turn: Option<u64>,
    started: BTreeSet<u64>,
    ended: BTreeSet<u64>,
    step_open: bool,
    next_turn_claims: BTreeMap<u64, usize>,
    statuses: Vec<Status>,
}

impl Tracker {
    fn follow(&mut self, log: &[Envelope]) {
        for e in &log[self.cursor..] {
            self.event(e);
        }
        self.cursor = log.len();
    }

    fn event(&mut self, e: &Envelope) {
        let at = render_durable(e);
        match &e.payload {
            EventPayload::InboxSpliced(s) => {
                let removed = self.inbox.apply(s).unwrap_or_else(|err| panic!("{at}: {err}"));
                let removed_ids: BTreeSet<String> = removed.iter().map(|m| m.id.0.clone()).collect();
                match s.outcome {
                    SpliceOutcome::None if !removed.is_empty() => {
                        let turn = self.open_turn.unwrap_or_else(|| panic!("{at}: a claim outside a turn"));
                        assert!(s.inserted.is_empty() && s.start == 0, "{at}: a claim is a head deletion");
                        assert!(!self.step_open, "{at}: a claim inside a step");
                        if s.target == Target::NextTurn {
                            let n = self.next_turn_claims.entry(turn).or_default();
                            *n += removed.len();
                            assert_eq!(*n, 1, "{at}: one next-turn message per turn");
                        }
                        for m in removed {
                            let f = self.fate.get(&m.id.0);
                            assert_eq!(f, Some(&Fate::Pending), "{at}: claimed {} that was not pending", m.id);
                            self.fate.insert(m.id.0.clone(), Fate::Claimed { turn, text: m.text() });
                        }
                    }
                    SpliceOutcome::Canceled => {
                        for m in &removed {
                            let f = self.fate.get(&m.id.0);
                            assert_eq!(f, Some(&Fate::Pending), "{at}: discarded {} that was not pending", m.id);
                            self.fate.insert(m.id.0.clone(), Fate::Discarded);
                        }
                    }
                    SpliceOutcome::Restored => panic!("{at}: no owner crashed, nothing is restored"),
                    SpliceOutcome::None => {}
                }
                for m in &s.inserted {
                    let f = self.fate.get(&m.id.0);
                    let reinsert = f == Some(&Fate::Discarded) && removed_ids.contains(&m.id.0);
                    assert!(f.is_none() || reinsert, "{at}: {} inserted again after {f:?}", m.id);
                    self.fate.insert(m.id.0.clone(), Fate::Pending);
                }
            }
            EventPayload::Status(s) => {
                assert_ne!(self.statuses.last(), Some(s), "{at}: a repeated status");
                self.statuses.push(*s);
            }
            EventPayload::TurnStart { turn } => {
                assert!(self.open_turn.is_none(), "{at}: a turn is open");
                assert!(self.started.insert(*turn), "{at}: turn started twice");
                assert_eq!(self.started.len() as u64, *turn, "{at}: turns are numbered from 1 without gaps");
                assert_eq!(self.statuses.last(), Some(&Status::Running), "{at}: a turn while idle");
                self.open_turn = Some(*turn);
            }
            EventPayload::TurnEnd { turn, reason } => {
                assert_eq!(self.open_turn, Some(*turn), "{at}");
                assert!(!self.step_open, "{at}: a step is open");
                assert!(self.ended.insert(*turn), "{at}: turn ended twice");
                self.open_turn = None;
                let losing = matches!(
                    reason,
                    TurnEndReason::Blocked { .. } | TurnEndReason::Error { .. } | TurnEndReason::Aborted(_)
                );
                for (id, f) in self.fate.iter_mut() {
                    if let Fate::Claimed { turn: t, text } = f
                        && t == turn
                    {
                        assert!(
                            losing || text.contains("[[drop]]"),
                            "{at}: {id} ({text:?}) was claimed and never entered, yet the turn ended {reason:?}"
                        );
                        *f = Fate::Lost { turn: *turn, reason: support::reason(reason) };
                    }
                }
            }
            EventPayload::StepStart { turn, .. } => {
                assert_eq!(self.open_turn, Some(*turn), "{at}");
                assert!(!self.step_open, "{at}: steps are balanced");
                self.step_open = true;
            }
            EventPayload::StepEnd { turn, .. } => {
                assert_eq!(self.open_turn, Some(*turn), "{at}");
                assert!(self.step_open, "{at}: steps are balanced");
                self.step_open = false;
            }
            EventPayload::UserMessage { message, turn, .. } => {
                assert!(self.step_open, "{at}: a user/message outside a step");
                let f = self.fate.get(&message.id.0).cloned();
                match f {
                    Some(Fate::Claimed { turn: t, .. }) if t == *turn => {}
                    other => panic!("{at}: entered {} whose fate was {other:?}", message.id),
                }
                self.fate.insert(message.id.0.clone(), Fate::Admitted { turn: *turn });
            }
            _ => {}
        }
    }
}

fn cause(n: u8) -> CancelCause {
    match n {
        0 => CancelCause::User,
        1 => CancelCause::Parent,
        2 => CancelCause::Hook { reason: "guard".into() },
        _ => CancelCause::Disposed,
    }
}

fn run(case: Case) {
    let mut sim = Sim::new();
    sim.hold_presteps = case.hold_presteps;
    sim.delay_aborts = case.delay_aborts;
    let mut tracker = Tracker::default();
    let mut accepted: BTreeMap<String, Accepted> = BTreeMap::new();
    let mut waiters = Vec::new();
    let mut goals_set = 0u32;

    for action in case.actions {
        let before = sim.log.len();
        let idle_before = sim.driver.running_turn().is_none() && sim.driver.state().status == Status::Idle;
        let last_turn_before = sim.driver.state().last_turn;
        let running_before = sim.driver.running_turn();
        match action {
            Action::Deliver { preset, id, variant, expected } => {
                let m = message(id, variant);
                let (target, wakeup) = preset.routing();
                let expected_turn = match (preset, expected) {
                    (Preset::Steer, Some(0)) => Some(running_before.unwrap_or(1)),
                    (Preset::Steer, Some(n)) => Some(u64::from(n) + 1),
                    _ => None,
                };
                let reply = sim.send(m.clone(), target, wakeup, expected_turn);
                check_delivery(
                    &sim,
                    &mut accepted,
                    &tracker,
                    m,
                    target,
                    wakeup,
                    expected_turn,
                    reply,
                    before,
                    idle_before,
                    last_turn_before,
                    running_before,
                );
            }
            Action::Interrupt { id, variant } => {
                let m = message(id, variant);
                let reply = sim.command(Command::Interrupt { message: m.clone() });
                check_delivery(
                    &sim,
                    &mut accepted,
                    &tracker,
                    m,
                    Target::NextTurn,
                    true,
                    None,
                    reply,
                    before,
                    idle_before,
                    last_turn_before,
                    running_before,
                );
            }
            Action::Replace { old, new, variant } => {
                let old_id = format!("m{old}");
                let m = message(new, variant);
                let pending = sim.driver.state().inbox.contains(&old_id.as_str().into());
                let taken = m.id.0 != old_id && tracker.fate.contains_key(&m.id.0);
                let reply = sim.replace(&old_id, m);
                match (&reply, pending, taken) {
                    (Err(e), false, _) => assert_eq!(error_kind(e), "not-found"),
                    (Err(e), true, true) => assert_eq!(error_kind(e), "already-exists"),
                    (Ok(CommandReply::Written { .. }), true, false) => assert_eq!(sim.log.len(), before + 1),
                    other => panic!("replace {old_id}: pending {pending}, id taken {taken}: {other:?}"),
                }
            }
            Action::Remove { id } => {
                let id = format!("m{id}");
                let pending = sim.driver.state().inbox.contains(&id.as_str().into());
                let reply = sim.remove(&id);
                assert_eq!(reply.is_ok(), pending, "remove {id}: {reply:?}");
                assert_eq!(sim.log.len(), before + usize::from(pending));
            }
            Action::Splice { next_step, start, delete, insert } => {
                let target = if next_step { Target::NextStep } else { Target::NextTurn };
                let inserted = insert.iter().map(|i| message(*i, false)).collect();
                // SPEC §3 normalization: what the splice can really remove from where it really starts.
                let len = sim.driver.state().inbox.list(target).len();
                let removes = usize::from(delete).min(len - usize::from(start).min(len));
                let reply = sim.command(Command::Splice {
                    target,
                    start: u32::from(start),
                    delete_count: u32::from(delete),
                    inserted,
                });
                assert!(sim.log.len() <= before + 1, "a client splice is one splice");
                if reply.is_ok() {
                    let changes = removes > 0 || !insert.is_empty();
                    assert_eq!(sim.log.len(), before + usize::from(changes), "splice {start} {delete} of {len}");
                }
            }
            Action::Clear => {
                let inbox = sim.driver.state().inbox.clone();
                assert!(sim.clear().is_ok());
                let lists = usize::from(!inbox.next_step.is_empty()) + usize::from(!inbox.next_turn.is_empty());
                assert_eq!(sim.log.len(), before + lists);
                assert!(sim.driver.state().inbox.is_empty());
            }
            Action::Cancel { cause: c, keep_inbox } => {
                let inbox = sim.driver.state().inbox.clone();
                let id = sim.submit(Command::Cancel { cause: cause(c), keep_inbox });
                let (reply, at) = sim.replies[&id].clone();
                match reply {
                    Ok(CommandReply::Written { seq }) => assert_eq!(seq as usize, at),
                    other => panic!("cancel: {other:?}"),
                }
                if !keep_inbox {
                    let lists = usize::from(!inbox.next_step.is_empty()) + usize::from(!inbox.next_turn.is_empty());
                    let splices = sim.log[before..at]
                        .iter()
                        .filter(|e| matches!(&e.payload, EventPayload::InboxSpliced(s) if s.outcome == SpliceOutcome::Canceled))
                        .count();
                    assert_eq!(splices, lists, "cancel clears each non-empty list once");
                } else {
                    assert_eq!(at, before, "cancel keeping the inbox writes nothing before it replies");
                }
            }
            Action::FinishTools => sim.finish_tools(),
            Action::StreamDelta => {
                sim.stream_one_delta();
            }
            Action::FinishModel => sim.finish_model(),
            Action::DeliverAborts => sim.deliver_aborts(),
            Action::DecidePreSteps => sim.decide_pre_steps(),
            Action::Advance(ms) => sim.advance(u64::from(ms)),
            Action::WhenIdle => {
                let quiescent = sim.driver.is_quiescent();
                let id = sim.when_idle();
                assert_eq!(sim.reply(id).is_some(), quiescent, "when_idle resolves at once iff quiescent");
                waiters.push((id, quiescent));
            }
            Action::SetGoal { max_rounds, slow } => {
                goals_set += 1;
                let objective = if slow { "work [[delay:100]]" } else { "work" };
                let reply = sim.command(Command::SetGoal {
                    goal_id: format!("g{goals_set}"),
                    objective: objective.into(),
                    max_rounds: u32::from(max_rounds),
                });
                assert!(matches!(reply, Ok(CommandReply::Written { .. })), "set goal: {reply:?}");
            }
            Action::UpdateGoal { action } => {
                let action = [GoalAction::Pause, GoalAction::Resume, GoalAction::Clear][usize::from(action)];
                let goal_id = sim.driver.state().goals.current.as_ref().map_or("g0".to_owned(), |g| g.goal_id.clone());
                match sim.command(Command::UpdateGoal { goal_id, action }) {
                    Ok(CommandReply::Written { .. }) => {}
                    Err(e) => assert!(["not-found", "failed-precondition"].contains(&error_kind(&e)), "{e}"),
                    Ok(other) => panic!("update goal: {other:?}"),
                }
            }
        }
        tracker.follow(&sim.log);
        check_always(&sim, &tracker);
    }

    sim.settle();
    tracker.follow(&sim.log);
    check_always(&sim, &tracker);
    assert!(sim.driver.is_quiescent(), "not idle after settling: {:#?}", sim.render_all());
    assert_eq!(tracker.started, tracker.ended, "every turn is closed once the driver is idle");
    assert!(tracker.open_turn.is_none());
    for (id, f) in &tracker.fate {
        assert!(!matches!(f, Fate::Claimed { .. }), "{id} is still claimed while idle");
    }
    for id in accepted.keys() {
        assert!(tracker.fate.contains_key(id), "accepted {id} vanished");
    }
    // Every when_idle resolved: at once (checked when it was sent) or right after the flip to idle.
    let lines: Vec<String> = sim.recs.iter().filter(|r| !matches!(r, Rec::Op(_))).map(support::render).collect();
    for (id, immediate) in waiters {
        assert!(matches!(sim.reply(id), Some(Ok(CommandReply::Idle(_)))), "when_idle {id} never resolved");
        if !immediate {
            let at = lines.iter().position(|l| l.starts_with(&format!("R {id} idle"))).unwrap();
            let mut prev = at - 1;
            // The goal system acts once the session is idle (a budget verdict): that may come between.
            while lines[prev].starts_with("R ") && lines[prev].contains(" idle ")
                || lines[prev].starts_with("D goal/change")
            {
                prev -= 1;
            }
            assert_eq!(lines[prev], "L status idle", "when_idle {id}: {lines:#?}");
        }
    }
    // Live statuses mirror the durable ones.
    let live: Vec<Status> = sim
        .live
        .iter()
        .filter_map(|e| match e.payload {
            LivePayload::Status { status } => Some(status),
            _ => None,
        })
        .collect();
    assert_eq!(live, tracker.statuses);
    for e in &sim.live {
        let _ = render_live(e);
    }
    sim.check_full_fold();
}

/// After every action: the tracker's view of the inbox is the driver's, pending fates match it.
fn check_always(sim: &Sim, tracker: &Tracker) {
    let inbox = &sim.driver.state().inbox;
    assert_eq!(&tracker.inbox, inbox);
    let pending: BTreeSet<&str> =
        tracker.fate.iter().filter(|(_, f)| **f == Fate::Pending).map(|(id, _)| id.as_str()).collect();
    let listed: BTreeSet<&str> = inbox.next_turn.iter().chain(&inbox.next_step).map(|m| m.id.as_str()).collect();
    assert_eq!(pending, listed);
    assert_eq!(inbox.len(), listed.len(), "an id occurs at most once across both lists");
    assert_eq!(tracker.open_turn, sim.driver.state().open_turn.as_ref().map(|o| o.turn));
    if sim.driver.is_quiescent() {
        assert!(tracker.open_turn.is_none());
    }
    check_goal(sim);
}

/// The goal's round is the number of its revision's continuations admitted, each round admitted once and
/// in order, never more than the budget.
fn check_goal(sim: &Sim) {
    let Some(goal) = sim.driver.state().goals.current.as_ref() else { return };
    let rounds: Vec<u64> = sim
        .user_messages()
        .into_iter()
        .filter_map(|(_, _, _, m)| match m.source {
            MessageSource::Goal { goal_id, revision, round }
                if goal_id == goal.goal_id && revision == goal.revision =>
            {
                Some(round)
            }
            _ => None,
        })
        .collect();
    assert_eq!(rounds, (1..=goal.round).collect::<Vec<_>>(), "admitted rounds of {goal:?}");
    assert!(goal.round <= u64::from(goal.max_rounds), "{goal:?} ran past its budget");
}

#[allow(clippy::too_many_arguments)]
fn check_delivery(
    sim: &Sim,
    accepted: &mut BTreeMap<String, Accepted>,
    tracker: &Tracker,
    m: UserMessage,
    target: Target,
    wakeup: bool,
    expected_turn: Option<u64>,
    reply: support::Reply,
    before: usize,
    idle_before: bool,
    last_turn_before: u64,
    running_before: Option<u64>,
) {
    let id = m.id.0.clone();
    if let Some(a) = accepted.get(&id) {
        if a.message == m && a.target == target && a.wakeup == wakeup {
            match reply {
                Ok(CommandReply::Sent { seq, turn }) => {
                    assert_eq!((seq, turn), (a.seq, a.turn), "a retry of {id} returns the original acceptance")
                }
                other => panic!("retry of {id}: {other:?}"),
            }
            assert_eq!(sim.log.len(), before, "a retry writes nothing");
        } else {
            match reply {
                Err(e) => assert_eq!(error_kind(&e), "already-exists", "{id}: {e}"),
                Ok(r) => panic!("{id} redelivered with other content or routing was accepted: {r:?}"),
            }
        }
        return;
    }
    if tracker.fate.contains_key(&id) {
        // First inserted by an edit: not a delivery anyone can retry; it must not write a second copy.
        if reply.is_ok() {
            assert_eq!(sim.log.len(), before, "{id} inserted twice");
        }
        return;
    }
    if let Some(expected) = expected_turn
        && running_before != Some(expected)
    {
        match reply {
            Err(e) => {
                assert_eq!(error_kind(&e), "failed-precondition");
                let msg = e.to_string();
                match running_before {
                    Some(t) => assert!(msg.contains(&format!("running turn {t}")), "{msg}"),
                    None => assert!(msg.contains("idle"), "{msg}"),
                }
            }
            other => panic!("steer with stale expected_turn {expected} (running {running_before:?}): {other:?}"),
        }
        return;
    }
    let (seq, turn) = match reply {
        Ok(CommandReply::Sent { seq, turn }) => (seq, turn),
        other => panic!("new delivery {id}: {other:?}"),
    };
    match &sim.log[seq as usize - 1].payload {
        EventPayload::InboxSpliced(s) => {
            assert_eq!(s.inserted, vec![m.clone()], "the reply's seq is the insert splice");
            assert_eq!(s.wake, wakeup);
            assert_eq!(s.outcome, SpliceOutcome::None);
            assert_eq!(s.requested_target.unwrap_or(s.target), target);
        }
        other => panic!("reply seq {seq} is not a splice: {other:?}"),
    }
    let expect_turn = (wakeup && idle_before).then_some(last_turn_before + 1);
    assert_eq!(turn, expect_turn, "delivery {id}: the turn it opened");
    if let Some(t) = turn {
        assert!(sim.log[seq as usize..].iter().any(|e| e.payload == EventPayload::TurnStart { turn: t }));
    }
    accepted.insert(id, Accepted { message: m, target, wakeup, seq, turn });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_sessions_keep_every_invariant(case in case()) {
        run(case);
    }
}
