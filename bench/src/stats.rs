//! Latency samples and their percentiles.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of one set of samples, in milliseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles; all zero for no samples.
    pub fn of(samples: &[Duration]) -> Self {
        let mut sorted: Vec<Duration> = samples.to_vec();
        sorted.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let rank = |p: f64| -> f64 {
            if sorted.is_empty() {
                return 0.0;
            }
            // Nearest rank: the smallest sample with at least p% of the samples at or below it.
            let k = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
            ms(sorted[k.clamp(1, sorted.len()) - 1])
        };
        let total: f64 = sorted.iter().copied().map(ms).sum();
        Self {
            count: sorted.len(),
            p50_ms: rank(50.0),
            p90_ms: rank(90.0),
            p99_ms: rank(99.0),
            max_ms: sorted.last().copied().map_or(0.0, ms),
            mean_ms: if sorted.is_empty() { 0.0 } else { total / sorted.len() as f64 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let p = Percentiles::of(&samples);
        assert_eq!(p.count, 100);
        assert!((p.p50_ms - 50.0).abs() < 1e-9);
        assert!((p.p90_ms - 90.0).abs() < 1e-9);
        assert!((p.p99_ms - 99.0).abs() < 1e-9);
        assert!((p.max_ms - 100.0).abs() < 1e-9);
        let empty = Percentiles::of(&[]);
        assert_eq!(empty.count, 0);
        assert!(empty.p99_ms.abs() < 1e-9);
    }
}
