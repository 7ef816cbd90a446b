//! Commands, replies and command errors ↔ the internal `turnstile.cluster.v1` API (gateway → worker).
//!
//! The mapping is one to one with [`Command`] and [`CommandReply`], so a command forwarded over the
//! internal hop reaches the owner's driver exactly as the gateway built it. Decoding validates like every
//! other decoder of this codec (ids, sources, targets) and names the field path of the first error.
//!
//! Errors are not messages but gRPC statuses; this module owns their *metadata* (no tonic here): the
//! [`CommandError`] kind under [`ERROR_KEY`], and for not-owner the session and the owner's address under
//! [`SESSION_KEY`] and [`OWNER_KEY`]. [`command_error_parts`] and [`command_error_from_parts`] are
//! inverses, so the gateway rebuilds the exact error the worker answered.

use std::time::Duration;

use turnstile_proto::cluster::v1 as cpb;
use turnstile_proto::cluster::v1::execute_reply::Reply;
use turnstile_proto::cluster::v1::execute_request::Command as PbCommand;
use turnstile_proto::v1 as pb;

use turnstile_model::command::{Command, CommandError, CommandReply, DeadlineSpec, Spawn, StreamingStep};
use turnstile_model::message::{MessageId, SessionRef};
use turnstile_model::schedule::Schedule;
use turnstile_proto::codec::error::{CodecError, join};
use turnstile_proto::codec::message::{
    encode_session_ref, encode_target, encode_user_message, messages_at, required_message_at, required_session_at,
    target_at,
};
use turnstile_proto::codec::schedule::{encode_labeled, encode_schedule_spec, labeled_at, schedule_spec_at};
use turnstile_proto::codec::session::{
    encode_goal_action, encode_goal_info, encode_session_info, goal_action_at, goal_info_at, session_info_at,
};
use turnstile_proto::codec::values::{
    decode_cancel_cause, encode_cancel_cause, encode_inject_mode, encode_on_deadline, inject_mode_at, on_deadline_at,
};

/// Metadata key of a failed `Execute`: the [`CommandError`] kind ([`CommandError::kind`]).
pub const ERROR_KEY: &str = "turnstile-error";
/// Metadata key of a not-owner answer: the owner's advertised address, when the worker knows it.
pub const OWNER_KEY: &str = "turnstile-owner";
/// Metadata key of a not-owner answer: the session, `tenant/id`.
pub const SESSION_KEY: &str = "turnstile-session";
/// Metadata key of every `Execute` request and reply: the internal API version of its sender
/// ([`API_VERSION`]). Absent: a build from before versions were numbered, which speaks version 1. A
/// request with no command this build knows, from a caller of a newer version, is [`unknown_command`]
/// rather than a malformed request.
pub const API_KEY: &str = "turnstile-api";
/// The internal API version this build speaks (SPEC §18, decision 0072). It grows when a command or reply
/// is added: a worker asked for a command it cannot decode by a caller of a newer version answers
/// UNAVAILABLE ([`unknown_command`]), so the router retries until the session's owner is upgraded instead
/// of failing the client during a rolling upgrade. 2: `import`. 3: the `goal` reply.
pub const API_VERSION: u32 = 3;

/// `reply` as a caller speaking internal API `caller` (`None`: a build from before versions, 1) can
/// decode it: a reply added after the caller's version becomes the one that caller expects (a goal
/// command's `goal` becomes `written_seq`, and that caller folds the log for the goal, as it always did).
pub fn reply_for_caller(reply: CommandReply, caller: Option<u32>) -> CommandReply {
    match reply {
        CommandReply::Goal { seq, .. } if caller.unwrap_or(1) < 3 => CommandReply::Written { seq },
        reply => reply,
    }
}

const COMMANDS: &str = "set one of send, interrupt, cancel, replace, remove, splice, clear, when_idle, configure, decide, \
     set_goal, update_goal, compact, fork, spawn, delete, streaming_step, create_schedule, delete_schedule, set_labels or import";
const REPLIES: &str = "set one of sent, written_seq, idle, streaming, schedule or goal";

/// The request that asks `session`'s owner to run `command`; `timeout` bounds `WhenIdle`.
pub fn encode_execute_request(
    session: &SessionRef,
    command: &Command,
    timeout: Option<Duration>,
) -> cpb::ExecuteRequest {
    cpb::ExecuteRequest {
        session: Some(encode_session_ref(session)),
        // Saturates: a timeout beyond u64 milliseconds is "no bound" in any practical sense.
        timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        command: Some(encode_command(command)),
    }
}

