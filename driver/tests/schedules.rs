//! SPEC §15 scheduled deliveries and §16 labels against the sans-IO driver: a firing is a delivery with the
//! MessageId `<schedule_id>@<fire_unix_ms>` followed by `schedule/changed {fired}`; a new owner catches up
//! on a firing missed within `catchup_ms` and skips (and counts) one beyond it; bad schedules are refused
//! precisely and write nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;

use support::Sim;
use turnstile_driver::Limits;
use turnstile_model::{
    Command, CommandError, CommandReply, ContentBlock, Labeled, MessageSource, Preset, ScheduleSpec, Timing,
};

const MINUTE: u64 = 60_000;

fn spec(id: &str, timing: Timing, catchup_ms: u64) -> ScheduleSpec {
    ScheduleSpec {
        schedule_id: id.into(),
        preset: Preset::Followup,
        content: vec![ContentBlock::text("tick")],
        timing,
        not_after_ms: None,
        catchup_ms,
    }
}

fn every_minute(id: &str, catchup_ms: u64) -> ScheduleSpec {
    spec(id, Timing::Cron { expr: "* * * * *".into(), time_zone: "UTC".into() }, catchup_ms)
}

fn create(sim: &mut Sim, spec: ScheduleSpec) -> Result<CommandReply, CommandError> {
    sim.command(Command::CreateSchedule(Box::new(spec)))
}

