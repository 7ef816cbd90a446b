//! Scheduled deliveries (SPEC §15): what a schedule is, when it fires, and its fold.
//!
//! A schedule lives in its session's log: `schedule/changed` events create it, record each firing (or the
//! firings skipped because they were too late) and delete it, and [`Schedules`] folds them. The next firing
//! is a function of the log alone (the creation event's time, the last recorded firing, the cron pattern
//! and its time zone), so every reader and every later owner computes the same one. Cron patterns are
//! evaluated with `croner` in an IANA zone from `chrono-tz` (compiled in: nothing is read at run time, and
//! no clock is read here; the driver passes the time in).
//!
//! ```
//! use turnstile_model::schedule::{Timing, next_fire_after};
//! let every_minute = Timing::Cron { expr: "* * * * *".into(), time_zone: "UTC".into() };
//! assert_eq!(next_fire_after(&every_minute, 90_000), Some(120_000));
//! let once = Timing::At { at_ms: 5_000 };
//! assert_eq!(next_fire_after(&once, 0), Some(5_000));
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr as _;

use chrono::TimeZone as _;
use serde::{Deserialize, Serialize};

use crate::message::{ContentBlock, MessageId, MessageSource, Target, UserMessage};

/// Longest schedule id: the firing's MessageId `<schedule_id>@<fire_unix_ms>` must fit the 128 bytes of a
/// MessageId (`@` and up to 20 digits follow the id).
pub const MAX_SCHEDULE_ID_LEN: usize = 100;

/// How late a missed firing may still be delivered when no `catchup_ms` is given (SPEC §15).
pub const DEFAULT_CATCHUP_MS: u64 = 60_000;

/// The longest catch-up window accepted: a week.
pub const MAX_CATCHUP_MS: u64 = 7 * 24 * 3600 * 1000;

/// The most schedules one session holds.
pub const MAX_SCHEDULES_PER_SESSION: usize = 64;

/// Furthest ahead a one-shot `at_unix_ms` may be: ten years (of 365.25 days). A time beyond any plausible
/// use is a mistake (a unit error, a `u64::MAX` sentinel) that would otherwise sit in the log forever.
pub const MAX_AT_AHEAD_MS: u64 = 36_525 * 24 * 3600 * 100;

/// Missed firings counted one by one before the rest is skipped in one jump (a schedule whose session was
/// unowned for a long time); `missed` then counts at least this many.
pub const MAX_COUNTED_MISSES: u64 = 10_000;

/// Which delivery preset a firing uses (SPEC §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Preset {
    Followup,
    Queue,
    Steer,
    Inject,
}