/// The inverse of [`encode_execute_request`]: session, command and timeout, validated.
pub fn decode_execute_request(
    request: cpb::ExecuteRequest,
) -> Result<(SessionRef, Command, Option<Duration>), CodecError> {
    let session = required_session_at(request.session, "session")?;
    let command = request.command.ok_or_else(|| CodecError::missing("command", COMMANDS))?;
    let command = decode_command(command)?;
    Ok((session, command, request.timeout_ms.map(Duration::from_millis)))
}

/// What a worker answers a caller of internal API version `theirs` (newer than this build's) whose command
/// it does not know: UNAVAILABLE, so the caller's router retries while the owner is being upgraded.
pub fn unknown_command(theirs: u32) -> CommandError {
    CommandError::Unavailable(format!(
        "this worker speaks internal API version {API_VERSION} and does not know a command of version \
         {theirs}: it is being upgraded; retry once it runs the new version"
    ))
}

/// The [`API_KEY`] value of a request or reply; `None` when absent or not a number.
pub fn api_version(value: Option<&str>) -> Option<u32> {
    value?.parse().ok()
}

/// One [`Command`] as the request's `command` oneof.
pub fn encode_command(command: &Command) -> PbCommand {
    match command {
        Command::Send { message, target, wakeup, expected_turn, deadline } => PbCommand::Send(cpb::SendCommand {
            message: Some(encode_user_message(message)),
            target: encode_target(*target) as i32,
            wakeup: *wakeup,
            expected_turn: *expected_turn,
            deadline_ms: deadline.map(|d| d.after_ms),
            on_deadline: deadline.map_or(0, |d| encode_on_deadline(d.on_deadline) as i32),
        }),
        Command::Interrupt { message } => {
            PbCommand::Interrupt(cpb::InterruptCommand { message: Some(encode_user_message(message)) })
        }
        Command::Cancel { cause, keep_inbox } => {
            PbCommand::Cancel(cpb::CancelCommand { cause: Some(encode_cancel_cause(cause)), keep_inbox: *keep_inbox })
        }
        Command::Replace { id, message } => {
            PbCommand::Replace(cpb::ReplaceCommand { id: id.0.clone(), message: Some(encode_user_message(message)) })
        }
        Command::Remove { id } => PbCommand::Remove(cpb::RemoveCommand { id: id.0.clone() }),
        Command::Splice { target, start, delete_count, inserted } => PbCommand::Splice(cpb::SpliceCommand {
            target: encode_target(*target) as i32,
            start: *start,
            delete_count: *delete_count,
            inserted: inserted.iter().map(encode_user_message).collect(),
        }),
        Command::Clear => PbCommand::Clear(cpb::ClearCommand {}),
        Command::WhenIdle => PbCommand::WhenIdle(cpb::WhenIdleCommand {}),
        Command::Compact => PbCommand::Compact(cpb::CompactCommand {}),
        Command::Fork(fork) => {
            PbCommand::Fork(cpb::ForkCommand { fork: Some(turnstile_proto::codec::event::encode_fork(fork)) })
        }
        Command::Spawn(spawn) => PbCommand::Spawn(cpb::SpawnCommand {
            parent: Some(encode_session_ref(&spawn.parent)),
            agent: spawn.agent.clone(),
            prompt: Some(encode_user_message(&spawn.prompt)),
        }),
        Command::Configure { agent, inject_mode, version, overrides } => PbCommand::Configure(cpb::ConfigureCommand {
            agent: agent.clone(),
            inject_mode: encode_inject_mode(*inject_mode) as i32,
            version: *version,
            overrides: (!overrides.is_empty()).then(|| turnstile_proto::codec::encode_overrides(overrides)),
        }),
        Command::Migrate { agent, version } => {
            PbCommand::Migrate(cpb::MigrateCommand { agent: agent.clone(), version: *version })
        }
        Command::Decide { call_id, approve, reason } => PbCommand::Decide(cpb::DecideCommand {
            call_id: call_id.clone(),
            approve: *approve,
            reason: reason.clone(),
        }),
        Command::CompleteToolCall { call_id, output, error } => {
            PbCommand::CompleteToolCall(cpb::CompleteToolCallCommand {
                call_id: call_id.clone(),
                output: output.clone(),
                error: error.clone(),
            })
        }
        Command::SetGoal { goal_id, objective, max_rounds } => PbCommand::SetGoal(cpb::SetGoalCommand {
            goal_id: goal_id.clone(),
            objective: objective.clone(),
            max_rounds: *max_rounds,
        }),
        Command::UpdateGoal { goal_id, action } => PbCommand::UpdateGoal(cpb::UpdateGoalCommand {
            goal_id: goal_id.clone(),
            action: encode_goal_action(*action) as i32,
        }),
        Command::Delete => PbCommand::Delete(cpb::DeleteCommand {}),
        Command::StreamingStep => PbCommand::StreamingStep(cpb::StreamingStepCommand {}),
        Command::CreateSchedule(spec) => {
            PbCommand::CreateSchedule(cpb::CreateScheduleCommand { spec: Some(encode_schedule_spec(spec)) })
        }
        Command::DeleteSchedule { schedule_id } => {
            PbCommand::DeleteSchedule(cpb::DeleteScheduleCommand { schedule_id: schedule_id.clone() })
        }
        Command::SetLabels(change) => {
            PbCommand::SetLabels(cpb::SetLabelsCommand { change: Some(encode_labeled(change)) })
        }
        Command::Import { events, complete } => PbCommand::Import(cpb::ImportCommand {
            events: events.iter().map(turnstile_proto::codec::encode_session_event).collect(),
            complete: *complete,
        }),
    }
}

