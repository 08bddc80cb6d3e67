//! The GenAI client metrics, aggregated in the exporter's task from the
//! turns it is given, all cumulative:
//! - `gen_ai.client.token.usage` (tokens per turn, by `gen_ai.token.type`
//!   input/output) and `gen_ai.client.operation.duration` (seconds per
//!   turn), explicit-bucket histograms with the bucket boundaries the
//!   conventions advise (`gen-ai-metrics.md`);
//! - the inference usage metrics (`gen-ai-inference-usage-metrics.md`):
//!   the histograms `gen_ai.client.inference.usage.{input,output}_tokens`
//!   (tokens per turn, deliberately not by modality: percentiles across
//!   modalities do not add up), and the counters
//!   `gen_ai.client.inference.usage.detailed.{input_tokens,output_tokens,cache_read.input_tokens}`
//!   by `gen_ai.token.modality` (`text`, `audio`, `image`; what a total
//!   has beyond its modalities' counts is `unknown`, as the conventions
//!   ask), so that each counter's sum over modalities is the rows' total.
//!
//! Metrics are not sampled: every turn counts, whatever the trace sampler
//! decided. The series are per route model, provider (and token type or
//! modality), so their number is bounded by the configuration.
//!
//! The per-turn histograms of both documents hold the same samples, so
//! they share one aggregation; only the counters add state.

use std::collections::HashMap;
use std::time::SystemTime;

use super::proto::{
    Attribute, HistogramData, HistogramPoint, MetricData, SumData, SumPoint, Value,
};
use super::semconv::{Turn, OPERATION};

/// `gen_ai.client.token.usage` boundaries (powers of 4).
pub const TOKEN_BOUNDS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
/// `gen_ai.client.operation.duration` boundaries (seconds).
pub const DURATION_BOUNDS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// `gen_ai.token.modality` values, in the order of [`TokenCounts::detailed`].
pub const MODALITIES: [&str; 4] = ["text", "audio", "image", "unknown"];

/// The `gen_ai.client.inference.usage.detailed.*` counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Detailed {
    Input,
    Output,
    CacheRead,
}

impl Detailed {
    pub const ALL: [Detailed; 3] = [Self::Input, Self::Output, Self::CacheRead];

    pub fn name(self) -> &'static str {
        match self {
            Self::Input => "gen_ai.client.inference.usage.detailed.input_tokens",
            Self::Output => "gen_ai.client.inference.usage.detailed.output_tokens",
            Self::CacheRead => "gen_ai.client.inference.usage.detailed.cache_read.input_tokens",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Self::Input => "Input tokens of realtime response turns, cached included, by modality",
            Self::Output => "Output tokens of realtime response turns, by modality",
            Self::CacheRead => "Input tokens served from the provider's cache, by modality",
        }
    }

    /// The modalities a row counts for it (the first of [`MODALITIES`]),
    /// recorded on every turn; another (`unknown`) only when not zero.
    fn reported(self) -> usize {
        match self {
            Self::Output => 2,
            Self::Input | Self::CacheRead => 3,
        }
    }
}

/// A turn's tokens, as its row has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenCounts {
    pub input: u64,
    pub output: u64,
    /// By [`Detailed`] counter, tokens by [`MODALITIES`].
    pub detailed: [[u64; 4]; 3],
}

impl TokenCounts {
    /// The counts of a metered turn; `None` when its usage is unknown.
    pub fn of(turn: &Turn<'_>) -> Option<Self> {
        let r = turn.row;
        (!r.usage_unknown).then(|| Self {
            input: r.input_tokens,
            output: r.output_tokens,
            detailed: [
                split(
                    r.input_tokens,
                    [
                        r.input_text_tokens,
                        r.input_audio_tokens,
                        r.input_image_tokens,
                    ],
                ),
                // The Realtime API reports no image output.
                split(
                    r.output_tokens,
                    [r.output_text_tokens, r.output_audio_tokens, 0],
                ),
                split(
                    r.input_cached_tokens,
                    [turn.cached_text, turn.cached_audio, turn.cached_image],
                ),
            ],
        })
    }
}

/// `parts` by modality, and what they leave of `total` as `unknown`.
fn split(total: u64, parts: [u64; 3]) -> [u64; 4] {
    let named = parts.iter().fold(0u64, |a, p| a.saturating_add(*p));
    [parts[0], parts[1], parts[2], total.saturating_sub(named)]
}

/// One turn as the metrics see it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnSample {
    pub model: String,
    /// `gen_ai.provider.name`.
    pub provider: &'static str,
    /// `None`: usage unknown (the turn is timed, its tokens not counted).
    pub tokens: Option<TokenCounts>,
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
/// (model, provider, counter, modality).
type CounterKey = (String, &'static str, Detailed, &'static str);

