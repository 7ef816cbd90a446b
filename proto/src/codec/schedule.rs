//! Schedules (SPEC §15) and labels (SPEC §16): the `schedule/changed` and `session/labeled` payloads, the
//! spec a `CreateSchedule` names and the `Schedule` reads report.

use crate::v1 as pb;
use crate::v1::schedule_changed::Change;
use crate::v1::schedule_spec::Timing as PbTiming;
use turnstile_model::labels::Labeled;
use turnstile_model::message::SessionRef;
use turnstile_model::schedule::{Preset, Schedule, ScheduleChange, ScheduleSpec, Timing, validate_schedule_id};

use super::error::{CodecError, index, join};
use super::message::{content_block_at, encode_content_block, encode_session_ref};

const PRESETS: &str = "use SCHEDULE_PRESET_FOLLOWUP, _QUEUE, _STEER or _INJECT";

pub fn encode_preset(preset: Preset) -> pb::SchedulePreset {
    match preset {
        Preset::Followup => pb::SchedulePreset::Followup,
        Preset::Queue => pb::SchedulePreset::Queue,
        Preset::Steer => pb::SchedulePreset::Steer,
        Preset::Inject => pb::SchedulePreset::Inject,
    }
}

/// A preset at `path`; UNSPECIFIED is refused (a schedule always says how it delivers).
pub fn preset_at(raw: i32, path: &str) -> Result<Preset, CodecError> {
    match pb::SchedulePreset::try_from(raw) {
        Ok(pb::SchedulePreset::Followup) => Ok(Preset::Followup),
        Ok(pb::SchedulePreset::Queue) => Ok(Preset::Queue),
        Ok(pb::SchedulePreset::Steer) => Ok(Preset::Steer),
        Ok(pb::SchedulePreset::Inject) => Ok(Preset::Inject),
        Ok(pb::SchedulePreset::Unspecified) => Err(CodecError::invalid(path, format!("is unspecified; {PRESETS}"))),
        Err(_) => Err(CodecError::invalid(path, format!("{raw} is not a schedule preset; {PRESETS}"))),
    }
}

pub fn encode_schedule_spec(spec: &ScheduleSpec) -> pb::ScheduleSpec {
    let (timing, time_zone) = match &spec.timing {
        Timing::At { at_ms } => (PbTiming::AtUnixMs(*at_ms), String::new()),
        Timing::Cron { expr, time_zone } => (PbTiming::Cron(expr.clone()), time_zone.clone()),
    };
    pb::ScheduleSpec {
        schedule_id: spec.schedule_id.clone(),
        preset: encode_preset(spec.preset).into(),
        content: spec.content.iter().map(encode_content_block).collect(),
        timing: Some(timing),
        time_zone,
        not_after_unix_ms: spec.not_after_ms,
        catchup_ms: spec.catchup_ms,
    }
}

