//! The built-in tool `spawn_agent {agent, prompt}` (SPEC §13): a child session on whatever worker owns
//! it, configured with `agent` and its `parent`, sent `prompt` as a followup; the parent's call waits for
//! the child to finish and returns its last assistant text (docs/decisions/0038-child-sessions.md).
//!
//! The tool talks to the child the way a client would, through a [`CommandRouter`] (the in-process host
//! in `turnstile dev`, the cluster router on a worker) and reads the child's log from the journal, so the
//! child's owner may be any worker and may change while the parent waits: every step is a retry-safe
//! command (the prompt's MessageId is derived from the call) and the outcome is read from the log.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use turnstile_cluster::CommandRouter;
use turnstile_journal::SessionLog;
use turnstile_model::event::{CancelCause, EventPayload, TurnEndReason};
use turnstile_model::{
    Command, CommandError, CommandReply, ContentBlock, MessageSource, SessionRef, Spawn, UserMessage, child,
};

use super::{Tool, ToolContext, ToolReturn, json_field};

/// The tool's name, as agents list it.
pub const SPAWN_AGENT: &str = "spawn_agent";

/// How long one `WhenIdle` of the child waits before it is asked again (the call's own deadline bounds the
/// whole wait).
const IDLE_WAIT: Duration = Duration::from_secs(30);

/// Pause between attempts while the child's owner cannot be reached (the router has already retried).
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// How long the cancel of a child whose parent stopped waiting may take; it runs on after the call ended.
const CANCEL_BOUND: Duration = Duration::from_secs(30);

/// What the tool needs from the node it runs on: a route to any session's owner and the journal.
#[derive(Clone)]
pub struct ChildSessions {
    pub router: Arc<dyn CommandRouter>,
    pub log: Arc<dyn SessionLog>,
}

/// Where the node sets [`ChildSessions`] once it has them (after the agents are built).
pub type ChildSessionsSlot = Arc<OnceLock<ChildSessions>>;

/// `spawn_agent`. `agents` (when known) are offered to the model as the argument's choices.
pub struct SpawnAgent {
    children: ChildSessionsSlot,
    agents: Vec<String>,
}

impl SpawnAgent {
    pub fn new(children: ChildSessionsSlot, agents: Vec<String>) -> Self {
        Self { children, agents }
    }
}

#[async_trait]
impl Tool for SpawnAgent {
    fn description(&self) -> &str {
        "Hands a task to another agent in a new child session and waits for it to finish; returns the child's \
         final answer. Give the agent profile to run and a complete, self-contained prompt."
    }

    fn input_schema(&self) -> serde_json::Value {
        let mut agent = serde_json::json!({"type": "string", "description": "The agent profile the child runs."});
        if !self.agents.is_empty() {
            agent["enum"] = serde_json::json!(self.agents);
        }
        serde_json::json!({
            "type": "object",
            "properties": {
                "agent": agent,
                "prompt": {"type": "string", "description": "The task for the child agent."},
            },
            "required": ["agent", "prompt"],
            "additionalProperties": false,
        })
    }

    async fn call(&self, ctx: &ToolContext, arguments: &str, abort: &CancellationToken) -> ToolReturn {
        let (agent, prompt) = match arguments_of(arguments) {
            Ok(parsed) => parsed,
            Err(e) => return ToolReturn::failed(e),
        };
        let Some(children) = self.children.get() else {
            return ToolReturn::failed("spawn_agent cannot run on this node: it has no route to other sessions");
        };
        let child = child::session_of(&ctx.session, &ctx.call_id);
        let prompt = UserMessage {
            id: child::prompt_id(&ctx.call_id),
            content: vec![ContentBlock::text(prompt)],
            source: MessageSource::User,
        };
        let prompt_id = prompt.id.clone();
        let spawn = Command::Spawn(Box::new(Spawn { parent: ctx.session.clone(), agent, prompt }));
        let outcome = tokio::select! {
            // An abort (the parent's turn cancelled, the call's deadline) wins over a reply in the same poll.
            biased;
            () = abort.cancelled() => None,
            outcome = run(children, &child, spawn, &prompt_id) => Some(outcome),
        };
        match outcome {
            Some(outcome) => outcome,
            // Not a cancel of the parent's turn: the next owner of the parent repairs the call, and the
            // child goes on (decision 0038).
            None if ctx.released.is_cancelled() => ToolReturn::failed(format!(
                "this worker let the call go before child session {child} finished; the child keeps running"
            )),
            None => {
                cancel_child(children.router.clone(), child.clone());
                ToolReturn::failed(format!(
                    "the parent's call stopped waiting; child session {child} is being cancelled (cause parent)"
                ))
            }
        }
    }
}

