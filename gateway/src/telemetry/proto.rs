//! The OTLP wire format, written by hand: the few messages of
//! opentelemetry-proto (v1, `collector/{trace,logs,metrics}/v1`) the
//! gateway exports, encoded as protobuf from plain structs.
//!
//! Why by hand: the gateway exports three message shapes, all known at
//! compile time; a protobuf code generator and its runtime (prost, and
//! tonic for gRPC) would add a build step and a dependency tree for what
//! is a few hundred lines of varints and length prefixes. The encoding is
//! checked against the official definitions by the export test, which
//! decodes it with the `opentelemetry-proto` package.
//!
//! Field numbers are those of opentelemetry-proto's `.proto` files; each
//! message writer names its message.

use std::time::{SystemTime, UNIX_EPOCH};

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Double(f64),
    Bool(bool),
    StrArray(Vec<String>),
}

/// An attribute: a key (always one of the gateway's constants) and a value.
pub type Attribute = (&'static str, Value);

/// `SpanKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// A finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanData {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_span_id: Option<[u8; 8]>,
    pub name: String,
    pub kind: SpanKind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<Attribute>,
    pub events: Vec<EventData>,
    /// `Some(message)`: status ERROR with that message; `None`: UNSET.
    pub error: Option<String>,
}

/// A span event.
#[derive(Debug, Clone, PartialEq)]
pub struct EventData {
    pub time: SystemTime,
    pub name: &'static str,
    pub attributes: Vec<Attribute>,
}

/// A log record carrying an event (`event_name` set), in a trace's context.
#[derive(Debug, Clone, PartialEq)]
pub struct LogData {
    pub time: SystemTime,
    pub event_name: &'static str,
    pub trace_id: [u8; 16],
    /// The span the event happened in (the client's, when it sent one).
    pub span_id: Option<[u8; 8]>,
    pub attributes: Vec<Attribute>,
}

/// One histogram data point, cumulative since `start`.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramPoint {
    pub attributes: Vec<Attribute>,
    pub start: SystemTime,
    pub time: SystemTime,
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    /// One more count than `bounds`.
    pub bucket_counts: Vec<u64>,
    pub bounds: &'static [f64],
}

/// A histogram metric and its points.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramData {
    pub name: &'static str,
    pub description: &'static str,
    pub unit: &'static str,
    pub points: Vec<HistogramPoint>,
}

/// One point of a monotonic sum (a counter), cumulative since `start`.
#[derive(Debug, Clone, PartialEq)]
pub struct SumPoint {
    pub attributes: Vec<Attribute>,
    pub start: SystemTime,
    pub time: SystemTime,
    pub value: u64,
}

/// A counter metric and its points.
#[derive(Debug, Clone, PartialEq)]
pub struct SumData {
    pub name: &'static str,
    pub description: &'static str,
    pub unit: &'static str,
    pub points: Vec<SumPoint>,
}

/// A metric of either kind the gateway exports.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricData {
    Histogram(HistogramData),
    Sum(SumData),
}

impl MetricData {
    /// Its data points.
    pub fn points(&self) -> usize {
        match self {
            Self::Histogram(h) => h.points.len(),
            Self::Sum(s) => s.points.len(),
        }
    }
}

/// What every request carries: the resource and the instrumentation scope.
#[derive(Debug, Clone, PartialEq)]
pub struct Origin {
    pub resource: Vec<(String, String)>,
    pub scope_name: &'static str,
    pub scope_version: &'static str,
    /// The semantic conventions' schema URL; empty: none.
    pub schema_url: &'static str,
}

const WIRE_VARINT: u8 = 0;
const WIRE_I64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_I32: u8 = 5;

fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, WIRE_VARINT);
    varint(out, v);
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, WIRE_I64);
    out.extend_from_slice(&v.to_le_bytes());
}

fn fixed32(out: &mut Vec<u8>, field: u32, v: u32) {
    tag(out, field, WIRE_I32);
    out.extend_from_slice(&v.to_le_bytes());
}

