//! The upstream side of a call: the calls API over HTTPS (create, accept,
//! hangup, reject, refer) and the sideband WebSocket (`?call_id=`).
//!
//! - URLs are derived from the route's WebSocket URL ([`calls_url`],
//!   [`sideband_url`]): `ws`→`http`, `wss`→`https`, the path plus `/calls`
//!   (OpenAI `/v1/realtime/calls`, Azure GA `/openai/v1/realtime/calls`),
//!   the route's other query parameters (`api-version`) kept. A GPT-Live
//!   route's collection is its own path (`/v1/live/sessions`: the primary
//!   WebSocket, the WebRTC create and `…/{id}/{action}` share it) and its
//!   sideband is `…/{id}/attach` (openai-python `resources/live/sideband.py`). A beta-protocol
//!   or Azure-preview route has no calls API: [`CallsRouteError`].
//! - One request per connection with hyper's HTTP/1 client over the
//!   project's rustls config (no pooling: a call makes a handful of
//!   requests over its life). Every request is bounded by the route's
//!   `upgrade_timeout_secs`, and an answer body by [`MAX_ANSWER_BYTES`].
//! - Requests carry the route's upstream key ([`upstream_headers`]), never
//!   the client's.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::either::Either;
use url::Url;

use serde_json::{Map, Value};

use crate::client_secret::Grant;
use crate::config::{Endpoint, Protocol, Provider, RouteConfig};
use crate::upstream::dial::{upstream_headers, UpstreamIo, UpstreamSocket};
use crate::upstream::tls;

/// The largest upstream answer body read (an SDP answer is a few KiB).
pub const MAX_ANSWER_BYTES: usize = 256 * 1024;
/// The largest Live recording relayed (`GET …/{id}/content`, streamed):
/// about an hour of 16 kHz mono PCM.
pub const MAX_RECORDING_BYTES: usize = 128 << 20;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallsRouteError {
    #[error("the route uses the beta Realtime protocol, which has no calls API")]
    Beta,
    #[error("the route's Azure preview deployment URL has no calls API; use the GA /openai/v1/realtime URL")]
    AzurePreview,
    #[error("invalid upstream_url: {0}")]
    Url(String),
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamCallError {
    #[error(transparent)]
    Route(#[from] CallsRouteError),
    #[error("connecting to {authority}: {source}")]
    Connect {
        authority: String,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("HTTP: {0}")]
    Http(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("the answer is larger than the gateway relays")]
    AnswerTooLarge,
    #[error("sideband upgrade refused with HTTP {0}")]
    SidebandRefused(u16),
    #[error("sideband handshake: {0}")]
    Sideband(String),
}

/// The upstream a route's calls go to: its first (on a route with several
/// upstreams, calls do not fail over; see README "Browsers and phones").
fn primary(route: &RouteConfig) -> Result<crate::config::UpstreamConfig, CallsRouteError> {
    route
        .upstream_list()
        .first()
        .cloned()
        .ok_or_else(|| CallsRouteError::Url("the route has no upstream".into()))
}

/// The calls collection URL for a route.
pub fn calls_url(route: &RouteConfig) -> Result<Url, CallsRouteError> {
    if route.protocol == Protocol::Beta {
        return Err(CallsRouteError::Beta);
    }
    let up = primary(route)?;
    let mut url = Url::parse(&up.upstream_url).map_err(|e| CallsRouteError::Url(e.to_string()))?;
    let path = url.path().trim_end_matches('/').to_string();
    let live = route.endpoint == Endpoint::Live;
    if up.provider == Provider::Azure && !live && !path.ends_with("/openai/v1/realtime") {
        return Err(CallsRouteError::AzurePreview);
    }
    let scheme = match url.scheme() {
        "wss" | "https" => "https",
        "ws" | "http" => "http",
        other => return Err(CallsRouteError::Url(format!("unsupported scheme {other}"))),
    };
    url.set_scheme(scheme)
        .map_err(|_| CallsRouteError::Url("cannot change scheme".into()))?;
    if !live {
        url.set_path(&format!("{path}/calls"));
    }
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != "model" && k != "deployment")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if kept.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(kept);
    }
    Ok(url)
}

