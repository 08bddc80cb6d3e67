//! The GenAI client metrics, aggregated in the exporter's task from the
//! turns it is given: `gen_ai.client.token.usage` (tokens per turn, by
//! `gen_ai.token.type` input/output) and `gen_ai.client.operation.duration`
//! (seconds per turn), as cumulative explicit-bucket histograms with the
//! bucket boundaries the conventions advise.
//!
//! Metrics are not sampled: every turn counts, whatever the trace sampler
//! decided. The series are per route model and provider, so their number
//! is bounded by the configuration.

use std::collections::HashMap;
use std::time::SystemTime;

use super::proto::{HistogramData, HistogramPoint, Value};
use super::semconv::OPERATION;

/// `gen_ai.client.token.usage` boundaries (powers of 4).
pub const TOKEN_BOUNDS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
/// `gen_ai.client.operation.duration` boundaries (seconds).
pub const DURATION_BOUNDS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// One turn as the metrics see it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnSample {
    pub model: String,
    /// `gen_ai.provider.name`.
    pub provider: &'static str,
    /// `None`: usage unknown (the turn is timed, its tokens not counted).
    pub tokens: Option<(u64, u64)>,
    pub seconds: f64,
}

#[derive(Debug, Clone)]
struct Hist {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    buckets: Vec<u64>,
}

impl Hist {
    fn new(bounds: &[f64]) -> Self {
        Self {
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            buckets: vec![0; bounds.len() + 1],
        }
    }

    fn record(&mut self, bounds: &[f64], v: f64) {
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        // A value equal to a bound falls in that bound's bucket (upper
        // bounds are inclusive).
        let i = bounds.partition_point(|b| *b < v);
        self.buckets[i] += 1;
    }
}

/// (model, provider, token type or "").
type SeriesKey = (String, &'static str, &'static str);

/// Cumulative histograms since [`Aggregates::new`].
#[derive(Debug)]
pub struct Aggregates {
    start: SystemTime,
    tokens: HashMap<SeriesKey, Hist>,
    duration: HashMap<SeriesKey, Hist>,
}

impl Aggregates {
    pub fn new(start: SystemTime) -> Self {
        Self {
            start,
            tokens: HashMap::new(),
            duration: HashMap::new(),
        }
    }

    pub fn record(&mut self, t: &TurnSample) {
        let key = |kind| (t.model.clone(), t.provider, kind);
        if let Some((input, output)) = t.tokens {
            for (kind, n) in [("input", input), ("output", output)] {
                self.tokens
                    .entry(key(kind))
                    .or_insert_with(|| Hist::new(&TOKEN_BOUNDS))
                    .record(&TOKEN_BOUNDS, n as f64);
            }
        }
        self.duration
            .entry(key(""))
            .or_insert_with(|| Hist::new(&DURATION_BOUNDS))
            .record(&DURATION_BOUNDS, t.seconds);
    }

    pub fn is_empty(&self) -> bool {
        self.duration.is_empty()
    }

    /// The metrics as of `now`, sorted by their attributes.
    pub fn snapshot(&self, now: SystemTime) -> Vec<HistogramData> {
        let points = |m: &HashMap<SeriesKey, Hist>, bounds: &'static [f64]| {
            let mut keys: Vec<&SeriesKey> = m.keys().collect();
            keys.sort();
            keys.into_iter()
                .map(|k| {
                    let h = &m[k];
                    let mut attributes = vec![
                        ("gen_ai.operation.name", Value::Str(OPERATION.into())),
                        ("gen_ai.provider.name", Value::Str(k.1.into())),
                        ("gen_ai.request.model", Value::Str(k.0.clone())),
                    ];
                    if !k.2.is_empty() {
                        attributes.push(("gen_ai.token.type", Value::Str(k.2.into())));
                    }
                    HistogramPoint {
                        attributes,
                        start: self.start,
                        time: now,
                        count: h.count,
                        sum: h.sum,
                        min: h.min,
                        max: h.max,
                        bucket_counts: h.buckets.clone(),
                        bounds,
                    }
                })
                .collect()
        };
        vec![
            HistogramData {
                name: "gen_ai.client.token.usage",
                description: "Tokens used per realtime response turn, by token type",
                unit: "{token}",
                points: points(&self.tokens, &TOKEN_BOUNDS),
            },
            HistogramData {
                name: "gen_ai.client.operation.duration",
                description: "Realtime response turns, response.created to response.done",
                unit: "s",
                points: points(&self.duration, &DURATION_BOUNDS),
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_counted_per_model_and_token_type_in_cumulative_buckets() {
        let mut a = Aggregates::new(SystemTime::UNIX_EPOCH);
        let t = |tokens| TurnSample {
            model: "gpt-realtime".into(),
            provider: "openai",
            tokens,
            seconds: 0.5,
        };
        a.record(&t(Some((16, 100))));
        a.record(&t(Some((17, 0))));
        a.record(&t(None));
        let snap = a.snapshot(SystemTime::UNIX_EPOCH);
        let usage = &snap[0];
        assert_eq!(usage.points.len(), 2);
        let input = &usage.points[0];
        assert_eq!(input.attributes[3].1, Value::Str("input".into()));
        assert_eq!(
            (input.count, input.sum, input.min, input.max),
            (2, 33.0, 16.0, 17.0)
        );
        // 16 falls in the (4, 16] bucket, 17 in (16, 64].
        assert_eq!(input.bucket_counts[2], 1);
        assert_eq!(input.bucket_counts[3], 1);
        assert_eq!(input.bucket_counts.len(), TOKEN_BOUNDS.len() + 1);
        let duration = &snap[1];
        assert_eq!(duration.points.len(), 1);
        assert_eq!(duration.points[0].count, 3);
    }
}