fn double(out: &mut Vec<u8>, field: u32, v: f64) {
    fixed64(out, field, v.to_bits());
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(out, field, WIRE_LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn string(out: &mut Vec<u8>, field: u32, s: &str) {
    bytes(out, field, s.as_bytes());
}

/// A nested message: written to a scratch buffer, then length-prefixed.
fn message(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    write(&mut inner);
    bytes(out, field, &inner);
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `AnyValue`: string_value 1, bool_value 2, int_value 3, double_value 4,
/// array_value 5 (`ArrayValue`: values 1).
fn any_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Str(s) => string(out, 1, s),
        Value::Bool(b) => uint(out, 2, u64::from(*b)),
        Value::Int(i) => uint(out, 3, *i as u64),
        Value::Double(d) => double(out, 4, *d),
        Value::StrArray(items) => message(out, 5, |arr| {
            for s in items {
                message(arr, 1, |v| string(v, 1, s));
            }
        }),
    }
}

/// `KeyValue`: key 1, value 2.
fn key_value(out: &mut Vec<u8>, field: u32, key: &str, v: &Value) {
    message(out, field, |kv| {
        string(kv, 1, key);
        message(kv, 2, |any| any_value(any, v));
    });
}

fn attributes(out: &mut Vec<u8>, field: u32, attrs: &[Attribute]) {
    for (k, v) in attrs {
        key_value(out, field, k, v);
    }
}

/// `Resource` (attributes 1) at field 1 of a `Resource*` message, then its
/// `Scope*` message at field 2 holding `items`, and the schema URL (3).
fn resource_and_scope(out: &mut Vec<u8>, origin: &Origin, items: impl FnOnce(&mut Vec<u8>)) {
    message(out, 1, |res| {
        for (k, v) in &origin.resource {
            message(res, 1, |kv| {
                string(kv, 1, k);
                message(kv, 2, |any| string(any, 1, v));
            });
        }
    });
    message(out, 2, |scope_items| {
        // `InstrumentationScope`: name 1, version 2.
        message(scope_items, 1, |scope| {
            string(scope, 1, origin.scope_name);
            string(scope, 2, origin.scope_version);
        });
        items(scope_items);
        if !origin.schema_url.is_empty() {
            string(scope_items, 3, origin.schema_url);
        }
    });
}

/// `ExportTraceServiceRequest` (resource_spans 1 → `ResourceSpans` →
/// `ScopeSpans`: spans 2).
pub fn encode_spans(origin: &Origin, spans: &[SpanData]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + spans.len() * 512);
    message(&mut out, 1, |rs| {
        resource_and_scope(rs, origin, |ss| {
            for s in spans {
                message(ss, 2, |m| span(m, s));
            }
        });
    });
    out
}

/// `Span`: trace_id 1, span_id 2, parent_span_id 4, name 5, kind 6,
/// start 7, end 8, attributes 9, events 11, status 15, flags 16.
fn span(out: &mut Vec<u8>, s: &SpanData) {
    bytes(out, 1, &s.trace_id);
    bytes(out, 2, &s.span_id);
    if let Some(p) = &s.parent_span_id {
        bytes(out, 4, p);
    }
    string(out, 5, &s.name);
    uint(out, 6, s.kind as u64);
    fixed64(out, 7, nanos(s.start));
    fixed64(out, 8, nanos(s.end));
    attributes(out, 9, &s.attributes);
    for e in &s.events {
        // `Span.Event`: time 1, name 2, attributes 3.
        message(out, 11, |m| {
            fixed64(m, 1, nanos(e.time));
            string(m, 2, e.name);
            attributes(m, 3, &e.attributes);
        });
    }
    if let Some(msg) = &s.error {
        // `Status`: message 2, code 3 (2 = ERROR).
        message(out, 15, |st| {
            string(st, 2, msg);
            uint(st, 3, 2);
        });
    }
    // Flags: the W3C sampled bit (every exported span was sampled).
    fixed32(out, 16, 1);
}

/// `ExportLogsServiceRequest` (resource_logs 1 → `ResourceLogs` →
/// `ScopeLogs`: log_records 2).
pub fn encode_logs(origin: &Origin, logs: &[LogData]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + logs.len() * 256);
    message(&mut out, 1, |rl| {
        resource_and_scope(rl, origin, |sl| {
            for l in logs {
                message(sl, 2, |m| log_record(m, l));
            }
        });
    });
    out
}

/// `LogRecord`: time 1, severity_number 2, severity_text 3, attributes 6,
/// trace_id 9, span_id 10, observed_time 11, event_name 12.
fn log_record(out: &mut Vec<u8>, l: &LogData) {
    let t = nanos(l.time);
    fixed64(out, 1, t);
    // SEVERITY_NUMBER_INFO.
    uint(out, 2, 9);
    string(out, 3, "INFO");
    attributes(out, 6, &l.attributes);
    bytes(out, 9, &l.trace_id);
    if let Some(s) = &l.span_id {
        bytes(out, 10, s);
    }
    fixed64(out, 11, t);
    string(out, 12, l.event_name);
}