/// `{calls_url}/{call_id}/{action}`.
pub fn action_url(
    route: &RouteConfig,
    call_id: &str,
    action: &str,
) -> Result<Url, CallsRouteError> {
    let mut url = calls_url(route)?;
    let path = format!("{}/{call_id}/{action}", url.path());
    url.set_path(&path);
    Ok(url)
}

/// The sideband WebSocket URL: the route's URL with `call_id` in place of the
/// model.
pub fn sideband_url(route: &RouteConfig, call_id: &str) -> Result<Url, CallsRouteError> {
    let calls = calls_url(route)?;
    if route.endpoint == Endpoint::Live {
        // `wss://…/v1/live/sessions/{id}/attach`, the scheme back to ws.
        let mut url = action_url(route, call_id, "attach")?;
        let scheme = if url.scheme() == "https" { "wss" } else { "ws" };
        url.set_scheme(scheme)
            .map_err(|_| CallsRouteError::Url("cannot change scheme".into()))?;
        return Ok(url);
    }
    let mut url = Url::parse(&primary(route)?.upstream_url)
        .map_err(|e| CallsRouteError::Url(e.to_string()))?;
    let kept: Vec<(String, String)> = calls
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    url.query_pairs_mut()
        .clear()
        .extend_pairs(kept)
        .append_pair("call_id", call_id);
    Ok(url)
}

/// What the upstream answered.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

async fn connect(route: &RouteConfig, url: &Url) -> Result<UpstreamIo, UpstreamCallError> {
    let host = url
        .host_str()
        .ok_or_else(|| CallsRouteError::Url("no host".into()))?
        .to_string();
    let port = url
        .port_or_known_default()
        .ok_or_else(|| CallsRouteError::Url("no port".into()))?;
    let authority = format!("{host}:{port}");
    let tcp = TcpStream::connect(&authority)
        .await
        .map_err(|source| UpstreamCallError::Connect { authority, source })?;
    let _ = tcp.set_nodelay(true);
    if matches!(url.scheme(), "https" | "wss") {
        let config = tls::client_config(primary(route)?.ca_file.as_deref())
            .map_err(|e| UpstreamCallError::Tls(e.to_string()))?;
        let name = rustls_pki_types::ServerName::try_from(host)
            .map_err(|e| UpstreamCallError::Tls(e.to_string()))?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| UpstreamCallError::Tls(e.to_string()))?;
        Ok(Either::Right(Box::new(tls)))
    } else {
        Ok(Either::Left(tcp))
    }
}

/// POSTs `body` to `url` with the route's key, within `timeout`.
pub async fn post(
    route: &RouteConfig,
    url: &Url,
    content_type: Option<&str>,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Answer, UpstreamCallError> {
    let req = request(
        route,
        Method::POST,
        url,
        content_type,
        body,
        MAX_ANSWER_BYTES,
    );
    tokio::time::timeout(timeout, req)
        .await
        .map_err(|_| UpstreamCallError::Timeout(timeout))?
}

/// A body relayed as the upstream sends it.
pub type ByteStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, UpstreamCallError>> + Send>>;

/// An answer whose body is streamed (a Live recording).
pub struct Streamed {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: ByteStream,
}

/// GETs `url` with the route's key (a Live recording): the status and
/// headers within `timeout`, then the body as it comes, each part within
/// `timeout` of the last, [`MAX_RECORDING_BYTES`] at most (a body that
/// says it is longer is refused before any of it is read; one that grows
/// past it ends with an error, the client seeing a cut body).
pub async fn get_streamed(
    route: &RouteConfig,
    url: &Url,
    timeout: Duration,
) -> Result<Streamed, UpstreamCallError> {
    let sent = send(route, Method::GET, url, None, Vec::new());
    let (resp, driver) = tokio::time::timeout(timeout, sent)
        .await
        .map_err(|_| UpstreamCallError::Timeout(timeout))??;
    let (parts, body) = resp.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_RECORDING_BYTES as u64) {
        driver.abort();
        return Err(UpstreamCallError::AnswerTooLarge);
    }
    let reading = Reading {
        body: http_body_util::Limited::new(body, MAX_RECORDING_BYTES),
        _driver: AbortOnDrop(driver),
        idle: timeout,
    };
    let body = futures_util::stream::unfold(Some(reading), |state| async move {
        let mut r = state?;
        loop {
            match tokio::time::timeout(r.idle, r.body.frame()).await {
                Err(_) => return Some((Err(UpstreamCallError::Timeout(r.idle)), None)),
                Ok(None) => return None,
                Ok(Some(Err(e))) => {
                    let e = if e.is::<http_body_util::LengthLimitError>() {
                        UpstreamCallError::AnswerTooLarge
                    } else {
                        UpstreamCallError::Http(e.to_string())
                    };
                    return Some((Err(e), None));
                }
                Ok(Some(Ok(frame))) => {
                    // Trailers carry no bytes: read on.
                    if let Ok(data) = frame.into_data() {
                        return Some((Ok(data), Some(r)));
                    }
                }
            }
        }
    });
    Ok(Streamed {
        status: parts.status,
        headers: parts.headers,
        body: Box::pin(body),
    })
}

