//! The host's table of sessions: every loaded runner or parked driver, and the sessions a `DeleteSession` or
//! an `ImportSessions` holds, behind one lock. They live in one struct so the rule "no runner starts for a
//! session being deleted or imported" is checked and changed under the same guard that starts runners: there
//! is no second lock, so no lock order to keep or break.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use tokio::time::Instant;

use tokio::sync::mpsc;
use turnstile_model::{CommandError, SessionRef, SessionState};
use turnstile_ops::GaugeGuard;

use crate::command::{CommandMsg, Control};
use crate::park::{Home, Parked};
use crate::sync::lock;

/// Control messages a runner's queue holds. A runner gets at most three in its life: the one who takes its
/// handle out of the table sends `Stop`, or `Drain` then `Stop` (`drain_where`), and a `DeleteSession`
/// holding a copy sends `Dispose` (deletes of a session run one at a time and wait for the runner to end).
/// So a send never finds the queue full; the senders that may wait do (`send().await`), the ones under the
/// table's lock cannot and report a full queue as the bug it would be.
pub(super) const CONTROL_QUEUE: usize = 4;

/// A loaded session's runner.
pub(super) struct RunnerHandle {
    pub commands: mpsc::Sender<CommandMsg>,
    pub control: mpsc::Sender<Control>,
    pub epoch: u64,
    /// Names this runner among the session's successive ones (see [`Home::park`]).
    pub id: u64,
}

impl RunnerHandle {
    /// Tells the runner to hand its session over, without waiting (callers hold the table's lock).
    pub fn order(&self, order: Control) {
        order_now(&self.control, order);
    }
}

/// Sends `order` on a runner's control queue without waiting. A runner that already ended needs none.
pub(super) fn order_now(control: &mpsc::Sender<Control>, order: Control) {
    if let Err(mpsc::error::TrySendError::Full(order)) = control.try_send(order) {
        tracing::error!(?order, capacity = CONTROL_QUEUE, "a runner's control queue is full; the order is dropped");
    }
}

/// What the host holds of a session: a running runner, the driver alone while it is idle, or the answer
/// of a session whose log cannot be folded.
pub(super) enum Slot {
    Running(RunnerHandle),
    Parked(Box<Parked>),
    Quarantined(Quarantine),
}

impl Slot {
    pub fn running(&self) -> Option<&RunnerHandle> {
        match self {
            Slot::Running(h) => Some(h),
            Slot::Parked(_) | Slot::Quarantined(_) => None,
        }
    }

    /// A running runner that still takes commands, or a parked driver.
    pub fn is_loaded(&self) -> bool {
        match self {
            Slot::Running(h) => !h.commands.is_closed(),
            Slot::Parked(_) => true,
            Slot::Quarantined(_) => false,
        }
    }
}

/// A quarantined session as the host holds it (`quarantine.rs` reports and answers it).
pub(super) struct Quarantine {
    /// What every command of the session is answered ([`CommandError::quarantined`]).
    pub answer: CommandError,
    /// Counts it in `turnstile_sessions_quarantined` while it is held.
    pub _counted: GaugeGuard,
}

/// A session an import holds (`import.rs` writes it and lets go of it).
pub(super) struct Importing {
    /// When its last group came.
    pub since: Instant,
    /// The fold of the groups written so far, while no group is being written; the next group is folded
    /// onto it.
    pub fold: Option<SessionState>,
}

/// Everything the host knows per session, guarded as one.
#[derive(Default)]
pub(super) struct Sessions {
    /// Shared with each runner's task, which removes its own entry when it ends (passivation included), so
    /// an unloaded session holds nothing here.
    pub runners: HashMap<SessionRef, Slot>,
    /// Sessions a `DeleteSession` is removing: no runner starts for them and their commands are refused
    /// until it answers.
    pub deleting: HashSet<SessionRef>,
    /// Sessions an `ImportSessions` is writing (SPEC §18): no runner starts for them until their last group,
    /// or until the import goes stale.
    pub importing: HashMap<SessionRef, Importing>,
    /// Every parking, in the order of its `until` (a constant after the park, so arrival order): the sweep
    /// takes the due ones from the front instead of walking every session (decision 0178). An entry whose
    /// session was resumed, parked again or unloaded since is stale and skipped.
    pub parkings: VecDeque<(Instant, SessionRef)>,
}

/// Stale parkings the queue may hold beyond one per runner before it is compacted.
const STALE_PARKINGS: usize = 1024;

impl Sessions {
    /// Takes out at most `max` parked drivers whose `until` has passed by `now`, oldest first; whether more
    /// may be due.
    pub fn take_due(&mut self, now: Instant, max: usize) -> (Vec<(SessionRef, Slot)>, bool) {
        let mut due = Vec::new();
        while let Some((until, _)) = self.parkings.front() {
            if *until > now {
                return (due, false);
            }
            if due.len() >= max {
                return (due, true);
            }
            let Some((until, session)) = self.parkings.pop_front() else { break };
            // Only the parking this entry records: a later one of the session has its own entry.
            if matches!(self.runners.get(&session), Some(Slot::Parked(p)) if p.until == until)
                && let Some(taken) = self.runners.remove_entry(&session)
            {
                due.push(taken);
            }
        }
        (due, false)
    }

    /// Records a parking (under the same guard that put the driver in its slot), compacting the queue when
    /// stale entries (sessions resumed and parked again) outnumber the runners by far.
    fn parked(&mut self, session: &SessionRef, until: Instant) {
        self.parkings.push_back((until, session.clone()));
        if self.parkings.len() > 2 * self.runners.len() + STALE_PARKINGS {
            let runners = &self.runners;
            self.parkings.retain(|(until, s)| matches!(runners.get(s), Some(Slot::Parked(p)) if p.until == *until));
        }
    }
}

/// The table, shared by the host and its runners' tasks.
pub(super) type Table = Mutex<Sessions>;

impl Home for Table {
    fn park(
        &self,
        session: &SessionRef,
        id: u64,
        parked: Box<Parked>,
        commands: &mut mpsc::Receiver<CommandMsg>,
        control: &mpsc::Receiver<Control>,
    ) -> Result<(), Box<Parked>> {
        let mut table = lock(self);
        let Some(slot) = table.runners.get_mut(session) else { return Err(parked) };
        // Under the lock no sender can be handed out; one handed out before finds the queue closed and
        // asks the host again, which resumes the parked driver.
        if slot.running().is_none_or(|h| h.id != id) || !commands.is_empty() || !control.is_empty() {
            return Err(parked);
        }
        commands.close();
        let until = parked.until;
        *slot = Slot::Parked(parked);
        table.parked(session, until);
        Ok(())
    }
}