impl Preset {
    /// The routing of the preset: `(target, wakeup)`.
    pub fn routing(self) -> (Target, bool) {
        match self {
            Self::Followup => (Target::NextTurn, true),
            Self::Queue => (Target::NextTurn, false),
            Self::Steer => (Target::NextStep, true),
            Self::Inject => (Target::NextStep, false),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Followup => "followup",
            Self::Queue => "queue",
            Self::Steer => "steer",
            Self::Inject => "inject",
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a schedule fires.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Timing {
    /// Once, at this Unix time in ms; the schedule is deleted after it fires.
    At { at_ms: u64 },
    /// A 5-field cron pattern (minute hour day-of-month month day-of-week) in an IANA time zone.
    Cron { expr: String, time_zone: String },
}

/// A schedule as created: everything `CreateSchedule` names.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// The caller's id, unique in the session: `[A-Za-z0-9_-]{1,100}`.
    pub schedule_id: String,
    pub preset: Preset,
    /// What each firing delivers; its MessageId and source are the firing's own.
    pub content: Vec<ContentBlock>,
    pub timing: Timing,
    /// No firing after this Unix time (ms); the schedule ends then.
    pub not_after_ms: Option<u64>,
    /// A firing this late or later (a new owner catching up) is skipped and counted instead of delivered.
    pub catchup_ms: u64,
}

impl ScheduleSpec {
    /// Checks everything that does not depend on the time: the id, the pattern, the zone, the window and
    /// the content (against `max_message_bytes`).
    pub fn validate(&self, max_message_bytes: usize) -> Result<(), ScheduleError> {
        validate_schedule_id(&self.schedule_id)?;
        if let Timing::Cron { expr, time_zone } = &self.timing {
            parse_cron(expr)?;
            parse_time_zone(time_zone)?;
        }
        if self.catchup_ms == 0 || self.catchup_ms > MAX_CATCHUP_MS {
            return Err(ScheduleError::Catchup { catchup_ms: self.catchup_ms });
        }
        self.message(0).validate(max_message_bytes).map_err(|e| ScheduleError::Message(e.to_string()))
    }

    /// The message of the firing at `fire_ms`: MessageId `<schedule_id>@<fire_ms>`, source
    /// `schedule {schedule_id, fire_unix_ms}` (SPEC §15).
    pub fn message(&self, fire_ms: u64) -> UserMessage {
        UserMessage {
            id: MessageId(format!("{}@{fire_ms}", self.schedule_id)),
            content: self.content.as_slice().into(),
            source: MessageSource::Schedule { schedule_id: self.schedule_id.clone(), fire_unix_ms: fire_ms },
        }
    }

    /// The first firing of a schedule created at `created_ms`, if it has one.
    pub fn first_fire(&self, created_ms: u64) -> Option<u64> {
        let first = match self.timing {
            Timing::At { at_ms } => Some(at_ms),
            Timing::Cron { .. } => next_fire_after(&self.timing, created_ms),
        };
        first.filter(|t| self.not_after_ms.is_none_or(|end| *t <= end))
    }

    /// The firing after the one at `fire_ms`, if any.
    pub fn fire_after(&self, fire_ms: u64) -> Option<u64> {
        match self.timing {
            Timing::At { .. } => None,
            Timing::Cron { .. } => {
                next_fire_after(&self.timing, fire_ms).filter(|t| self.not_after_ms.is_none_or(|end| *t <= end))
            }
        }
    }
}

/// The first firing of `timing` strictly after `after_ms` (for `At`, its time if it is later). `None` when
/// there is none (or the pattern or zone does not parse: validated specs always do).
pub fn next_fire_after(timing: &Timing, after_ms: u64) -> Option<u64> {
    match timing {
        Timing::At { at_ms } => (*at_ms > after_ms).then_some(*at_ms),
        Timing::Cron { expr, time_zone } => {
            let cron = parse_cron(expr).ok()?;
            let tz = parse_time_zone(time_zone).ok()?;
            let after = tz.timestamp_millis_opt(i64::try_from(after_ms).ok()?).single()?;
            let next = cron.find_next_occurrence(&after, false).ok()?;
            u64::try_from(next.timestamp_millis()).ok()
        }
    }
}

/// The schedule id rule: session-id characters, 1 to [`MAX_SCHEDULE_ID_LEN`].
pub fn validate_schedule_id(id: &str) -> Result<(), ScheduleError> {
    if id.is_empty() || id.len() > MAX_SCHEDULE_ID_LEN {
        return Err(ScheduleError::IdLength { len: id.len() });
    }
    if let Some(c) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_')) {
        return Err(ScheduleError::IdChar { id: id.to_owned(), c });
    }
    Ok(())
}

/// An IANA time zone name (`Europe/Paris`, `UTC`).
pub fn parse_time_zone(name: &str) -> Result<chrono_tz::Tz, ScheduleError> {
    chrono_tz::Tz::from_str(name).map_err(|_| ScheduleError::TimeZone { name: name.to_owned() })
}

/// The five fields of a cron pattern, with what each allows.
const FIELDS: [(&str, u32, u32, &[&str]); 5] = [
    ("minute", 0, 59, &[]),
    ("hour", 0, 23, &[]),
    ("day-of-month", 1, 31, &[]),
    ("month", 1, 12, &["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]),
    ("day-of-week", 0, 7, &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]),
];

/// Parses a 5-field cron pattern, checking each field first so an error names the field and what it
/// allows (croner's own messages do not).
pub fn parse_cron(expr: &str) -> Result<croner::Cron, ScheduleError> {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(ScheduleError::CronFields { expr: expr.to_owned(), count: fields.len() });
    }
    for (position, (field, (name, min, max, names))) in fields.iter().zip(FIELDS).enumerate() {
        check_field(field, min, max, names).map_err(|detail| ScheduleError::CronField {
            expr: expr.to_owned(),
            position: position + 1,
            field: name,
            value: (*field).to_owned(),
            detail,
            allowed: allowed(min, max, names),
        })?;
    }
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Disallowed)
        .year(croner::parser::Year::Disallowed)
        .build()
        .parse(expr)
        .map_err(|e| ScheduleError::Cron { expr: expr.to_owned(), detail: e.to_string() })
}

