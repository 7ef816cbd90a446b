//! Client commands: deliveries, cancel, interrupt, edits and `when_idle` (SPEC §2–§4).
//!
//! Every command is validated completely before its first write, so a refused command writes nothing.

use turnstile_model::overrides::SessionOverrides;
use turnstile_model::size;
use turnstile_model::state::Fingerprint;
use turnstile_model::{
    CancelCause, Command, CommandError, CommandReply, DeadlineSpec, EventPayload, Fork, InjectMode, LivePayload,
    MessageId, Spawn, Splice, SpliceOutcome, Status, SteerDeadline, Target, UserMessage,
};

use super::{CommandId, Driver};

/// Where a delivery goes in its list.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Position {
    Tail,
    Head,
}

impl Driver {
    /// Handles one client command; its reply is among the effects.
    pub fn on_command(&mut self, id: CommandId, command: Command, now_ms: u64) {
        self.now_ms = now_ms;
        let result = match command {
            Command::Send { message, target, wakeup, expected_turn, deadline } => {
                self.deliver(message, target, wakeup, expected_turn, deadline, Position::Tail)
            }
            Command::Interrupt { message } => self.interrupt(message),
            Command::Cancel { cause, keep_inbox } => Ok(self.cancel(cause, keep_inbox)),
            Command::Replace { id, message } => self.replace(&id, message),
            Command::Remove { id } => self.remove(&id),
            Command::Splice { target, start, delete_count, inserted } => {
                self.client_splice(target, start, delete_count, inserted)
            }
            Command::Clear => Ok(self.clear()),
            Command::Configure { agent, inject_mode, version, overrides } => {
                self.configure(agent, inject_mode, version, overrides)
            }
            Command::Migrate { agent, version } => self.migrate(agent, version),
            Command::Decide { call_id, approve, reason } => self.decide(&call_id, approve, reason, false),
            Command::CompleteToolCall { call_id, output, error } => self.complete_tool_call(&call_id, output, error),
            Command::SetGoal { goal_id, objective, max_rounds } => self.set_goal(goal_id, objective, max_rounds),
            Command::UpdateGoal { goal_id, action } => self.update_goal(&goal_id, action),
            Command::Compact => match self.compact_command(id) {
                Some(result) => result,
                None => return,
            },
            Command::Fork(fork) => self.fork(*fork),
            Command::Spawn(spawn) => self.spawn(*spawn),
            // The host removes the log around a stopped driver; a driver asked to do it refuses.
            Command::Delete => Err(CommandError::Internal(
                "DeleteSession reached the session driver; the session host performs it".into(),
            )),
            Command::StreamingStep => Ok(CommandReply::Streaming(self.streaming_step().map(Box::new))),
            Command::CreateSchedule(spec) => self.create_schedule(*spec),
            Command::DeleteSchedule { schedule_id } => self.delete_schedule(&schedule_id),
            Command::SetLabels(change) => self.set_labels(change),
            // Likewise an import: the host appends the imported groups with no driver loaded.
            Command::Import { .. } => Err(CommandError::Internal(
                "ImportSessions reached the session driver; the session host performs it".into(),
            )),
            Command::WhenIdle => {
                if self.is_quiescent() {
                    Ok(CommandReply::Idle(Box::new(self.summary())))
                } else {
                    self.idle_waiters.push(id);
                    return;
                }
            }
        };
        self.reply(id, result);
    }

    /// A message must be well-formed, within the size limit, and storable as one event.
    pub(super) fn check_message(&self, message: &UserMessage) -> Result<(), CommandError> {
        message.validate(self.limits.max_message_bytes).map_err(|e| CommandError::InvalidArgument(e.to_string()))?;
        self.check_event_size(std::slice::from_ref(message))
    }

