//! Compaction (SPEC §13, decision 0023): the oldest whole turns are summarized by the model and later
//! requests carry the summary instead of them.
//!
//! A compaction is an ordinary model request marked [`CompactionTask`]: the runner sends it to the
//! agent's `compaction_model` with no tools and publishes nothing. It runs in two places:
//! - before a step whose request would exceed the agent's `context_budget_tokens` (at most once per
//!   turn), between the pre-step decision and `step/start`;
//! - on `Compact` while idle, answering the command once `context/compacted` is durable.
//!
//! A failed compaction writes nothing: the step goes on with the uncompacted request, and `Compact`
//! answers with the error.

use turnstile_model::{
    CommandError, CommandReply, Compaction, ContentBlock, EventPayload, TranscriptEntry, TurnEndReason, UserMessage,
};

use super::turn::Phase;
use super::{CommandId, Driver, Effect, ModelOutcome, ModelRequest, OpId};
use crate::effect::CompactionTask;

/// An idle `Compact` whose request runs.
#[derive(Debug)]
pub(super) struct IdleCompaction {
    pub op: OpId,
    pub reply: CommandId,
    pub task: CompactionTask,
}

/// The estimated size of a model request in tokens: UTF-8 bytes (and data bytes) / 4, rounded up.
pub fn estimate_tokens(
    system: Option<&str>,
    summary: Option<&str>,
    history: &[std::sync::Arc<TranscriptEntry>],
    messages: &[UserMessage],
) -> u64 {
    let message_bytes = |m: &UserMessage| -> usize {
        m.content
            .iter()
            .map(|b| match b {
                ContentBlock::Text { text } => text.len(),
                ContentBlock::Data { mime, bytes } => mime.len() + bytes.len(),
            })
            .sum()
    };
    let mut bytes = system.map_or(0, str::len) + summary.map_or(0, str::len);
    for entry in history {
        bytes += match entry.as_ref() {
            TranscriptEntry::User { message, .. } => message_bytes(message),
            TranscriptEntry::Assistant { text, tool_calls, .. } => {
                text.len() + tool_calls.iter().map(|c| c.name.len() + c.arguments.len()).sum::<usize>()
            }
            TranscriptEntry::ToolResult { output, error, name, .. } => {
                output.len() + name.len() + error.as_ref().map_or(0, String::len)
            }
        };
    }
    bytes += messages.iter().map(message_bytes).sum::<usize>();
    (bytes as u64).div_ceil(4)
}

impl Driver {
    /// What a compaction now would summarize: the kept whole turns after the last summary and before
    /// `before_turn` (the current turn is never summarized). `None` when there is no such turn.
    fn compaction_task(&self, before_turn: u64) -> Option<CompactionTask> {
        let upto_turn = self.state.transcript.turns().map(|g| g.turn).filter(|t| *t != 0 && *t < before_turn).max()?;
        let previous = self.state.compaction.as_ref();
        if previous.is_some_and(|p| p.upto_turn >= upto_turn) {
            return None;
        }
        let first_new = self.state.transcript.turns_through(upto_turn).first().copied().unwrap_or(upto_turn);
        let from_turn = previous.map_or(first_new, |p| p.from_turn);
        Some(CompactionTask { from_turn, upto_turn })
    }

    /// The compaction request for `task` of `agent`.
    fn compaction_request(
        &mut self,
        (agent, agent_hash): (&str, &str),
        turn: u64,
        step: u32,
        task: CompactionTask,
    ) -> ModelRequest {
        ModelRequest {
            op: self.new_op(),
            session: self.state.session.clone(),
            turn,
            step,
            agent: agent.to_owned(),
            agent_hash: agent_hash.to_owned(),
            system: None,
            overrides: turnstile_model::overrides::SessionOverrides::default(),
            history: self.state.transcript.entries_through(task.upto_turn),
            messages: Vec::new(),
            tool_results: Vec::new(),
            interrupted_prompt: Vec::new(),
            goal: None,
            summary: self.state.compaction.as_ref().map(|c| c.summary.clone()),
            output: None,
            compaction: Some(task),
        }
    }