/// Cumulative histograms and counters since [`Aggregates::new`].
#[derive(Debug)]
pub struct Aggregates {
    start: SystemTime,
    tokens: HashMap<SeriesKey, Hist>,
    duration: HashMap<SeriesKey, Hist>,
    detailed: HashMap<CounterKey, u64>,
}

impl Aggregates {
    pub fn new(start: SystemTime) -> Self {
        Self {
            start,
            tokens: HashMap::new(),
            duration: HashMap::new(),
            detailed: HashMap::new(),
        }
    }

    pub fn record(&mut self, t: &TurnSample) {
        let key = |kind| (t.model.clone(), t.provider, kind);
        if let Some(tokens) = &t.tokens {
            for (kind, n) in [("input", tokens.input), ("output", tokens.output)] {
                self.tokens
                    .entry(key(kind))
                    .or_insert_with(|| Hist::new(&TOKEN_BOUNDS))
                    .record(&TOKEN_BOUNDS, n as f64);
            }
            for (counter, by_modality) in Detailed::ALL.into_iter().zip(&tokens.detailed) {
                for (i, (modality, n)) in MODALITIES.into_iter().zip(by_modality).enumerate() {
                    if i < counter.reported() || *n > 0 {
                        let total = self
                            .detailed
                            .entry((t.model.clone(), t.provider, counter, modality))
                            .or_default();
                        *total = total.saturating_add(*n);
                    }
                }
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
    pub fn snapshot(&self, now: SystemTime) -> Vec<MetricData> {
        // The histograms of `m`: all of them, their token type named as
        // `gen_ai.token.type`; or those of one type (`kind`), unnamed.
        let points = |m: &HashMap<SeriesKey, Hist>, bounds: &'static [f64], kind: Option<&str>| {
            let mut keys: Vec<&SeriesKey> =
                m.keys().filter(|k| kind.is_none_or(|t| k.2 == t)).collect();
            keys.sort();
            keys.into_iter()
                .map(|k| {
                    let h = &m[k];
                    let mut attributes = common(&k.0, k.1);
                    if kind.is_none() && !k.2.is_empty() {
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
        let histogram = |name, description, unit, points| {
            MetricData::Histogram(HistogramData {
                name,
                description,
                unit,
                points,
            })
        };
        let mut metrics = vec![
            histogram(
                "gen_ai.client.token.usage",
                "Tokens used per realtime response turn, by token type",
                "{token}",
                points(&self.tokens, &TOKEN_BOUNDS, None),
            ),
            histogram(
                "gen_ai.client.operation.duration",
                "Realtime response turns, response.created to response.done",
                "s",
                points(&self.duration, &DURATION_BOUNDS, None),
            ),
            histogram(
                "gen_ai.client.inference.usage.input_tokens",
                "Input tokens per realtime response turn",
                "{token}",
                points(&self.tokens, &TOKEN_BOUNDS, Some("input")),
            ),
            histogram(
                "gen_ai.client.inference.usage.output_tokens",
                "Output tokens per realtime response turn",
                "{token}",
                points(&self.tokens, &TOKEN_BOUNDS, Some("output")),
            ),
        ];
        let mut keys: Vec<&CounterKey> = self.detailed.keys().collect();
        keys.sort();
        for counter in Detailed::ALL {
            let points = keys
                .iter()
                .filter(|k| k.2 == counter)
                .map(|k| {
                    let mut attributes = common(&k.0, k.1);
                    attributes.push(("gen_ai.token.modality", Value::Str(k.3.into())));
                    SumPoint {
                        attributes,
                        start: self.start,
                        time: now,
                        value: self.detailed[*k],
                    }
                })
                .collect();
            metrics.push(MetricData::Sum(SumData {
                name: counter.name(),
                description: counter.description(),
                unit: "{token}",
                points,
            }));
        }
        metrics
    }
}

/// The attributes every GenAI client metric point carries.
fn common(model: &str, provider: &'static str) -> Vec<Attribute> {
    vec![
        ("gen_ai.operation.name", Value::Str(OPERATION.into())),
        ("gen_ai.provider.name", Value::Str(provider.into())),
        ("gen_ai.request.model", Value::Str(model.to_string())),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(input: u64, output: u64) -> TokenCounts {
        TokenCounts {
            input,
            output,
            detailed: [[input, 0, 0, 0], [0, output, 0, 0], [0; 4]],
        }
    }

    fn sample(tokens: Option<TokenCounts>) -> TurnSample {
        TurnSample {
            model: "gpt-realtime".into(),
            provider: "openai",
            tokens,
            seconds: 0.5,
        }
    }

    fn histogram<'a>(snap: &'a [MetricData], name: &str) -> &'a HistogramData {
        snap.iter()
            .find_map(|m| match m {
                MetricData::Histogram(h) if h.name == name => Some(h),
                _ => None,
            })
            .unwrap()
    }

    /// (modality, value) of each point of the counter `name`.
    fn counter(snap: &[MetricData], name: &str) -> Vec<(String, u64)> {
        let sum = snap
            .iter()
            .find_map(|m| match m {
                MetricData::Sum(s) if s.name == name => Some(s),
                _ => None,
            })
            .unwrap();
        sum.points
            .iter()
            .map(|p| {
                let modality = p
                    .attributes
                    .iter()
                    .find(|(k, _)| *k == "gen_ai.token.modality")
                    .map(|(_, v)| match v {
                        Value::Str(s) => s.clone(),
                        v => panic!("{v:?}"),
                    })
                    .unwrap();
                (modality, p.value)
            })
            .collect()
    }

    #[test]
    fn turns_are_counted_per_model_and_token_type_in_cumulative_buckets() {
        let mut a = Aggregates::new(SystemTime::UNIX_EPOCH);
        a.record(&sample(Some(counts(16, 100))));
        a.record(&sample(Some(counts(17, 0))));
        a.record(&sample(None));
        let snap = a.snapshot(SystemTime::UNIX_EPOCH);
        let usage = histogram(&snap, "gen_ai.client.token.usage");
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
        let duration = histogram(&snap, "gen_ai.client.operation.duration");
        assert_eq!(duration.points.len(), 1);
        assert_eq!(duration.points[0].count, 3);
    }

    #[test]
    fn inference_usage_histograms_hold_each_turns_tokens_without_a_modality() {
        let mut a = Aggregates::new(SystemTime::UNIX_EPOCH);
        a.record(&sample(Some(counts(16, 100))));
        a.record(&sample(Some(counts(17, 0))));
        let snap = a.snapshot(SystemTime::UNIX_EPOCH);
        let input = histogram(&snap, "gen_ai.client.inference.usage.input_tokens");
        let output = histogram(&snap, "gen_ai.client.inference.usage.output_tokens");
        assert_eq!((input.points.len(), output.points.len()), (1, 1));
        assert_eq!((input.points[0].count, input.points[0].sum), (2, 33.0));
        assert_eq!((output.points[0].count, output.points[0].sum), (2, 100.0));
        assert_eq!(input.unit, "{token}");
        // Only the operation, provider and model: no token type or modality.
        let keys: Vec<&str> = input.points[0].attributes.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            [
                "gen_ai.operation.name",
                "gen_ai.provider.name",
                "gen_ai.request.model"
            ]
        );
    }

    #[test]
    fn detailed_counters_add_up_by_modality_and_name_what_is_left_unknown() {
        let mut a = Aggregates::new(SystemTime::UNIX_EPOCH);
        let t = |input, output, cached| TokenCounts {
            input: 0,
            output: 0,
            detailed: [
                split(input, [10, 20, 0]),
                split(output, [5, 45, 0]),
                split(cached, [3, 5, 0]),
            ],
        };
        a.record(&sample(Some(t(30, 50, 8))));
        // A provider whose breakdown misses 4 input tokens.
        a.record(&sample(Some(t(34, 50, 8))));
        a.record(&sample(None));
        let snap = a.snapshot(SystemTime::UNIX_EPOCH);
        let pairs = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(m, n)| (m.to_string(), *n)).collect()
        };
        assert_eq!(
            counter(&snap, Detailed::Input.name()),
            pairs(&[("audio", 40), ("image", 0), ("text", 20), ("unknown", 4)])
        );
        // No image output is reported, and none is counted.
        assert_eq!(
            counter(&snap, Detailed::Output.name()),
            pairs(&[("audio", 90), ("text", 10)])
        );
        assert_eq!(
            counter(&snap, Detailed::CacheRead.name()),
            pairs(&[("audio", 10), ("image", 0), ("text", 6)])
        );
    }

    #[test]
    fn a_rows_tokens_split_by_modality_with_the_remainder_unknown() {
        assert_eq!(split(30, [10, 20, 0]), [10, 20, 0, 0]);
        assert_eq!(split(34, [10, 20, 0]), [10, 20, 0, 4]);
        // Parts over the total (an odd report): nothing is unknown.
        assert_eq!(split(20, [10, 20, 0]), [10, 20, 0, 0]);
    }
}