    /// Messages inserted by one splice travel in one event, which must fit the journal's largest event
    /// ([`crate::Limits::max_event_bytes`]): refused before anything is written, since no retry could
    /// store it (decision 0085).
    fn check_event_size(&self, inserted: &[UserMessage]) -> Result<(), CommandError> {
        let Some(max) = self.limits.max_event_bytes else { return Ok(()) };
        let event = size::messages_bytes(inserted).saturating_add(size::EVENT_OVERHEAD_BYTES);
        if event <= max {
            return Ok(());
        }
        Err(CommandError::InvalidArgument(format!(
            "the {} message(s) inserted into session {} count {} bytes, and with their event's {} bytes of envelope \
             that is over the journal's largest event of {max} bytes (the NATS server's max_payload less its headers); \
             send smaller messages or fewer at once, or raise max_payload in the nats-server configuration",
            inserted.len(),
            self.state.session,
            event - size::EVENT_OVERHEAD_BYTES,
            size::EVENT_OVERHEAD_BYTES,
        )))
    }

    /// The pending-items and pending-bytes limits, for a change that adds `added` and removes the pending
    /// items `removed` (their count and content bytes). Only a change that grows a measure is refused by it,
    /// so removing and shrinking stay possible above a lowered limit.
    fn check_room(&self, added: &[UserMessage], removed: Room) -> Result<(), CommandError> {
        let after = (self.state.inbox.len() + added.len()).saturating_sub(removed.items);
        if added.len() > removed.items && after > self.limits.max_pending {
            return Err(CommandError::ResourceExhausted(format!(
                "session {} has {} pending messages and the limit is {}; wait for turns to drain, or remove or clear pending messages",
                self.state.session,
                self.state.inbox.len(),
                self.limits.max_pending
            )));
        }
        self.check_event_size(added)?;
        let added_bytes = size::messages_bytes(added);
        let pending_bytes = self.state.inbox.counted_bytes();
        let after_bytes = (pending_bytes + added_bytes).saturating_sub(removed.bytes);
        if added_bytes > removed.bytes && after_bytes > self.limits.max_pending_bytes {
            return Err(CommandError::ResourceExhausted(format!(
                "session {} has {pending_bytes} bytes pending; {added_bytes} more would make {after_bytes}, \
                 above the limit of {} (config limits.max_pending_bytes; a message counts its id, source and every \
                 field of every block, plus {} per block); wait for turns to drain, or remove or clear pending messages",
                self.state.session,
                self.limits.max_pending_bytes,
                size::BLOCK_OVERHEAD_BYTES
            )));
        }
        Ok(())
    }

    /// What a change removes from the pending lists: `list[start..start + count]` of `target`.
    fn removed_room(&self, target: Target, start: usize, count: usize) -> Room {
        Room::of(self.state.inbox.list(target).get(start..start + count).unwrap_or_default())
    }

    /// A message id that a delivery or edit may insert: not pending (unless `except` is being removed by
    /// the same splice) and never accepted before.
    pub(super) fn check_new_id(&self, id: &MessageId, except: &[&MessageId]) -> Result<(), CommandError> {
        if except.contains(&id) {
            return Ok(());
        }
        if self.state.inbox.contains(id) {
            return Err(CommandError::AlreadyExists(format!(
                "message id {id} is already pending in session {}; mint a new id for a new message",
                self.state.session
            )));
        }
        if let Some(acceptance) = self.state.accepted.get(id) {
            return Err(CommandError::AlreadyExists(format!(
                "message id {id} was already accepted by session {} (seq {}); mint a new id for a new message",
                self.state.session, acceptance.seq
            )));
        }
        Ok(())
    }