fn allowed(min: u32, max: u32, names: &[&str]) -> String {
    let mut text = format!("* or numbers {min}-{max}");
    if let (Some(first), Some(last)) = (names.first(), names.last()) {
        text.push_str(&format!(" or names {first}-{last}"));
    }
    text + ", as lists (a,b), ranges (a-b) and steps (*/n, a-b/n)"
}

/// One field: comma-separated items, each `*`, a value or a range `a-b`, optionally with `/step`.
fn check_field(field: &str, min: u32, max: u32, names: &[&str]) -> Result<(), String> {
    let value = |text: &str| -> Result<u32, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(text)) {
            // Months are named from 1, weekdays from 0 (SUN).
            return Ok(i as u32 + min);
        }
        let n: u32 = text.parse().map_err(|_| format!("{text:?} is not a number"))?;
        if n < min || n > max {
            return Err(format!("{n} is outside {min}-{max}"));
        }
        Ok(n)
    };
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (item, None),
        };
        if let Some(step) = step {
            match step.parse::<u32>() {
                Ok(n) if n >= 1 && n <= max.max(1) => {}
                _ => return Err(format!("step {step:?} must be a number from 1 to {}", max.max(1))),
            }
        }
        match range {
            "*" => {}
            "" => return Err(format!("{item:?} has an empty part")),
            _ => match range.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (value(a)?, value(b)?);
                    if a > b {
                        return Err(format!("range {range} runs backwards"));
                    }
                }
                None => {
                    value(range)?;
                }
            },
        }
    }
    Ok(())
}

/// A schedule as its session's log has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub spec: ScheduleSpec,
    /// When it fires next; `None` never happens in the fold (a schedule with no next firing is deleted).
    pub next_fire_ms: Option<u64>,
    /// Firings delivered.
    pub fired: u64,
    /// Firings skipped: too late when a new owner caught up, or refused by the session (its inbox full).
    pub missed: u64,
}

/// `schedule/changed`: one change to one of the session's schedules (SPEC §15).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScheduleChange {
    /// `CreateSchedule`: the first firing is the first one after this event's time (`at` for a one-shot).
    Created(ScheduleSpec),
    /// `DeleteSchedule` (a one-shot that fired, or a schedule past `not_after`, ends without one).
    Deleted { schedule_id: String },
    /// The firing at `fire_ms` was delivered (its delivery precedes this event in the log).
    Fired { schedule_id: String, fire_ms: u64 },
    /// `count` firings through the one at `upto_fire_ms` were skipped.
    Skipped { schedule_id: String, upto_fire_ms: u64, count: u64 },
}

impl ScheduleChange {
    pub fn schedule_id(&self) -> &str {
        match self {
            Self::Created(spec) => &spec.schedule_id,
            Self::Deleted { schedule_id } | Self::Fired { schedule_id, .. } | Self::Skipped { schedule_id, .. } => {
                schedule_id
            }
        }
    }
}

