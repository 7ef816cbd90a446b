//! A remote pre-step hook: the gRPC service `turnstile.hooks.v1.PreStepHook` at a configured URL (SPEC §9).
//!
//! One channel per hook, opened on the first call and reused (tonic reconnects it after a failure), so a
//! hook that is down at start does not stop the worker and a hook that comes back is used again. Every call
//! carries the hook's deadline (`grpc-timeout`, and enforced here, connect included). The answer is checked
//! against the batch the hook was given ([`validate_answer`]); a timeout, a transport error, an error
//! status or an invalid answer is a [`HookFailure`], and the hook's `on_failure` decides what it does to
//! the proposal: `error` ends the turn `error` (§7 12), `reject` ends it `blocked` naming the hook and the
//! failure, `skip` passes the batch on unchanged.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use metrics::{counter, histogram};
use tokio::sync::OnceCell;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tracing::Instrument as _;
use turnstile_config::{HookConfig, OnFailure};
use turnstile_driver::{HookError, HookVerdict, PreStepRequest};
use turnstile_model::{SessionRef, UserMessage};
use turnstile_ops::names;
use turnstile_proto::codec::{decode_user_message_with_default_source, encode_session_ref, encode_user_message};
use turnstile_proto::hooks::v1 as pb;
use turnstile_proto::hooks::v1::pre_step_hook_client::PreStepHookClient;

use super::{PreStepHook, Proposal};

/// Why one call of a remote hook produced no usable decision.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HookFailure {
    /// No answer within the hook's `deadline_ms` (connecting included).
    #[error("no answer within the deadline of {0} ms")]
    Timeout(u64),
    /// The hook could not be reached (connection refused or reset, bad URL, TLS).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The hook answered with a gRPC error status.
    #[error("answered {code:?}: {message}")]
    Status { code: tonic::Code, message: String },
    /// The hook's answer breaks the contract of `Decide`.
    #[error("invalid answer: {0}")]
    Invalid(#[from] InvalidAnswer),
}

impl HookFailure {
    /// The metric label of the failure.
    fn label(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Unavailable(_) => "unavailable",
            Self::Status { .. } => "status",
            Self::Invalid(_) => "invalid",
        }
    }
}

/// An answer of a hook that the worker cannot enter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidAnswer {
    /// Neither `reject` nor `enter` is set.
    #[error("the decision is empty (set reject or enter)")]
    NoDecision,
    /// `enter` names a message the hook was not given: a hook may rewrite and drop, never add.
    #[error("enter.messages[{index}]: id {id:?} is not in the batch the hook was given")]
    UnknownId { index: usize, id: String },
    /// `enter` names one message twice.
    #[error("enter.messages[{index}]: id {id:?} appears twice")]
    DuplicateId { index: usize, id: String },
    /// A message does not decode (bad content block).
    #[error("{0}")]
    Message(String),
}

/// Checks a hook's `decision` over the `batch` it was given. `enter` may drop, reorder and rewrite the
/// content of the given messages (same id); each message keeps its original source, because the source
/// records who sent the message and a hook does not get to change that.
pub fn validate_answer(batch: &[UserMessage], decision: pb::PreStepDecision) -> Result<HookVerdict, InvalidAnswer> {
    let entered = match decision.decision {
        None => return Err(InvalidAnswer::NoDecision),
        Some(pb::pre_step_decision::Decision::Reject(reject)) => {
            let reason = (!reject.reason.trim().is_empty()).then_some(reject.reason);
            return Ok(HookVerdict::Reject { reason });
        }
        Some(pb::pre_step_decision::Decision::Enter(enter)) => enter.messages,
    };
    let given: HashMap<&str, &UserMessage> = batch.iter().map(|m| (m.id.0.as_str(), m)).collect();
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(entered.len());
    for (index, mut message) in entered.into_iter().enumerate() {
        let Some(original) = given.get(message.id.as_str()) else {
            return Err(InvalidAnswer::UnknownId { index, id: message.id });
        };
        if !seen.insert(message.id.clone()) {
            return Err(InvalidAnswer::DuplicateId { index, id: message.id });
        }
        message.source = None;
        let decoded = decode_user_message_with_default_source(message, original.source.clone())
            .map_err(|e| InvalidAnswer::Message(format!("enter.messages[{index}]: {e}")))?;
        out.push(decoded);
    }
    Ok(HookVerdict::Pass(out))
}

