//! Schedules (SPEC §15) and labels (SPEC §16) at the gateway: requests become commands for the session's
//! owner (which validates them against the time and its limits), reads are folds of the log.

use tonic::Status;
use turnstile_model::labels::Labeled;
use turnstile_model::{Command, CommandReply, SessionRef};
use turnstile_proto::codec::schedule::{encode_schedule, schedule_spec_at};
use turnstile_proto::v1 as pb;

use crate::service::{Gateway, page_token, parse_page_token, unexpected};
use crate::{read, status};

impl Gateway {
    /// `CreateSchedule`: the request's fields as the spec the driver stores.
    pub(crate) async fn create_schedule(&self, req: pb::CreateScheduleRequest) -> Result<pb::Schedule, Status> {
        let session = self.session(req.session)?;
        let timing = req.timing.map(|t| match t {
            pb::create_schedule_request::Timing::AtUnixMs(at) => pb::schedule_spec::Timing::AtUnixMs(at),
            pb::create_schedule_request::Timing::Cron(expr) => pb::schedule_spec::Timing::Cron(expr),
        });
        if !req.time_zone.is_empty() && matches!(timing, Some(pb::schedule_spec::Timing::AtUnixMs(_))) {
            return Err(Status::invalid_argument(
                "time_zone: is set with at_unix_ms; a time zone only applies to cron (at_unix_ms is absolute)",
            ));
        }
        let message = req
            .message
            .ok_or_else(|| Status::invalid_argument("message: is missing; set the content each firing delivers"))?;
        let raw = pb::ScheduleSpec {
            schedule_id: req.schedule_id,
            preset: req.preset,
            content: message.content,
            timing,
            time_zone: req.time_zone,
            not_after_unix_ms: req.not_after_unix_ms,
            catchup_ms: if req.catchup_ms == 0 {
                turnstile_model::schedule::DEFAULT_CATCHUP_MS
            } else {
                req.catchup_ms
            },
        };
        // Structure here; the pattern, zone, content and time are the driver's to check.
        let spec = schedule_spec_at(raw, "").map_err(status::from_convert)?;
        let reply = self.execute(&session, Command::CreateSchedule(Box::new(spec)), None).await?;
        schedule_of(&session, reply, "create_schedule")
    }

    pub(crate) async fn delete_schedule(&self, req: pb::DeleteScheduleRequest) -> Result<pb::Schedule, Status> {
        let session = self.session(req.session)?;
        if req.schedule_id.is_empty() {
            return Err(Status::invalid_argument("schedule_id: is empty; name the schedule to delete"));
        }
        let reply = self.execute(&session, Command::DeleteSchedule { schedule_id: req.schedule_id }, None).await?;
        schedule_of(&session, reply, "delete_schedule")
    }

    /// `ListSchedules`: one session's from its fold; without a session, the tenant's sessions in id order
    /// (those with schedules, as the session index says), a page holding whole sessions.
    pub(crate) async fn list_schedules(
        &self,
        session: Option<SessionRef>,
        tenant: String,
        token: &str,
        page_size: u32,
    ) -> Result<pb::ListSchedulesReply, Status> {
        if let Some(session) = session {
            let state = read::existing(self.log.as_ref(), self.snapshots.as_ref(), &session).await?;
            let schedules = state.schedules.iter().map(|s| encode_schedule(&session, s)).collect();
            return Ok(pb::ListSchedulesReply { schedules, next_page_token: String::new() });
        }
        let page_size = crate::service::page_size(page_size)?;
        let mut after = parse_page_token(token)?;
        let mut schedules = Vec::new();
        loop {
            let refs = self.scheduled_sessions(&tenant, after.as_ref(), page_size).await?;
            let Some(last) = refs.last().cloned() else {
                return Ok(pb::ListSchedulesReply { schedules, next_page_token: String::new() });
            };
            for session in &refs {
                let state = read::project(self.log.as_ref(), self.snapshots.as_ref(), session).await?;
                schedules.extend(state.schedules.iter().map(|s| encode_schedule(session, s)));
                if schedules.len() >= page_size {
                    return Ok(pb::ListSchedulesReply { schedules, next_page_token: page_token(session) });
                }
            }
            after = Some(last);
        }
    }

    /// Sessions of `tenant` after `after` in id order that have schedules: from the index, or every session
    /// (filtered when folded) without one.
    async fn scheduled_sessions(
        &self,
        tenant: &str,
        after: Option<&SessionRef>,
        limit: usize,
    ) -> Result<Vec<SessionRef>, Status> {
        match &self.index {
            Some(index) => {
                let query = turnstile_journal::index::Query {
                    tenant: Some(tenant.to_owned()),
                    with_schedules: true,
                    after: after.cloned().map(turnstile_journal::index::Cursor::Id),
                    limit,
                    ..Default::default()
                };
                Ok(index.query(&query).into_iter().map(|e| e.session).collect())
            }
            None => self.log.list_sessions(Some(tenant), after, limit).await.map_err(status::from_journal),
        }
    }

    /// `SetLabels`: the owner writes `session/labeled`; the reply is the session as it is after.
    pub(crate) async fn set_labels(&self, req: pb::SetLabelsRequest) -> Result<pb::SessionInfo, Status> {
        let session = self.session(req.session)?;
        let change = Labeled { set: req.labels.into_iter().collect(), removed: req.remove_keys };
        turnstile_model::labels::check_change(&Default::default(), &change)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let seq = self.written(session.clone(), Command::SetLabels(change)).await?;
        let state = self.state_after(&session, seq, "retry GetSession").await?;
        Ok(self.info(&state).await)
    }
}

fn schedule_of(session: &SessionRef, reply: CommandReply, what: &str) -> Result<pb::Schedule, Status> {
    match reply {
        CommandReply::Schedule { schedule, .. } => Ok(encode_schedule(session, &schedule)),
        other => Err(unexpected(what, &other)),
    }
}
