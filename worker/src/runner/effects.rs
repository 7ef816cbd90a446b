//! How the runner performs the driver's effects: each append group made durable before any later effect,
//! the callers of a segment answered as soon as its group is (decision 0199), live events, operations.

use tracing::Instrument as _;
use turnstile_driver::{CommandId, Effect};
use turnstile_journal::JournalError;
use turnstile_model::{CommandError, CommandReply, Envelope};

use super::{Runner, Stop};
use crate::command::journal_error;

impl Runner {
    pub(super) async fn perform(&mut self, effects: Vec<Effect>) -> Result<(), Stop> {
        // Slots, so a reply answered ahead of its segment (`answer_first`) is not performed again.
        let mut effects: Vec<Option<Effect>> = effects.into_iter().map(Some).collect();
        // Set once a group is durable: the index hears of it before any caller does (read your writes).
        let mut unindexed = false;
        if self.answer_first(&mut effects, &mut unindexed) {
            tokio::task::yield_now().await;
        }
        for i in 0..effects.len() {
            let Some(effect) = effects[i].take() else { continue };
            match effect {
                Effect::Append(group) => {
                    unindexed = true;
                    if let Err(e) = self.write(group.events(), false).await {
                        let remaining: Vec<Effect> = effects.drain(i + 1..).flatten().collect();
                        let lost = e.is_lost_ownership();
                        let message = journal_error(e.clone()).to_string();
                        tracing::warn!(session = %self.session, error = %e, "append failed");
                        self.fail_replies(&remaining, &message);
                        return Err(if lost { Stop::Lost } else { Stop::Reload });
                    }
                    if self.answer_first(&mut effects[i + 1..], &mut unindexed) {
                        tokio::task::yield_now().await;
                    }
                }
                Effect::Publish(event) => {
                    if let Err(e) = self.deps.bus.publish(&event).await {
                        tracing::debug!(session = %self.session, error = %e, "live event not published");
                    }
                }
                // Each segment's replies were answered by `answer_first`; kept for the match to be whole.
                Effect::Reply { id, result } => {
                    self.answer(id, result, &mut unindexed);
                }
                Effect::PreStep(request) => self.ops.pre_step(&self.deps, &self.session, request, self.spans.active()),
                Effect::Model(request) => self.ops.model(&self.deps, &self.session, *request, &self.spans.active()),
                Effect::Tool(request) => self.ops.tool(&self.deps, &self.session, request, &self.spans.active()),
                Effect::Abort { op } => self.ops.abort(op),
                Effect::Reload { reason } => {
                    // The driver already withdrew this input's effects and failed its replies.
                    tracing::error!(session = %self.session, error = %reason, "driver invariant broken; reloading");
                    return Err(Stop::Reload);
                }
            }
        }
        Ok(())
    }

    /// Answers the replies among `segment` up to its next append group, ahead of the live events and
    /// operation starts beside them (the group before them, if any, is durable: nothing is answered
    /// earlier than it was). Whether a caller was answered: the runner then yields once, so that caller's
    /// task, woken on this thread, sends its answer before the rest of this input's work runs instead of
    /// after it (a followup's live events, its pre-step, the index and timers; decision 0199).
    fn answer_first(&mut self, segment: &mut [Option<Effect>], unindexed: &mut bool) -> bool {
        let mut answered = false;
        for slot in segment.iter_mut() {
            match slot {
                Some(Effect::Append(_)) => break,
                Some(Effect::Reply { .. }) => {
                    let Some(Effect::Reply { id, result }) = slot.take() else { continue };
                    answered |= self.answer(id, result, unindexed);
                }
                _ => {}
            }
        }
        answered
    }

    /// Answers the caller of `id` with `result`, the index told first of a group made durable since it last
    /// was (read your writes). Whether a caller was still waiting to hear it.
    fn answer(&mut self, id: CommandId, result: Result<CommandReply, CommandError>, unindexed: &mut bool) -> bool {
        if std::mem::take(unindexed) {
            self.index(false);
        }
        self.waiting.remove(&id).is_some_and(|tx| tx.send(result).is_ok())
    }

    /// Appends `batch` after the driver's last durable event; with `new_log` as the first events of the
    /// session's log ([`SessionLog::append_first`](turnstile_journal::SessionLog::append_first): refused
    /// with [`JournalError::FirstRefused`] when the log has events). Returns the new last seq.
    pub(super) async fn write(&mut self, batch: &[Envelope], new_log: bool) -> Result<u64, JournalError> {
        // A worker whose lease lapsed (or was taken) must not write again under the old epoch, even
        // where the conditional append would still let it through (nobody else has written yet).
        if let Some(ownership) = &self.deps.ownership
            && !ownership.may_write(&self.session, self.epoch)
        {
            return Err(JournalError::Fenced { session: self.session.clone(), epoch: self.epoch });
        }
        let started = std::time::Instant::now();
        let span = self.spans.begin_append(&self.session, batch);
        let traceparent = turnstile_ops::trace::traceparent_of(&span);
        let log = &self.deps.log;
        let result = if new_log {
            log.append_first(&self.session, batch, traceparent.as_deref()).instrument(span).await
        } else {
            let expected = batch.first().map_or(0, |e| e.seq.saturating_sub(1));
            log.append(&self.session, expected, batch, traceparent.as_deref()).instrument(span).await
        };
        self.spans.end_append(batch);
        self.clock.appended(batch, started.elapsed(), &result);
        result
    }

    /// Answers every reply among `effects` with UNAVAILABLE: their writes did not all become durable.
    pub(super) fn fail_replies(&mut self, effects: &[Effect], message: &str) {
        for effect in effects {
            if let Effect::Reply { id, .. } = effect
                && let Some(tx) = self.waiting.remove(id)
            {
                let _ = tx.send(Err(CommandError::Unavailable(message.to_owned())));
            }
        }
    }
}
