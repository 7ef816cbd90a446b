//! Parking (decision 0037): an idle session keeps only its driver's fold in the host, with no task, channel,
//! timer or span, until a command resumes it or passivation drops it.

use tokio::sync::mpsc;
use turnstile_model::{SessionRef, SessionState};
use turnstile_ops::GaugeGuard;

use crate::command::{CommandMsg, Control};

/// A loaded session whose runner ended because it was idle: its driver alone. The host keeps it until the
/// next command resumes it or passivation drops it; both happen without reading or writing anything.
pub(crate) struct Parked {
    /// The quiescent driver's fold: a driver is rebuilt from it, without repair, when a command comes.
    pub(crate) state: SessionState,
    pub(crate) epoch: u64,
    /// The seq of the last snapshot written (or loaded), so a resumed runner keeps the snapshot cadence.
    pub(crate) snapshot_seq: u64,
    /// When passivation may drop it.
    pub(crate) until: tokio::time::Instant,
    /// Counts it in `turnstile_sessions_loaded` while it is held.
    pub(crate) loaded: GaugeGuard,
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked").field("epoch", &self.epoch).field("last_seq", &self.state.last_seq).finish()
    }
}

/// Where a runner may park its driver when idle: the host's slot of its session, named by the runner's id.
pub(crate) trait Home: Send + Sync + 'static {
    /// Replaces runner `id`'s entry with `parked` when it is still the session's runner and `commands` and
    /// `control` are empty, closing `commands` so the next command finds the parked driver. Gives `parked`
    /// back when the runner must go on serving.
    fn park(
        &self,
        session: &SessionRef,
        id: u64,
        parked: Box<Parked>,
        commands: &mut mpsc::Receiver<CommandMsg>,
        control: &mpsc::Receiver<Control>,
    ) -> Result<(), Box<Parked>>;
}

/// What a runner needs to park: the host's map and its own id there.
pub(crate) struct Parking {
    pub home: std::sync::Weak<dyn Home>,
    pub id: u64,
}
