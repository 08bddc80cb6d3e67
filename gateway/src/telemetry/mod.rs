//! OpenTelemetry export: traces, events and metrics over OTLP
//! (http/protobuf or grpc), in the GenAI semantic conventions for realtime
//! sessions ([`semconv`]).
//!
//! - Each session: `gen_ai.client.realtime_session.started` and `.ended`
//!   events (OTLP log records with an event name) carrying the route,
//!   model, transport, key id (never a key), outcome and close codes.
//! - Each response turn: a `realtime_inference {model}` CLIENT span from
//!   `response.created` to `response.done` (or the cut), built from the
//!   turn's request-log row when the meter flushes it, so its usage and
//!   cost are the row's. None for translation or transcription sessions.
//! - A W3C `traceparent` on the client's upgrade continues the client's
//!   trace ([`context`]); none is sent upstream.
//! - The exporter ([`export`]) is batched, bounded, and drops (counted in
//!   `patchbay_telemetry_dropped_total`) rather than wait; it POSTs
//!   protobuf over HTTP/1.1 or makes gRPC calls over HTTP/2 ([`grpc`],
//!   [`transport`]).
//!
//! Configured by `[telemetry]` and the standard `OTEL_*` variables
//! ([`config`]); off when no endpoint is set.

pub mod aggregate;
pub mod config;
pub mod context;
pub mod export;
pub mod grpc;
pub mod handle;
pub mod proto;
pub mod semconv;
pub mod transport;
