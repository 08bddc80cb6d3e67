//! Reading a request body within its bounds: at most a size, all of it
//! within the gateway's `upgrade_timeout_secs` (hyper bounds the head's
//! read, not the body's). A body whose `Content-Length` is over the size is
//! refused before any of it is read: waiting for it would only end in the
//! timeout's 408 (a client that sends its body after a `100 Continue`, or
//! slowly, gets the 413 at once).

use axum::body::Body;
use http::StatusCode;
use http_body_util::BodyExt;

use crate::admission::Refusal;
use crate::gateway::Gateway;

/// Why a request body was not read.
#[derive(Debug)]
pub enum BodyError {
    /// Over its limit, or cut off.
    TooLarge,
    /// Not all there within this long.
    Slow(std::time::Duration),
}

/// `408` for a body that did not arrive within `after`.
pub fn body_timeout(after: std::time::Duration) -> Refusal {
    Refusal::new(
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        "request_timeout",
        format!(
            "the request body did not arrive within {} s",
            after.as_secs()
        ),
    )
}

/// A request body of at most `max` bytes, all of it within the gateway's
/// `upgrade_timeout_secs` (hyper bounds the head's read, not the body's: a
/// client trickling a declared body would hold its connection and task).
pub async fn read_body(gw: &Gateway, body: Body, max: usize) -> Result<bytes::Bytes, BodyError> {
    let declared = axum::body::HttpBody::size_hint(&body).lower();
    if declared > max as u64 {
        tracing::info!(
            declared_bytes = declared,
            limit_bytes = max,
            "request refused before its body: Content-Length over the limit"
        );
        return Err(BodyError::TooLarge);
    }
    let within = std::time::Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    match tokio::time::timeout(within, http_body_util::Limited::new(body, max).collect()).await {
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(_)) => Err(BodyError::TooLarge),
        Err(_) => Err(BodyError::Slow(within)),
    }
}