/// The inverse of [`encode_schedule_spec`] at `path`: structure only (the id's characters, a timing, a
/// preset); the pattern, zone and content are checked by [`ScheduleSpec::validate`] where the limits are
/// known.
pub fn schedule_spec_at(spec: pb::ScheduleSpec, path: &str) -> Result<ScheduleSpec, CodecError> {
    validate_schedule_id(&spec.schedule_id)
        .map_err(|e| CodecError::invalid(join(path, "schedule_id"), e.to_string()))?;
    let timing = match spec.timing {
        Some(PbTiming::AtUnixMs(at_ms)) => Timing::At { at_ms },
        Some(PbTiming::Cron(expr)) => {
            Timing::Cron { expr, time_zone: if spec.time_zone.is_empty() { "UTC".into() } else { spec.time_zone } }
        }
        None => return Err(CodecError::missing(join(path, "timing"), "set at_unix_ms or cron")),
    };
    let content = spec
        .content
        .into_iter()
        .enumerate()
        .map(|(i, b)| content_block_at(b, &index(&join(path, "content"), i)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ScheduleSpec {
        schedule_id: spec.schedule_id,
        preset: preset_at(spec.preset, &join(path, "preset"))?,
        content,
        timing,
        not_after_ms: spec.not_after_unix_ms,
        catchup_ms: spec.catchup_ms,
    })
}

pub fn encode_schedule_change(change: &ScheduleChange) -> pb::ScheduleChanged {
    let change = match change {
        ScheduleChange::Created(spec) => Change::Created(encode_schedule_spec(spec)),
        ScheduleChange::Deleted { schedule_id } => Change::Deleted(schedule_id.clone()),
        ScheduleChange::Fired { schedule_id, fire_ms } => {
            Change::Fired(pb::ScheduleFired { schedule_id: schedule_id.clone(), fire_unix_ms: *fire_ms })
        }
        ScheduleChange::Skipped { schedule_id, upto_fire_ms, count } => Change::Skipped(pb::ScheduleSkipped {
            schedule_id: schedule_id.clone(),
            upto_fire_unix_ms: *upto_fire_ms,
            count: *count,
        }),
    };
    pb::ScheduleChanged { change: Some(change) }
}

pub fn schedule_change_at(change: pb::ScheduleChanged, path: &str) -> Result<ScheduleChange, CodecError> {
    let id_at = |id: String, field: &str| -> Result<String, CodecError> {
        validate_schedule_id(&id).map_err(|e| CodecError::invalid(join(path, field), e.to_string()))?;
        Ok(id)
    };
    Ok(match change.change {
        Some(Change::Created(spec)) => ScheduleChange::Created(schedule_spec_at(spec, &join(path, "created"))?),
        Some(Change::Deleted(id)) => ScheduleChange::Deleted { schedule_id: id_at(id, "deleted")? },
        Some(Change::Fired(f)) => {
            ScheduleChange::Fired { schedule_id: id_at(f.schedule_id, "fired.schedule_id")?, fire_ms: f.fire_unix_ms }
        }
        Some(Change::Skipped(s)) => ScheduleChange::Skipped {
            schedule_id: id_at(s.schedule_id, "skipped.schedule_id")?,
            upto_fire_ms: s.upto_fire_unix_ms,
            count: s.count,
        },
        None => return Err(CodecError::missing(path, "set one of created, deleted, fired or skipped")),
    })
}

pub fn encode_labeled(labeled: &Labeled) -> pb::SessionLabeled {
    pb::SessionLabeled {
        set: labeled.set.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        removed: labeled.removed.clone(),
    }
}

/// A `session/labeled` at `path`; the keys and values are checked against the rules here, since a log
/// may hold only what `SetLabels` accepts.
pub fn labeled_at(labeled: pb::SessionLabeled, path: &str) -> Result<Labeled, CodecError> {
    let labeled = Labeled { set: labeled.set.into_iter().collect(), removed: labeled.removed };
    turnstile_model::labels::check_change(&Default::default(), &labeled)
        .map_err(|e| CodecError::invalid(path, e.to_string()))?;
    Ok(labeled)
}

/// The public `Schedule` of `session`'s schedule.
pub fn encode_schedule(session: &SessionRef, schedule: &Schedule) -> pb::Schedule {
    let spec = &schedule.spec;
    let (at_unix_ms, cron, time_zone) = match &spec.timing {
        Timing::At { at_ms } => (*at_ms, String::new(), String::new()),
        Timing::Cron { expr, time_zone } => (0, expr.clone(), time_zone.clone()),
    };
    pb::Schedule {
        session: Some(encode_session_ref(session)),
        schedule_id: spec.schedule_id.clone(),
        preset: encode_preset(spec.preset).into(),
        message: Some(pb::UserMessage {
            id: String::new(),
            content: spec.content.iter().map(encode_content_block).collect(),
            source: None,
        }),
        at_unix_ms,
        cron,
        time_zone,
        next_fire_unix_ms: schedule.next_fire_ms,
        fired: schedule.fired,
        missed: schedule.missed,
        not_after_unix_ms: spec.not_after_ms,
        catchup_ms: spec.catchup_ms,
    }
}
