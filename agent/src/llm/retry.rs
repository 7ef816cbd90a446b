//! When to try a model request again (SPEC §8): connection failures, 429 and 5xx *before the first
//! byte*, up to the endpoint's `retries`, waiting an exponential backoff with full jitter or what the
//! provider's `Retry-After` asks for.
//!
//! ```
//! use std::time::Duration;
//! use turnstile_agent::llm::retry::Backoff;
//!
//! let backoff = Backoff::default();
//! // The third retry waits at most base · 2² (full jitter: anywhere from zero up to that).
//! assert!(backoff.delay(2, &mut fastrand::Rng::with_seed(7)) <= backoff.base * 4);
//! // A `Retry-After` wins, capped at `retry_after_max`.
//! assert_eq!(backoff.wait(0, Some(Duration::from_secs(2)), &mut fastrand::Rng::new()), Duration::from_secs(2));
//! ```

use std::time::{Duration, SystemTime};

/// Exponential backoff with full jitter, and the cap on a provider's `Retry-After`.
///
/// A small function rather than a crate: `backon` and `backoff` jitter additively (`d + rand·d`), not
/// with full jitter, and the retry loop must also honour `Retry-After`, stop retrying after the first
/// byte and end at once on cancel, which is easier to read written out (docs/decisions/0008).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The ceiling of the first retry's wait; it doubles with every retry.
    pub base: Duration,
    /// The largest ceiling.
    pub max: Duration,
    /// A longer `Retry-After` is cut to this (a provider asking for an hour must not stall a step that
    /// long; the request's own `timeout` ends it first anyway).
    pub retry_after_max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(500),
            max: Duration::from_secs(10),
            retry_after_max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// Full jitter: uniform in `[0, min(max, base · 2^retry)]` (`retry` counts from 0).
    pub fn delay(&self, retry: u32, rng: &mut fastrand::Rng) -> Duration {
        let ceiling = self.base.saturating_mul(1_u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX)).min(self.max);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.u64(0..=nanos))
    }

    /// The wait before retry number `retry`: the provider's `Retry-After` (capped) when it sent one,
    /// else [`Backoff::delay`].
    pub fn wait(&self, retry: u32, retry_after: Option<Duration>, rng: &mut fastrand::Rng) -> Duration {
        match retry_after {
            Some(asked) => asked.min(self.retry_after_max),
            None => self.delay(retry, rng),
        }
    }
}

/// Reads a `Retry-After` value: delay seconds (`"120"`) or an HTTP date, relative to `now` (a date in
/// the past means "now"). `None` for anything else.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use turnstile_agent::llm::retry::parse_retry_after;
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_770);
/// assert_eq!(parse_retry_after("3", now), Some(Duration::from_secs(3)));
/// assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now), Some(Duration::from_secs(7)));
/// assert_eq!(parse_retry_after("soon", now), None);
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    // Some servers send fractional seconds; accept them rather than ignore the request to wait.
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_stays_under_the_doubling_ceiling_and_the_cap() {
        let backoff =
            Backoff { base: Duration::from_millis(100), max: Duration::from_secs(1), retry_after_max: Duration::ZERO };
        let mut rng = fastrand::Rng::with_seed(1);
        for retry in 0..40 {
            let ceiling =
                (Duration::from_millis(100) * 2_u32.saturating_pow(retry.min(20))).min(Duration::from_secs(1));
            for _ in 0..50 {
                assert!(backoff.delay(retry, &mut rng) <= ceiling, "retry {retry}");
            }
        }
        // Jitter is real: the waits of one retry differ.
        let waits: std::collections::HashSet<_> = (0..20).map(|_| backoff.delay(3, &mut rng)).collect();
        assert!(waits.len() > 1);
    }

    #[test]
    fn retry_after_wins_and_is_capped() {
        let backoff = Backoff {
            base: Duration::from_millis(1),
            max: Duration::from_millis(1),
            retry_after_max: Duration::from_secs(30),
        };
        let mut rng = fastrand::Rng::with_seed(1);
        assert_eq!(backoff.wait(0, Some(Duration::from_secs(5)), &mut rng), Duration::from_secs(5));
        assert_eq!(backoff.wait(0, Some(Duration::from_secs(3600)), &mut rng), Duration::from_secs(30));
        assert!(backoff.wait(0, None, &mut rng) <= Duration::from_millis(1));
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("1.5", now), Some(Duration::from_millis(1500)));
        assert_eq!(parse_retry_after("-1", now), None);
        // An HTTP date in the past: retry now.
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:50:37 GMT", now), Some(Duration::from_secs(60)));
        assert_eq!(parse_retry_after("", now), None);
    }
}
