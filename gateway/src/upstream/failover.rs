//! What a failed dial means for the session and for the upstream's health.
//!
//! - **retry** (connect error, TLS or handshake failure, timeout, a close
//!   before `session.created`, HTTP 429 or 5xx, a first `error` event of type
//!   `server_error` or code `rate_limit_exceeded`): the upstream's breaker
//!   counts a failure and the session tries the next candidate;
//! - **trip** (HTTP 401/403: the upstream refuses *our* key): no retry will
//!   fix it, so the breaker opens at once, an alert is logged, and the
//!   session tries the next candidate;
//! - **final** (any other refusal, such as a 400 for a bad request, or a
//!   first `error` event of another kind): the next upstream would say the
//!   same; the client gets the error and the breaker is left alone.
//!
//! A session's set-up is bounded by `(1 + max_failovers) ×
//! upgrade_timeout_secs`: each candidate has its own dial deadline.

use std::sync::Mutex;
use std::time::Instant;

use crate::event::error_kind;
use crate::upstream::breaker::Breaker;
use crate::upstream::dial::{DialError, Warm};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Retry,
    Trip,
    Final,
}

pub fn classify(e: &DialError) -> Verdict {
    match e {
        DialError::Connect { .. }
        | DialError::Timeout { .. }
        | DialError::Tls { .. }
        | DialError::Handshake { .. }
        | DialError::ClosedEarly { .. } => Verdict::Retry,
        DialError::Refused { status, .. } => match status {
            401 | 403 => Verdict::Trip,
            429 => Verdict::Retry,
            s if *s >= 500 => Verdict::Retry,
            _ => Verdict::Final,
        },
        DialError::FirstEvent {
            frame: Some(frame), ..
        } if refuses_the_account(frame) => Verdict::Trip,
        DialError::FirstEvent { frame, .. } => match frame.as_deref().map(error_kind) {
            Some((Some("server_error"), _)) | Some((_, Some("rate_limit_exceeded"))) => {
                Verdict::Retry
            }
            _ => Verdict::Final,
        },
        // Another upstream needs a socket too.
        DialError::CircuitOpen | DialError::OutOfDescriptors => Verdict::Final,
    }
}

/// Every value of [`reason`].
pub const REASONS: [&str; 9] = [
    "rate_limited",
    "auth",
    "server_error",
    "refused",
    "timeout",
    "error_event",
    "unreachable",
    "circuit_open",
    "out_of_descriptors",
];

/// The failover counter's `reason` label.
pub fn reason(e: &DialError) -> &'static str {
    match e {
        DialError::Refused { status: 429, .. } => "rate_limited",
        DialError::Refused {
            status: 401 | 403, ..
        } => "auth",
        DialError::Refused { status, .. } if *status >= 500 => "server_error",
        DialError::Refused { .. } => "refused",
        DialError::Timeout { .. } => "timeout",
        DialError::FirstEvent {
            frame: Some(frame), ..
        } if refuses_the_account(frame) => "auth",
        DialError::FirstEvent { .. } => "error_event",
        DialError::Connect { .. }
        | DialError::Tls { .. }
        | DialError::Handshake { .. }
        | DialError::ClosedEarly { .. } => "unreachable",
        DialError::CircuitOpen => "circuit_open",
        DialError::OutOfDescriptors => "out_of_descriptors",
    }
}

/// Whether an upstream's first `error` event refuses the gateway's own
/// account: its key (`invalid_api_key`, an `authentication_error`; OpenAI
/// can answer a bad key this way after the 101, quoting the key masked) or
/// its quota (`insufficient_quota`). As an HTTP 401 does, it trips the
/// upstream's breaker and fails over.
pub fn refuses_the_account(frame: &str) -> bool {
    matches!(
        error_kind(frame),
        (Some("authentication_error"), _) | (_, Some("invalid_api_key" | "insufficient_quota"))
    )
}

/// How a report changed the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Opened,
    Closed,
    None,
}