/// Decodes and validates the `command` oneof; paths start at the variant (`send.message.id`).
pub fn decode_command(command: PbCommand) -> Result<Command, CodecError> {
    Ok(match command {
        PbCommand::Send(s) => Command::Send {
            message: required_message_at(s.message, "send.message")?,
            target: target_at(s.target, "send.target")?,
            wakeup: s.wakeup,
            expected_turn: s.expected_turn,
            deadline: match s.deadline_ms {
                None => None,
                Some(after_ms) => Some(DeadlineSpec {
                    after_ms,
                    on_deadline: on_deadline_at(s.on_deadline, "send.on_deadline", None)?,
                }),
            },
        },
        PbCommand::Interrupt(i) => Command::Interrupt { message: required_message_at(i.message, "interrupt.message")? },
        PbCommand::Cancel(c) => {
            let cause =
                c.cause.ok_or_else(|| CodecError::missing("cancel.cause", "set user, parent, hook or disposed"))?;
            // `decode_cancel_cause` names its path `cause`; put it under the variant.
            let cause = decode_cancel_cause(cause).map_err(|e| under("cancel", e))?;
            Command::Cancel { cause, keep_inbox: c.keep_inbox }
        }
        PbCommand::Replace(r) => Command::Replace {
            id: message_id_at(r.id, "replace.id")?,
            message: required_message_at(r.message, "replace.message")?,
        },
        PbCommand::Remove(r) => Command::Remove { id: message_id_at(r.id, "remove.id")? },
        PbCommand::Splice(s) => Command::Splice {
            target: target_at(s.target, "splice.target")?,
            start: s.start,
            delete_count: s.delete_count,
            inserted: messages_at(s.inserted, "splice.inserted")?,
        },
        PbCommand::Clear(_) => Command::Clear,
        PbCommand::WhenIdle(_) => Command::WhenIdle,
        PbCommand::Compact(_) => Command::Compact,
        PbCommand::Fork(f) => {
            let fork = f.fork.ok_or_else(|| CodecError::missing("fork.fork", "set the fork to write"))?;
            Command::Fork(Box::new(turnstile_proto::codec::event::fork_at(fork, "fork.fork")?))
        }
        PbCommand::Spawn(s) => {
            if s.agent.is_empty() {
                return Err(CodecError::invalid("spawn.agent", "is empty; name one of the configured agents"));
            }
            Command::Spawn(Box::new(Spawn {
                parent: required_session_at(s.parent, "spawn.parent")?,
                agent: s.agent,
                prompt: required_message_at(s.prompt, "spawn.prompt")?,
            }))
        }
        PbCommand::Delete(_) => Command::Delete,
        PbCommand::StreamingStep(_) => Command::StreamingStep,
        PbCommand::CreateSchedule(c) => {
            let spec = c.spec.ok_or_else(|| CodecError::missing("create_schedule.spec", "set the schedule"))?;
            Command::CreateSchedule(Box::new(schedule_spec_at(spec, "create_schedule.spec")?))
        }
        PbCommand::DeleteSchedule(d) => Command::DeleteSchedule { schedule_id: d.schedule_id },
        PbCommand::SetLabels(s) => {
            let change = s.change.ok_or_else(|| CodecError::missing("set_labels.change", "set the labels"))?;
            Command::SetLabels(labeled_at(change, "set_labels.change")?)
        }
        PbCommand::Import(i) => Command::Import {
            events: i
                .events
                .into_iter()
                .enumerate()
                .map(|(n, e)| {
                    turnstile_proto::codec::decode_session_event(e)
                        .map_err(|e| under(&format!("import.events[{n}]"), e))
                })
                .collect::<Result<_, _>>()?,
            complete: i.complete,
        },
        PbCommand::Configure(c) => {
            if c.agent.is_empty() {
                return Err(CodecError::invalid("configure.agent", "is empty; name one of the configured agents"));
            }
            // The gateway already turned an unspecified mode into pending; the hop carries a named one.
            Command::Configure {
                agent: c.agent,
                inject_mode: inject_mode_at(c.inject_mode, "configure.inject_mode", None)?,
                version: c.version,
                overrides: c
                    .overrides
                    .map(|o| turnstile_proto::codec::overrides_at(o, "configure.overrides"))
                    .transpose()?
                    .unwrap_or_default(),
            }
        }
        PbCommand::Migrate(m) => {
            if m.agent.is_empty() || m.version == 0 {
                return Err(CodecError::invalid("migrate", "names no agent or version; name both"));
            }
            Command::Migrate { agent: m.agent, version: m.version }
        }
        PbCommand::Decide(d) => {
            if d.call_id.is_empty() {
                return Err(CodecError::invalid("decide.call_id", "is empty; name the tool call to decide"));
            }
            Command::Decide { call_id: d.call_id, approve: d.approve, reason: d.reason }
        }
        PbCommand::CompleteToolCall(c) => {
            if c.call_id.is_empty() {
                return Err(CodecError::invalid("complete_tool_call.call_id", "is empty; name the call to complete"));
            }
            Command::CompleteToolCall { call_id: c.call_id, output: c.output, error: c.error }
        }
        // The driver checks the goal id, the objective and the round budget against its limits.
        PbCommand::SetGoal(g) => {
            Command::SetGoal { goal_id: g.goal_id, objective: g.objective, max_rounds: g.max_rounds }
        }
        PbCommand::UpdateGoal(g) => {
            Command::UpdateGoal { goal_id: g.goal_id, action: goal_action_at(g.action, "update_goal.action")? }
        }
    })
}