/// A streamed body being read, and its connection's task (ended with it).
struct Reading {
    body: http_body_util::Limited<hyper::body::Incoming>,
    /// Held for its drop: the connection lives as long as the body.
    _driver: AbortOnDrop,
    idle: Duration,
}

/// Aborts its task when dropped (a client gone mid-body frees the
/// upstream connection).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn request(
    route: &RouteConfig,
    method: Method,
    url: &Url,
    content_type: Option<&str>,
    body: Vec<u8>,
    limit: usize,
) -> Result<Answer, UpstreamCallError> {
    let (resp, driver) = send(route, method, url, content_type, body).await?;
    let (parts, body) = resp.into_parts();
    let body = http_body_util::Limited::new(body, limit)
        .collect()
        .await
        .map_err(|_| UpstreamCallError::AnswerTooLarge);
    driver.abort();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body: body?.to_bytes(),
    })
}

/// Sends one request on a connection of its own: the response (its body
/// unread) and the task driving the connection.
async fn send(
    route: &RouteConfig,
    method: Method,
    url: &Url,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Result<
    (
        http::Response<hyper::body::Incoming>,
        tokio::task::JoinHandle<()>,
    ),
    UpstreamCallError,
> {
    let io = connect(route, url).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| UpstreamCallError::Http(e.to_string()))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let path_and_query = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let accept = if method == Method::GET {
        "application/octet-stream, */*"
    } else {
        "application/sdp, application/json"
    };
    let mut req = Request::builder()
        .method(method)
        .uri(path_and_query)
        .header(header::HOST, url.authority())
        .header(header::ACCEPT, accept);
    if let Some(ct) = content_type {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    let mut req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| UpstreamCallError::Http(e.to_string()))?;
    let headers = upstream_headers(&primary(route)?, route.protocol);
    for (name, value) in headers.map_err(UpstreamCallError::Http)? {
        req.headers_mut().insert(name, value);
    }
    match sender.send_request(req).await {
        Ok(resp) => Ok((resp, driver)),
        Err(e) => {
            driver.abort();
            Err(UpstreamCallError::Http(e.to_string()))
        }
    }
}

/// Opens the sideband for `call_id` with the route's key, within `timeout`.
/// The first event is not awaited: whatever the upstream sends is the
/// tracker's to read.
pub async fn sideband(
    route: &RouteConfig,
    call_id: &str,
    timeout: Duration,
    max_message_bytes: usize,
) -> Result<UpstreamSocket, UpstreamCallError> {
    sideband_with(route, call_id, &[], timeout, max_message_bytes).await
}

