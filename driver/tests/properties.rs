//! Random command sequences against the driver in the simulated runner, with crashes, refused appends
//! and failovers among the actions (issue 14): the log stays a valid, self-consistent history across
//! owners, and every accepted MessageId has exactly one fate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use support::{Fault, Rec, Sim, error_kind, msg, render_durable, render_live};
use turnstile_driver::{AgentCatalog, AgentProfile, ApprovalRules, CommandId, Limits};
use turnstile_model::{
    CancelCause, Command, CommandReply, DeadlineSpec, Envelope, EventPayload, GoalAction, Inbox, LivePayload,
    MessageSource, OnDeadline, SpliceOutcome, Status, Target, TurnEndReason, UserMessage,
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
    /// `expected`: for steer, `Some(0)` names the running turn, `Some(n)` turn n. `deadline`: for steer,
    /// `(after_ms, interrupt)`.
    Deliver {
        preset: Preset,
        id: u8,
        variant: bool,
        expected: Option<u8>,
        deadline: Option<(u8, bool)>,
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
    /// Time passes: due `sleep` calls finish, due steer deadlines fire.
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
    /// Decide the call awaiting approval, or an unknown call when none waits.
    Decide {
        approve: bool,
    },
    /// The worker dies between inputs; the next owner takes over `gap` ms later.
    Crash {
        gap: u8,
    },
    /// `pass` more append groups are performed, whatever input writes them; the next one suffers `fault`.
    Arm {
        pass: u8,
        fault: Fault,
        gap: u8,
    },
    /// The client retries its oldest delivery whose answer it does not know.
    Retry,
}

fn action() -> impl Strategy<Value = Action> {
    let id = 0u8..14;
    let preset = prop_oneof![Just(Preset::Followup), Just(Preset::Queue), Just(Preset::Steer), Just(Preset::Inject)];
    let fault = prop_oneof![Just(Fault::Crash), Just(Fault::Unavailable), Just(Fault::Conflict)];
    prop_oneof![
        12 => (
            preset,
            id.clone(),
            prop::bool::weighted(0.15),
            prop::option::weighted(0.2, 0u8..3),
            prop::option::weighted(0.4, (1u8..200, any::<bool>())),
        )
            .prop_map(|(preset, id, variant, expected, deadline)| Action::Deliver { preset, id, variant, expected, deadline }),
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
        2 => (1u16..250).prop_map(Action::Advance),
        1 => Just(Action::WhenIdle),
        1 => (1u8..4, any::<bool>()).prop_map(|(max_rounds, slow)| Action::SetGoal { max_rounds, slow }),
        1 => (0u8..3).prop_map(|action| Action::UpdateGoal { action }),
        1 => any::<bool>().prop_map(|approve| Action::Decide { approve }),
        2 => any::<u8>().prop_map(|gap| Action::Crash { gap }),
        4 => (0u8..4, fault, any::<u8>()).prop_map(|(pass, fault, gap)| Action::Arm { pass, fault, gap }),
        2 => Just(Action::Retry),
    ]
}

#[derive(Clone, Debug)]
struct Case {
    hold_presteps: bool,
    delay_aborts: bool,
    /// `echo` calls wait for approval (SPEC §9).
    gated: bool,
    actions: Vec<Action>,
}

fn case() -> impl Strategy<Value = Case> {
    (any::<bool>(), any::<bool>(), any::<bool>(), prop::collection::vec(action(), 1..48))
        .prop_map(|(hold_presteps, delay_aborts, gated, actions)| Case { hold_presteps, delay_aborts, gated, actions })
}

/// The scripted agent with `echo` gated by approval.
fn gated_echo() -> AgentCatalog {
    let approval = ApprovalRules::new(|tool| tool == "echo");
    AgentCatalog::new("scripted", [("scripted".to_owned(), AgentProfile { approval, ..AgentProfile::default() })])
        .unwrap()
}

/// What became of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fate {
    Pending,
    /// Claimed by `turn` (the `order`-th claim of the session); `undecided` until a `step/start` of that
    /// turn shows that its pre-step decision was made.
    Claimed {
        turn: u64,
        text: String,
        target: Target,
        undecided: bool,
        order: u64,
    },
    /// Claimed by a turn a crash cut before deciding it: the new owner must restore it right away.
    Owed {
        target: Target,
        order: u64,
    },
    Admitted {
        turn: u64,
    },
    Discarded,
    Lost {
        turn: u64,
        reason: String,
    },
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

/// One delivery as the client sends it (and sends it again when it does not know the answer).
#[derive(Clone, Debug)]
struct Delivery {
    message: UserMessage,
    target: Target,
    wakeup: bool,
    expected_turn: Option<u64>,
    deadline: Option<DeadlineSpec>,
    interrupt: bool,
}

impl Delivery {
    fn command(&self) -> Command {
        if self.interrupt {
            return Command::Interrupt { message: self.message.clone() };
        }
        Command::Send {
            message: self.message.clone(),
            target: self.target,
            wakeup: self.wakeup,
            expected_turn: self.expected_turn,
            deadline: self.deadline,
        }
    }
}

/// What the clients were told.
#[derive(Default)]
struct Client {
    accepted: BTreeMap<String, Accepted>,
    /// Deliveries whose answer was lost with a worker or was UNAVAILABLE: retried with the same id.
    in_doubt: Vec<Delivery>,
    /// Ids inserted by edits answered `Written`.
    edited: BTreeSet<String>,
    /// Ids inserted by edits whose answer was lost or UNAVAILABLE (an edit is not retried).
    edits_in_doubt: BTreeSet<String>,
    /// `when_idle` calls: id, resolved at once, faults before it was sent.
    waiters: Vec<(CommandId, bool, usize)>,
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
    statuses: Vec<(u64, Status)>,
    claims: u64,
    last_epoch: u64,
    /// From a driver's load until it writes something a running turn writes: its repair (SPEC §6).
    repairing: bool,
    /// Ids the previous event removed with a canceled splice (a steer deadline's `interrupt` moves its steer).
    just_discarded: BTreeSet<String>,
    /// Ids first inserted by the goal system, which no client delivered.
    system: BTreeSet<String>,
}

impl Tracker {
    fn follow(&mut self, sim: &Sim) {
        for i in self.cursor..sim.log.len() {
            if sim.loads.contains(&i) {
                self.repairing = true;
            }
            self.event(&sim.log[i]);
        }
        self.cursor = sim.log.len();
    }

    fn event(&mut self, e: &Envelope) {
        let at = render_durable(e);
        assert!(e.epoch >= self.last_epoch, "{at}: epoch {} after an event of epoch {}", e.epoch, self.last_epoch);
        self.last_epoch = e.epoch;
        let restores = matches!(&e.payload, EventPayload::InboxSpliced(s) if s.outcome == SpliceOutcome::Restored);
        if !restores {
            let owed: Vec<&String> =
                self.fate.iter().filter(|(_, f)| matches!(f, Fate::Owed { .. })).map(|(id, _)| id).collect();
            assert!(owed.is_empty(), "{at}: {owed:?} were claimed by the cut turn, never entered, and not restored");
        }
        if matches!(
            e.payload,
            EventPayload::TurnStart { .. }
                | EventPayload::StepStart { .. }
                | EventPayload::UserMessage { .. }
                | EventPayload::AssistantMessage { .. }
                | EventPayload::ToolCall { .. }
                | EventPayload::ToolDecision { .. }
                | EventPayload::Status(_)
        ) {
            self.repairing = false;
        }
        let just_discarded = std::mem::take(&mut self.just_discarded);
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
                            self.claims += 1;
                            let claimed = Fate::Claimed {
                                turn,
                                text: m.text(),
                                target: s.target,
                                undecided: true,
                                order: self.claims,
                            };
                            self.fate.insert(m.id.0.clone(), claimed);
                        }
                    }
                    SpliceOutcome::Canceled => {
                        for m in &removed {
                            let f = self.fate.get(&m.id.0);
                            assert_eq!(f, Some(&Fate::Pending), "{at}: discarded {} that was not pending", m.id);
                            self.fate.insert(m.id.0.clone(), Fate::Discarded);
                            self.just_discarded.insert(m.id.0.clone());
                        }
                    }
                    SpliceOutcome::Restored => {
                        assert!(self.repairing, "{at}: a restore outside a new owner's repair");
                        assert!(removed.is_empty() && s.start == 0, "{at}: a restore inserts at the head");
                        let mut last = 0;
                        for m in &s.inserted {
                            match self.fate.get(&m.id.0) {
                                Some(Fate::Owed { target, order }) if *target == s.target && *order > last => {
                                    last = *order;
                                }
                                other => panic!("{at}: restored {} whose fate was {other:?}", m.id),
                            }
                            self.fate.insert(m.id.0.clone(), Fate::Pending);
                        }
                    }
                    SpliceOutcome::None => {}
                }
                if s.outcome != SpliceOutcome::Restored {
                    for m in &s.inserted {
                        let f = self.fate.get(&m.id.0);
                        let moved = removed_ids.contains(&m.id.0) || just_discarded.contains(&m.id.0);
                        let reinsert = f == Some(&Fate::Discarded) && moved;
                        assert!(f.is_none() || reinsert, "{at}: {} inserted again after {f:?}", m.id);
                        if f.is_none() && matches!(m.source, MessageSource::Goal { .. }) {
                            self.system.insert(m.id.0.clone());
                        }
                        self.fate.insert(m.id.0.clone(), Fate::Pending);
                    }
                }
            }
            EventPayload::Status(s) => {
                assert_ne!(self.statuses.last().map(|(_, s)| s), Some(s), "{at}: a repeated status");
                self.statuses.push((e.seq, *s));
            }
            EventPayload::TurnStart { turn } => {
                assert!(self.open_turn.is_none(), "{at}: a turn is open");
                assert!(self.started.insert(*turn), "{at}: turn started twice");
                assert_eq!(self.started.len() as u64, *turn, "{at}: turns are numbered from 1 without gaps");
                assert_eq!(self.statuses.last().map(|(_, s)| s), Some(&Status::Running), "{at}: a turn while idle");
                self.open_turn = Some(*turn);
            }
            EventPayload::TurnEnd { turn, reason } => {
                assert_eq!(self.open_turn, Some(*turn), "{at}");
                assert!(!self.step_open, "{at}: a step is open");
                assert!(self.ended.insert(*turn), "{at}: turn ended twice");
                self.open_turn = None;
                let interrupted = *reason == TurnEndReason::Interrupted;
                // Only a new owner ends a turn `interrupted`, as the first thing it writes (SPEC §6).
                assert!(!interrupted || self.repairing, "{at}: a turn ended interrupted outside a repair");
                let losing = matches!(
                    reason,
                    TurnEndReason::Blocked { .. } | TurnEndReason::Error { .. } | TurnEndReason::Aborted(_)
                );
                for (id, f) in self.fate.iter_mut() {
                    if let Fate::Claimed { turn: t, text, target, undecided, order } = f
                        && t == turn
                    {
                        if interrupted && *undecided {
                            *f = Fate::Owed { target: *target, order: *order };
                            continue;
                        }
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
                // The step's group holds the pre-step's verdict on everything claimed before it.
                for f in self.fate.values_mut() {
                    if let Fate::Claimed { turn: t, undecided, .. } = f
                        && t == turn
                    {
                        *undecided = false;
                    }
                }
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

/// A reply the client can act on; `None` when the worker died before answering or answered UNAVAILABLE
/// (only a fault may do either).
fn answered(reply: Option<support::Reply>, faulted: bool) -> Option<support::Reply> {
    match reply {
        Some(Err(e)) if error_kind(&e) == "unavailable" => {
            assert!(faulted, "UNAVAILABLE without a fault: {e}");
            None
        }
        None => {
            assert!(faulted, "no reply without a fault");
            None
        }
        other => other,
    }
}

/// Runs the session to quiescence the way time and people would: finishes what is held, fires due steer
/// deadlines, approves waiting calls.
fn quiesce(sim: &mut Sim) {
    for _ in 0..100 {
        sim.settle();
        if let Some(at) = sim.driver.next_timer() {
            sim.fire_timers(at);
            continue;
        }
        let awaiting = sim.driver.state().open_turn.as_ref().and_then(|o| o.awaiting.clone());
        match awaiting {
            Some(call) => {
                let reply = sim.command(Command::Decide { call_id: call.call_id, approve: true, reason: "ok".into() });
                assert!(reply.is_ok(), "approving a waiting call: {reply:?}");
            }
            None => return,
        }
    }
    panic!("the session did not quiesce: {:#?}", sim.render_all());
}

fn run(case: Case) {
    let agents = if case.gated { gated_echo() } else { AgentCatalog::default() };
    let mut sim = Sim::with_agents(Limits::default(), agents);
    sim.hold_presteps = case.hold_presteps;
    sim.delay_aborts = case.delay_aborts;
    let mut tracker = Tracker::default();
    let mut client = Client::default();
    let mut goals_set = 0u32;

    for action in case.actions.clone() {
        let before = sim.log.len();
        let faults = sim.faults.len();
        let known: BTreeSet<String> = tracker.fate.keys().cloned().collect();
        match action {
            Action::Deliver { preset, id, variant, expected, deadline } => {
                let (target, wakeup) = preset.routing();
                let expected_turn = match (preset, expected) {
                    (Preset::Steer, Some(0)) => Some(sim.driver.running_turn().unwrap_or(1)),
                    (Preset::Steer, Some(n)) => Some(u64::from(n) + 1),
                    _ => None,
                };
                let deadline = match (preset, deadline) {
                    (Preset::Steer, Some((after, interrupt))) => Some(DeadlineSpec {
                        after_ms: u64::from(after),
                        on_deadline: if interrupt { OnDeadline::Interrupt } else { OnDeadline::Drop },
                    }),
                    _ => None,
                };
                let message = message(id, variant);
                deliver(
                    &mut sim,
                    &mut client,
                    &tracker,
                    Delivery { message, target, wakeup, expected_turn, deadline, interrupt: false },
                );
            }
            Action::Interrupt { id, variant } => {
                let message = message(id, variant);
                let d = Delivery {
                    message,
                    target: Target::NextTurn,
                    wakeup: true,
                    expected_turn: None,
                    deadline: None,
                    interrupt: true,
                };
                deliver(&mut sim, &mut client, &tracker, d);
            }
            Action::Replace { old, new, variant } => {
                let old_id = format!("m{old}");
                let m = message(new, variant);
                let new_id = m.id.0.clone();
                let pending = sim.driver.state().inbox.contains(&old_id.as_str().into());
                let taken = new_id != old_id && tracker.fate.contains_key(&new_id);
                let reply = sim.try_command(Command::Replace { id: old_id.as_str().into(), message: m });
                let faulted = sim.faults.len() > faults;
                match answered(reply, faulted) {
                    None => {
                        client.edits_in_doubt.insert(new_id);
                    }
                    Some(reply) => match (&reply, pending, taken) {
                        (Err(e), false, _) => assert_eq!(error_kind(e), "not-found"),
                        (Err(e), true, true) => assert_eq!(error_kind(e), "already-exists"),
                        (Ok(CommandReply::Written { .. }), true, false) => {
                            assert!(faulted || sim.log.len() == before + 1);
                            client.edited.insert(new_id);
                        }
                        other => panic!("replace {old_id}: pending {pending}, id taken {taken}: {other:?}"),
                    },
                }
            }
            Action::Remove { id } => {
                let id = format!("m{id}");
                let pending = sim.driver.state().inbox.contains(&id.as_str().into());
                let reply = sim.try_command(Command::Remove { id: id.as_str().into() });
                let faulted = sim.faults.len() > faults;
                if let Some(reply) = answered(reply, faulted) {
                    assert_eq!(reply.is_ok(), pending, "remove {id}: {reply:?}");
                    assert!(faulted || sim.log.len() == before + usize::from(pending));
                }
            }
            Action::Splice { next_step, start, delete, insert } => {
                let target = if next_step { Target::NextStep } else { Target::NextTurn };
                let inserted: Vec<UserMessage> = insert.iter().map(|i| message(*i, false)).collect();
                let ids: Vec<String> = inserted.iter().map(|m| m.id.0.clone()).collect();
                // SPEC §3 normalization: what the splice can really remove from where it really starts.
                let len = sim.driver.state().inbox.list(target).len();
                let removes = usize::from(delete).min(len - usize::from(start).min(len));
                let reply = sim.try_command(Command::Splice {
                    target,
                    start: u32::from(start),
                    delete_count: u32::from(delete),
                    inserted,
                });
                let faulted = sim.faults.len() > faults;
                match answered(reply, faulted) {
                    None => client.edits_in_doubt.extend(ids),
                    Some(reply) if !faulted => {
                        assert!(sim.log.len() <= before + 1, "a client splice is one splice");
                        if reply.is_ok() {
                            let changes = removes > 0 || !insert.is_empty();
                            assert_eq!(
                                sim.log.len(),
                                before + usize::from(changes),
                                "splice {start} {delete} of {len}"
                            );
                            client.edited.extend(ids);
                        }
                    }
                    Some(reply) => {
                        if reply.is_ok() {
                            client.edited.extend(ids);
                        }
                    }
                }
            }
            Action::Clear => {
                let inbox = sim.driver.state().inbox.clone();
                let reply = sim.try_command(Command::Clear);
                let faulted = sim.faults.len() > faults;
                if let Some(reply) = answered(reply, faulted) {
                    assert!(reply.is_ok());
                    if !faulted {
                        let lists = usize::from(!inbox.next_step.is_empty()) + usize::from(!inbox.next_turn.is_empty());
                        assert_eq!(sim.log.len(), before + lists);
                        assert!(sim.driver.state().inbox.is_empty());
                    }
                }
            }
            Action::Cancel { cause: c, keep_inbox } => {
                let inbox = sim.driver.state().inbox.clone();
                let id = sim.submit(Command::Cancel { cause: cause(c), keep_inbox });
                let faulted = sim.faults.len() > faults;
                if let Some(reply) = answered(sim.reply(id).cloned(), faulted) {
                    let at = sim.replies[&id].1;
                    match reply {
                        Ok(CommandReply::Written { seq }) => assert_eq!(seq as usize, at),
                        other => panic!("cancel: {other:?}"),
                    }
                    // Before its reply a cancel writes its clearing splices and, for a call awaiting approval,
                    // that call's end (nothing runs it, so nothing else can).
                    let lists = usize::from(!inbox.next_step.is_empty()) + usize::from(!inbox.next_turn.is_empty());
                    let splices = sim.log[before..at]
                        .iter()
                        .filter(|e| matches!(&e.payload, EventPayload::InboxSpliced(s) if s.outcome == SpliceOutcome::Canceled))
                        .count();
                    let clears = if keep_inbox { 0 } else { lists };
                    assert_eq!(splices, clears, "cancel clears each non-empty list once, unless it keeps the inbox");
                    if !case.gated {
                        assert!(
                            !keep_inbox || at == before,
                            "cancel keeping the inbox writes nothing before it replies"
                        );
                    }
                }
            }
            Action::FinishTools => sim.finish_tools(),
            Action::StreamDelta => {
                sim.stream_one_delta();
            }
            Action::FinishModel => sim.finish_model(),
            Action::DeliverAborts => sim.deliver_aborts(),
            Action::DecidePreSteps => sim.decide_pre_steps(),
            Action::Advance(ms) => {
                sim.advance(u64::from(ms));
                let now = sim.now;
                sim.fire_timers(now);
            }
            Action::WhenIdle => {
                let quiescent = sim.driver.is_quiescent();
                let id = sim.when_idle();
                assert_eq!(sim.reply(id).is_some(), quiescent, "when_idle resolves at once iff quiescent");
                client.waiters.push((id, quiescent, sim.faults.len()));
            }
            Action::SetGoal { max_rounds, slow } => {
                goals_set += 1;
                let objective = if slow { "work [[delay:100]]" } else { "work" };
                let reply = sim.try_command(Command::SetGoal {
                    goal_id: format!("g{goals_set}"),
                    objective: objective.into(),
                    max_rounds: u32::from(max_rounds),
                });
                if let Some(reply) = answered(reply, sim.faults.len() > faults) {
                    assert!(matches!(reply, Ok(CommandReply::Goal { .. })), "set goal: {reply:?}");
                }
            }
            Action::UpdateGoal { action } => {
                let action = [GoalAction::Pause, GoalAction::Resume, GoalAction::Clear][usize::from(action)];
                let goal_id =
                    sim.driver.state().goals.current.as_ref().map_or("g0".to_owned(), |g| g.info.goal_id.clone());
                let reply = sim.try_command(Command::UpdateGoal { goal_id, action });
                match answered(reply, sim.faults.len() > faults) {
                    None | Some(Ok(CommandReply::Goal { .. })) => {}
                    Some(Err(e)) => assert!(["not-found", "failed-precondition"].contains(&error_kind(&e)), "{e}"),
                    Some(Ok(other)) => panic!("update goal: {other:?}"),
                }
            }
            Action::Decide { approve } => {
                let awaiting = sim.driver.state().open_turn.as_ref().and_then(|o| o.awaiting.clone());
                let call_id = awaiting.as_ref().map_or("call-none".to_owned(), |c| c.call_id.clone());
                let reply = sim.try_command(Command::Decide { call_id, approve, reason: "r".into() });
                match (answered(reply, sim.faults.len() > faults), awaiting) {
                    (None, _) | (Some(Ok(CommandReply::Written { .. })), Some(_)) => {}
                    (Some(Err(e)), None) => assert_eq!(error_kind(&e), "not-found", "{e}"),
                    (Some(Err(e)), Some(_)) => assert_eq!(error_kind(&e), "failed-precondition", "{e}"),
                    (Some(other), awaiting) => panic!("decide {awaiting:?}: {other:?}"),
                }
            }
            Action::Crash { gap } => {
                sim.takeover_gap_ms = u64::from(gap);
                sim.crash();
            }
            Action::Arm { pass, fault, gap } => {
                sim.takeover_gap_ms = u64::from(gap);
                sim.arm(usize::from(pass), fault);
            }
            Action::Retry => {
                if !client.in_doubt.is_empty() {
                    let d = client.in_doubt.remove(0);
                    deliver(&mut sim, &mut client, &tracker, d);
                }
            }
        }
        tracker.follow(&sim);
        check_refused(&sim, &tracker, faults, &known);
        check_always(&sim, &tracker);
    }

    // The client learns the answer of every delivery it is unsure of; then one more owner takes over
    // wherever the actions left the session, and the session runs to quiescence.
    sim.armed = None;
    while !client.in_doubt.is_empty() {
        let d = client.in_doubt.remove(0);
        deliver(&mut sim, &mut client, &tracker, d);
        tracker.follow(&sim);
    }
    // Long enough that every steer deadline still armed passes while no owner runs the session.
    sim.takeover_gap_ms = 1_000;
    sim.crash();
    quiesce(&mut sim);
    tracker.follow(&sim);
    check_always(&sim, &tracker);
    assert!(sim.driver.is_quiescent(), "not idle after settling: {:#?}", sim.render_all());
    assert_eq!(tracker.started, tracker.ended, "every turn is closed once the driver is idle");
    assert!(tracker.open_turn.is_none());
    for (id, f) in &tracker.fate {
        assert!(!matches!(f, Fate::Claimed { .. } | Fate::Owed { .. }), "{id} is still claimed while idle: {f:?}");
    }
    // Every acknowledged id has exactly one fate (admitted once, pending, discarded by a canceled splice,
    // or lost with the turn that claimed it) ...
    for id in client.accepted.keys().chain(&client.edited) {
        assert!(tracker.fate.contains_key(id), "acknowledged {id} vanished");
    }
    // ... and every id in the log was acknowledged, or is the answer a client never learned of an edit.
    for (id, f) in &tracker.fate {
        let known = client.accepted.contains_key(id)
            || client.edited.contains(id)
            || client.edits_in_doubt.contains(id)
            || tracker.system.contains(id);
        assert!(known, "{id} is in the log ({f:?}) but no client was told it was accepted");
    }
    // A new owner of a quiescent session has nothing to repair or resume.
    let len = sim.log.len();
    sim.crash();
    assert_eq!(sim.log.len(), len, "recovering a quiescent session wrote: {:#?}", &sim.log[len..]);
    assert!(sim.driver.is_quiescent());

    // Every when_idle resolved (at once, checked when it was sent, or right after the flip to idle),
    // unless a fault took its driver away first.
    let lines: Vec<String> = sim.recs.iter().filter(|r| !matches!(r, Rec::Op(_))).map(support::render).collect();
    for (id, immediate, faults) in client.waiters {
        match sim.reply(id) {
            Some(Ok(CommandReply::Idle(_))) => {}
            None => assert!(sim.faults.len() > faults, "when_idle {id} never resolved"),
            Some(Err(e)) => {
                assert!(sim.faults.len() > faults && error_kind(e) == "unavailable", "when_idle {id}: {e}");
                continue;
            }
            Some(Ok(other)) => panic!("when_idle {id}: {other:?}"),
        }
        if !immediate && sim.reply(id).is_some() {
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
    // Live statuses mirror the durable ones, except those of a group a crash struck before they went out.
    let cut: BTreeSet<u64> =
        sim.faults.iter().filter(|f| f.fault == Fault::Crash).flat_map(|f| f.group.iter().map(|e| e.seq)).collect();
    let live: Vec<(u64, Status)> = sim
        .live
        .iter()
        .filter_map(|e| match e.payload {
            LivePayload::Status { status } => Some((e.after_seq, status)),
            _ => None,
        })
        .collect();
    let published: Vec<(u64, Status)> =
        tracker.statuses.iter().filter(|(seq, _)| !cut.contains(seq)).copied().collect();
    assert_eq!(live, published);
    for e in &sim.live {
        let _ = render_live(e);
    }
    sim.check_full_fold();
}

/// Nothing of a refused append group is durable: no client message it inserted is in the log.
fn check_refused(sim: &Sim, tracker: &Tracker, faults: usize, known: &BTreeSet<String>) {
    for f in sim.faults[faults..].iter().filter(|f| f.fault != Fault::Crash) {
        for e in &f.group {
            let EventPayload::InboxSpliced(s) = &e.payload else { continue };
            for m in &s.inserted {
                // The goal system delivers its continuation again after a reload; no client does that.
                let client_message = !matches!(m.source, MessageSource::Goal { .. });
                if client_message && !known.contains(&m.id.0) {
                    let f = tracker.fate.get(&m.id.0);
                    assert!(f.is_none(), "{} of a refused append group is in the log: {f:?}", m.id);
                }
            }
        }
    }
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
    let Some(goal) = sim.driver.state().goals.current.as_ref().map(|g| &g.info) else { return };
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

/// Sends `d` and checks its answer against the log and what the client was told before.
fn deliver(sim: &mut Sim, client: &mut Client, tracker: &Tracker, d: Delivery) {
    let before = sim.log.len();
    let faults = sim.faults.len();
    let idle_before = sim.driver.running_turn().is_none() && sim.driver.state().status == Status::Idle;
    let last_turn_before = sim.driver.state().last_turn;
    let running_before = sim.driver.running_turn();
    let reply = sim.try_command(d.command());
    let faulted = sim.faults.len() > faults;
    let Some(reply) = answered(reply, faulted) else {
        client.in_doubt.push(d);
        return;
    };
    let id = d.message.id.0.clone();
    let (m, target, wakeup) = (d.message, d.target, d.wakeup);
    if let Some(a) = client.accepted.get(&id) {
        if a.message == m && a.target == target && a.wakeup == wakeup {
            match reply {
                Ok(CommandReply::Sent { seq, turn }) => {
                    assert_eq!((seq, turn), (a.seq, a.turn), "a retry of {id} returns the original acceptance")
                }
                other => panic!("retry of {id}: {other:?}"),
            }
            assert!(faulted || sim.log.len() == before, "a retry writes nothing");
        } else {
            match reply {
                Err(e) => assert_eq!(error_kind(&e), "already-exists", "{id}: {e}"),
                Ok(r) => panic!("{id} redelivered with other content or routing was accepted: {r:?}"),
            }
        }
        return;
    }
    // Inserted before, yet never acknowledged to this client: by an edit, or by an earlier attempt of this
    // delivery whose answer was lost. The fold reads an insert-only splice as a delivery into its list,
    // so the same delivery is a retry and gets that splice's acceptance (SPEC §2).
    let first_insert = sim.log[..before].iter().find_map(|e| match &e.payload {
        EventPayload::InboxSpliced(s) if s.inserted.iter().any(|i| i.id.0 == id) => Some((e.seq, s)),
        _ => None,
    });
    if let Some((seq, s)) = first_insert {
        assert!(tracker.fate.contains_key(&id));
        let same = s.outcome == SpliceOutcome::None
            && s.removed_count == 0
            && s.wake == wakeup
            && s.requested_target.unwrap_or(s.target) == target
            && s.inserted.contains(&m);
        match reply {
            Ok(CommandReply::Sent { seq: got, turn }) if same => {
                assert_eq!(got, seq, "a retry of {id} whose answer was lost returns its splice's seq");
                if let Some(t) = turn {
                    assert!(sim.log[seq as usize..].iter().any(|e| e.payload == EventPayload::TurnStart { turn: t }));
                }
                assert!(faulted || sim.log.len() == before, "a retry writes nothing");
                client.accepted.insert(id, Accepted { message: m, target, wakeup, seq, turn });
            }
            Err(e) if !same => assert_eq!(error_kind(&e), "already-exists", "{id}: {e}"),
            other => panic!("{id} inserted at seq {seq} ({s:?}), delivered again: {other:?}"),
        }
        return;
    }
    if let Some(expected) = d.expected_turn
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
            assert_eq!(s.deadline.is_some(), d.deadline.is_some(), "the splice records the steer's deadline");
        }
        other => panic!("reply seq {seq} is not a splice: {other:?}"),
    }
    // A waking delivery to an idle session opens a turn. An interrupt may find the session idle once its
    // cancel half has ended the turn at once (nothing was running: a call awaiting approval).
    let prefix = &sim.log[..seq as usize - 1];
    let idle_at_insert = prefix.iter().rev().find_map(|e| match e.payload {
        EventPayload::Status(s) => Some(s == Status::Idle),
        _ => None,
    });
    let turns = prefix.iter().filter(|e| matches!(e.payload, EventPayload::TurnStart { .. })).count() as u64;
    let expect_turn = (wakeup && idle_at_insert != Some(false)).then_some(turns + 1);
    assert_eq!(turn, expect_turn, "delivery {id}: the turn it opened");
    if idle_before {
        assert_eq!(turns, last_turn_before);
    } else {
        assert!(d.interrupt || turn.is_none(), "delivery {id} to a running session opened turn {turn:?}");
    }
    if let Some(t) = turn {
        assert!(sim.log[seq as usize..].iter().any(|e| e.payload == EventPayload::TurnStart { turn: t }));
    }
    client.accepted.insert(id, Accepted { message: m, target, wakeup, seq, turn });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_sessions_keep_every_invariant(case in case()) {
        run(case);
    }
}