fn message_id_at(raw: String, path: &str) -> Result<MessageId, CodecError> {
    let id = MessageId(raw);
    id.validate().map_err(|e| CodecError::value(path, e))?;
    Ok(id)
}

/// Prefixes an error's path with `parent`.
fn under(parent: &str, err: CodecError) -> CodecError {
    match err {
        CodecError::Invalid { path, detail } => CodecError::Invalid { path: join(parent, &path), detail },
        CodecError::Value { path, value } => CodecError::Value { path: join(parent, &path), value },
        other @ CodecError::Malformed { .. } => other,
    }
}

/// The reply to a command on `session` (the session is only carried by the `idle` reply).
pub fn encode_command_reply(session: &SessionRef, reply: &CommandReply) -> cpb::ExecuteReply {
    let reply = match reply {
        CommandReply::Sent { seq, turn } => Reply::Sent(pb::SendReply { seq: *seq, turn: *turn }),
        CommandReply::Written { seq } => Reply::WrittenSeq(*seq),
        CommandReply::Idle(summary) => Reply::Idle(encode_session_info(session, summary)),
        CommandReply::Streaming(step) => Reply::Streaming(cpb::StreamingStepReply {
            step: step.as_deref().map(|s| cpb::StreamingStep {
                turn: s.turn,
                step: s.step,
                after_seq: s.after_seq,
                text: s.text.clone(),
                reasoning: s.reasoning.clone(),
            }),
        }),
        CommandReply::Schedule { seq, schedule } => Reply::Schedule(cpb::ScheduleReply {
            seq: *seq,
            spec: Some(encode_schedule_spec(&schedule.spec)),
            next_fire_unix_ms: schedule.next_fire_ms,
            fired: schedule.fired,
            missed: schedule.missed,
        }),
        CommandReply::Goal { seq, goal } => {
            Reply::Goal(cpb::GoalReply { seq: *seq, goal: Some(encode_goal_info(goal)) })
        }
    };
    cpb::ExecuteReply { reply: Some(reply) }
}

