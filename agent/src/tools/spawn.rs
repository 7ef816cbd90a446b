//! The built-in tool `spawn_agent {agent, prompt}` (SPEC §13): a child session on whatever worker owns
//! it, configured with `agent` and its `parent`, sent `prompt` as a followup; the parent's call waits for
//! the child to finish and returns its last assistant text (docs/decisions/0038-child-sessions.md).
//!
//! The tool talks to the child the way a client would, through a [`CommandRouter`] (the in-process host
//! in `turnstile dev`, the cluster router on a worker) and reads the child's log from the journal, so the
//! child's owner may be any worker and may change while the parent waits: every step is a retry-safe
//! command (the prompt's MessageId is derived from the call) and the outcome is read from the log.
//!
//! Limits (decision 0076): a child may sit at most [`SpawnLimits::max_depth`] levels below its root session
//! and a session may create at most [`SpawnLimits::max_children`] children (config `limits.max_spawn_depth`,
//! `limits.max_children`), so an agent that spawns agents that spawn cannot fill a cluster. A call over
//! either is refused before anything is written, with a [`SpawnRefused`] whose text starts with its code.

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

/// How far `spawn_agent` may go (config `limits.max_spawn_depth` and `limits.max_children`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpawnLimits {
    /// Levels a child may sit below its root session (a session nobody spawned): 1 lets roots spawn
    /// children that cannot spawn.
    pub max_depth: u32,
    /// Children one session may create.
    pub max_children: u32,
}

impl Default for SpawnLimits {
    fn default() -> Self {
        Self { max_depth: 3, max_children: 16 }
    }
}

/// Why a `spawn_agent` call was refused before it created anything. The text starts with a stable code
/// (`spawn_depth_exceeded`, `spawn_children_exceeded`) a model or a client can match.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpawnRefused {
    #[error(
        "spawn_depth_exceeded: session {session} is {depth} levels below its root session, and a child of it \
         would be deeper than limits.max_spawn_depth ({limit}); do this task in this session"
    )]
    TooDeep { session: SessionRef, depth: u32, limit: u32 },
    #[error(
        "spawn_children_exceeded: session {session} already has {children} child sessions, limits.max_children \
         ({limit}); give the task to one of them (a followup to it) or do it in this session"
    )]
    TooManyChildren { session: SessionRef, children: u32, limit: u32 },
    #[error("spawn_agent could not check its limits for session {session}: {detail}; try again")]
    Unchecked { session: SessionRef, detail: String },
}

/// What the tool needs from the node it runs on: a route to any session's owner and the journal.
#[derive(Clone)]
pub struct ChildSessions {
    pub router: Arc<dyn CommandRouter>,
    pub log: Arc<dyn SessionLog>,
}

/// Where the node sets [`ChildSessions`] once it has them (after the agents are built).
pub type ChildSessionsSlot = Arc<OnceLock<ChildSessions>>;

/// `spawn_agent`. `agents` (when known), the configuration's, are named to the model in the argument's
/// description.
pub struct SpawnAgent {
    children: ChildSessionsSlot,
    agents: Vec<String>,
    limits: SpawnLimits,
}

impl SpawnAgent {
    pub fn new(children: ChildSessionsSlot, agents: Vec<String>, limits: SpawnLimits) -> Self {
        Self { children, agents, limits }
    }
}

#[async_trait]
impl Tool for SpawnAgent {
    fn description(&self) -> &str {
        "Hands a task to another agent in a new child session and waits for it to finish; returns the child's \
         final answer. Give the agent profile to run and a complete, self-contained prompt."
    }