fn invalid(result: Result<CommandReply, CommandError>) -> String {
    match result {
        Err(CommandError::InvalidArgument(m)) => m,
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
}

#[test]
fn a_cron_schedule_fires_each_minute_once_with_its_message_id() {
    let mut sim = Sim::new();
    sim.now = 1_000;
    create(&mut sim, every_minute("tick", 60_000)).unwrap();
    sim.expect(&["D schedule/changed created tick"]);
    assert_eq!(sim.driver.next_timer(), Some(MINUTE));
    sim.fire_timers(MINUTE - 1);
    sim.expect_nothing();
    sim.fire_timers(MINUTE + 3);
    sim.settle();
    let lines = sim.take();
    assert_eq!(lines[..2], ["D spliced next-turn 0 0 [tick@60000] wake", "L inserted tick@60000"], "{lines:#?}");
    assert!(lines.contains(&"D schedule/changed fired tick@60000".to_owned()), "{lines:#?}");
    assert!(lines.contains(&"D user/message tick@60000 1.1".to_owned()), "{lines:#?}");
    let (_, _, _, m) = sim.user_messages().pop().unwrap();
    assert_eq!(m.source, MessageSource::Schedule { schedule_id: "tick".into(), fire_unix_ms: MINUTE });
    assert_eq!(sim.driver.next_timer(), Some(2 * MINUTE));
    // Firing the timer again at the same time does nothing: the firing is recorded.
    sim.fire_timers(MINUTE + 5);
    sim.expect_nothing();
    let s = sim.driver.state().schedules.get("tick").unwrap().clone();
    assert_eq!((s.fired, s.missed, s.next_fire_ms), (1, 0, Some(2 * MINUTE)));
}

#[test]
fn a_one_shot_fires_once_and_is_gone() {
    let mut sim = Sim::new();
    sim.now = 1_000;
    let mut once = spec("once", Timing::At { at_ms: 3_000 }, 60_000);
    once.preset = Preset::Queue;
    create(&mut sim, once).unwrap();
    sim.take();
    sim.fire_timers(3_000);
    sim.expect(&["D spliced next-turn 0 0 [once@3000]", "L inserted once@3000", "D schedule/changed fired once@3000"]);
    assert!(sim.driver.state().schedules.is_empty());
    assert_eq!(sim.driver.next_timer(), None);
}

#[test]
fn a_new_owner_delivers_a_miss_within_catchup_and_skips_one_beyond() {
    let mut sim = Sim::new();
    sim.now = 1_000;
    create(&mut sim, every_minute("near", 60_000)).unwrap();
    create(&mut sim, every_minute("far", 1_000)).unwrap();
    sim.take();
    // The owner dies; the next one loads the log 5 s after the first minute.
    let mut next = Sim::recover(sim.log.clone(), Limits::default(), 2, MINUTE + 5_000);
    next.settle();
    let lines = next.lines();
    assert!(lines.contains(&"D schedule/changed fired near@60000".to_owned()), "{lines:#?}");
    assert!(lines.contains(&"D schedule/changed skipped far x1 to 60000".to_owned()), "{lines:#?}");
    assert!(!lines.iter().any(|l| l.contains("far@")), "the late firing is not delivered: {lines:#?}");
    let state = next.driver.state();
    assert_eq!(state.schedules.get("far").map(|s| (s.fired, s.missed)), Some((0, 1)));
    assert_eq!(state.schedules.get("near").map(|s| (s.fired, s.missed)), Some((1, 0)));
    // Ten minutes without an owner: the nine firings older than the window are counted in one event, the
    // one within it is delivered.
    let mut later = Sim::recover(next.log.clone(), Limits::default(), 3, 11 * MINUTE + 500);
    later.settle();
    let lines = later.lines();
    assert!(lines.contains(&"D schedule/changed skipped near x9 to 600000".to_owned()), "{lines:#?}");
    assert!(lines.contains(&"D schedule/changed fired near@660000".to_owned()), "{lines:#?}");
    // `far` (a 1 s window) is 500 ms late for the last minute: delivered too.
    assert!(lines.contains(&"D schedule/changed skipped far x9 to 600000".to_owned()), "{lines:#?}");
    assert!(lines.contains(&"D schedule/changed fired far@660000".to_owned()), "{lines:#?}");
}

#[test]
fn a_firing_delivered_before_a_crash_is_not_delivered_twice() {
    let mut sim = Sim::new();
    sim.now = 1_000;
    create(&mut sim, every_minute("tick", 60_000)).unwrap();
    sim.take();
    // The delivery of the first minute is durable; the owner dies before `schedule/changed {fired}`: what a
    // cut between append groups leaves.
    sim.fire_timers(MINUTE);
    let cut = sim
        .log
        .iter()
        .position(|e| matches!(e.payload, turnstile_model::EventPayload::ScheduleChanged(_)) && e.seq > 1)
        .unwrap();
    let log = sim.log[..cut].to_vec();
    let mut next = Sim::recover(log, Limits::default(), 2, MINUTE + 2_000);
    next.settle();
    let lines = next.lines();
    assert!(
        !lines.iter().any(|l| l.starts_with("D spliced") && l.contains("tick@60000 ")),
        "no second delivery: {lines:#?}"
    );
    assert!(lines.contains(&"D schedule/changed fired tick@60000".to_owned()), "{lines:#?}");
    let ids: Vec<String> = next.user_messages().into_iter().map(|(id, ..)| id).collect();
    assert_eq!(ids.iter().filter(|id| id.as_str() == "tick@60000").count(), 1, "{ids:?}");
}

#[test]
fn bad_schedules_are_refused_precisely_and_write_nothing() {
    let mut sim = Sim::new();
    sim.now = 10_000;
    let cron = |expr: &str, tz: &str| spec("s", Timing::Cron { expr: expr.into(), time_zone: tz.into() }, 60_000);
    let m = invalid(create(&mut sim, cron("0 25 * * *", "UTC")));
    assert!(m.contains("field 2 (hour)") && m.contains("0-23"), "{m}");
    let m = invalid(create(&mut sim, cron("0 9 * *", "UTC")));
    assert!(m.contains("4 fields; use 5"), "{m}");
    let m = invalid(create(&mut sim, cron("0 9 * * *", "Europe/Atlantis")));
    assert!(m.contains("\"Europe/Atlantis\" is not an IANA time zone"), "{m}");
    let m = invalid(create(&mut sim, spec("s", Timing::At { at_ms: 9_000 }, 60_000)));
    assert!(m.contains("1000 ms in the past"), "{m}");
    let m = invalid(create(&mut sim, spec("s@1", Timing::At { at_ms: 20_000 }, 60_000)));
    assert!(m.contains("'@'"), "{m}");
    assert!(sim.log.is_empty());

    create(&mut sim, spec("s", Timing::At { at_ms: 20_000 }, 60_000)).unwrap();
    // The same again is a retry; other content under the same id is refused.
    let again = create(&mut sim, spec("s", Timing::At { at_ms: 20_000 }, 60_000)).unwrap();
    assert!(matches!(again, CommandReply::Schedule { seq: 1, .. }), "{again:?}");
    let other = create(&mut sim, spec("s", Timing::At { at_ms: 30_000 }, 60_000));
    assert!(matches!(other, Err(CommandError::AlreadyExists(ref m)) if m.contains("other content")), "{other:?}");
    assert_eq!(sim.log.len(), 1);
    let missing = sim.command(Command::DeleteSchedule { schedule_id: "nope".into() });
    assert!(matches!(missing, Err(CommandError::NotFound(_))), "{missing:?}");
    sim.command(Command::DeleteSchedule { schedule_id: "s".into() }).unwrap();
    assert_eq!(sim.driver.next_timer(), None);
}

#[test]
fn labels_are_set_removed_and_a_repeat_writes_nothing() {
    let mut sim = Sim::new();
    let set = |pairs: &[(&str, &str)], removed: &[&str]| Labeled {
        set: pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>(),
        removed: removed.iter().map(|k| (*k).to_owned()).collect(),
    };
    sim.command(Command::SetLabels(set(&[("team", "blue"), ("env", "prod")], &[]))).unwrap();
    sim.expect(&["D session/labeled env=prod,team=blue -"]);
    sim.command(Command::SetLabels(set(&[("team", "blue")], &["gone"]))).unwrap();
    sim.expect_nothing();
    sim.command(Command::SetLabels(set(&[("team", "red")], &["env"]))).unwrap();
    sim.expect(&["D session/labeled team=red -env"]);
    assert_eq!(sim.driver.state().labels, BTreeMap::from([("team".to_owned(), "red".to_owned())]));
    let bad = sim.command(Command::SetLabels(set(&[("Team", "x")], &[])));
    assert!(matches!(bad, Err(CommandError::InvalidArgument(ref m)) if m.contains("'T'")), "{bad:?}");
}