/// `{"agent": A, "prompt": P}` from a model, or `AGENT PROMPT` from a scripted `[[tool:spawn_agent …]]`.
fn arguments_of(arguments: &str) -> Result<(String, String), String> {
    const USAGE: &str = "spawn_agent takes {\"agent\": AGENT, \"prompt\": TEXT}";
    let (agent, prompt) = match (json_field(arguments, "agent"), json_field(arguments, "prompt")) {
        (Some(agent), Some(prompt)) => match (agent, prompt) {
            (Some(serde_json::Value::String(a)), Some(serde_json::Value::String(p))) => (a, p),
            _ => return Err(format!("{USAGE}, both strings; got {arguments}")),
        },
        _ => match arguments.trim().split_once(char::is_whitespace) {
            Some((a, p)) => (a.to_owned(), p.trim().to_owned()),
            None => return Err(format!("{USAGE} (or `AGENT PROMPT`); got {arguments:?}")),
        },
    };
    if agent.trim().is_empty() || prompt.trim().is_empty() {
        return Err(format!("{USAGE} with neither empty; got {arguments}"));
    }
    Ok((agent, prompt))
}

/// Starts the child (or finds it started by an earlier attempt of this call), waits until it is idle and
/// reads what its turn came to.
async fn run(
    children: &ChildSessions,
    child: &SessionRef,
    spawn: Command,
    prompt_id: &turnstile_model::MessageId,
) -> ToolReturn {
    let accepted = loop {
        match children.router.execute(child, spawn.clone(), None).await {
            Ok(CommandReply::Sent { seq, .. }) => break seq,
            Ok(other) => {
                return ToolReturn::failed(format!("child session {child} answered the spawn with {other:?}"));
            }
            Err(CommandError::Unavailable(_) | CommandError::NotOwner { .. }) => tokio::time::sleep(RETRY_PAUSE).await,
            Err(e) => return ToolReturn::failed(format!("spawn_agent could not start child session {child}: {e}")),
        }
    };
    let idle_seq = loop {
        match children.router.execute(child, Command::WhenIdle, Some(IDLE_WAIT)).await {
            Ok(CommandReply::Idle(summary)) => break summary.last_seq,
            Ok(other) => return ToolReturn::failed(format!("child session {child} answered WhenIdle with {other:?}")),
            // Still running, or its owner is changing: ask again.
            Err(CommandError::DeadlineExceeded(_)) => {}
            Err(CommandError::Unavailable(_) | CommandError::NotOwner { .. }) => tokio::time::sleep(RETRY_PAUSE).await,
            Err(e) => return ToolReturn::failed(format!("waiting for child session {child} failed: {e}")),
        }
    };
    loop {
        match children.log.read_after(child, accepted.saturating_sub(1), None).await {
            // Everything the owner had written when it answered idle: what the turn came to.
            Ok(Some(events)) if events.last().is_some_and(|e| e.seq >= idle_seq) => {
                return outcome(child, prompt_id, events.iter().map(|e| &e.payload));
            }
            // A replica that has not caught up with the owner's writes yet, or a store that did not answer:
            // read again (the call's abort bounds the wait).
            Ok(Some(_)) => tokio::time::sleep(RETRY_PAUSE).await,
            Err(e) if e.is_retryable() => tokio::time::sleep(RETRY_PAUSE).await,
            Ok(None) => {
                return ToolReturn::failed(format!("child session {child} was deleted before its turn could be read"));
            }
            Err(e) => return ToolReturn::failed(format!("the log of child session {child} could not be read: {e}")),
        }
    }
}