/// A `schedule/changed` that does not fit the schedules folded so far.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleFoldError {
    #[error("schedule {0} already exists")]
    Exists(String),
    #[error("schedule {0} does not exist")]
    Unknown(String),
    #[error("schedule {schedule_id} records firing {fire_ms}, but its next firing is {next:?}")]
    NotDue { schedule_id: String, fire_ms: u64, next: Option<u64> },
}

/// The session's schedules, by id (the fold of its `schedule/changed` events).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedules {
    by_id: BTreeMap<String, Schedule>,
}

impl Schedules {
    pub fn get(&self, schedule_id: &str) -> Option<&Schedule> {
        self.by_id.get(schedule_id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Schedule> {
        self.by_id.values()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The earliest next firing of any schedule.
    pub fn next_fire(&self) -> Option<u64> {
        self.by_id.values().filter_map(|s| s.next_fire_ms).min()
    }

    /// Checks that `change`, written at `time_ms`, can follow, without applying it.
    pub fn check(&self, change: &ScheduleChange) -> Result<(), ScheduleFoldError> {
        let id = change.schedule_id();
        match change {
            ScheduleChange::Created(_) if self.by_id.contains_key(id) => Err(ScheduleFoldError::Exists(id.into())),
            ScheduleChange::Created(_) => Ok(()),
            ScheduleChange::Deleted { .. } => {
                self.by_id.get(id).map(|_| ()).ok_or_else(|| ScheduleFoldError::Unknown(id.into()))
            }
            ScheduleChange::Fired { fire_ms, .. } | ScheduleChange::Skipped { upto_fire_ms: fire_ms, .. } => {
                let schedule = self.by_id.get(id).ok_or_else(|| ScheduleFoldError::Unknown(id.into()))?;
                match schedule.next_fire_ms {
                    Some(next) if next <= *fire_ms => Ok(()),
                    next => Err(ScheduleFoldError::NotDue { schedule_id: id.into(), fire_ms: *fire_ms, next }),
                }
            }
        }
    }

    /// Applies a checked `change` written at `time_ms`. A schedule left with no next firing (a one-shot
    /// that fired, a cron past `not_after`) is gone.
    pub fn apply(&mut self, change: &ScheduleChange, time_ms: u64) {
        let id = change.schedule_id().to_owned();
        match change {
            ScheduleChange::Created(spec) => {
                let next_fire_ms = spec.first_fire(time_ms);
                self.by_id.insert(id.clone(), Schedule { spec: spec.clone(), next_fire_ms, fired: 0, missed: 0 });
            }
            ScheduleChange::Deleted { .. } => {
                self.by_id.remove(&id);
            }
            ScheduleChange::Fired { fire_ms, .. } => {
                if let Some(s) = self.by_id.get_mut(&id) {
                    s.fired += 1;
                    s.next_fire_ms = s.spec.fire_after(*fire_ms);
                }
            }
            ScheduleChange::Skipped { upto_fire_ms, count, .. } => {
                if let Some(s) = self.by_id.get_mut(&id) {
                    s.missed = s.missed.saturating_add(*count);
                    s.next_fire_ms = s.spec.fire_after(*upto_fire_ms);
                }
            }
        }
        if self.by_id.get(&id).is_some_and(|s| s.next_fire_ms.is_none()) {
            self.by_id.remove(&id);
        }
    }
}

/// A schedule that cannot be created, with what to do instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule_id must be 1 to {MAX_SCHEDULE_ID_LEN} characters, got {len}")]
    IdLength { len: usize },
    #[error("schedule_id {id:?} has the character {c:?}; use only A-Z, a-z, 0-9, '-' and '_'")]
    IdChar { id: String, c: char },
    #[error(
        "cron {expr:?} has {count} fields; use 5: minute hour day-of-month month day-of-week (e.g. \"0 9 * * MON-FRI\")"
    )]
    CronFields { expr: String, count: usize },
    #[error("cron {expr:?} field {position} ({field}) {value:?}: {detail}; allowed: {allowed}")]
    CronField { expr: String, position: usize, field: &'static str, value: String, detail: String, allowed: String },
    #[error("cron {expr:?} is not valid: {detail}")]
    Cron { expr: String, detail: String },
    #[error(
        "time_zone {name:?} is not an IANA time zone; use a name like \"UTC\", \"Europe/Paris\" or \"America/New_York\""
    )]
    TimeZone { name: String },
    #[error(
        "catchup_ms {catchup_ms} must be 1 to {MAX_CATCHUP_MS} (a week); leave it 0 for the default {DEFAULT_CATCHUP_MS}"
    )]
    Catchup { catchup_ms: u64 },
    #[error("message: {0}")]
    Message(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cron(expr: &str, tz: &str) -> Timing {
        Timing::Cron { expr: expr.into(), time_zone: tz.into() }
    }

    #[test]
    fn cron_fires_on_minute_boundaries_in_its_zone() {
        assert_eq!(next_fire_after(&cron("* * * * *", "UTC"), 0), Some(60_000));
        assert_eq!(next_fire_after(&cron("* * * * *", "UTC"), 60_000), Some(120_000));
        // 09:00 in Paris on 1970-01-01 is 08:00 UTC.
        assert_eq!(next_fire_after(&cron("0 9 * * *", "Europe/Paris"), 0), Some(8 * 3600 * 1000));
    }

    #[test]
    fn bad_cron_names_the_field_and_what_it_allows() {
        let e = parse_cron("61 * * * *").unwrap_err().to_string();
        assert!(e.contains("field 1 (minute)") && e.contains("0-59"), "{e}");
        let e = parse_cron("* * * FOO *").unwrap_err().to_string();
        assert!(e.contains("field 4 (month)") && e.contains("JAN-DEC"), "{e}");
        let e = parse_cron("* * *").unwrap_err().to_string();
        assert!(e.contains("has 3 fields; use 5"), "{e}");
        let e = parse_cron("*/0 * * * *").unwrap_err().to_string();
        assert!(e.contains("step"), "{e}");
        assert!(parse_cron("*/5 9-17 * JAN,MAR mon-fri").is_ok());
        let e = parse_time_zone("Mars/Olympus").unwrap_err().to_string();
        assert!(e.contains("IANA"), "{e}");
    }

    #[test]
    fn a_one_shot_is_gone_after_its_firing_and_a_cron_moves_on() {
        let spec = |timing| ScheduleSpec {
            schedule_id: "s".into(),
            preset: Preset::Followup,
            content: vec![ContentBlock::text("hi")],
            timing,
            not_after_ms: None,
            catchup_ms: DEFAULT_CATCHUP_MS,
        };
        let mut schedules = Schedules::default();
        schedules.apply(&ScheduleChange::Created(spec(Timing::At { at_ms: 5_000 })), 1_000);
        assert_eq!(schedules.next_fire(), Some(5_000));
        let fired = ScheduleChange::Fired { schedule_id: "s".into(), fire_ms: 5_000 };
        schedules.check(&fired).unwrap();
        schedules.apply(&fired, 5_001);
        assert!(schedules.is_empty());

        schedules.apply(&ScheduleChange::Created(spec(cron("* * * * *", "UTC"))), 1_000);
        let early = ScheduleChange::Fired { schedule_id: "s".into(), fire_ms: 59_999 };
        assert!(schedules.check(&early).is_err());
        schedules.apply(&ScheduleChange::Skipped { schedule_id: "s".into(), upto_fire_ms: 120_000, count: 2 }, 130_000);
        let s = schedules.get("s").unwrap();
        assert_eq!((s.next_fire_ms, s.missed, s.fired), (Some(180_000), 2, 0));
        assert_eq!(spec(cron("* * * * *", "UTC")).message(60_000).id.as_str(), "s@60000");
    }
}
