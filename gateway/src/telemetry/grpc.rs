//! OTLP/gRPC on the wire: the three unary `Export` methods, the message
//! framing, and the `grpc-status` that says whether a call worked.
//!
//! A call is an HTTP/2 POST to the method's path with `content-type:
//! application/grpc` and `te: trailers`; its body is one length-prefixed
//! message (a compressed flag, 0 here, then the length as 4 big-endian
//! bytes, then the same protobuf message the http/protobuf exporter
//! sends, [`super::proto`]). The answer is HTTP 200 whatever happened: the
//! outcome is `grpc-status` in the trailers, or in the headers of a
//! trailers-only answer; anything but 0 (OK), or no status at all, is a
//! failed call.
//!
//! Why not tonic: the gateway sends three message shapes it already
//! encodes; tonic would bring prost, tower's buffer and a codegen step for
//! five bytes of framing and one trailer. The `h2` crate's client (the
//! HTTP/2 under hyper) carries the calls ([`super::transport`]).

use std::time::Duration;

use http::HeaderMap;

/// `content-type` of a call.
pub const CONTENT_TYPE: &str = "application/grpc";
/// The services' unary methods, as request paths.
pub const TRACES_METHOD: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
pub const LOGS_METHOD: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";
pub const METRICS_METHOD: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// The length-prefixed message's header: flag and length.
pub const FRAME_HEADER_BYTES: usize = 5;
/// The compressed flag: the gateway never compresses.
const UNCOMPRESSED: u8 = 0;
/// `grpc-timeout` takes at most eight digits.
const MAX_TIMEOUT_DIGITS: u64 = 99_999_999;

/// A call that did not succeed, as its answer said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("grpc-status {code} ({}): {message}", code_name(*.code))]
    Status { code: u32, message: String },
    #[error("the answer has no grpc-status")]
    NoStatus,
}

/// `message` as the body of a call: one uncompressed length-prefixed
/// message.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + message.len());
    out.push(UNCOMPRESSED);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The `grpc-timeout` value for `timeout`: milliseconds, or whole seconds
/// when that needs more than eight digits.
pub fn timeout_value(timeout: Duration) -> String {
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    if ms <= MAX_TIMEOUT_DIGITS {
        format!("{ms}m")
    } else {
        format!("{}S", timeout.as_secs().min(MAX_TIMEOUT_DIGITS))
    }
}

/// The outcome of a call from its answer's headers and trailers: the
/// trailers' `grpc-status` (or the headers', for a trailers-only answer).
pub fn outcome(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Result<(), CallError> {
    let map = match trailers {
        Some(t) if t.contains_key("grpc-status") => t,
        _ => headers,
    };
    let Some(code) = map.get("grpc-status") else {
        return Err(CallError::NoStatus);
    };
    // A status that is not a number is not OK.
    let code = code
        .to_str()
        .ok()
        .and_then(|c| c.trim().parse::<u32>().ok())
        .unwrap_or(UNKNOWN);
    if code == 0 {
        return Ok(());
    }
    let message = map
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Err(CallError::Status { code, message })
}

/// The status code `UNKNOWN`.
const UNKNOWN: u32 = 2;

/// The status codes' names, for the log.
fn code_name(code: u32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|c| NAMES.get(c))
        .copied()
        .unwrap_or("?")
}

/// `grpc-message` is percent-encoded UTF-8; a bad escape is kept as it is.
fn percent_decode(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let v = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn a_message_is_framed_uncompressed_with_its_big_endian_length() {
        assert_eq!(frame(b""), vec![0, 0, 0, 0, 0]);
        assert_eq!(
            frame(b"\x0a\x02hi"),
            vec![0, 0, 0, 0, 4, 0x0a, 0x02, b'h', b'i']
        );
        let big = vec![7u8; 0x0001_0203];
        let framed = frame(&big);
        assert_eq!(&framed[..FRAME_HEADER_BYTES], &[0, 0x00, 0x01, 0x02, 0x03]);
        assert_eq!(&framed[FRAME_HEADER_BYTES..], &big[..]);
    }

    #[test]
    fn the_methods_are_the_collector_services_export() {
        assert_eq!(
            TRACES_METHOD,
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        assert_eq!(
            LOGS_METHOD,
            "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
        );
        assert_eq!(
            METRICS_METHOD,
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
        );
    }

    #[test]
    fn status_zero_in_the_trailers_or_a_trailers_only_answer_is_success() {
        let head = map(&[("content-type", "application/grpc")]);
        assert_eq!(outcome(&head, Some(&map(&[("grpc-status", "0")]))), Ok(()));
        assert_eq!(outcome(&map(&[("grpc-status", "0")]), None), Ok(()));
        assert_eq!(
            outcome(&map(&[("grpc-status", "0")]), Some(&HeaderMap::new())),
            Ok(())
        );
    }

    #[test]
    fn a_non_zero_or_missing_status_is_a_failed_call_with_its_message() {
        let head = HeaderMap::new();
        let e = outcome(
            &head,
            Some(&map(&[
                ("grpc-status", "14"),
                ("grpc-message", "collector%20overloaded%3A%20try%20later"),
            ])),
        )
        .unwrap_err();
        assert_eq!(
            e,
            CallError::Status {
                code: 14,
                message: "collector overloaded: try later".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "grpc-status 14 (UNAVAILABLE): collector overloaded: try later"
        );
        let trailers_only = map(&[("grpc-status", "8"), ("grpc-message", "full")]);
        assert!(matches!(
            outcome(&trailers_only, None),
            Err(CallError::Status { code: 8, .. })
        ));
        assert_eq!(outcome(&head, None), Err(CallError::NoStatus));
        assert_eq!(
            outcome(&head, Some(&HeaderMap::new())),
            Err(CallError::NoStatus)
        );
        assert!(matches!(
            outcome(&map(&[("grpc-status", "ok")]), None),
            Err(CallError::Status { code: UNKNOWN, .. })
        ));
    }

    #[test]
    fn a_bad_escape_in_the_message_is_kept() {
        assert_eq!(percent_decode(b"100%"), "100%");
        assert_eq!(percent_decode(b"%zz%41"), "%zzA");
        assert_eq!(percent_decode(b"caf%C3%A9"), "caf\u{e9}");
    }

    #[test]
    fn the_timeout_is_in_milliseconds_up_to_eight_digits() {
        assert_eq!(timeout_value(Duration::from_millis(10_000)), "10000m");
        assert_eq!(timeout_value(Duration::from_millis(1)), "1m");
        assert_eq!(timeout_value(Duration::from_secs(200_000)), "200000S");
    }
}