    /// `send(message, target, wakeup)`: the delivery primitive.
    pub(super) fn deliver(
        &mut self,
        message: UserMessage,
        target: Target,
        wakeup: bool,
        expected_turn: Option<u64>,
        deadline: Option<DeadlineSpec>,
        position: Position,
    ) -> Result<CommandReply, CommandError> {
        self.check_message(&message)?;
        if let Some(acceptance) = self.state.accepted.get(&message.id) {
            // Same id, same delivery: a retry gets the original acceptance and writes nothing.
            if acceptance.fingerprint == Some(Fingerprint::of(&message, target, wakeup)) {
                return Ok(CommandReply::Sent { seq: acceptance.seq, turn: acceptance.opened_turn });
            }
            return Err(CommandError::AlreadyExists(format!(
                "message id {} was already accepted by session {} (seq {}) with other content, source or routing; \
                 a retry must repeat the delivery exactly, and a new message needs a new id",
                message.id, self.state.session, acceptance.seq
            )));
        }
        self.check_new_id(&message.id, &[])?;
        if let Some(expected) = expected_turn
            && self.running_turn() != Some(expected)
        {
            return Err(CommandError::FailedPrecondition(match self.running_turn() {
                Some(running) => format!(
                    "steer expected turn {expected} but session {} is running turn {running}; steer turn {running} or omit expected_turn",
                    self.state.session
                ),
                None => format!(
                    "steer expected turn {expected} but session {} is idle (last turn {}); send a followup or omit expected_turn",
                    self.state.session, self.state.last_turn
                ),
            }));
        }
        let idle = self.turn.is_none() && self.state.status == Status::Idle;
        if target == Target::NextStep && !wakeup && idle && self.state.inject_mode == InjectMode::OutOfTurn {
            // SPEC §11, seed 004: an idle inject becomes history between turns, not pending input.
            let seq = self.write(EventPayload::UserMessage { message, turn: 0, step: 0 });
            return Ok(CommandReply::Sent { seq, turn: None });
        }
        self.check_room(std::slice::from_ref(&message), Room::NONE)?;

        // A waking delivery during an abort is forced to next-turn and latches a wake (never for
        // `disposed`): it runs as the next turn once the aborted one has ended.
        let aborting = self.aborting_cause().cloned();
        let forced = wakeup && aborting.is_some() && target != Target::NextTurn;
        let written_target = if wakeup && aborting.is_some() { Target::NextTurn } else { target };
        let start = match position {
            Position::Tail => self.state.inbox.list(written_target).len() as u32,
            Position::Head => 0,
        };
        let seq = self.write(EventPayload::InboxSpliced(Splice {
            target: written_target,
            start,
            removed_count: 0,
            inserted: vec![message.clone()],
            outcome: SpliceOutcome::None,
            wake: wakeup,
            requested_target: forced.then_some(target),
            deadline: deadline
                .map(|d| SteerDeadline { at_ms: self.now_ms.saturating_add(d.after_ms), on_deadline: d.on_deadline }),
        }));
        self.publish(LivePayload::Inserted { message });
        let turn = if wakeup { self.wake() } else { None };
        Ok(CommandReply::Sent { seq, turn })
    }

    /// A waking insert was just written: during an abort it latches a wake (never for `disposed`), so it
    /// runs once the aborted turn has ended; on an idle session it starts the driver, `turn/start` and the
    /// turn-boundary claim (all before the caller's reply); a running driver takes it at a later boundary.
    /// The turn it opened, if any.
    pub(super) fn wake(&mut self) -> Option<u64> {
        if self.recovering {
            return None;
        }
        if let Some(cause) = self.aborting_cause() {
            if *cause != CancelCause::Disposed {
                self.latched_wake = true;
            }
            return None;
        }
        if self.turn.is_none() && self.state.status == Status::Idle {
            self.set_status(Status::Running);
            self.open_turn(super::turn::Resume::default());
            return Some(self.state.last_turn);
        }
        None
    }

    /// Cancel the active turn keeping the inbox, then a followup at the head of next-turn.
    fn interrupt(&mut self, message: UserMessage) -> Result<CommandReply, CommandError> {
        self.check_message(&message)?;
        if let Some(acceptance) = self.state.accepted.get(&message.id)
            && acceptance.fingerprint == Some(Fingerprint::of(&message, Target::NextTurn, true))
        {
            return Ok(CommandReply::Sent { seq: acceptance.seq, turn: acceptance.opened_turn });
        }
        // Validate the followup half before the cancel half acts, so a refused interrupt changes nothing.
        self.check_new_id(&message.id, &[])?;
        self.check_room(std::slice::from_ref(&message), Room::NONE)?;
        self.holding_idle_waiters(|driver| {
            if driver.turn.is_some() {
                driver.abort_turn(CancelCause::User);
            }
            driver.deliver(message, Target::NextTurn, true, None, None, Position::Head)
        })
    }

