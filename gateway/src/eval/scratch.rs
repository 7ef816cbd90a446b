//! Scratch sessions: where an evaluation reruns a turn (and a judge scores a reply). Each is labelled with
//! its run (`turnstile/eval=<run_id>`) and registered before its first command, so whatever happens to the
//! run (a failed turn, a client gone, a gateway stopping) [`Scratch::delete_all`] finds it.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use turnstile_journal::log::read_all;
use turnstile_model::labels::Labeled;
use turnstile_model::message::{MessageId, SessionRef, Target, UserMessage};
use turnstile_model::overrides::SessionOverrides;
use turnstile_model::{Command, CommandError, CommandReply, Envelope, Fork, InjectMode, Tenant};

use super::turns::{TurnRecord, ended_turns};
use crate::service::Gateway;

/// The label key on every scratch session; its value is the run's id.
pub const EVAL_LABEL: &str = "turnstile/eval";

/// The scratch sessions of one run that may exist.
#[derive(Debug)]
pub(crate) struct Scratch {
    gateway: Gateway,
    tenant: Tenant,
    run_id: String,
    cancel: CancellationToken,
    live: Mutex<BTreeSet<SessionRef>>,
    deleted: AtomicU32,
}

/// What a scratch session runs.
#[derive(Clone, Debug)]
pub(crate) struct Profile {
    pub(crate) agent: String,
    pub(crate) version: Option<u64>,
    /// A model from the agent's `overrides.models` to run instead of its own (a session override, SPEC §20).
    pub(crate) model: Option<String>,
}

/// Why a rerun gave no reply: a row's `error`.
pub(crate) type Failed = String;

fn failed(what: &str, status: &tonic::Status) -> Failed {
    format!("{what}: {}", status.message())
}

impl Scratch {
    pub(crate) fn new(gateway: Gateway, tenant: Tenant, run_id: String, cancel: CancellationToken) -> Self {
        Self { gateway, tenant, run_id, cancel, live: Mutex::new(BTreeSet::new()), deleted: AtomicU32::new(0) }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, BTreeSet<SessionRef>> {
        // A panic while holding the set leaves it as it was: still the sessions to delete.
        self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new scratch session `eval-<run>-<name>` at `fork` (none: empty), running `profile`, labelled.
    pub(crate) async fn open(&self, name: &str, fork: Option<Fork>, profile: &Profile) -> Result<SessionRef, Failed> {
        if self.cancel.is_cancelled() {
            return Err("cancelled".into());
        }
        let session = SessionRef::in_tenant(&self.tenant, format!("eval-{}-{name}", self.run_id))
            .map_err(|e| format!("scratch session: {e}"))?;
        self.live().insert(session.clone());
        let g = &self.gateway;
        if let Some(fork) = fork {
            g.written(session.clone(), Command::Fork(Box::new(fork))).await.map_err(|e| failed("fork", &e))?;
        }
        let configure = Command::Configure {
            agent: profile.agent.clone(),
            inject_mode: InjectMode::Pending,
            version: profile.version,
            overrides: SessionOverrides { model: profile.model.clone(), ..SessionOverrides::default() },
        };
        g.written(session.clone(), configure).await.map_err(|e| failed("configure", &e))?;
        let label = Labeled { set: [(EVAL_LABEL.to_owned(), self.run_id.clone())].into(), removed: Vec::new() };
        g.written(session.clone(), Command::SetLabels(label)).await.map_err(|e| failed("label", &e))?;
        Ok(session)
    }

    /// Delivers `input` as one turn (all but the last queued, the last a followup, so they enter its first
    /// step together), waits for it to end within `timeout` and reads it back.
    pub(crate) async fn run_turn(
        &self,
        session: &SessionRef,
        input: &[UserMessage],
        timeout: Duration,
    ) -> Result<TurnRecord, Failed> {
        let g = &self.gateway;
        for (i, message) in input.iter().enumerate() {
            // New ids: the scratch session is not where the recorded ids were accepted.
            let message = UserMessage {
                id: MessageId(uuid::Uuid::new_v4().to_string()),
                content: message.content.clone(),
                source: message.source.clone(),
            };
            let wakeup = i + 1 == input.len();
            let send = Command::Send { message, target: Target::NextTurn, wakeup, expected_turn: None, deadline: None };
            g.execute(session, send, None).await.map_err(|e| failed("deliver", &e))?;
        }
        let idle = g.execute(session, Command::WhenIdle, Some(timeout));
        let last_seq = tokio::select! {
            done = tokio::time::timeout(timeout + Duration::from_secs(1), idle) => match done {
                Ok(Ok(CommandReply::Idle(summary))) => summary.last_seq,
                Ok(Ok(other)) => return Err(format!("wait: the owner answered {other:?}; this is a bug")),
                Ok(Err(e)) if e.code() != tonic::Code::DeadlineExceeded => return Err(failed("wait", &e)),
                _ => return Err(format!("the turn did not end within {} ms (turn_timeout_ms)", timeout.as_millis())),
            },
            () = self.cancel.cancelled() => return Err("cancelled".into()),
        };
        let events = self.read_through(session, last_seq).await?;
        // The scratch session's only turn.
        ended_turns(&events).into_values().last().ok_or_else(|| "the turn left no end in its log".to_owned())
    }

    /// `session`'s log through `seq`, which its owner has written: a read that ends earlier came from a
    /// replica still catching up, so it is read again (a few times, briefly).
    async fn read_through(&self, session: &SessionRef, seq: u64) -> Result<Vec<Envelope>, Failed> {
        const ATTEMPTS: u32 = 50;
        let mut read_to = 0;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let events = read_all(self.gateway.log.as_ref(), session, 1).await.map_err(|e| format!("read: {e}"))?;
            read_to = events.last().map_or(0, |e| e.seq);
            if read_to >= seq {
                return Ok(events);
            }
        }
        Err(format!("read: the log of {session} ends at seq {read_to}, before the turn's end at {seq}"))
    }

    /// Deletes `session` (a running turn is cancelled first); one already gone counts as deleted.
    pub(crate) async fn delete(&self, session: &SessionRef) -> Result<(), Failed> {
        match self.gateway.router.execute(session, Command::Delete, None).await {
            Ok(_) | Err(CommandError::NotFound(_)) => {
                if self.live().remove(session) {
                    self.deleted.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            Err(e) => Err(format!("delete {session}: {e}")),
        }
    }

    /// Deletes every scratch session still registered: `(deleted over the whole run, the ids left)`.
    pub(crate) async fn delete_all(&self) -> (u32, Vec<String>) {
        let sessions: Vec<SessionRef> = self.live().iter().cloned().collect();
        let mut left = Vec::new();
        for session in sessions {
            match self.delete(&session).await {
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(%session, error = %e, "an evaluation's scratch session could not be deleted");
                    left.push(session.id.clone());
                }
            }
        }
        (self.deleted.load(Ordering::Relaxed), left)
    }
}
