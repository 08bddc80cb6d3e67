//! The simulator's calls API (WebRTC and SIP), faithful enough for tests and
//! the demo:
//!
//! - `POST /v1/realtime/calls` (multipart, JSON or raw `application/sdp`,
//!   read by [`crate::offer`]) → 201, an SDP answer built from the
//!   offer ([`answer_for`]: the same m-lines and mids, `a=setup:active`, ICE
//!   credentials, a fingerprint) and `Location: /v1/realtime/calls/rtc_…`;
//! - `POST /v1/realtime/calls/{id}/{accept,hangup,reject,refer}` → 200,
//!   recorded in [`SimCalls::actions`]; `hangup` and `reject` end the call
//!   (its sidebands are closed with 1000); an unknown id → 404;
//! - `POST /v1/realtime/translations/calls` (a WebRTC translation call;
//!   OpenAI's realtime-translation guide: the browser posts its raw
//!   `application/sdp` offer with a client secret, the model bound to the
//!   secret; a server posting with its API key sends multipart `sdp` and a
//!   `session` as for `/v1/realtime/calls`, here the translation session
//!   create request, openai-python
//!   `types/realtime/realtime_translation_session_create_request_param.py`:
//!   `model` and `audio` only, anything else 400 `unknown_parameter`) → 201,
//!   the same answer and `Location: /v1/realtime/translations/calls/rtc_…`;
//!   `POST …/translations/calls/{id}/hangup` ends it (a translation call is
//!   WebRTC only: nothing to accept, refer or reject; 404). A call is
//!   controlled at the collection it was created in (404 at the other);
//! - [`SimCalls::incoming_sip_call`] stands for a phone call arriving (its
//!   id is what OpenAI's webhook would carry); it must be accepted before a
//!   sideband can attach. Out of process, `POST /v1/sim/sip_calls` does the
//!   same (`{"call_id": …}`), and `POST /v1/sim/call_actions` lists what was
//!   asked of calls (`[{"call_id","action","body"}]`): test hooks, not
//!   OpenAI API.
//!
//! The sideband itself is a normal simulated session opened with
//! `?call_id=` (a live call, else 404); the simulated caller speaks
//! [`crate::SimConfig::caller_turns`] response turns per call, one every
//! `caller_turn_interval`, on whichever sideband is attached (a hand-over
//! continues the count). Served on plain TCP only: a TLS simulator answers
//! WebSocket upgrades alone.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;

use crate::calls::{lock, CallAction, CallKind, CreatedCall, SimCall};
use crate::config::{SimConfig, SimFault};
use crate::handle::{SimHandle, SimStats};
use crate::offer::{self, answer_for};
use crate::wire::{mask_key, short_id};

/// Serves one plain-HTTP connection of the calls API.
pub(crate) async fn serve(tcp: TcpStream, config: Arc<SimConfig>, handle: SimHandle) {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let config = config.clone();
        let handle = handle.clone();
        async move { Ok::<_, std::convert::Infallible>(route(req, &config, &handle).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tcp), service)
        .await;
}

fn answer(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    answer(
        status,
        json!({"error": {"message": message, "type": "invalid_request_error", "code": code, "param": null}}),
    )
}

