//! Steer deadlines (SPEC §11): driver timers with time as an input.
//!
//! A steer's deadline is recorded in its insert splice as an absolute time, so the fold
//! ([`SessionState::steer_deadlines`](turnstile_model::SessionState)) holds every pending one and a new
//! owner re-arms them from the log: a deadline that passed during a failover is due at once. The runner
//! sleeps until [`Driver::next_timer`] and then calls [`Driver::on_timer`].

use turnstile_model::{CancelCause, EventPayload, LivePayload, MessageId, OnDeadline, Splice, SpliceOutcome, Target};

use super::Driver;
use super::agents::ApprovalTimeout;
use super::turn::Phase;

impl Driver {
    /// The earliest pending steer deadline or schedule firing (unix ms), if any: when the runner must call
    /// [`Driver::on_timer`].
    pub fn next_timer(&self) -> Option<u64> {
        match (self.state.next_timer(), self.approval_deadline()) {
            (Some(a), Some((b, ..))) => Some(a.min(b)),
            (a, b) => a.or(b.map(|(at, ..)| at)),
        }
    }

    /// The earliest pending steer deadline alone: a session with one stays loaded, while one with only
    /// schedules may be unloaded and woken by its host when a firing is due.
    pub fn next_steer_deadline(&self) -> Option<u64> {
        let steer = self.state.steer_deadlines.values().map(|d| d.at_ms).min();
        // A call's approval deadline keeps the session loaded like a steer's.
        match (steer, self.approval_deadline()) {
            (Some(a), Some((b, ..))) => Some(a.min(b)),
            (a, b) => a.or(b.map(|(at, ..)| at)),
        }
    }

    /// When the call awaiting approval is decided without a person (SPEC §21): its `tool/call`'s time
    /// (from the log, so a new owner sees the same deadline) plus its agent's `approval_timeout_ms`; with
    /// the call's id and the agent's `on_timeout`.
    fn approval_deadline(&self) -> Option<(u64, String, ApprovalTimeout)> {
        let t = self.turn.as_ref()?;
        let Phase::Tools { awaiting: Some(call_id), for_client: false, .. } = &t.phase else { return None };
        let timeout = self.agents.turn_profile(&t.agent, &self.state.session.tenant, t.version).approval_timeout?;
        let (_, since_ms) = self.state.open_turn.as_ref()?.awaiting_since?;
        Some((since_ms.saturating_add(timeout.after_ms), call_id.clone(), timeout))
    }

    /// Time passed: every steer still pending at its deadline gets its `on_deadline`, earliest first; then
    /// every schedule firing due is delivered (or skipped, beyond its catch-up window; SPEC §15).
    pub fn on_timer(&mut self, now_ms: u64) {
        self.steer_deadlines_due(now_ms);
        self.approval_deadline_due(now_ms);
        self.fire_schedules(now_ms);
    }

    /// A call still awaiting approval at its deadline is decided by its agent's `on_timeout`, durably, as
    /// a `Decide` would (`tool/decision {timed_out}`), and the turn goes on.
    fn approval_deadline_due(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        let Some((at_ms, call_id, timeout)) = self.approval_deadline() else { return };
        if at_ms > now_ms {
            return;
        }
        let reason = format!("no decision within approval_timeout_ms ({} ms)", timeout.after_ms);
        // Cannot fail: `approval_deadline` named the call the turn waits on.
        let _ = self.holding_idle_waiters(|driver| driver.decide(&call_id, timeout.approve, reason, true));
    }

    fn steer_deadlines_due(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        let mut due: Vec<(u64, MessageId, OnDeadline)> = self
            .state
            .steer_deadlines
            .iter()
            .filter(|(_, d)| d.at_ms <= now_ms)
            .map(|(id, d)| (d.at_ms, id.clone(), d.on_deadline))
            .collect();
        due.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        for (_, id, on_deadline) in due {
            // An earlier deadline of this round may have moved things; act only on what is still pending.
            let Some((target, index)) = self.state.inbox.find(&id) else { continue };
            match on_deadline {
                OnDeadline::Drop => self.write_edit(target, index as u32, 1, Vec::new()),
                OnDeadline::Interrupt => {
                    self.holding_idle_waiters(|driver| driver.steer_deadline_interrupt(target, index));
                }
            }
        }
    }

    /// Like `interrupt(steer)`: cancel the running turn keeping the inbox (cause `steer-deadline`), and move
    /// the steer to the head of next-turn as a waking insert, so it runs as the next turn.
    fn steer_deadline_interrupt(&mut self, target: Target, index: usize) {
        let message = self.state.inbox.list(target)[index].clone();
        if self.turn.is_some() {
            self.abort_turn(CancelCause::SteerDeadline);
        }
        self.write_edit(target, index as u32, 1, Vec::new());
        self.write(EventPayload::InboxSpliced(Splice {
            target: Target::NextTurn,
            start: 0,
            removed_count: 0,
            inserted: vec![message.clone()],
            outcome: SpliceOutcome::None,
            wake: true,
            requested_target: None,
            deadline: None,
        }));
        self.publish(LivePayload::Inserted { message });
        // Like any waking delivery: latched behind the aborted turn, or a turn of its own when idle.
        self.wake();
    }
}