/// [`sideband`] with `extra` query parameters (a client's attach:
/// `graceful_close`).
pub async fn sideband_with(
    route: &RouteConfig,
    call_id: &str,
    extra: &[(String, String)],
    timeout: Duration,
    max_message_bytes: usize,
) -> Result<UpstreamSocket, UpstreamCallError> {
    let mut url = sideband_url(route, call_id)?;
    if !extra.is_empty() {
        url.query_pairs_mut().extend_pairs(extra);
    }
    let open = async {
        let io = connect(route, &url).await?;
        let mut request = url
            .as_str()
            .into_client_request()
            .map_err(|e| UpstreamCallError::Sideband(e.to_string()))?;
        let headers = upstream_headers(&primary(route)?, route.protocol);
        for (name, value) in headers.map_err(UpstreamCallError::Sideband)? {
            request.headers_mut().insert(name, value);
        }
        let config = crate::relay::ws_config(max_message_bytes);
        match tokio_tungstenite::client_async_with_config(request, io, Some(config)).await {
            Ok((ws, _)) => Ok(ws),
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                Err(UpstreamCallError::SidebandRefused(r.status().as_u16()))
            }
            Err(e) => Err(UpstreamCallError::Sideband(e.to_string())),
        }
    };
    tokio::time::timeout(timeout, open)
        .await
        .map_err(|_| UpstreamCallError::Timeout(timeout))?
}

/// The session config sent upstream with an offer: the client's, else the
/// client secret's, with the route's upstream model and, for a Realtime
/// call, `type: realtime` (a translation session has no `type`).
pub fn upstream_session(
    client: Option<Map<String, Value>>,
    grant: Option<&Grant>,
    upstream_model: &str,
    endpoint: Endpoint,
) -> Map<String, Value> {
    let mut s = client
        .or_else(|| grant.and_then(|g| serde_json::from_str(&g.config).ok()))
        .unwrap_or_default();
    if endpoint != Endpoint::Translations {
        s.insert("type".into(), "realtime".into());
    }
    s.insert("model".into(), upstream_model.into());
    s
}