async fn route(
    req: Request<Incoming>,
    config: &SimConfig,
    handle: &SimHandle,
) -> Response<Full<Bytes>> {
    let stats = &handle.stats;
    let header = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok());
    let key = header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| header("api-key"))
        .unwrap_or("")
        .to_string();
    let content_type = header("content-type").map(str::to_string);
    if let Ok(mut seen) = stats.auth_headers.lock() {
        seen.push(key.clone());
    }
    if let Some(SimFault::Refuse { status }) = &config.fault {
        let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        // OpenAI quotes the (masked) key it was given.
        return error(
            status,
            "simulated",
            &format!("simulated refusal for key {}", mask_key(&key)),
        );
    }
    let known = config.keys.is_empty() || config.keys.contains(&key);
    if key.is_empty() || !known || stats.refusing.load(Ordering::Relaxed) {
        let message = format!("Incorrect API key provided: {}.", mask_key(&key));
        return error(StatusCode::UNAUTHORIZED, "invalid_api_key", &message);
    }
    if let Some(rest) = crate::live_webrtc::live_rest(req.uri().path()) {
        let (method, rest) = (req.method().clone(), rest.to_string());
        let Ok(body) = http_body_util::Limited::new(req.into_body(), offer::MAX_BODY_BYTES)
            .collect()
            .await
        else {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                "body too large",
            );
        };
        return crate::live_webrtc::route(&method, &rest, &body.to_bytes(), key, config, handle);
    }
    if req.method() != Method::POST {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "use POST",
        );
    }
    let path = req.uri().path().to_string();
    match path.as_str() {
        "/v1/sim/sip_calls" => {
            let id = stats.calls.incoming_sip_call();
            return answer(StatusCode::OK, json!({"call_id": id}));
        }
        "/v1/sim/call_actions" => {
            let actions: Vec<Value> = stats
                .calls
                .actions()
                .into_iter()
                .map(|a| json!({"call_id": a.call_id, "action": a.action, "body": a.body}))
                .collect();
            return answer(StatusCode::OK, Value::Array(actions));
        }
        _ => {}
    }
    let translations = path
        .strip_prefix("/v1/realtime/translations/calls")
        .or_else(|| path.strip_prefix("/openai/v1/realtime/translations/calls"));
    let rest = translations.or_else(|| {
        path.strip_prefix("/v1/realtime/calls")
            .or_else(|| path.strip_prefix("/openai/v1/realtime/calls"))
    });
    let translation = translations.is_some();
    let Some(rest) = rest.map(str::to_string) else {
        return error(StatusCode::NOT_FOUND, "not_found", "no such route");
    };
    let body = match http_body_util::Limited::new(req.into_body(), offer::MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                "body too large",
            )
        }
    };
    if rest.is_empty() || rest == "/" {
        return create(stats, content_type.as_deref(), &body, key, translation);
    }
    let mut parts = rest.trim_start_matches('/').splitn(2, '/');
    let (Some(call_id), Some(action)) = (parts.next(), parts.next()) else {
        return error(StatusCode::NOT_FOUND, "not_found", "no such route");
    };
    let actions: &[&str] = if translation {
        &["hangup"]
    } else {
        &["accept", "hangup", "reject", "refer"]
    };
    if !actions.contains(&action) {
        return error(StatusCode::NOT_FOUND, "not_found", "no such route");
    }
    let calls = &stats.calls;
    {
        let mut map = lock(&calls.calls);
        let Some(call) = map
            .get_mut(call_id)
            .filter(|c| (c.kind == CallKind::Translation) == translation)
        else {
            return error(StatusCode::NOT_FOUND, "call_not_found", "call not found");
        };
        match action {
            "accept" if call.kind == CallKind::Sip => call.accepted = true,
            "accept" => return error(StatusCode::BAD_REQUEST, "invalid_request", "not a SIP call"),
            "hangup" | "reject" => call.end(),
            _ => {}
        }
    }
    let body_json = serde_json::from_slice(&body).unwrap_or(Value::Null);
    lock(&calls.actions).push(CallAction {
        call_id: call_id.to_string(),
        action: action.to_string(),
        body: body_json,
        key,
    });
    if action == "accept" {
        tokio::time::sleep(config.accept_answer_delay).await;
    }
    Response::new(Full::new(Bytes::new()))
}

fn create(
    stats: &SimStats,
    content_type: Option<&str>,
    body: &[u8],
    key: String,
    translation: bool,
) -> Response<Full<Bytes>> {
    let offer = match offer::parse(content_type, body) {
        Ok(o) => o,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_offer", &e),
    };
    let (kind, collection, model) = if translation {
        if let Some(unknown) = offer
            .session
            .iter()
            .flat_map(|s| s.keys())
            .find(|k| !matches!(k.as_str(), "model" | "audio"))
        {
            let message = format!("Unknown parameter: 'session.{unknown}'.");
            return error(StatusCode::BAD_REQUEST, "unknown_parameter", &message);
        }
        // Without a session (a client secret's call) the secret's model;
        // the simulator's translation model stands for it.
        let model = offer
            .session
            .as_ref()
            .and_then(|s| s.get("model"))
            .and_then(Value::as_str)
            .unwrap_or(crate::translation::TRANSLATION_MODEL);
        let model = Some(model.to_string());
        (
            CallKind::Translation,
            "/v1/realtime/translations/calls",
            model,
        )
    } else {
        (CallKind::Webrtc, "/v1/realtime/calls", None)
    };
    let id = format!("rtc_{}", short_id());
    lock(&stats.calls.calls).insert(id.clone(), SimCall::new(kind, true, model));
    lock(&stats.calls.created).push(CreatedCall {
        call_id: id.clone(),
        sdp: offer.sdp.clone(),
        session: offer.session.map(Value::Object),
        key,
    });
    let mut r = Response::new(Full::new(Bytes::from(answer_for(&offer.sdp, &id))));
    *r.status_mut() = StatusCode::CREATED;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/sdp"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("{collection}/{id}")) {
        h.insert(header::LOCATION, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFFER: &str = "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=setup:actpass\r\na=rtcp-mux\r\na=rtpmap:111 opus/48000/2\r\na=fmtp:111 minptime=10\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=mid:1\r\na=sctp-port:5000\r\n";

    #[test]
    fn the_answer_keeps_the_offers_m_lines_and_mids_and_is_active() {
        let a = answer_for(OFFER, "rtc_x");
        let m_lines: Vec<&str> = a.lines().filter(|l| l.starts_with("m=")).collect();
        assert_eq!(
            m_lines,
            [
                "m=audio 9 UDP/TLS/RTP/SAVPF 111",
                "m=application 9 UDP/DTLS/SCTP webrtc-datachannel"
            ]
        );
        assert!(a.contains("a=group:BUNDLE 0 1\r\n"));
        assert_eq!(a.matches("a=setup:active").count(), 2);
        assert!(!a.contains("actpass"));
        assert_eq!(a.matches("a=ice-ufrag:").count(), 2);
        assert!(a.contains("a=rtpmap:111 opus/48000/2"));
        let fp = a
            .lines()
            .find_map(|l| l.strip_prefix("a=fingerprint:sha-256 "))
            .unwrap();
        assert_eq!(fp.split(':').count(), 32);
        assert!(offer::parse(Some("application/sdp"), a.as_bytes()).is_ok());
    }
}