/// A hook URL the worker cannot dial.
#[derive(Debug, thiserror::Error)]
#[error("hook {url}: {source}")]
pub struct RemoteHookError {
    pub url: String,
    #[source]
    pub source: tonic::transport::Error,
}

/// The `turnstile.hooks.v1.PreStepHook` service at one URL.
#[derive(Debug)]
pub struct RemoteHook {
    url: String,
    endpoint: Endpoint,
    deadline: Duration,
    on_failure: OnFailure,
    /// Opened by the first call (it needs the runtime; agent setup may run without one).
    channel: OnceCell<Channel>,
}

impl RemoteHook {
    /// The hook `config` describes; nothing is dialled yet.
    pub fn new(config: &HookConfig) -> Result<Self, RemoteHookError> {
        let url = config.url.as_str().trim_end_matches('/').to_owned();
        let error = |source| RemoteHookError { url: url.clone(), source };
        let mut endpoint = Endpoint::from_shared(url.clone()).map_err(error)?;
        if config.url.as_url().scheme() == "https" {
            endpoint = endpoint.tls_config(ClientTlsConfig::new()).map_err(error)?;
        }
        Ok(Self { url, endpoint, deadline: config.deadline(), on_failure: config.on_failure, channel: OnceCell::new() })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// One `Decide` call, bounded by the deadline, its answer checked against `batch`.
    async fn call(
        &self,
        session: &SessionRef,
        request: &PreStepRequest,
        batch: &[UserMessage],
    ) -> Result<HookVerdict, HookFailure> {
        let channel = self.channel.get_or_init(|| async { self.endpoint.connect_lazy() }).await.clone();
        let mut call = tonic::Request::new(pb::PreStepRequest {
            session: Some(encode_session_ref(session)),
            agent: request.agent.clone(),
            turn: request.turn,
            step: request.step,
            messages: batch.iter().map(encode_user_message).collect(),
        });
        // Tells the hook how long the worker waits, so it can give up too.
        call.set_timeout(self.deadline);
        let mut client = PreStepHookClient::new(channel);
        let deadline_ms = u64::try_from(self.deadline.as_millis()).unwrap_or(u64::MAX);
        let started = Instant::now();
        let answer = match tokio::time::timeout(self.deadline, client.decide(call)).await {
            Err(_) => return Err(HookFailure::Timeout(deadline_ms)),
            Ok(Err(status)) => return Err(failure_of(status, started.elapsed(), self.deadline)),
            Ok(Ok(answer)) => answer.into_inner(),
        };
        Ok(validate_answer(batch, answer)?)
    }
}

/// Sorts a status the client saw into what went wrong: the transport (tonic reports a failed connect as
/// `Unavailable`), the deadline, or the hook's own status. A server that enforces the `grpc-timeout` we
/// sent answers `DeadlineExceeded` or (tonic) `Cancelled` at about our deadline, on its own clock, which
/// can beat our timer by a hair: near the deadline both count as the timeout, so the failure (and the
/// `turn/end` reason that names it) does not depend on which timer fired first.
fn failure_of(status: tonic::Status, elapsed: Duration, deadline: Duration) -> HookFailure {
    let deadline_ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
    let near_deadline = elapsed >= deadline.mul_f64(0.9);
    match status.code() {
        tonic::Code::DeadlineExceeded => HookFailure::Timeout(deadline_ms),
        tonic::Code::Cancelled if near_deadline => HookFailure::Timeout(deadline_ms),
        tonic::Code::Unavailable => HookFailure::Unavailable(status.message().to_owned()),
        code => HookFailure::Status { code, message: status.message().to_owned() },
    }
}

#[async_trait]
impl PreStepHook for RemoteHook {
    fn name(&self) -> &str {
        &self.url
    }

