//! Scheduled deliveries (SPEC §15) and labels (SPEC §16): driver timers with time as an input, like steer
//! deadlines.
//!
//! A schedule's next firing is part of the fold ([`SessionState::schedules`](turnstile_model::SessionState)),
//! so [`Driver::next_timer`] covers it and a new owner re-arms it from the log. At each due firing the
//! driver delivers the schedule's message with its preset, MessageId `<schedule_id>@<fire_unix_ms>` and
//! source `schedule {…}`, then records `schedule/changed {fired}`. A crash between the two is harmless: the
//! next owner fires the same firing again, and the delivery of an id the session already accepted is a
//! retry that writes nothing (SPEC §2), so each firing is delivered exactly once. A firing a new owner finds
//! `catchup_ms` late or later is skipped and counted (`schedule/changed {skipped}`) instead.

use turnstile_model::labels::check_change;
use turnstile_model::schedule::{MAX_AT_AHEAD_MS, MAX_COUNTED_MISSES, MAX_SCHEDULES_PER_SESSION, Timing};
use turnstile_model::{CommandError, CommandReply, EventPayload, Labeled, Schedule, ScheduleChange, ScheduleSpec};

use super::Driver;
use super::commands::Position;

impl Driver {
    /// `CreateSchedule`: validated (the time is this input's), then one `schedule/changed {created}`. The
    /// same id with the same spec is a retry and answers the schedule as it is.
    pub(super) fn create_schedule(&mut self, spec: ScheduleSpec) -> Result<CommandReply, CommandError> {
        let session = &self.state.session;
        if let Some(existing) = self.state.schedules.get(&spec.schedule_id) {
            if existing.spec == spec {
                return Ok(self.schedule_reply(existing.clone()));
            }
            return Err(CommandError::AlreadyExists(format!(
                "session {session} already has schedule {} with other content; delete it first, or use another \
                 schedule_id",
                spec.schedule_id
            )));
        }
        spec.validate(self.limits.max_message_bytes).map_err(|e| CommandError::InvalidArgument(e.to_string()))?;
        if let Timing::At { at_ms } = spec.timing
            && at_ms <= self.now_ms
        {
            return Err(CommandError::InvalidArgument(format!(
                "at_unix_ms {at_ms} is {} ms in the past (the server's time is {}); give a time in the future",
                self.now_ms - at_ms,
                self.now_ms
            )));
        }
        if let Timing::At { at_ms } = spec.timing
            && at_ms - self.now_ms > MAX_AT_AHEAD_MS
        {
            return Err(CommandError::InvalidArgument(format!(
                "at_unix_ms {at_ms} is more than 10 years ahead (the server's time is {}); give a time before {}",
                self.now_ms,
                self.now_ms.saturating_add(MAX_AT_AHEAD_MS)
            )));
        }
        if spec.first_fire(self.now_ms).is_none() {
            return Err(CommandError::InvalidArgument(format!(
                "schedule {} would never fire (no firing of its pattern comes before not_after_unix_ms {:?}); \
                 check the pattern and not_after_unix_ms",
                spec.schedule_id, spec.not_after_ms
            )));
        }
        if self.state.schedules.len() >= MAX_SCHEDULES_PER_SESSION {
            return Err(CommandError::ResourceExhausted(format!(
                "session {session} has {MAX_SCHEDULES_PER_SESSION} schedules, the most one session may have; delete \
                 one first"
            )));
        }
        let schedule_id = spec.schedule_id.clone();
        self.write(EventPayload::ScheduleChanged(ScheduleChange::Created(spec)));
        let schedule = self.state.schedules.get(&schedule_id).cloned().ok_or_else(|| {
            CommandError::Internal(format!("schedule {schedule_id} is not in the fold after its creation"))
        })?;
        Ok(self.schedule_reply(schedule))
    }

    /// `DeleteSchedule`: one `schedule/changed {deleted}`; answers the schedule as it was.
    pub(super) fn delete_schedule(&mut self, schedule_id: &str) -> Result<CommandReply, CommandError> {
        let Some(mut schedule) = self.state.schedules.get(schedule_id).cloned() else {
            return Err(CommandError::NotFound(format!(
                "session {} has no schedule {schedule_id:?}; ListSchedules shows the ones it has (a one-shot \
                 schedule is gone once it fired)",
                self.state.session
            )));
        };
        self.write(EventPayload::ScheduleChanged(ScheduleChange::Deleted { schedule_id: schedule_id.to_owned() }));
        schedule.next_fire_ms = None;
        Ok(self.schedule_reply(schedule))
    }