    /// `cancel(cause, keep_inbox)`: replies once its splices are durable and the abort is signalled.
    fn cancel(&mut self, cause: CancelCause, keep_inbox: bool) -> CommandReply {
        if !keep_inbox {
            self.clear_inbox();
            self.latched_wake = false;
        }
        self.abort_turn(cause);
        CommandReply::Written { seq: self.state.last_seq }
    }

    fn replace(&mut self, id: &MessageId, message: UserMessage) -> Result<CommandReply, CommandError> {
        self.check_message(&message)?;
        let (target, index) = self.find_pending(id)?;
        self.check_new_id(&message.id, &[id])?;
        self.check_room(std::slice::from_ref(&message), self.removed_room(target, index, 1))?;
        self.write_edit(target, index as u32, 1, vec![message]);
        Ok(CommandReply::Written { seq: self.state.last_seq })
    }

    fn remove(&mut self, id: &MessageId) -> Result<CommandReply, CommandError> {
        let (target, index) = self.find_pending(id)?;
        self.write_edit(target, index as u32, 1, Vec::new());
        Ok(CommandReply::Written { seq: self.state.last_seq })
    }

    fn client_splice(
        &mut self,
        target: Target,
        start: u32,
        delete_count: u32,
        inserted: Vec<UserMessage>,
    ) -> Result<CommandReply, CommandError> {
        // Normalized like the seed's `Array.prototype.splice` (SPEC §3): a start past the end is the end, a
        // delete count past the end is cut; the durable splice holds the normalized values.
        let len = self.state.inbox.list(target).len();
        let start = start.min(u32::try_from(len).unwrap_or(u32::MAX));
        let delete_count = delete_count.min(u32::try_from(len - start as usize).unwrap_or(u32::MAX));
        let removed_messages = &self.state.inbox.list(target)[start as usize..(start + delete_count) as usize];
        let removed_room = Room::of(removed_messages);
        let removed: Vec<MessageId> = removed_messages.iter().map(|m| m.id.clone()).collect();
        let removed_refs: Vec<&MessageId> = removed.iter().collect();
        for (i, message) in inserted.iter().enumerate() {
            self.check_message(message)?;
            if inserted[..i].iter().any(|m| m.id == message.id) {
                return Err(CommandError::InvalidArgument(format!(
                    "splice inserts message id {} twice; each message needs its own id",
                    message.id
                )));
            }
            self.check_new_id(&message.id, &removed_refs)?;
        }
        self.check_room(&inserted, removed_room)?;
        if delete_count == 0 && inserted.is_empty() {
            return Ok(CommandReply::Written { seq: self.state.last_seq });
        }
        self.write_edit(target, start, delete_count, inserted);
        Ok(CommandReply::Written { seq: self.state.last_seq })
    }

    /// An agent the configuration names for this session's tenant. One confined to other tenants answers
    /// exactly as one that does not exist, listing only this tenant's (decision 0091).
    fn check_agent(&self, agent: &str) -> Result<(), CommandError> {
        let tenant = self.state.session.tenant.as_str();
        if self.agents.get_for(agent, tenant).is_none() {
            let known: Vec<&str> = self.agents.names_for(tenant).collect();
            return Err(CommandError::InvalidArgument(format!(
                "agent {agent:?} is not configured; known agents: {}",
                known.join(", ")
            )));
        }
        Ok(())
    }