/// The call id at the end of an upstream `Location`.
pub fn call_id_from_location(location: &str) -> Option<String> {
    let path = location.split(['?', '#']).next()?;
    let id = path.trim_end_matches('/').rsplit('/').next()?;
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    ok.then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;

    fn route(provider: Provider, url: &str, protocol: Protocol) -> RouteConfig {
        RouteConfig {
            model: "gpt-realtime".into(),
            provider,
            upstream_url: url.into(),
            protocol,
            api_key: crate::upstream_key::UpstreamKey::new(Secret::new("sk-up")),
            ..RouteConfig::default()
        }
    }

    /// An upstream answering one GET: `head` and a first chunk, then
    /// (once `release` fires, if it ever does) the last chunk.
    async fn upstream_once(
        head: &'static str,
        release: tokio::sync::oneshot::Receiver<()>,
    ) -> RouteConfig {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut seen = Vec::new();
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = tcp.read(&mut buf).await.unwrap();
                assert!(n > 0, "request head");
                seen.extend_from_slice(&buf[..n]);
            }
            tcp.write_all(head.as_bytes()).await.unwrap();
            tcp.write_all(b"5\r\nfirst\r\n").await.unwrap();
            if release.await.is_ok() {
                tcp.write_all(b"4\r\nrest\r\n0\r\n\r\n").await.unwrap();
            }
            let _ = tcp.read(&mut buf).await;
        });
        RouteConfig {
            endpoint: Endpoint::Live,
            ..route(
                Provider::Openai,
                &format!("ws://{addr}/v1/live/sessions"),
                Protocol::Ga,
            )
        }
    }

    const CHUNKED: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: audio/wav\r\ntransfer-encoding: chunked\r\n\r\n";

    #[tokio::test]
    async fn a_recording_is_relayed_as_it_comes_and_one_that_stalls_ends_in_a_timeout() {
        use futures_util::StreamExt;
        let (release, held) = tokio::sync::oneshot::channel();
        let r = upstream_once(CHUNKED, held).await;
        let url = action_url(&r, "live_1", "content").unwrap();
        let mut a = get_streamed(&r, &url, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.headers[header::CONTENT_TYPE], "audio/wav");
        // The first part is out while the upstream still holds the rest.
        assert_eq!(a.body.next().await.unwrap().unwrap(), "first");
        release.send(()).unwrap();
        assert_eq!(a.body.next().await.unwrap().unwrap(), "rest");
        assert!(a.body.next().await.is_none());

        let (_never, held) = tokio::sync::oneshot::channel();
        let r = upstream_once(CHUNKED, held).await;
        let url = action_url(&r, "live_1", "content").unwrap();
        let idle = Duration::from_millis(200);
        let mut a = get_streamed(&r, &url, idle).await.unwrap();
        assert_eq!(a.body.next().await.unwrap().unwrap(), "first");
        let stalled = a.body.next().await.unwrap();
        assert!(matches!(stalled, Err(UpstreamCallError::Timeout(t)) if t == idle));
        assert!(a.body.next().await.is_none());
    }

    #[tokio::test]
    async fn a_recording_declared_longer_than_the_bound_is_refused_before_its_body() {
        let (_never, held) = tokio::sync::oneshot::channel();
        let head: &'static str = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
                MAX_RECORDING_BYTES + 1
            )
            .into_boxed_str(),
        );
        let r = upstream_once(head, held).await;
        let url = action_url(&r, "live_1", "content").unwrap();
        let refused = get_streamed(&r, &url, Duration::from_secs(5)).await;
        assert!(matches!(refused, Err(UpstreamCallError::AnswerTooLarge)));
    }

    #[test]
    fn calls_urls_are_derived_from_the_route() {
        let r = route(
            Provider::Openai,
            "wss://api.openai.com/v1/realtime",
            Protocol::Ga,
        );
        assert_eq!(
            calls_url(&r).unwrap().as_str(),
            "https://api.openai.com/v1/realtime/calls"
        );
        assert_eq!(
            action_url(&r, "rtc_1", "hangup").unwrap().as_str(),
            "https://api.openai.com/v1/realtime/calls/rtc_1/hangup"
        );
        assert_eq!(
            sideband_url(&r, "rtc_1").unwrap().as_str(),
            "wss://api.openai.com/v1/realtime?call_id=rtc_1"
        );
        let local = route(
            Provider::Openai,
            "ws://127.0.0.1:9/v1/realtime?model=x",
            Protocol::Ga,
        );
        assert_eq!(
            calls_url(&local).unwrap().as_str(),
            "http://127.0.0.1:9/v1/realtime/calls"
        );
        let azure = route(
            Provider::Azure,
            "wss://r.openai.azure.com/openai/v1/realtime?api-version=2025-08-28",
            Protocol::Ga,
        );
        assert_eq!(
            calls_url(&azure).unwrap().as_str(),
            "https://r.openai.azure.com/openai/v1/realtime/calls?api-version=2025-08-28"
        );
        assert_eq!(
            sideband_url(&azure, "rtc_2").unwrap().as_str(),
            "wss://r.openai.azure.com/openai/v1/realtime?api-version=2025-08-28&call_id=rtc_2"
        );
    }

    #[test]
    fn a_live_routes_sessions_are_controlled_under_its_own_path() {
        let r = RouteConfig {
            endpoint: Endpoint::Live,
            ..route(
                Provider::Openai,
                "wss://api.openai.com/v1/live/sessions",
                Protocol::Ga,
            )
        };
        assert_eq!(
            calls_url(&r).unwrap().as_str(),
            "https://api.openai.com/v1/live/sessions"
        );
        assert_eq!(
            action_url(&r, "live_1", "content").unwrap().as_str(),
            "https://api.openai.com/v1/live/sessions/live_1/content"
        );
        assert_eq!(
            sideband_url(&r, "live_1").unwrap().as_str(),
            "wss://api.openai.com/v1/live/sessions/live_1/attach"
        );
    }

    #[test]
    fn beta_and_azure_preview_routes_have_no_calls_api() {
        let beta = route(
            Provider::Openai,
            "wss://api.openai.com/v1/realtime",
            Protocol::Beta,
        );
        assert_eq!(calls_url(&beta).unwrap_err(), CallsRouteError::Beta);
        let preview = route(
            Provider::Azure,
            "wss://r.openai.azure.com/openai/realtime",
            Protocol::Ga,
        );
        assert_eq!(
            calls_url(&preview).unwrap_err(),
            CallsRouteError::AzurePreview
        );
    }
}
