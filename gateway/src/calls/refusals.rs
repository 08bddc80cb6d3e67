//! The calls API's refusals, each OpenAI's error JSON once answered: a bad
//! offer (413, 415, 400), a route without a calls API, the upstream's
//! refusal (its status, never its body), an upstream that could not be
//! reached (never named to the client) or a gateway out of descriptors
//! (503 `server_busy`), a call the key does not hold (404), an accept that
//! lost its call to another (400) or a control action that came while the
//! call's accept was in flight (409), and an owner that could not be
//! looked up (503).
//!
//! Not found is one answer per API, whichever endpoint asked and whoever
//! says so (the owner record, the path, or the upstream): `404
//! call_not_found` for a call, `404 session_not_found` for a GPT-Live
//! session ([`not_found`]), so a Live id's 404 from `hangup` is the same as
//! from `content`, `fork` or `attach`.

use std::time::Duration;

use http::StatusCode;

use crate::admission::Refusal;
use crate::config::Endpoint;

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

/// `404`: no Live session of that id for this key.
pub fn session_not_found(id: &str) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "session_not_found",
        format!("no Live session '{id}' for this API key"),
    )
}

/// `404` for an id at `endpoint`'s API: a Live session's, else a call's.
pub fn not_found(endpoint: Endpoint, id: &str) -> Refusal {
    match endpoint {
        Endpoint::Live => session_not_found(id),
        Endpoint::Realtime | Endpoint::Translations => call_not_found(id),
    }
}

/// [`upstream_refusal`] for an action on `id` at `endpoint`: the
/// upstream's 404 is the gateway's own [`not_found`].
pub fn upstream_refusal_for(endpoint: Endpoint, id: &str, status: StatusCode) -> Refusal {
    if status == StatusCode::NOT_FOUND {
        return not_found(endpoint, id);
    }
    upstream_refusal(status)
}

/// The answer to an action the call's holder rules out.
pub fn held_refusal(d: &Decision, call_id: &str, endpoint: Endpoint) -> Refusal {
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
        _ => not_found(endpoint, call_id),
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
    fn a_live_ids_404_is_session_not_found_wherever_it_comes_from_and_a_calls_call_not_found() {
        let live = [
            not_found(Endpoint::Live, "live_1"),
            held_refusal(&Decision::NotFound, "live_1", Endpoint::Live),
            upstream_refusal_for(Endpoint::Live, "live_1", StatusCode::NOT_FOUND),
        ];
        for r in &live {
            assert_eq!(
                (r.status, r.code),
                (StatusCode::NOT_FOUND, "session_not_found")
            );
            assert_eq!(r.body(), live[0].body());
        }
        for e in [Endpoint::Realtime, Endpoint::Translations] {
            let r = upstream_refusal_for(e, "rtc_1", StatusCode::NOT_FOUND);
            assert_eq!(r.code, "call_not_found");
            assert_eq!(
                r.body(),
                held_refusal(&Decision::NotFound, "rtc_1", e).body()
            );
        }
        let r = upstream_refusal_for(Endpoint::Live, "live_1", StatusCode::BAD_GATEWAY);
        assert_eq!(r.code, "upstream_unavailable");
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