    /// `ConfigureSession` (SPEC §8, §20): a durable `session/configured` and, when the overrides change,
    /// `session/overridden`, only while idle. A configure equal to the last recorded one writes nothing; a
    /// session never configured always records the choice (even the default agent), so a later change of
    /// the configuration's default does not move it.
    fn configure(
        &mut self,
        agent: String,
        inject_mode: InjectMode,
        version: Option<u64>,
        overrides: SessionOverrides,
    ) -> Result<CommandReply, CommandError> {
        self.check_agent(&agent)?;
        if let Some(v) = version {
            self.check_version(&agent, v)?;
        }
        self.check_overrides(&agent, version, &overrides)?;
        if self.turn.is_some() || self.state.status != Status::Idle || self.latched_wake {
            let running = self.running_turn().unwrap_or(self.state.last_turn);
            return Err(CommandError::FailedPrecondition(format!(
                "session {} is running turn {running}; configure it once it is idle (WhenIdle), or cancel the turn",
                self.state.session
            )));
        }
        let configured = self.state.agent.as_deref() == Some(agent.as_str())
            && self.state.inject_mode == inject_mode
            && self.state.agent_version == version;
        if !configured {
            self.write(EventPayload::SessionConfigured { agent, inject_mode, parent: None, version });
        }
        if self.state.overrides != overrides {
            self.write(EventPayload::SessionOverridden(overrides));
        }
        Ok(CommandReply::Written { seq: self.state.last_seq })
    }

    /// The overrides are ones `agent` allows (SPEC §20): those of the version asked for, else of its newest.
    /// One it does not allow at all is FAILED_PRECONDITION (the agent must change, not the request); a
    /// model or tool it does not have is INVALID_ARGUMENT.
    fn check_overrides(
        &self,
        agent: &str,
        version: Option<u64>,
        overrides: &SessionOverrides,
    ) -> Result<(), CommandError> {
        let tenant = self.state.session.tenant.as_str();
        let profile = match version {
            Some(v) => self.agents.version_for(agent, tenant, v),
            None => self.agents.get_for(agent, tenant),
        };
        // `check_agent` and `check_version` found it; nothing to check against otherwise.
        let Some(profile) = profile else { return Ok(()) };
        profile.check_overrides(agent, overrides).map_err(|e| {
            if e.is_not_allowed() {
                CommandError::FailedPrecondition(e.to_string())
            } else {
                CommandError::InvalidArgument(e.to_string())
            }
        })
    }

    /// Version `version` of `agent` exists for this session's tenant (SPEC §20).
    fn check_version(&self, agent: &str, version: u64) -> Result<(), CommandError> {
        if self.agents.version_for(agent, &self.state.session.tenant, version).is_none() {
            return Err(CommandError::InvalidArgument(format!(
                "agent {agent:?} has no version {version}; list its versions with ListAgentVersions"
            )));
        }
        Ok(())
    }

    /// `MigrateSessions` on one session (SPEC §20): a session running `agent` records `version`, durably
    /// and at once, and runs it from its next turn (a running turn keeps its own version). A session that
    /// runs another agent is left alone (FAILED_PRECONDITION, which the gateway counts as skipped); one
    /// already on `version` writes nothing.
    fn migrate(&mut self, agent: String, version: u64) -> Result<CommandReply, CommandError> {
        let tenant = &self.state.session.tenant;
        let runs = self.agents.resolve_version(self.state.agent.as_deref(), self.state.agent_version, tenant).0;
        if !self.state.exists() || runs != agent {
            return Err(CommandError::FailedPrecondition(format!(
                "session {} runs agent {runs:?}, not {agent:?}; it was not migrated",
                self.state.session
            )));
        }
        self.check_version(&agent, version)?;
        if self.state.agent_version == Some(version) {
            return Ok(CommandReply::Written { seq: self.state.last_seq });
        }
        let seq = self.write(EventPayload::SessionConfigured {
            agent,
            inject_mode: self.state.inject_mode,
            parent: None,
            version: Some(version),
        });
        Ok(CommandReply::Written { seq })
    }