/// Reports a dial's result to the upstream's breaker.
pub fn report(breaker: &Mutex<Breaker>, result: &Result<Warm, DialError>, now: Instant) -> Change {
    let mut b = breaker.lock().unwrap_or_else(|p| p.into_inner());
    let was_open = b.is_open();
    let opened = match result {
        Ok(_) => {
            b.success();
            false
        }
        // The gateway's own shortage says nothing about the upstream (an
        // unreported probe is replaced after its timeout).
        Err(DialError::OutOfDescriptors) => false,
        Err(e) => match classify(e) {
            Verdict::Retry => b.failure(now),
            Verdict::Trip => b.trip(now),
            // The upstream answered (a refusal no other upstream would
            // change): as a probe, that shows it is back.
            Verdict::Final => {
                if b.probing() {
                    b.success();
                }
                false
            }
        },
    };
    match (was_open, opened, b.is_open()) {
        (_, true, _) => Change::Opened,
        (true, _, false) => Change::Closed,
        _ => Change::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(status: u16) -> DialError {
        DialError::Refused {
            status,
            retry_after: None,
            body: String::new(),
        }
    }

    fn first(event: &str) -> DialError {
        DialError::FirstEvent {
            event_type: Some("error".into()),
            frame: Some(event.to_string()),
        }
    }

    #[test]
    fn every_cause_is_retried_tripped_or_final_as_documented() {
        let cases = [
            (refused(429), Verdict::Retry, "rate_limited"),
            (refused(500), Verdict::Retry, "server_error"),
            (refused(503), Verdict::Retry, "server_error"),
            (refused(401), Verdict::Trip, "auth"),
            (refused(403), Verdict::Trip, "auth"),
            (refused(400), Verdict::Final, "refused"),
            (refused(404), Verdict::Final, "refused"),
            (
                DialError::Timeout { phase: "upgrade" },
                Verdict::Retry,
                "timeout",
            ),
            (
                DialError::Connect {
                    authority: "x:1".into(),
                    source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
                },
                Verdict::Retry,
                "unreachable",
            ),
            (
                DialError::ClosedEarly { code: Some(1011) },
                Verdict::Retry,
                "unreachable",
            ),
            (
                first(
                    r#"{"type":"error","error":{"type":"server_error","code":null,"message":"x"}}"#,
                ),
                Verdict::Retry,
                "error_event",
            ),
            (
                first(
                    r#"{"type":"error","error":{"type":"requests","code":"rate_limit_exceeded"}}"#,
                ),
                Verdict::Retry,
                "error_event",
            ),
            (
                first(r#"{"type":"error","error":{"type":"invalid_request_error","code":"x"}}"#),
                Verdict::Final,
                "error_event",
            ),
            (
                first(
                    r#"{"type":"error","error":{"type":"invalid_request_error","code":"invalid_api_key"}}"#,
                ),
                Verdict::Trip,
                "auth",
            ),
            (
                first(r#"{"type":"error","error":{"type":"authentication_error","code":null}}"#),
                Verdict::Trip,
                "auth",
            ),
            (
                first(
                    r#"{"type":"error","error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#,
                ),
                Verdict::Trip,
                "auth",
            ),
            (
                DialError::FirstEvent {
                    event_type: None,
                    frame: None,
                },
                Verdict::Final,
                "error_event",
            ),
        ];
        for (e, verdict, label) in cases {
            assert_eq!((classify(&e), reason(&e)), (verdict, label), "{e}");
            // The label sets exported at 0 from the start hold every label.
            assert!(REASONS.contains(&label), "{label}");
            assert!(DialError::RESULT_LABELS.contains(&e.result_label()), "{e}");
        }
        for e in [DialError::CircuitOpen, DialError::OutOfDescriptors] {
            assert!(REASONS.contains(&reason(&e)), "{e}");
            assert!(DialError::RESULT_LABELS.contains(&e.result_label()), "{e}");
        }
    }

    #[test]
    fn reports_move_the_breaker() {
        use crate::upstream::breaker::BreakerConfig;
        let b = Mutex::new(Breaker::new(BreakerConfig {
            failures_to_open: 2,
            ..BreakerConfig::default()
        }));
        let now = Instant::now();
        assert_eq!(
            report(&b, &Err(refused(400)), now),
            Change::None,
            "final: untouched"
        );
        assert_eq!(report(&b, &Err(refused(429)), now), Change::None);
        assert_eq!(
            report(&b, &Err(refused(500)), now),
            Change::Opened,
            "second failure opens"
        );
        let b = Mutex::new(Breaker::new(BreakerConfig::default()));
        assert_eq!(
            report(&b, &Err(refused(401)), now),
            Change::Opened,
            "our key refused: at once"
        );
        // After the open time one probe goes; its failure opens it again,
        // the next probe's success closes it.
        let later = now + std::time::Duration::from_secs(60);
        assert!(b.lock().unwrap().allow(later));
        let lost = DialError::ClosedEarly { code: None };
        assert_eq!(report(&b, &Err(lost), later), Change::Opened);
        assert!(b
            .lock()
            .unwrap()
            .allow(later + std::time::Duration::from_secs(120)));
        b.lock().unwrap().success();
        assert!(!b.lock().unwrap().is_open());
        // A probe answered with a final refusal (a bad request): the
        // upstream is back, the breaker closes.
        let b = Mutex::new(Breaker::new(BreakerConfig::default()));
        report(&b, &Err(refused(401)), now);
        assert!(b.lock().unwrap().allow(later));
        assert_eq!(report(&b, &Err(refused(400)), later), Change::Closed);
    }

    #[test]
    fn the_gateways_own_descriptor_shortage_never_moves_a_breaker() {
        use crate::upstream::breaker::BreakerConfig;
        let out = || Err(DialError::OutOfDescriptors);
        assert_eq!(
            (
                classify(&DialError::OutOfDescriptors),
                reason(&DialError::OutOfDescriptors)
            ),
            (Verdict::Final, "out_of_descriptors")
        );
        let b = Mutex::new(Breaker::new(BreakerConfig {
            failures_to_open: 1,
            ..BreakerConfig::default()
        }));
        let now = Instant::now();
        assert_eq!(report(&b, &out(), now), Change::None);
        assert!(!b.lock().unwrap().is_open(), "not the upstream's failure");
        // Nor does it close an open one, as a probe's answer would.
        report(&b, &Err(refused(401)), now);
        let later = now + std::time::Duration::from_secs(60);
        assert!(b.lock().unwrap().allow(later));
        assert_eq!(report(&b, &out(), later), Change::None);
        assert!(
            b.lock().unwrap().is_open(),
            "still open: nothing was learnt"
        );
    }
}