/// The inverse of [`encode_command_reply`].
pub fn decode_command_reply(reply: cpb::ExecuteReply) -> Result<CommandReply, CodecError> {
    match reply.reply {
        Some(Reply::Sent(s)) => Ok(CommandReply::Sent { seq: s.seq, turn: s.turn }),
        Some(Reply::WrittenSeq(seq)) => Ok(CommandReply::Written { seq }),
        Some(Reply::Idle(info)) => Ok(CommandReply::Idle(Box::new(session_info_at(info, "idle")?))),
        Some(Reply::Streaming(reply)) => Ok(CommandReply::Streaming(reply.step.map(|s| {
            Box::new(StreamingStep {
                turn: s.turn,
                step: s.step,
                after_seq: s.after_seq,
                text: s.text,
                reasoning: s.reasoning,
            })
        }))),
        Some(Reply::Schedule(s)) => {
            let spec = s.spec.ok_or_else(|| CodecError::missing("schedule.spec", "set the schedule"))?;
            Ok(CommandReply::Schedule {
                seq: s.seq,
                schedule: Box::new(Schedule {
                    spec: schedule_spec_at(spec, "schedule.spec")?,
                    next_fire_ms: s.next_fire_unix_ms,
                    fired: s.fired,
                    missed: s.missed,
                }),
            })
        }
        Some(Reply::Goal(g)) => {
            let goal = g.goal.ok_or_else(|| CodecError::missing("goal.goal", "set the goal"))?;
            Ok(CommandReply::Goal { seq: g.seq, goal: Box::new(goal_info_at(goal, "goal.goal")?) })
        }
        None => Err(CodecError::missing("reply", REPLIES)),
    }
}

/// What a [`CommandError`] becomes on the wire: its kind, the status message, and for not-owner the
/// session and the owner's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorParts {
    pub kind: &'static str,
    pub message: String,
    pub session: Option<String>,
    pub owner: Option<String>,
}

/// Splits `err` into the parts a status carries. The message is the error's payload, not its display,
/// so [`command_error_from_parts`] gets the same value back.
pub fn command_error_parts(err: &CommandError) -> ErrorParts {
    let kind = err.kind();
    match err {
        CommandError::NotOwner { session, owner } => {
            ErrorParts { kind, message: err.to_string(), session: Some(session.clone()), owner: owner.clone() }
        }
        CommandError::InvalidArgument(m)
        | CommandError::NotFound(m)
        | CommandError::AlreadyExists(m)
        | CommandError::FailedPrecondition(m)
        | CommandError::ResourceExhausted(m)
        | CommandError::Unavailable(m)
        | CommandError::DeadlineExceeded(m)
        | CommandError::Internal(m) => ErrorParts { kind, message: m.clone(), session: None, owner: None },
    }
}

