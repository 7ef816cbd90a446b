//! The limits of SPEC §2 that the driver enforces.

use turnstile_model::state::DEFAULT_DEDUP_HORIZON;

/// `max_rounds` a goal may ask for unless the configuration says otherwise.
pub const DEFAULT_MAX_GOAL_ROUNDS: u32 = 100;

/// `max_pending_bytes` unless the configuration says otherwise: 4 MiB less 64 KiB, so that a whole inbox
/// at the limit, with the framing of a `GetInbox` reply or a Watch's `caught_up`, fits a client's default
/// 4 MiB receive limit (decisions 0033, 0085).
pub const DEFAULT_MAX_PENDING_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;

/// The limits of SPEC §2.
///
/// ```
/// let limits = turnstile_driver::Limits::default();
/// assert_eq!(limits.max_pending, 1000);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The bytes one message counts ([`turnstile_model::size::message_bytes`]). Default 1 MiB.
    pub max_message_bytes: usize,
    /// Pending items across both lists of one session. Default 1,000.
    pub max_pending: usize,
    /// The bytes the pending items across both lists of one session count
    /// ([`turnstile_model::size::message_bytes`]; config `limits.max_pending_bytes`). Default 4 MiB less
    /// 64 KiB.
    pub max_pending_bytes: usize,
    /// Accepted MessageIds remembered for idempotent retries. Default 10,000.
    pub dedup_horizon: usize,
    /// The largest `max_rounds` a `SetGoal` may ask for (config `limits.max_goal_rounds`). Default 100.
    pub max_goal_rounds: u32,
    /// The largest event the journal can store, when it has such a limit (JetStream: the NATS server's
    /// `max_payload` less the message headers; the host sets it from its journal). A delivery whose
    /// splice event could not fit is refused up front as INVALID_ARGUMENT: no retry could store it.
    pub max_event_bytes: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 1024 * 1024,
            max_pending: 1000,
            max_pending_bytes: DEFAULT_MAX_PENDING_BYTES,
            dedup_horizon: DEFAULT_DEDUP_HORIZON,
            max_goal_rounds: DEFAULT_MAX_GOAL_ROUNDS,
            max_event_bytes: None,
        }
    }
}