    fn input_schema(&self) -> serde_json::Value {
        // Not an `enum`: the agents a tenant put through the API (SPEC §20) are as valid as the file's, and
        // they change at run time; an unknown name is refused with the list of the tenant's agents.
        let description = if self.agents.is_empty() {
            "The agent profile the child runs.".to_owned()
        } else {
            format!("The agent profile the child runs (the configuration's: {}).", self.agents.join(", "))
        };
        let agent = serde_json::json!({"type": "string", "description": description});
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
        if let Err(refused) = check_limits(children.log.as_ref(), &ctx.session, &child, self.limits).await {
            return ToolReturn::failed(refused.to_string());
        }
        let prompt = UserMessage {
            id: child::prompt_id(&ctx.call_id),
            content: vec![ContentBlock::text(prompt)].into(),
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

/// The parent a session's first event names (a child's `session/configured`), if any.
async fn parent_of(log: &dyn SessionLog, session: &SessionRef) -> Result<Option<SessionRef>, SpawnRefused> {
    let first = log
        .read(session, 1, 1)
        .await
        .map_err(|e| SpawnRefused::Unchecked { session: session.clone(), detail: e.to_string() })?;
    Ok(first.into_iter().find_map(|e| match e.payload {
        EventPayload::SessionConfigured { parent, .. } => parent,
        _ => None,
    }))
}

/// Refuses a call of `parent` that would create `child` past `limits`: `parent`'s ancestors are read up to
/// the depth limit (one event each), and its children (the sessions named with its prefix) up to the
/// children limit. A retry of a call whose child exists is not refused for the children limit. The calls of
/// one session run one at a time, so the count cannot race with the session's own calls.
async fn check_limits(
    log: &dyn SessionLog,
    parent: &SessionRef,
    child: &SessionRef,
    limits: SpawnLimits,
) -> Result<(), SpawnRefused> {
    let unchecked =
        |e: turnstile_journal::JournalError| SpawnRefused::Unchecked { session: parent.clone(), detail: e.to_string() };
    let mut depth = 0;
    let mut at = parent.clone();
    while let Some(up) = parent_of(log, &at).await? {
        depth += 1;
        if depth >= limits.max_depth {
            return Err(SpawnRefused::TooDeep { session: parent.clone(), depth, limit: limits.max_depth });
        }
        at = up;
    }
    let prefix = format!("{}-", child::id_prefix(parent));
    let start = SessionRef { tenant: parent.tenant.clone(), id: prefix.clone() };
    let want = limits.max_children as usize + 1;
    let named = log.list_sessions(Some(&parent.tenant), Some(&start), want).await.map_err(unchecked)?;
    let mut children = 0;
    for session in named.iter().take_while(|s| s.tenant == parent.tenant && s.id.starts_with(&prefix)) {
        if session == child {
            return Ok(());
        }
        if parent_of(log, session).await?.as_ref() == Some(parent) {
            children += 1;
        }
    }
    if children >= limits.max_children {
        return Err(SpawnRefused::TooManyChildren { session: parent.clone(), children, limit: limits.max_children });
    }
    Ok(())
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
        let tool = SpawnAgent::new(slot, vec![], SpawnLimits::default());
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

    /// A log holding `(session, parent)` first events.
    async fn family(sessions: &[(&str, Option<&str>)]) -> turnstile_journal::EmbeddedLog {
        let log = turnstile_journal::EmbeddedLog::in_memory();
        for (id, parent) in sessions {
            let session = SessionRef::new("t", *id).unwrap();
            let payload = EventPayload::SessionConfigured {
                version: None,
                agent: "a".into(),
                inject_mode: turnstile_model::InjectMode::Pending,
                parent: parent.map(|p| SessionRef::new("t", p).unwrap()),
            };
            let event = turnstile_model::Envelope { session: session.clone(), seq: 1, time_ms: 1, epoch: 1, payload };
            log.append(&session, 0, &[event], None).await.unwrap();
        }
        log
    }

    #[tokio::test]
    async fn spawning_past_the_depth_or_the_children_limit_is_refused_with_its_code() {
        let r = |id: &str| SessionRef::new("t", id).unwrap();
        let log = family(&[
            ("root", None),
            ("root-c1", Some("root")),
            ("root-c1-c1", Some("root-c1")),
            ("root-c2", Some("root")),
            ("root-notes", None),
        ])
        .await;
        let limits = SpawnLimits { max_depth: 2, max_children: 2 };
        let check = |parent: &str, child: &str| {
            let (log, parent, child) = (&log, r(parent), r(child));
            async move { check_limits(log, &parent, &child, limits).await }
        };
        // Depth: root's children are at 1, theirs at 2; a child of a depth-2 session would be at 3.
        assert_eq!(check("root-c1", "root-c1-c9").await, Ok(()));
        let deep = check("root-c1-c1", "root-c1-c1-c1").await.unwrap_err();
        assert_eq!(deep, SpawnRefused::TooDeep { session: r("root-c1-c1"), depth: 2, limit: 2 });
        assert!(deep.to_string().starts_with("spawn_depth_exceeded: session t/root-c1-c1 is 2 levels"), "{deep}");
        // Children: root has two (root-notes shares the prefix but is no child); a third is refused, a retry
        // of an existing child's call is not.
        let wide = check("root", "root-c3").await.unwrap_err();
        assert_eq!(wide, SpawnRefused::TooManyChildren { session: r("root"), children: 2, limit: 2 });
        assert!(wide.to_string().starts_with("spawn_children_exceeded: "), "{wide}");
        assert_eq!(check("root", "root-c2").await, Ok(()));
        assert_eq!(check("root-c1", "root-c1-c2").await, Ok(()), "one child of its own so far");
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
                content: vec![ContentBlock::text("p")].into(),
                source: MessageSource::User,
            },
            turn,
            step: 1,
        }
    }

    fn said(turn: u64, text: &str) -> EventPayload {
        EventPayload::reply(turn, 1, text)
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