/// Rebuilds the [`CommandError`] of [`command_error_parts`]; `None` for a kind this build does not know
/// (the caller then falls back to the gRPC code).
pub fn command_error_from_parts(
    kind: &str,
    message: String,
    session: Option<String>,
    owner: Option<String>,
) -> Option<CommandError> {
    Some(match kind {
        "invalid-argument" => CommandError::InvalidArgument(message),
        "not-found" => CommandError::NotFound(message),
        "already-exists" => CommandError::AlreadyExists(message),
        "failed-precondition" => CommandError::FailedPrecondition(message),
        "resource-exhausted" => CommandError::ResourceExhausted(message),
        "unavailable" => CommandError::Unavailable(message),
        "deadline-exceeded" => CommandError::DeadlineExceeded(message),
        "not-owner" => CommandError::NotOwner { session: session.unwrap_or_default(), owner },
        "internal" => CommandError::Internal(message),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_model::SessionSummary;
    use turnstile_model::event::{CancelCause, InjectMode, OnDeadline, Status};
    use turnstile_model::goal::{GoalAction, GoalChange, GoalState};
    use turnstile_model::message::{ContentBlock, MessageSource, Target, UserMessage};

    fn session() -> SessionRef {
        SessionRef { tenant: "acme".into(), id: "s-1".into() }
    }

    fn message(id: &str, source: MessageSource) -> UserMessage {
        UserMessage {
            id: MessageId(id.into()),
            content: vec![ContentBlock::text("hi"), ContentBlock::Data { mime: "a/b".into(), bytes: vec![0, 255] }]
                .into(),
            source,
        }
    }

    fn commands() -> Vec<Command> {
        let m = |id: &str| message(id, MessageSource::User);
        let mut all = Vec::new();
        for target in [Target::NextTurn, Target::NextStep] {
            for wakeup in [true, false] {
                for expected_turn in [None, Some(0), Some(7)] {
                    all.push(Command::Send { message: m("m1"), target, wakeup, expected_turn, deadline: None });
                }
            }
        }
        all.push(Command::Send {
            message: message("m2", MessageSource::Plugin { plugin: "mem".into(), form: Some("recall".into()) }),
            target: Target::NextStep,
            wakeup: false,
            expected_turn: None,
            deadline: None,
        });
        for on_deadline in [OnDeadline::Interrupt, OnDeadline::Drop] {
            all.push(Command::Send {
                message: m("m3"),
                target: Target::NextStep,
                wakeup: true,
                expected_turn: None,
                deadline: Some(DeadlineSpec { after_ms: 1500, on_deadline }),
            });
        }
        all.push(Command::Interrupt { message: message("m3", MessageSource::Tool { call_id: "c".into() }) });
        for cause in [
            CancelCause::User,
            CancelCause::Parent,
            CancelCause::Hook { reason: "r".into() },
            CancelCause::Disposed,
            CancelCause::SteerDeadline,
        ] {
            for keep_inbox in [true, false] {
                all.push(Command::Cancel { cause: cause.clone(), keep_inbox });
            }
        }
        all.push(Command::Replace { id: MessageId("old".into()), message: m("new") });
        all.push(Command::Remove { id: MessageId("gone".into()) });
        all.push(Command::Splice {
            target: Target::NextTurn,
            start: 1,
            delete_count: 2,
            inserted: vec![m("a"), m("b")],
        });
        all.push(Command::Splice { target: Target::NextStep, start: 0, delete_count: 0, inserted: vec![] });
        all.push(Command::Clear);
        all.push(Command::Delete);
        all.push(Command::StreamingStep);
        all.push(Command::CreateSchedule(Box::new(schedule_spec())));
        all.push(Command::DeleteSchedule { schedule_id: "daily".into() });
        all.push(Command::SetLabels(turnstile_model::Labeled {
            set: [("team".to_string(), "blue".to_string())].into(),
            removed: vec!["old".into()],
        }));
        let imported = turnstile_model::Envelope {
            session: SessionRef { tenant: "acme".into(), id: "moved".into() },
            seq: 1,
            time_ms: 7,
            epoch: 4,
            payload: turnstile_model::EventPayload::TurnStart { turn: 1 },
        };
        all.push(Command::Import { events: vec![imported], complete: true });
        all.push(Command::WhenIdle);
        all.push(Command::Compact);
        all.push(Command::Spawn(Box::new(Spawn {
            parent: SessionRef { tenant: "acme".into(), id: "planner".into() },
            agent: "researcher".into(),
            prompt: message("spawn:call-1-1-1", MessageSource::User),
        })));
        all.push(Command::Fork(Box::new(turnstile_model::Fork {
            from: SessionRef::new("acme", "source").unwrap(),
            at_turn: 2,
            at_seq: 9,
            agent: Some("assistant".into()),
            compacted: Some(turnstile_model::Compaction {
                upto_turn: 1,
                from_turn: 1,
                summary: "summary of turns 1..1".into(),
                summarized_turns: 1,
            }),
            transcript: vec![turnstile_model::TranscriptEntry::User { turn: 2, step: 1, message: m("m9") }],
        })));
        all.push(Command::Configure {
            agent: "assistant".into(),
            inject_mode: InjectMode::Pending,
            version: None,
            overrides: Default::default(),
        });
        all.push(Command::Configure {
            agent: "scripted".into(),
            inject_mode: InjectMode::OutOfTurn,
            version: Some(3),
            overrides: turnstile_model::overrides::SessionOverrides {
                system_prompt: Some("Be brief.".into()),
                model: Some("large".into()),
                tools: Some(vec![]),
            },
        });
        all.push(Command::Migrate { agent: "assistant".into(), version: 2 });
        all.push(Command::Decide { call_id: "call-1".into(), approve: false, reason: "too risky".into() });
        all.push(Command::CompleteToolCall { call_id: "call-2".into(), output: "sunny".into(), error: None });
        all.push(Command::CompleteToolCall {
            call_id: "call-3".into(),
            output: String::new(),
            error: Some("no".into()),
        });
        all.push(Command::SetGoal { goal_id: "g-1".into(), objective: "ship it".into(), max_rounds: 4 });
        for action in [GoalAction::Pause, GoalAction::Resume, GoalAction::Clear] {
            all.push(Command::UpdateGoal { goal_id: "g-1".into(), action });
        }
        all
    }

    fn schedule_spec() -> turnstile_model::ScheduleSpec {
        turnstile_model::ScheduleSpec {
            schedule_id: "daily".into(),
            preset: turnstile_model::Preset::Steer,
            content: vec![turnstile_model::ContentBlock::text("summarize my inbox")],
            timing: turnstile_model::Timing::Cron { expr: "0 9 * * MON-FRI".into(), time_zone: "Europe/Paris".into() },
            not_after_ms: Some(2_000_000_000_000),
            catchup_ms: 60_000,
        }
    }

    #[test]
    fn every_command_round_trips_with_its_timeout() {
        for command in commands() {
            for timeout in [None, Some(Duration::from_millis(0)), Some(Duration::from_millis(1500))] {
                let request = encode_execute_request(&session(), &command, timeout);
                // Through the bytes, as the wire sees it.
                let bytes = prost::Message::encode_to_vec(&request);
                let request = <cpb::ExecuteRequest as prost::Message>::decode(bytes.as_slice()).unwrap();
                assert_eq!(decode_execute_request(request).unwrap(), (session(), command.clone(), timeout));
            }
        }
    }

    #[test]
    fn a_goal_reply_goes_to_a_caller_of_api_2_or_older_as_the_seq_it_knows() {
        let change = turnstile_model::goal::GoalChange {
            goal_id: "g1".into(),
            revision: 1,
            state: turnstile_model::goal::GoalState::Active,
            objective: "ship it".into(),
            max_rounds: 3,
            round: 0,
            summary: None,
            reason: None,
        };
        let reply = CommandReply::Goal { seq: 4, goal: Box::new(change) };
        for old in [None, Some(1), Some(2)] {
            assert_eq!(reply_for_caller(reply.clone(), old), CommandReply::Written { seq: 4 }, "caller {old:?}");
        }
        assert_eq!(reply_for_caller(reply.clone(), Some(API_VERSION)), reply);
        let sent = CommandReply::Sent { seq: 2, turn: Some(1) };
        assert_eq!(reply_for_caller(sent.clone(), None), sent, "replies every version knows pass unchanged");
    }

    #[test]
    fn every_reply_round_trips() {
        let replies = [
            CommandReply::Sent { seq: 3, turn: Some(1) },
            CommandReply::Sent { seq: 9, turn: None },
            CommandReply::Written { seq: 0 },
            CommandReply::Written { seq: 12 },
            CommandReply::Streaming(None),
            CommandReply::Schedule {
                seq: 7,
                schedule: Box::new(Schedule {
                    spec: schedule_spec(),
                    next_fire_ms: Some(1_700_000_060_000),
                    fired: 3,
                    missed: 1,
                }),
            },
            CommandReply::Goal {
                seq: 11,
                goal: Box::new(turnstile_model::goal::GoalChange {
                    goal_id: "g1".into(),
                    revision: 2,
                    state: turnstile_model::goal::GoalState::Paused,
                    objective: "ship it".into(),
                    max_rounds: 5,
                    round: 1,
                    summary: None,
                    reason: Some("paused by UpdateGoal".into()),
                }),
            },
            CommandReply::Streaming(Some(Box::new(StreamingStep {
                turn: 3,
                step: 2,
                after_seq: 17,
                text: "echo: hé".into(),
                reasoning: "hmm".into(),
            }))),
            CommandReply::Idle(Box::new(SessionSummary {
                agent_version: None,
                status: Status::Idle,
                last_seq: 40,
                last_turn: 3,
                epoch: 2,
                owner: "w1".into(),
                agent: "scripted".into(),
                inject_mode: InjectMode::OutOfTurn,
                goal: None,
                last_time_ms: 1_700_000_000_000,
                parent: Some(SessionRef { tenant: "acme".into(), id: "planner".into() }),
                labels: Default::default(),
            })),
            CommandReply::Idle(Box::new(SessionSummary {
                agent_version: Some(2),
                status: Status::Running,
                last_seq: 41,
                last_turn: 4,
                epoch: 2,
                owner: "w1".into(),
                agent: "scripted".into(),
                inject_mode: InjectMode::Pending,
                goal: Some(GoalChange {
                    goal_id: "g-1".into(),
                    revision: 2,
                    state: GoalState::Paused,
                    objective: "ship it".into(),
                    max_rounds: 4,
                    round: 3,
                    summary: None,
                    reason: Some("turn 4 ended error".into()),
                }),
                last_time_ms: 0,
                parent: None,
                labels: [("team".to_string(), "blue".to_string())].into(),
            })),
        ];
        for reply in replies {
            let encoded = encode_command_reply(&session(), &reply);
            assert_eq!(decode_command_reply(encoded).unwrap(), reply);
        }
    }

    #[test]
    fn malformed_requests_name_their_field() {
        let err = decode_execute_request(cpb::ExecuteRequest::default()).unwrap_err();
        assert_eq!(err.path(), Some("session"));
        let request = cpb::ExecuteRequest { session: Some(encode_session_ref(&session())), ..Default::default() };
        assert_eq!(decode_execute_request(request).unwrap_err().path(), Some("command"));
        let send = PbCommand::Send(cpb::SendCommand {
            message: Some(encode_user_message(&message("m1", MessageSource::User))),
            target: 0,
            wakeup: true,
            expected_turn: None,
            ..Default::default()
        });
        assert_eq!(decode_command(send).unwrap_err().path(), Some("send.target"));
        let send = PbCommand::Send(cpb::SendCommand {
            message: Some(encode_user_message(&message("m1", MessageSource::User))),
            target: pb::Target::NextStep as i32,
            wakeup: true,
            deadline_ms: Some(100),
            ..Default::default()
        });
        assert_eq!(decode_command(send).unwrap_err().path(), Some("send.on_deadline"));
        let mut raw = encode_user_message(&message("m1", MessageSource::User));
        raw.source = None;
        let interrupt = PbCommand::Interrupt(cpb::InterruptCommand { message: Some(raw) });
        assert_eq!(decode_command(interrupt).unwrap_err().path(), Some("interrupt.message.source"));
        let remove = PbCommand::Remove(cpb::RemoveCommand { id: String::new() });
        assert_eq!(decode_command(remove).unwrap_err().path(), Some("remove.id"));
        let cancel =
            PbCommand::Cancel(cpb::CancelCommand { cause: Some(pb::CancelCause { cause: None }), keep_inbox: false });
        assert_eq!(decode_command(cancel).unwrap_err().path(), Some("cancel.cause"));
        let cancel = PbCommand::Cancel(cpb::CancelCommand { cause: None, keep_inbox: false });
        assert_eq!(decode_command(cancel).unwrap_err().path(), Some("cancel.cause"));
        let splice = PbCommand::Splice(cpb::SpliceCommand {
            target: 1,
            inserted: vec![pb::UserMessage::default()],
            ..Default::default()
        });
        assert_eq!(decode_command(splice).unwrap_err().path(), Some("splice.inserted[0].id"));
        assert_eq!(decode_command_reply(cpb::ExecuteReply::default()).unwrap_err().path(), Some("reply"));
    }

    #[test]
    fn every_error_kind_round_trips() {
        let errors = [
            CommandError::InvalidArgument("bad".into()),
            CommandError::NotFound("no such id".into()),
            CommandError::AlreadyExists("dup".into()),
            CommandError::FailedPrecondition("turn 3 is running".into()),
            CommandError::ResourceExhausted("full".into()),
            CommandError::Unavailable("down".into()),
            CommandError::DeadlineExceeded("slow".into()),
            CommandError::NotOwner { session: "acme/s-1".into(), owner: Some("127.0.0.1:7501".into()) },
            CommandError::NotOwner { session: "acme/s-1".into(), owner: None },
            CommandError::Internal("bug".into()),
        ];
        for err in errors {
            let parts = command_error_parts(&err);
            assert_eq!(parts.kind, err.kind());
            let back = command_error_from_parts(parts.kind, parts.message, parts.session, parts.owner);
            assert_eq!(back, Some(err));
        }
        assert_eq!(command_error_from_parts("from-the-future", "x".into(), None, None), None);
    }
}