    /// Before step `step` of the running turn enters `messages`: when the request would exceed the
    /// agent's budget and there are whole turns to summarize, asks for a compaction and returns true (the
    /// step starts when it is done). At most once per turn.
    pub(super) fn compact_before_step(&mut self, messages: &[UserMessage]) -> bool {
        if self.idle_compaction.is_some() {
            return false;
        }
        let Some(t) = self.turn.as_ref() else { return false };
        if t.compaction_tried {
            return false;
        }
        let (turn, step, agent, agent_hash) = (t.turn, t.step + 1, t.agent.clone(), t.agent_hash.clone());
        let profile = self.agents.turn_profile(&agent, &self.state.session.tenant, t.version);
        let Some(budget) = profile.context_budget_tokens else { return false };
        let history = self.state.transcript.history(turn, step, profile.history_turns);
        let summary = self.state.compaction.as_ref().map(|c| c.summary.as_str());
        if estimate_tokens(profile.system.as_deref(), summary, &history, messages) <= budget {
            return false;
        }
        let Some(task) = self.compaction_task(turn) else { return false };
        let request = self.compaction_request((&agent, &agent_hash), turn, step, task);
        if let Some(t) = self.turn.as_mut() {
            t.compaction_tried = true;
            t.phase = Phase::Compacting { op: request.op, task, messages: messages.to_vec() };
        }
        self.effects.push_back(Effect::Model(Box::new(request)));
        true
    }

    /// `Compact` (SPEC §13): only while idle; nothing to summarize writes nothing.
    pub(super) fn compact_command(&mut self, id: CommandId) -> Option<Result<CommandReply, CommandError>> {
        let session = &self.state.session;
        // Like every other call that needs a session, not a silent OK on one that was never written.
        if self.state.last_seq == 0 {
            return Some(Err(CommandError::session_not_found(session)));
        }
        if let Some(turn) = self.running_turn() {
            return Some(Err(CommandError::FailedPrecondition(format!(
                "session {session} is running turn {turn}; compact once it is idle (wait-idle), or let the agent's \
                 context_budget_tokens compact before a step"
            ))));
        }
        if self.idle_compaction.is_some() {
            return Some(Err(CommandError::FailedPrecondition(format!(
                "session {session} is already compacting; wait for that Compact to answer"
            ))));
        }
        let Some(task) = self.compaction_task(u64::MAX) else {
            return Some(Ok(CommandReply::Written { seq: self.state.last_seq }));
        };
        let (agent, profile) = self.agents.resolve_version(
            self.state.agent.as_deref(),
            self.state.agent_version,
            &self.state.session.tenant,
        );
        let (agent, agent_hash) = (agent.to_owned(), profile.hash.clone());
        let request = self.compaction_request((&agent, &agent_hash), self.state.last_turn, 0, task);
        self.idle_compaction = Some(IdleCompaction { op: request.op, reply: id, task });
        self.effects.push_back(Effect::Model(Box::new(request)));
        None
    }

    /// A model request ended that may be a compaction: true when it was one (and is handled).
    pub(super) fn compaction_done(&mut self, op: OpId, outcome: &ModelOutcome) -> bool {
        if let Some(idle) = self.idle_compaction.take_if(|c| c.op == op) {
            let result = match self.record_compaction(idle.task, outcome) {
                Ok(seq) => Ok(CommandReply::Written { seq }),
                Err(message) => Err(CommandError::Unavailable(format!(
                    "compaction of session {} failed ({message}); nothing was written; retry Compact",
                    self.state.session
                ))),
            };
            self.reply(idle.reply, result);
            return true;
        }
        let Some(t) = self.turn.as_mut() else { return false };
        let Phase::Compacting { op: current, task, messages } = &mut t.phase else { return false };
        if *current != op {
            return false;
        }
        let (task, messages) = (*task, std::mem::take(messages));
        if let Some(cause) = t.cancel.clone() {
            // Before `step/start`: a no-step turn ending aborted, like an abort during the pre-step.
            self.end_turn(TurnEndReason::Aborted(cause));
            return true;
        }
        if let Err(message) = self.record_compaction(task, outcome) {
            tracing::warn!(session = %self.state.session, %message, "compaction failed; the step goes on uncompacted");
        }
        self.run_step(messages);
        true
    }

    /// Writes `context/compacted` for a finished compaction; the reason it was not written otherwise.
    fn record_compaction(&mut self, task: CompactionTask, outcome: &ModelOutcome) -> Result<u64, String> {
        let summary = match outcome {
            ModelOutcome::Finished(output) if !output.text.trim().is_empty() => output.text.trim().to_owned(),
            ModelOutcome::Finished(_) => return Err("the model wrote an empty summary".into()),
            ModelOutcome::Failed { message, .. } => return Err(message.clone()),
            ModelOutcome::Aborted { .. } => return Err("the request was aborted".into()),
        };
        if self.state.compaction.as_ref().is_some_and(|c| c.upto_turn >= task.upto_turn) {
            return Err(format!("turns through {} were compacted meanwhile", task.upto_turn));
        }
        let summarized_turns = self.state.transcript.turns_through(task.upto_turn).len() as u32;
        Ok(self.write(EventPayload::ContextCompacted(Compaction {
            upto_turn: task.upto_turn,
            from_turn: task.from_turn,
            summary,
            summarized_turns,
        })))
    }
}