/// `ExportMetricsServiceRequest` (resource_metrics 1 → `ResourceMetrics`
/// → `ScopeMetrics`: metrics 2).
pub fn encode_metrics(origin: &Origin, metrics: &[MetricData]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    message(&mut out, 1, |rm| {
        resource_and_scope(rm, origin, |sm| {
            for metric in metrics {
                message(sm, 2, |m| match metric {
                    MetricData::Histogram(h) => histogram(m, h),
                    MetricData::Sum(s) => sum(m, s),
                });
            }
        });
    });
    out
}

/// `Metric`: name 1, description 2, unit 3, sum 7 (`Sum`: data_points 1,
/// aggregation_temporality 2 = CUMULATIVE, is_monotonic 3).
fn sum(out: &mut Vec<u8>, s: &SumData) {
    string(out, 1, s.name);
    string(out, 2, s.description);
    string(out, 3, s.unit);
    message(out, 7, |sum| {
        for p in &s.points {
            message(sum, 1, |dp| sum_point(dp, p));
        }
        uint(sum, 2, 2);
        uint(sum, 3, 1);
    });
}

/// `NumberDataPoint`: start 2, time 3, as_int 6 (sfixed64), attributes 7.
fn sum_point(out: &mut Vec<u8>, p: &SumPoint) {
    fixed64(out, 2, nanos(p.start));
    fixed64(out, 3, nanos(p.time));
    fixed64(out, 6, p.value.min(i64::MAX as u64));
    attributes(out, 7, &p.attributes);
}

/// `Metric`: name 1, description 2, unit 3, histogram 9 (`Histogram`:
/// data_points 1, aggregation_temporality 2 = CUMULATIVE).
fn histogram(out: &mut Vec<u8>, h: &HistogramData) {
    string(out, 1, h.name);
    string(out, 2, h.description);
    string(out, 3, h.unit);
    message(out, 9, |hist| {
        for p in &h.points {
            message(hist, 1, |dp| histogram_point(dp, p));
        }
        uint(hist, 2, 2);
    });
}

/// `HistogramDataPoint`: start 2, time 3, count 4, sum 5, bucket_counts 6
/// (packed fixed64), explicit_bounds 7 (packed double), attributes 9,
/// min 11, max 12.
fn histogram_point(out: &mut Vec<u8>, p: &HistogramPoint) {
    fixed64(out, 2, nanos(p.start));
    fixed64(out, 3, nanos(p.time));
    fixed64(out, 4, p.count);
    double(out, 5, p.sum);
    let mut counts = Vec::with_capacity(p.bucket_counts.len() * 8);
    for c in &p.bucket_counts {
        counts.extend_from_slice(&c.to_le_bytes());
    }
    bytes(out, 6, &counts);
    let mut bounds = Vec::with_capacity(p.bounds.len() * 8);
    for b in p.bounds {
        bounds.extend_from_slice(&b.to_bits().to_le_bytes());
    }
    bytes(out, 7, &bounds);
    attributes(out, 9, &p.attributes);
    if p.count > 0 {
        double(out, 11, p.min);
        double(out, 12, p.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_take_seven_bits_a_byte() {
        let mut out = Vec::new();
        varint(&mut out, 1);
        varint(&mut out, 300);
        varint(&mut out, u64::MAX);
        assert_eq!(&out[..3], &[0x01, 0xac, 0x02]);
        assert_eq!(out.len(), 3 + 10);
    }

    #[test]
    fn a_key_value_is_a_string_key_and_a_nested_any_value() {
        let mut out = Vec::new();
        key_value(&mut out, 9, "a", &Value::Int(150));
        // field 9 LEN, 8 bytes: key (0a 01 'a'), value (12 03 → int 18 96 01).
        assert_eq!(
            out,
            vec![0x4a, 0x08, 0x0a, 0x01, b'a', 0x12, 0x03, 0x18, 0x96, 0x01]
        );
    }

    #[test]
    fn a_negative_int_is_written_as_its_twos_complement_varint() {
        let mut out = Vec::new();
        any_value(&mut out, &Value::Int(-1));
        assert_eq!(out.len(), 1 + 10);
    }
}
