//! Percentiles and ratios: the arithmetic behind the report, kept pure.
//!
//! Percentiles are nearest-rank on the sorted samples (the smallest sample
//! with at least p % of the samples at or below it): no interpolation, so
//! every reported number is a latency that some session really saw. Ratios
//! compare medians of targets measured in the same run; a ratio against a
//! zero or missing baseline is `None`, never infinity.

use std::time::Duration;

/// Nearest-rank percentile `p` (0 < p ≤ 100) of ascending `sorted`;
/// `None` when there are no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The distribution of one phase at one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub count: usize,
    pub p50: Duration,
    pub p95: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Summary {
    /// Sorts `samples` in place and summarises them; `None` when empty.
    pub fn of(samples: &mut [Duration]) -> Option<Self> {
        samples.sort_unstable();
        Some(Self {
            count: samples.len(),
            p50: percentile(samples, 50.0)?,
            p95: percentile(samples, 95.0)?,
            p99: percentile(samples, 99.0)?,
            max: *samples.last()?,
        })
    }
}

/// `value / baseline`, or `None` when the baseline is zero.
pub fn ratio(value: Duration, baseline: Duration) -> Option<f64> {
    if baseline.is_zero() {
        return None;
    }
    Some(value.as_secs_f64() / baseline.as_secs_f64())
}

/// `value - baseline` in milliseconds, negative when `value` is faster.
pub fn delta_ms(value: Duration, baseline: Duration) -> f64 {
    (value.as_secs_f64() - baseline.as_secs_f64()) * 1000.0
}

/// Percentage of `part` in `whole` (0 when `whole` is 0).
pub fn percent(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn percentile_of_nothing_is_none() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(Summary::of(&mut []), None);
    }

    #[test]
    fn percentile_of_one_sample_is_that_sample() {
        let s = millis(&[7]);
        for p in [1.0, 50.0, 99.0, 100.0] {
            assert_eq!(percentile(&s, p), Some(Duration::from_millis(7)));
        }
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let s = millis(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&s, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&s, 95.0), Some(Duration::from_millis(95)));
        assert_eq!(percentile(&s, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&s, 100.0), Some(Duration::from_millis(100)));
        // Rank ceil(0.5 * 4) = 2: the lower middle, never an average.
        let s = millis(&[10, 20, 30, 40]);
        assert_eq!(percentile(&s, 50.0), Some(Duration::from_millis(20)));
        // Rank ceil(0.99 * 4) = 4: a small sample's p99 is its maximum.
        assert_eq!(percentile(&s, 99.0), Some(Duration::from_millis(40)));
    }

    #[test]
    fn summary_sorts_its_input() {
        let mut s = millis(&[5, 1, 4, 2, 3]);
        let sum = Summary::of(&mut s).unwrap();
        assert_eq!(sum.count, 5);
        assert_eq!(sum.p50, Duration::from_millis(3));
        assert_eq!(sum.p95, Duration::from_millis(5));
        assert_eq!(sum.p99, Duration::from_millis(5));
        assert_eq!(sum.max, Duration::from_millis(5));
    }

    #[test]
    fn ratio_and_delta_against_the_baseline() {
        let base = Duration::from_millis(200);
        assert_eq!(ratio(Duration::from_millis(50), base), Some(0.25));
        assert_eq!(ratio(base, base), Some(1.0));
        assert_eq!(ratio(base, Duration::ZERO), None);
        assert!((delta_ms(Duration::from_micros(200_500), base) - 0.5).abs() < 1e-9);
        assert!((delta_ms(Duration::from_millis(150), base) + 50.0).abs() < 1e-9);
    }

    #[test]
    fn percent_of_zero_is_zero() {
        assert_eq!(percent(0, 0), 0.0);
        assert_eq!(percent(1, 4), 25.0);
        assert_eq!(percent(3, 3), 100.0);
    }
}