    fn schedule_reply(&self, schedule: Schedule) -> CommandReply {
        CommandReply::Schedule { seq: self.state.last_seq, schedule: Box::new(schedule) }
    }

    /// Fires every schedule firing due at `now` (earliest first), or skips the ones beyond their catch-up
    /// window. A draining driver fires nothing: the next owner does.
    pub(super) fn fire_schedules(&mut self, now: u64) {
        if self.draining {
            return;
        }
        // Each round takes the earliest due firing, so two schedules due together fire in time order.
        while let Some((fire_ms, schedule_id)) = self
            .state
            .schedules
            .iter()
            .filter_map(|s| s.next_fire_ms.filter(|t| *t <= now).map(|t| (t, s.spec.schedule_id.clone())))
            .min()
        {
            let Some(schedule) = self.state.schedules.get(&schedule_id).cloned() else { break };
            let before = self.state.last_seq;
            if now - fire_ms >= schedule.spec.catchup_ms {
                self.skip_missed(&schedule, fire_ms, now);
            } else {
                self.fire(&schedule, fire_ms);
            }
            if self.state.last_seq == before {
                // Nothing could be written (a poisoned driver): stop rather than loop.
                break;
            }
        }
    }

    /// Delivers the firing at `fire_ms`, then records it; a delivery the session refuses is a miss.
    fn fire(&mut self, schedule: &Schedule, fire_ms: u64) {
        let spec = &schedule.spec;
        let (target, wakeup) = spec.preset.routing();
        let schedule_id = spec.schedule_id.clone();
        match self.deliver(spec.message(fire_ms), target, wakeup, None, None, Position::Tail) {
            Ok(_) => {
                self.write(EventPayload::ScheduleChanged(ScheduleChange::Fired { schedule_id, fire_ms }));
            }
            Err(e) => {
                tracing::warn!(session = %self.state.session, schedule = %schedule_id, fire_ms, error = %e,
                    "a schedule's firing was refused by the session; counted as missed");
                self.write(EventPayload::ScheduleChanged(ScheduleChange::Skipped {
                    schedule_id,
                    upto_fire_ms: fire_ms,
                    count: 1,
                }));
            }
        }
    }

    /// Skips the firings from `first` that are at least `catchup_ms` late at `now`, in one event of at most
    /// [`MAX_COUNTED_MISSES`] (the caller's loop writes another for the rest of a longer gap).
    fn skip_missed(&mut self, schedule: &Schedule, first: u64, now: u64) {
        let spec = &schedule.spec;
        let latest_late = now.saturating_sub(spec.catchup_ms);
        let (mut upto, mut count) = (first, 1u64);
        while count < MAX_COUNTED_MISSES
            && let Some(next) = spec.fire_after(upto).filter(|t| *t <= latest_late)
        {
            upto = next;
            count += 1;
        }
        tracing::info!(session = %self.state.session, schedule = %spec.schedule_id, count, upto_fire_ms = upto,
            catchup_ms = spec.catchup_ms, "schedule firings missed beyond the catch-up window; skipped");
        self.write(EventPayload::ScheduleChanged(ScheduleChange::Skipped {
            schedule_id: spec.schedule_id.clone(),
            upto_fire_ms: upto,
            count,
        }));
    }

    /// `SetLabels` (SPEC §16): one `session/labeled` with what changes; nothing when nothing would.
    pub(super) fn set_labels(&mut self, change: Labeled) -> Result<CommandReply, CommandError> {
        check_change(&self.state.labels, &change).map_err(|e| CommandError::InvalidArgument(e.to_string()))?;
        // Only what changes is recorded: a repeated SetLabels writes nothing.
        let set: std::collections::BTreeMap<String, String> =
            change.set.into_iter().filter(|(k, v)| self.state.labels.get(k) != Some(v)).collect();
        let removed: Vec<String> = change.removed.into_iter().filter(|k| self.state.labels.contains_key(k)).collect();
        if set.is_empty() && removed.is_empty() {
            return Ok(CommandReply::Written { seq: self.state.last_seq });
        }
        let seq = self.write(EventPayload::SessionLabeled(Labeled { set, removed }));
        Ok(CommandReply::Written { seq })
    }
}
