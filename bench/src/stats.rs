//! Latency samples and their percentiles; the median of a phase's repeated rounds.

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

/// The median, minimum and maximum of a few values (the runs of `turnstile-bench model`); all zero for none.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Spread {
    pub count: usize,
    pub p50: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// Nearest-rank median (the lower middle value of an even count), as [`Percentiles`] computes p50.
    pub fn of(values: &[f64]) -> Self {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        sorted.sort_by(f64::total_cmp);
        let (Some(min), Some(max)) = (sorted.first().copied(), sorted.last().copied()) else {
            return Self::default();
        };
        let k = sorted.len().div_ceil(2);
        Self { count: sorted.len(), p50: sorted[k - 1], min, max }
    }
}

/// `a / b`, when both were measured and `b` is positive.
pub(crate) fn ratio_of(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b.filter(|b| *b > 0.0)?)
}

/// The middle value (the mean of the two middle ones of an even count); 0 for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_of_a_few_runs() {
        let s = Spread::of(&[3.0, 1.0, 2.0, f64::NAN]);
        assert_eq!((s.count, s.p50, s.min, s.max), (3, 2.0, 1.0, 3.0));
        let even = Spread::of(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!(even.p50, 2.0);
        assert_eq!(Spread::of(&[]).count, 0);
    }

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
