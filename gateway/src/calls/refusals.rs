//! The calls API's refusals, each OpenAI's error JSON once answered: a bad
//! offer (413, 415, 400), a route without a calls API, the upstream's
//! refusal (its status, never its body), an upstream that could not be
//! reached (never named to the client) or a gateway out of descriptors
//! (503 `server_busy`), a call the key does not hold (404), an accept that
//! lost its call to another (400) or a control action that came while the
//! call's accept was in flight (409), and an owner that could not be
//! looked up (503).

use std::time::Duration;

use http::StatusCode;

use crate::admission::Refusal;

use super::offer::OfferError;
use super::ownership::Decision;
use super::upstream::{CallsRouteError, UpstreamCallError};

/// `400` with `code`.
pub fn bad_request(code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        code,
        message,
    )
}

/// The refusal for a body that is not a usable offer.
pub fn offer_refusal(e: &OfferError) -> Refusal {
    let status = match e {
        OfferError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        OfferError::UnsupportedType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        _ => StatusCode::BAD_REQUEST,
    };
    let code = match e {
        OfferError::TooLarge => "request_too_large",
        OfferError::UnsupportedType(_) => "unsupported_media_type",
        OfferError::MissingSdp => "missing_required_parameter",
        _ => "invalid_request",
    };
    Refusal::new(status, "invalid_request_error", code, e.to_string()).with_param(e.param())
}

/// The refusal for a route without a calls API.
pub fn route_refusal(model: &str, e: &CallsRouteError) -> Refusal {
    bad_request(
        "unsupported_for_route",
        format!("the model '{model}' cannot take calls through this gateway: {e}"),
    )
}

/// The refusal for an upstream that answered with an error status: the
/// upstream's status, the gateway's own message (the upstream's body may
/// quote the gateway's key).
pub fn upstream_refusal(status: StatusCode) -> Refusal {
    let (kind, code) = match status.as_u16() {
        401 | 403 => ("server_error", "upstream_auth_failed"),
        404 => ("invalid_request_error", "call_not_found"),
        429 => ("rate_limit_error", "upstream_rate_limited"),
        s if s >= 500 => ("server_error", "upstream_unavailable"),
        _ => ("invalid_request_error", "upstream_refused"),
    };
    let message = if status == StatusCode::NOT_FOUND {
        "call not found".to_string()
    } else {
        format!(
            "the upstream refused the request with HTTP {}",
            status.as_u16()
        )
    };
    Refusal::new(status, kind, code, message)
}

/// The client learns that the upstream could not be reached, not where it
/// is (the error names its host and port, perhaps an internal proxy's):
/// that goes to the log.
pub fn unreachable_refusal(e: &UpstreamCallError) -> Refusal {
    tracing::warn!(error = %e, "calls upstream could not be reached");
    let (status, code, message) = match e {
        // The gateway's own shortage: busy, not the upstream's fault.
        UpstreamCallError::Connect { source, .. }
            if crate::descriptors::is_out_of_descriptors(source) =>
        {
            let r = Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "server_busy",
                "the gateway is out of connections right now; try again later",
            );
            return r.retry_after(Duration::from_secs(1));
        }
        UpstreamCallError::Timeout(_) => (
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
            "the upstream did not answer in time",
        ),
        _ => (
            StatusCode::BAD_GATEWAY,
            "upstream_unavailable",
            "the upstream could not be reached",
        ),
    };
    Refusal::new(status, "server_error", code, message.to_string())
}

/// `503`: the calls store could not say who holds a call.
pub fn calls_store_unavailable() -> Refusal {
    Refusal::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "store_unavailable",
        "the call's owner cannot be looked up right now; retry".to_string(),
    )
    .retry_after(Duration::from_secs(1))
}

/// `404`: no call of that id for this key (whether it exists elsewhere is
/// not told).
pub fn call_not_found(call_id: &str) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "call_not_found",
        format!("no call '{call_id}' for this API key"),
    )
}

/// The answer to an action the call's holder rules out.
pub fn held_refusal(d: &Decision, call_id: &str) -> Refusal {
    match d {
        Decision::AlreadyAccepted => bad_request(
            "call_already_accepted",
            format!("the call '{call_id}' was already accepted"),
        ),
        Decision::AcceptInProgress => Refusal::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            "call_accept_in_progress",
            format!("the call '{call_id}' is being accepted; retry once the accept is answered"),
        )
        .retry_after(Duration::from_secs(1)),
        _ => call_not_found(call_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_upstream_is_not_named_to_the_client() {
        let e = UpstreamCallError::Connect {
            authority: "proxy.internal:3128".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        let r = unreachable_refusal(&e);
        assert_eq!(r.status, StatusCode::BAD_GATEWAY);
        assert!(!r.body().contains("proxy.internal"), "{}", r.body());
        let r = unreachable_refusal(&UpstreamCallError::Timeout(Duration::from_secs(5)));
        assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
        let r = unreachable_refusal(&UpstreamCallError::Connect {
            authority: "api.openai.com:443".into(),
            source: std::io::Error::from_raw_os_error(libc::EMFILE),
        });
        assert_eq!(
            (r.status, r.code),
            (StatusCode::SERVICE_UNAVAILABLE, "server_busy")
        );
    }

    #[test]
    fn offer_errors_map_to_413_415_and_400() {
        assert_eq!(
            offer_refusal(&OfferError::TooLarge).status,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(
            offer_refusal(&OfferError::UnsupportedType("text/html".into())).status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        for e in [
            OfferError::MissingSdp,
            OfferError::NotSdp,
            OfferError::Multipart("x"),
            OfferError::Json("x".into()),
        ] {
            assert_eq!(offer_refusal(&e).status, StatusCode::BAD_REQUEST, "{e:?}");
        }
        assert_eq!(
            offer_refusal(&OfferError::MissingSdp).param.as_deref(),
            Some("sdp")
        );
    }

    #[test]
    fn an_upstream_refusal_keeps_the_status_and_never_the_body() {
        for s in [400u16, 401, 403, 404, 422, 429, 500, 503] {
            let status = StatusCode::from_u16(s).unwrap();
            let r = upstream_refusal(status);
            assert_eq!(r.status, status);
            assert!(!r.body().contains("sk-"), "{}", r.body());
        }
    }
}