    /// `spawn_agent` on the child session (SPEC §13). A session with no events becomes the child:
    /// `session/configured {agent, parent}`, then the prompt as a followup, in the same append group, so a
    /// child never exists without its parent link or its prompt. On a child of the same parent only the
    /// followup runs: a retried call gets its first acceptance back (SPEC §1 dedup). Any other session is
    /// not the parent's to take.
    fn spawn(&mut self, spawn: Spawn) -> Result<CommandReply, CommandError> {
        let Spawn { parent, agent, prompt } = spawn;
        let session = &self.state.session;
        if parent.tenant != session.tenant || parent == *session {
            return Err(CommandError::InvalidArgument(format!(
                "session {parent} cannot spawn {session} as its child: a child is another session of the same tenant"
            )));
        }
        self.check_agent(&agent)?;
        if self.state.exists() {
            if self.state.parent.as_ref() != Some(&parent) {
                return Err(CommandError::AlreadyExists(format!(
                    "session {session} already exists (last seq {}) and is not a child of {parent}; a child session \
                     is created by its parent's spawn_agent call only",
                    self.state.last_seq
                )));
            }
        } else {
            // Everything `deliver` checks that could fail on a session with no events, before the first write.
            self.check_message(&prompt)?;
            self.write(EventPayload::SessionConfigured {
                agent,
                inject_mode: InjectMode::Pending,
                parent: Some(parent),
                version: None,
            });
        }
        self.deliver(prompt, Target::NextTurn, true, None, None, Position::Tail)
    }

    /// `ForkSession` on the new session (SPEC §13): `session/forked` as its first event, only while it
    /// has none.
    fn fork(&mut self, fork: Fork) -> Result<CommandReply, CommandError> {
        if self.state.exists() {
            return Err(CommandError::AlreadyExists(format!(
                "session {} already has events (last seq {}); fork onto a new session id",
                self.state.session, self.state.last_seq
            )));
        }
        if fork.from.tenant != self.state.session.tenant {
            return Err(CommandError::InvalidArgument(format!(
                "a fork stays in its tenant: {} cannot be forked into tenant {}",
                fork.from, self.state.session.tenant
            )));
        }
        let seq = self.write(EventPayload::SessionForked(fork));
        Ok(CommandReply::Written { seq })
    }

    fn clear(&mut self) -> CommandReply {
        self.clear_inbox();
        CommandReply::Written { seq: self.state.last_seq }
    }

    /// next-step first, then next-turn; an empty list writes nothing.
    fn clear_inbox(&mut self) {
        for target in [Target::NextStep, Target::NextTurn] {
            let len = self.state.inbox.list(target).len();
            if len > 0 {
                self.write_edit(target, 0, len as u32, Vec::new());
            }
        }
    }

    fn find_pending(&self, id: &MessageId) -> Result<(Target, usize), CommandError> {
        self.state.inbox.find(id).ok_or_else(|| {
            CommandError::NotFound(format!(
                "message id {id} is not pending in session {}; it was never sent, or it was already claimed or removed",
                self.state.session
            ))
        })
    }

    /// A client edit: one splice (canceled when it removes anything), then discarded and inserted events.
    pub(super) fn write_edit(&mut self, target: Target, start: u32, removed_count: u32, inserted: Vec<UserMessage>) {
        let removed: Vec<UserMessage> =
            self.state.inbox.list(target)[start as usize..(start + removed_count) as usize].to_vec();
        self.write(EventPayload::InboxSpliced(Splice {
            target,
            start,
            removed_count,
            inserted: inserted.clone(),
            outcome: if removed_count > 0 { SpliceOutcome::Canceled } else { SpliceOutcome::None },
            wake: false,
            requested_target: None,
            deadline: None,
        }));
        for message in removed {
            self.publish(LivePayload::Discarded { message });
        }
        for message in inserted {
            self.publish(LivePayload::Inserted { message });
        }
    }
}

/// Pending items a change removes: how many, and the bytes they count.
#[derive(Clone, Copy, Debug)]
struct Room {
    items: usize,
    bytes: usize,
}

impl Room {
    const NONE: Self = Self { items: 0, bytes: 0 };

    fn of(removed: &[UserMessage]) -> Self {
        Self { items: removed.len(), bytes: size::messages_bytes(removed) }
    }
}