/// The call's result from the child's events since the prompt was accepted: the last assistant text of the
/// turns from the last one that entered the prompt (a turn repaired after a crash is followed by the turn
/// that resumes it), or an error naming how the last of them ended.
fn outcome<'a>(
    child: &SessionRef,
    prompt_id: &turnstile_model::MessageId,
    events: impl Iterator<Item = &'a EventPayload>,
) -> ToolReturn {
    let mut entered: Option<u64> = None;
    let mut text: Option<&str> = None;
    let mut ended: Option<(u64, &TurnEndReason)> = None;
    for payload in events {
        match payload {
            EventPayload::UserMessage { message, turn, .. } if message.id == *prompt_id => {
                (entered, text, ended) = (Some(*turn), None, None);
            }
            EventPayload::AssistantMessage { turn, text: t, .. }
                if entered.is_some_and(|e| *turn >= e) && !t.is_empty() =>
            {
                text = Some(t);
            }
            EventPayload::TurnEnd { turn, reason } if entered.is_none_or(|e| *turn >= e) => {
                ended = Some((*turn, reason))
            }
            _ => {}
        }
    }
    match (entered, ended) {
        (Some(_), Some((_, TurnEndReason::Completed))) => match text {
            Some(text) => ToolReturn::ok(text),
            None => ToolReturn::ok(format!("child session {child} finished without a text answer")),
        },
        (Some(_), Some((turn, reason))) => {
            let said = text.map(|t| format!("; its last answer: {t}")).unwrap_or_default();
            ToolReturn::failed(format!("child session {child} turn {turn} ended {reason}{said}"))
        }
        (None, Some((turn, reason))) => ToolReturn::failed(format!(
            "child session {child} turn {turn} ended {reason} before the prompt was entered"
        )),
        (_, None) => ToolReturn::failed(format!(
            "child session {child} went idle without running the prompt (it was removed from its inbox)"
        )),
    }
}