    async fn decide(&self, proposal: Proposal<'_>, batch: Vec<UserMessage>) -> Result<HookVerdict, HookError> {
        let Proposal { session, request, abort } = proposal;
        let span = tracing::info_span!(
            "pre_step.hook",
            hook = %self.url,
            %session,
            agent = %request.agent,
            turn = request.turn,
            step = request.step,
            outcome = tracing::field::Empty,
            action = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = tokio::select! {
            // An abort ends the call at once; the runner reports the proposal aborted.
            () = abort.cancelled() => None,
            r = self.call(session, request, &batch).instrument(span.clone()) => Some(r),
        };
        let (outcome, action, verdict) = match result {
            None => ("aborted", "error", Err(HookError { hook: self.url.clone(), message: "aborted".into() })),
            Some(Ok(HookVerdict::Pass(next))) => ("enter", "pass", Ok(HookVerdict::Pass(next))),
            Some(Ok(HookVerdict::Reject { reason })) => ("reject", "reject", Ok(HookVerdict::Reject { reason })),
            Some(Err(failure)) => {
                let action = on_failure_label(self.on_failure);
                tracing::warn!(parent: &span, hook = %self.url, %session, turn = request.turn, step = request.step,
                    on_failure = action, "pre-step hook failed: {failure}");
                (failure.label(), action, self.apply_on_failure(failure, batch))
            }
        };
        span.record("outcome", outcome).record("action", action);
        counter!(names::PRE_STEP_HOOK_CALLS, "hook" => self.url.clone(), "outcome" => outcome, "action" => action)
            .increment(1);
        histogram!(names::PRE_STEP_HOOK_SECONDS, "hook" => self.url.clone(), "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        verdict
    }
}

impl RemoteHook {
    /// What `on_failure` makes of `failure`.
    fn apply_on_failure(&self, failure: HookFailure, batch: Vec<UserMessage>) -> Result<HookVerdict, HookError> {
        match self.on_failure {
            OnFailure::Error => Err(HookError { hook: self.url.clone(), message: failure.to_string() }),
            OnFailure::Reject => {
                Ok(HookVerdict::Reject { reason: Some(format!("pre-step hook {} failed: {failure}", self.url)) })
            }
            OnFailure::Skip => Ok(HookVerdict::Pass(batch)),
        }
    }
}

fn on_failure_label(on_failure: OnFailure) -> &'static str {
    match on_failure {
        OnFailure::Error => "error",
        OnFailure::Reject => "reject",
        OnFailure::Skip => "skip",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use turnstile_model::MessageSource;
    use turnstile_proto::codec::encode_user_message;

    fn batch() -> Vec<UserMessage> {
        vec![UserMessage::user_text("a", "first"), UserMessage::user_text("b", "second")]
    }

    fn enter(messages: Vec<UserMessage>) -> pb::PreStepDecision {
        pb::PreStepDecision {
            decision: Some(pb::pre_step_decision::Decision::Enter(pb::Enter {
                messages: messages.iter().map(encode_user_message).collect(),
            })),
        }
    }

    #[test]
    fn enter_may_rewrite_drop_and_reorder() {
        let answer = enter(vec![UserMessage::user_text("b", "SECOND"), UserMessage::user_text("a", "first")]);
        assert_eq!(
            validate_answer(&batch(), answer),
            Ok(HookVerdict::Pass(vec![UserMessage::user_text("b", "SECOND"), UserMessage::user_text("a", "first")]))
        );
        assert_eq!(validate_answer(&batch(), enter(vec![])), Ok(HookVerdict::Pass(vec![])));
    }

    #[test]
    fn a_rewrite_keeps_the_original_source() {
        let mut forged = UserMessage::user_text("a", "other");
        forged.source = MessageSource::Plugin { plugin: "hook".into(), form: None };
        let HookVerdict::Pass(out) = validate_answer(&batch(), enter(vec![forged])).unwrap() else { panic!() };
        assert_eq!(out, vec![UserMessage::user_text("a", "other")]);
    }

    #[test]
    fn new_or_duplicate_ids_are_invalid_and_named() {
        let err = validate_answer(&batch(), enter(vec![UserMessage::user_text("c", "new")])).unwrap_err();
        assert_eq!(err, InvalidAnswer::UnknownId { index: 0, id: "c".into() });
        assert_eq!(err.to_string(), "enter.messages[0]: id \"c\" is not in the batch the hook was given");
        let twice = enter(vec![UserMessage::user_text("a", "x"), UserMessage::user_text("a", "y")]);
        assert_eq!(validate_answer(&batch(), twice), Err(InvalidAnswer::DuplicateId { index: 1, id: "a".into() }));
    }

    #[test]
    fn reject_and_empty_decisions() {
        let reject = |reason: &str| pb::PreStepDecision {
            decision: Some(pb::pre_step_decision::Decision::Reject(pb::Reject { reason: reason.into() })),
        };
        assert_eq!(validate_answer(&batch(), reject("no")), Ok(HookVerdict::Reject { reason: Some("no".into()) }));
        assert_eq!(validate_answer(&batch(), reject("")), Ok(HookVerdict::Reject { reason: None }));
        assert_eq!(validate_answer(&batch(), pb::PreStepDecision { decision: None }), Err(InvalidAnswer::NoDecision));
    }

    #[test]
    fn a_servers_own_timeout_counts_as_the_deadline() {
        let deadline = Duration::from_millis(200);
        let cancelled = || tonic::Status::cancelled("Timeout expired");
        assert_eq!(failure_of(cancelled(), Duration::from_millis(199), deadline), HookFailure::Timeout(200));
        assert_eq!(
            failure_of(cancelled(), Duration::from_millis(10), deadline),
            HookFailure::Status { code: tonic::Code::Cancelled, message: "Timeout expired".into() }
        );
        assert_eq!(
            failure_of(tonic::Status::deadline_exceeded("late"), Duration::ZERO, deadline),
            HookFailure::Timeout(200)
        );
        assert!(matches!(
            failure_of(tonic::Status::unavailable("tcp connect error"), Duration::ZERO, deadline),
            HookFailure::Unavailable(_)
        ));
    }

    #[test]
    fn failures_map_through_on_failure() {
        let config = |on_failure: &str| {
            let toml = format!(
                "[agents.a]\nhooks = [{{ url = \"http://127.0.0.1:9\", deadline_ms = 5, on_failure = \"{on_failure}\" }}]\n"
            );
            turnstile_config::Config::from_toml_str(&toml).unwrap().agents["a"].hooks[0].clone()
        };
        let failure = HookFailure::Timeout(5);
        let hook = RemoteHook::new(&config("error")).unwrap();
        assert_eq!(
            hook.apply_on_failure(failure.clone(), batch()),
            Err(HookError {
                hook: "http://127.0.0.1:9".into(),
                message: "no answer within the deadline of 5 ms".into()
            })
        );
        let hook = RemoteHook::new(&config("reject")).unwrap();
        assert_eq!(
            hook.apply_on_failure(failure.clone(), batch()),
            Ok(HookVerdict::Reject {
                reason: Some("pre-step hook http://127.0.0.1:9 failed: no answer within the deadline of 5 ms".into())
            })
        );
        let hook = RemoteHook::new(&config("skip")).unwrap();
        assert_eq!(hook.apply_on_failure(failure, batch()), Ok(HookVerdict::Pass(batch())));
    }
}
