//! Quarantine (decision 0084): a session whose log cannot be folded, however it got there, is set aside.
//! Its commands are answered FAILED_PRECONDITION naming the quarantine, without a log read each time; it is
//! counted in `turnstile_sessions_quarantined` and logged once when found; its raw events stay readable
//! (`ExportSessions`) and `DeleteSession` removes it. It never stops a take-over or another session.

use turnstile_model::{CommandError, SessionRef};

use super::SessionHost;
use super::table::{Quarantine, Slot};
use crate::sync::lock;

impl Quarantine {
    /// Reports `session` quarantined with `answer` (a log line and the gauge).
    pub fn new(session: &SessionRef, answer: CommandError) -> Self {
        tracing::warn!(%session, reason = %answer, "session quarantined: its log cannot be folded");
        Self { answer, _counted: crate::metrics::quarantined() }
    }
}

impl SessionHost {
    /// Holds `session` quarantined with `answer`, unless the table holds something else for it (a runner
    /// started meanwhile finds the same log and reports the same).
    pub(super) fn quarantine(&self, session: &SessionRef, answer: CommandError) {
        let mut table = lock(&self.table);
        if !table.runners.contains_key(session) {
            table.runners.insert(session.clone(), Slot::Quarantined(Quarantine::new(session, answer)));
        }
    }
}