/// Cancels `child` with cause `parent` (SPEC §13) on a task of its own: the call that stopped waiting may
/// be dropped right after, and the cancel must still reach the child's owner.
fn cancel_child(router: Arc<dyn CommandRouter>, child: SessionRef) {
    tokio::spawn(async move {
        let cancel = Command::Cancel { cause: CancelCause::Parent, keep_inbox: false };
        match tokio::time::timeout(CANCEL_BOUND, router.execute(&child, cancel, None)).await {
            Ok(Ok(_)) => tracing::debug!(%child, "child session cancelled with cause parent"),
            Ok(Err(e)) => tracing::warn!(%child, error = %e, "the child session could not be cancelled"),
            Err(_) => tracing::warn!(%child, "the child session's cancel did not finish in time"),
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use turnstile_model::MessageId;

    /// Answers `Spawn` as accepted, never finds the child idle, and records every command it routes.
    #[derive(Default)]
    struct Recording(std::sync::Mutex<Vec<Command>>);

    #[async_trait]
    impl CommandRouter for Recording {
        async fn execute(
            &self,
            _: &SessionRef,
            command: Command,
            _: Option<Duration>,
        ) -> Result<CommandReply, CommandError> {
            self.0.lock().unwrap().push(command.clone());
            match command {
                Command::Spawn(_) => Ok(CommandReply::Sent { seq: 2, turn: Some(1) }),
                Command::WhenIdle => std::future::pending().await,
                _ => Ok(CommandReply::Written { seq: 3 }),
            }
        }
    }

    /// Runs a call until it waits for the child, then stops it through `stop`; the commands routed after.
    async fn stopped_by(stop: impl FnOnce(&ToolContext, &CancellationToken)) -> (ToolReturn, Vec<Command>) {
        let router = Arc::new(Recording::default());
        let slot = ChildSessionsSlot::default();
        let _ = slot
            .set(ChildSessions { router: router.clone(), log: Arc::new(turnstile_journal::EmbeddedLog::in_memory()) });
        let tool = SpawnAgent::new(slot, vec![]);
        let ctx = ToolContext { call_id: "call-1-1-1".into(), ..ToolContext::default() };
        let abort = CancellationToken::new();
        let call = tool.call(&ctx, "researcher dig", &abort);
        tokio::pin!(call);
        while !router.0.lock().unwrap().iter().any(|c| matches!(c, Command::WhenIdle)) {
            tokio::select! {
                r = &mut call => panic!("the call ended before waiting: {r:?}"),
                () = tokio::task::yield_now() => {}
            }
        }
        stop(&ctx, &abort);
        let r = call.await;
        // The cancel runs on a task of its own.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        let routed = router.0.lock().unwrap().clone();
        (r, routed)
    }

    #[tokio::test]
    async fn an_abort_cancels_the_child_with_cause_parent_but_a_release_does_not() {
        let cancel = Command::Cancel { cause: CancelCause::Parent, keep_inbox: false };
        let (r, routed) = stopped_by(|_, abort| abort.cancel()).await;
        assert!(r.error.unwrap().contains("is being cancelled (cause parent)"));
        assert_eq!(routed.last(), Some(&cancel), "{routed:?}");
        // The worker lets the call go (reload, shutdown): released first, then the abort.
        let (r, routed) = stopped_by(|ctx, abort| {
            ctx.released.cancel();
            abort.cancel();
        })
        .await;
        assert!(r.error.unwrap().contains("the child keeps running"));
        assert!(!routed.contains(&cancel), "{routed:?}");
    }

    #[test]
    fn arguments_from_a_model_or_a_script() {
        assert_eq!(
            arguments_of(r#"{"agent": "researcher", "prompt": "find it"}"#).unwrap(),
            ("researcher".to_owned(), "find it".to_owned())
        );
        assert_eq!(
            arguments_of("researcher find it now").unwrap(),
            ("researcher".to_owned(), "find it now".to_owned())
        );
        for bad in [
            "",
            "researcher",
            r#"{"agent": "a"}"#,
            r#"{"agent": 1, "prompt": "p"}"#,
            r#"{"agent": " ", "prompt": "p"}"#,
        ] {
            assert!(arguments_of(bad).unwrap_err().starts_with("spawn_agent takes"), "{bad}");
        }
    }

    fn user(id: &str, turn: u64) -> EventPayload {
        EventPayload::UserMessage {
            message: UserMessage {
                id: MessageId(id.into()),
                content: vec![ContentBlock::text("p")],
                source: MessageSource::User,
            },
            turn,
            step: 1,
        }
    }

    fn said(turn: u64, text: &str) -> EventPayload {
        EventPayload::AssistantMessage {
            turn,
            step: 1,
            text: text.into(),
            tool_calls: vec![],
            interrupted: false,
            max_tokens: false,
            reasoning: None,
            usage: None,
            model: None,
        }
    }

    fn end(turn: u64, reason: TurnEndReason) -> EventPayload {
        EventPayload::TurnEnd { turn, reason }
    }

    #[test]
    fn the_outcome_follows_the_prompt_through_a_repaired_turn() {
        let child = SessionRef::new("t", "c").unwrap();
        let id = MessageId("spawn:x".into());
        let run = |events: Vec<EventPayload>| outcome(&child, &id, events.iter());
        assert_eq!(
            run(vec![user("spawn:x", 1), said(1, "done"), end(1, TurnEndReason::Completed)]),
            ToolReturn::ok("done")
        );
        // Interrupted by a crash, resumed by the next turn: that turn's answer counts.
        assert_eq!(
            run(vec![
                user("spawn:x", 1),
                said(1, "half"),
                end(1, TurnEndReason::Interrupted),
                said(2, "whole"),
                end(2, TurnEndReason::Completed)
            ]),
            ToolReturn::ok("whole")
        );
        let aborted =
            run(vec![user("spawn:x", 1), said(1, "so far"), end(1, TurnEndReason::Aborted(CancelCause::User))]);
        assert_eq!(aborted.error.unwrap(), "child session t/c turn 1 ended aborted{user}; its last answer: so far");
        let blocked = run(vec![end(1, TurnEndReason::Blocked { reason: None })]);
        assert_eq!(blocked.error.unwrap(), "child session t/c turn 1 ended blocked before the prompt was entered");
        assert!(run(vec![]).error.unwrap().contains("without running the prompt"));
        // Another message's turn is not the prompt's.
        assert_eq!(
            run(vec![
                user("other", 1),
                said(1, "no"),
                end(1, TurnEndReason::Completed),
                user("spawn:x", 2),
                said(2, "yes"),
                end(2, TurnEndReason::Completed)
            ]),
            ToolReturn::ok("yes")
        );
    }
}
