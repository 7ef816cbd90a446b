//! The wall clock, read in one place. The driver never reads it: its runner stamps each input with
//! [`now_ms`] once, when the input arrives.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; 0 for a clock set before 1970, saturating far in the future.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
