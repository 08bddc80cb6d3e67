//! A refusal as an HTTP answer, written once for every HTTP edge: OpenAI's
//! error JSON (`{"error":{"message","type","code","param"}}`) with
//! `Retry-After` when the refusal has one ([`refusal_response`], and
//! [`ApiError`] for axum handlers), and its count in
//! `patchbay_admission_refusals_total{model,reason}` ([`count_refusal`]).
//! A response carries its refusal's code as an extension for the access
//! log ([`crate::access`]).

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::Full;

use crate::access::RefusalCode;
use crate::admission::Refusal;
use crate::gateway::Gateway;
use crate::metrics::ReasonLabels;

type Body = Full<Bytes>;

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

/// Counts a refusal in `patchbay_admission_refusals_total{model,reason}`.
pub fn count_refusal(gw: &Gateway, model_name: &str, refusal: &Refusal) {
    gw.metrics
        .refusals
        .get_or_create(&ReasonLabels {
            model: model_name.into(),
            reason: refusal.code.into(),
        })
        .inc();
}

/// The OpenAI-style JSON answer for a refusal, with `Retry-After` when it
/// has one.
pub fn refusal_response(refusal: &Refusal) -> Response<Body> {
    let (status, headers, body) = refusal_parts(refusal);
    let mut r = text(status, body);
    *r.headers_mut() = headers;
    r.extensions_mut().insert(RefusalCode(refusal.code));
    r
}

/// A refusal's status, headers and body.
pub fn refusal_parts(refusal: &Refusal) -> (StatusCode, HeaderMap, String) {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(after) = refusal.retry_after {
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(after.as_secs().max(1)),
        );
    }
    (refusal.status, headers, refusal.body())
}

/// An OpenAI-style error answer.
#[derive(Debug)]
pub struct ApiError(pub Refusal);

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        Self(r)
    }
}

impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        refusal_response(&self.0).map(axum::body::Body::new)
    }
}
