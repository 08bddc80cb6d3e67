//! Dialling the upstream Realtime API and reading its `session.created`.
//!
//! [`Upstream`] is built once per route at start (URL, headers, TLS config)
//! and [`Upstream::dial`] returns a [`Warm`] socket: connected, upgraded, and
//! past its first event, which must be `session.created`. That event is kept
//! as received so the client gets it byte-for-byte, whether the socket came
//! from the pool or from a fresh dial.
//!
//! The whole dial (DNS and connect, TLS, upgrade, first event) has one
//! deadline, `upgrade_timeout` from its start: a slow upstream costs a
//! client at most that long before its error event, however the delay is
//! spread over the phases. The error names the phase the deadline ran out
//! in. `TCP_NODELAY` is set (Nagle would hold
//! small audio deltas back for tens of milliseconds), and no
//! `Sec-WebSocket-Extensions` is offered, so permessage-deflate is never
//! negotiated. The upstream key is a sensitive header value: `http`'s `Debug`
//! prints it as `Sensitive`, and [`Upstream`]'s own `Debug` leaves it out.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderName, HeaderValue};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::WebSocketStream;
use tokio_util::either::Either;
use url::Url;

use crate::config::{Endpoint, Protocol, Provider, RouteConfig, UpstreamConfig};
use crate::event::event_type;
use crate::relay::frame::FrameRole;
use crate::relay::leg::{Control, Leg, Side};
use crate::secret::Secret;
use crate::upstream::handshake::{self, HandshakeError, REFUSAL_BODY_MAX};
use crate::upstream::resolve::Resolver;
use crate::upstream::tls;
use crate::upstream_key::UpstreamKey;

/// A connection to the upstream, plain or TLS. The TLS stream is boxed: it
/// holds rustls's connection state inline (over 1 KiB), and this type sits
/// in every upstream leg and in the futures that dial and splice it, which
/// are moved whole when a session's task is spawned.
pub type UpstreamIo = Either<TcpStream, Box<tokio_rustls::client::TlsStream<TcpStream>>>;
/// A tungstenite connection to the upstream (a call's sideband).
pub type UpstreamSocket = WebSocketStream<UpstreamIo>;
/// The relay's raw connection to the upstream.
pub type UpstreamLeg = Leg<UpstreamIo>;

/// Query parameters a client may pass through to the upstream: they select
/// what kind of session the upstream starts (`intent=transcription`). Every
/// other parameter is dropped; `model`, `deployment` and `api-version` are
/// always the route's.
pub const SESSION_PARAMS: [&str; 1] = ["intent"];

/// First events that start a session: `session.created` (both protocols;
/// a GA transcription session is one with `type: transcription`), and the
/// beta protocol's `transcription_session.created`.
/// A Live session's `session.started` answers the `session.start` the
/// gateway sends first ([`Upstream::dial_live`]).
pub const SESSION_STARTED: [&str; 3] = [
    "session.created",
    "transcription_session.created",
    "session.started",
];

/// The session-selecting parameters of a client's query string, in the
/// order given, each at most once (the first occurrence wins).
pub fn session_params(query: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        if SESSION_PARAMS.contains(&k.as_ref()) && !out.iter().any(|(seen, _)| *seen == k) {
            out.push((k.into_owned(), v.into_owned()));
        }
    }
    out
}

/// An upstream socket that has received `session.created` and nothing else.
pub struct Warm {
    pub leg: UpstreamLeg,
    /// The text of `session.created`.
    pub session_created: String,
    /// Its frames exactly as the upstream sent them (valid frames for the
    /// client as they are).
    pub created_frames: Vec<Bytes>,
    /// When the upstream session started (its expiry clock runs from here).
    pub connected_at: Instant,
}

impl fmt::Debug for Warm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Warm")
            .field("connected_at", &self.connected_at)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        authority: String,
        source: std::io::Error,
    },
    #[error("timed out during {phase}")]
    Timeout { phase: &'static str },
    #[error("TLS handshake failed: {source}")]
    Tls { source: std::io::Error },
    #[error("upstream refused the connection: HTTP {status}{}", body_suffix(.body))]
    Refused {
        status: u16,
        retry_after: Option<String>,
        body: String,
    },
    #[error("WebSocket handshake failed: {message}")]
    Handshake { message: String },
    #[error("upstream's first event was {}{} instead of session.created", .event_type.as_deref().unwrap_or("not an event"), error_code_suffix(.frame.as_deref()))]
    FirstEvent {
        event_type: Option<String>,
        /// The offending text message, forwarded to the client as is.
        frame: Option<String>,
    },
    #[error("upstream closed before session.created (code {code:?})")]
    ClosedEarly { code: Option<u16> },
    /// Every upstream of the route has its circuit breaker open.
    #[error("every upstream of this route is failing; try again later")]
    CircuitOpen,
    /// The gateway itself has no file descriptor left for the socket
    /// (`EMFILE`/`ENFILE`): nothing is known about the upstream.
    #[error("the gateway is out of file descriptors")]
    OutOfDescriptors,
}

/// ` (code)` of an `error` event, for the log.
fn error_code_suffix(frame: Option<&str>) -> String {
    match frame.map(crate::event::error_kind) {
        Some((_, Some(code))) => format!(" ({code})"),
        Some((Some(kind), None)) => format!(" ({kind})"),
        _ => String::new(),
    }
}

fn body_suffix(body: &str) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}

impl DialError {
    /// The message a client may see. What only the logs get: a refusal's
    /// body (OpenAI's 401 body quotes the gateway's own upstream key,
    /// masked, but with its prefix and last characters), and where the
    /// upstream is and what its connection said (its host and port may
    /// name an internal proxy; TLS and handshake errors carry library
    /// detail). None of it is any client's business.
    pub fn client_message(&self) -> String {
        match self {
            DialError::Refused { status, .. } => {
                format!("upstream refused the connection: HTTP {status}")
            }
            DialError::Connect { .. } => "cannot connect to the upstream".to_string(),
            DialError::Tls { .. } => "TLS handshake with the upstream failed".to_string(),
            DialError::Handshake { .. } => {
                "WebSocket handshake with the upstream failed".to_string()
            }
            other => other.to_string(),
        }
    }

    /// Every value of [`DialError::result_label`].
    pub const RESULT_LABELS: [&'static str; 6] = [
        "unreachable",
        "timeout",
        "refused",
        "bad_first_event",
        "circuit_open",
        "out_of_descriptors",
    ];

    /// Label for `patchbay_pool_dials_total{result}` and the dial histogram.
    pub fn result_label(&self) -> &'static str {
        match self {
            DialError::Connect { .. } | DialError::Tls { .. } | DialError::Handshake { .. } => {
                "unreachable"
            }
            DialError::Timeout { .. } => "timeout",
            DialError::Refused { .. } => "refused",
            DialError::FirstEvent { .. } | DialError::ClosedEarly { .. } => "bad_first_event",
            DialError::CircuitOpen => "circuit_open",
            DialError::OutOfDescriptors => "out_of_descriptors",
        }
    }
}

/// One route's upstream, ready to dial.
///
/// What every dial sends but the key is built here once: the request head
/// up to the credential ([`handshake::head`], with the protocol and agent
/// headers), and where the host is ([`Resolver`]: an IP literal parsed, a
/// name's answer cached).
#[derive(Clone)]
pub struct Upstream {
    url: Url,
    /// The head of a dial without session parameters, but its credential.
    head: Arc<[u8]>,
    /// `Host`, as the URL gives it (with a non-default port).
    authority: String,
    /// Headers every dial sends besides the credential.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Read at every dial, so a rotated key file applies to the next one.
    key: UpstreamKey,
    provider: Provider,
    tls: Option<(TlsConnector, rustls_pki_types::ServerName<'static>)>,
    resolver: Resolver,
    timeout: Duration,
    max_message_bytes: usize,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("url", &self.url.as_str())
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// The route's first upstream (single-upstream routes).
    pub fn new(
        route: &RouteConfig,
        timeout: Duration,
        max_message_bytes: usize,
    ) -> Result<Self, String> {
        let list = route.upstream_list();
        let up = list.first().ok_or("the route has no upstream")?;
        Self::for_upstream(route, up, timeout, max_message_bytes)
    }

    /// One of the route's upstreams.
    pub fn for_upstream(
        route: &RouteConfig,
        up: &UpstreamConfig,
        timeout: Duration,
        max_message_bytes: usize,
    ) -> Result<Self, String> {
        let url = route_upstream_url(route, up)?;
        // The credential is added at each dial (the key may rotate).
        let mut headers = upstream_headers(up, route.protocol)?;
        headers.retain(|(name, _)| *name != auth_header_name(up.provider));
        let host = url
            .host_str()
            .ok_or("upstream URL has no host")?
            .to_string();
        let port = url
            .port_or_known_default()
            .ok_or("upstream URL has no port")?;
        let tls = if url.scheme() == "wss" {
            let config = tls::client_config(up.ca_file.as_deref()).map_err(|e| e.to_string())?;
            let name = tls_server_name(&url)?;
            Some((TlsConnector::from(config), name))
        } else {
            None
        };
        let authority = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        let head = head_of(&url, &authority, &headers).into();
        Ok(Self {
            resolver: Resolver::new(&host, port),
            url,
            head,
            authority,
            headers,
            key: up.api_key.clone(),
            provider: up.provider,
            tls,
            timeout,
            max_message_bytes,
        })
    }

    /// Connects, upgrades and reads `session.created`, all within the
    /// route's `upgrade_timeout` from now.
    pub async fn dial(&self) -> Result<Warm, DialError> {
        self.dial_with(&[]).await
    }

    /// [`Upstream::dial`] with session-selecting query parameters
    /// ([`session_params`]) added to the route's URL.
    pub async fn dial_with(&self, params: &[(String, String)]) -> Result<Warm, DialError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let leg = self.connect(deadline, self.head(params)?).await?;
        read_session_created(leg, deadline).await
    }

    /// A Live session's dial: connects, sends the client's `session.start`
    /// (`start`, its model already the upstream's; a fork's names none) and
    /// reads `session.started`, all within the route's `upgrade_timeout`. A
    /// fork of `fork_of` dials `…/{fork_of}/fork` under the route's URL
    /// (openai-python `resources/live/forks.py`).
    pub async fn dial_live(&self, fork_of: Option<&str>, start: &str) -> Result<Warm, DialError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let head = match fork_of {
            None => self.head(&[])?,
            Some(parent) => {
                let mut url = self.url.clone();
                let path = format!("{}/{parent}/fork", url.path().trim_end_matches('/'));
                url.set_path(&path);
                self.with_credential(head_of(&url, &self.authority, &self.headers))?
            }
        };
        let mut leg = self.connect(deadline, head).await?;
        leg.queue_text(start);
        tokio::time::timeout_at(deadline, leg.flush())
            .await
            .map_err(|_| DialError::Timeout {
                phase: "session.start",
            })?
            .map_err(|e| DialError::Handshake {
                message: e.to_string(),
            })?;
        read_session_created(leg, deadline).await
    }

    /// Connects and upgrades by `deadline`; the first event is not read yet.
    async fn connect(
        &self,
        deadline: tokio::time::Instant,
        head: handshake::Head,
    ) -> Result<UpstreamLeg, DialError> {
        let tcp = by(deadline, "connect", self.resolver.connect())
            .await?
            .map_err(|source| {
                if crate::descriptors::is_out_of_descriptors(&source) {
                    DialError::OutOfDescriptors
                } else {
                    DialError::Connect {
                        authority: self.resolver.authority(),
                        source,
                    }
                }
            })?;
        // Nagle would hold small frames back; never fatal if it fails.
        let _ = tcp.set_nodelay(true);
        let mut io = match &self.tls {
            Some((connector, name)) => {
                let tls = by(deadline, "tls", connector.connect(name.clone(), tcp))
                    .await?
                    .map_err(|source| DialError::Tls { source })?;
                Either::Right(Box::new(tls))
            }
            None => Either::Left(tcp),
        };
        // A refusal's body is read until the deadline at most, so that a
        // slow one still ends as the refusal it is.
        let upgrade = handshake::client_by(&mut io, head, Some(deadline));
        let already_read = by(deadline, "upgrade", upgrade)
            .await?
            .map_err(handshake_error)?;
        Ok(Leg::new(
            io,
            &already_read,
            Side::Client,
            self.max_message_bytes,
        ))
    }

    /// The request head of a dial with `params`, with the key as it is now
    /// (it may have been rotated since start); [`handshake::client`] adds
    /// the upgrade's own key.
    fn head(&self, params: &[(String, String)]) -> Result<handshake::Head, DialError> {
        let (name, value) = self.credential()?;
        let mut head = if params.is_empty() {
            let mut head = Vec::with_capacity(
                self.head.len()
                    + name.as_str().len()
                    + value.expose().len()
                    + 4
                    + handshake::KEY_PART_BYTES,
            );
            head.extend_from_slice(&self.head);
            head
        } else {
            let mut url = self.url.clone();
            url.query_pairs_mut().extend_pairs(params);
            head_of(&url, &self.authority, &self.headers)
        };
        handshake::push_header(&mut head, name.as_str(), value.expose().as_bytes());
        Ok(head)
    }

    /// `head` with the key as it is now.
    fn with_credential(&self, mut head: handshake::Head) -> Result<handshake::Head, DialError> {
        let (name, value) = self.credential()?;
        handshake::push_header(&mut head, name.as_str(), value.expose().as_bytes());
        Ok(head)
    }

    /// The credential header's name and value, with the key as it is now.
    fn credential(&self) -> Result<(HeaderName, Secret), DialError> {
        let key = self.key.current();
        let value =
            auth_value(self.provider, &key).map_err(|message| DialError::Handshake { message })?;
        Ok((auth_header_name(self.provider), value))
    }
}

/// The name a `wss://` upstream's certificate is checked against: its DNS
/// name, or its IP address (an IPv6 literal without the URL's brackets).
fn tls_server_name(url: &Url) -> Result<rustls_pki_types::ServerName<'static>, String> {
    use std::net::IpAddr;
    match url.host() {
        Some(url::Host::Domain(d)) => rustls_pki_types::ServerName::try_from(d.to_string())
            .map_err(|e| format!("invalid TLS server name {d}: {e}")),
        Some(url::Host::Ipv4(a)) => Ok(IpAddr::V4(a).into()),
        Some(url::Host::Ipv6(a)) => Ok(IpAddr::V6(a).into()),
        None => Err("upstream URL has no host".into()),
    }
}

/// The head of an upgrade to `url` with `headers`, the credential not yet.
fn head_of(url: &Url, authority: &str, headers: &[(HeaderName, HeaderValue)]) -> handshake::Head {
    let target = &url[url::Position::BeforePath..url::Position::AfterQuery];
    let mut head = handshake::head(target, authority);
    for (name, value) in headers {
        handshake::push_header(&mut head, name.as_str(), value.as_bytes());
    }
    head
}

/// `fut` bounded by `deadline`, its timeout named by `phase`. A combinator,
/// not an `async fn`: an `async fn` would hold `fut` twice (its argument
/// and the timeout it is moved into), doubling the dial's future.
fn by<F: std::future::Future>(
    deadline: tokio::time::Instant,
    phase: &'static str,
    fut: F,
) -> impl std::future::Future<Output = Result<F::Output, DialError>> {
    tokio::time::timeout_at(deadline, fut).map(move |r| r.map_err(|_| DialError::Timeout { phase }))
}

fn handshake_error(e: HandshakeError) -> DialError {
    match e {
        HandshakeError::Refused {
            status,
            retry_after,
            body,
        } => {
            let end = body.len().min(REFUSAL_BODY_MAX);
            DialError::Refused {
                status,
                retry_after,
                body: one_line(&String::from_utf8_lossy(&body[..end])),
            }
        }
        other => DialError::Handshake {
            message: other.to_string(),
        },
    }
}

/// `text` on one line: every run of whitespace and control characters is
/// one space. A refusal's body (a pretty-printed JSON error, a proxy's HTML
/// page) goes into a log line, which must stay one line.
fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split(|c: char| c.is_whitespace() || c.is_control()) {
        if !word.is_empty() {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(word);
        }
    }
    out
}

/// Reads the first event by `deadline`; it must start a session
/// ([`SESSION_STARTED`]). Pings before it are answered and skipped; the
/// event may come in fragments.
async fn read_session_created(
    mut leg: UpstreamLeg,
    deadline: tokio::time::Instant,
) -> Result<Warm, DialError> {
    let timeout = || DialError::Timeout {
        phase: "session.created",
    };
    let mut frames = Vec::new();
    loop {
        let next = tokio::time::timeout_at(deadline, leg.next_frame())
            .await
            .map_err(|_| timeout())?;
        let f = match next {
            Ok(Some(f)) => f,
            Ok(None) => return Err(DialError::ClosedEarly { code: None }),
            Err(e) => {
                return Err(DialError::Handshake {
                    message: e.to_string(),
                })
            }
        };
        match f.role {
            FrameRole::Control => match leg.answer(&f) {
                Ok(Control::PingPong) => {
                    tokio::time::timeout_at(deadline, leg.flush())
                        .await
                        .map_err(|_| timeout())?
                        .map_err(|e| DialError::Handshake {
                            message: e.to_string(),
                        })?;
                }
                Ok(Control::Close(frame)) => {
                    return Err(DialError::ClosedEarly {
                        code: frame.map(|f| u16::from(f.code)),
                    })
                }
                Err(code) => {
                    return Err(DialError::Handshake {
                        message: format!("invalid close frame (would close {code})"),
                    })
                }
            },
            FrameRole::Data { text: false, .. } => {
                return Err(DialError::FirstEvent {
                    event_type: None,
                    frame: None,
                })
            }
            FrameRole::Data { text: true, .. } => {
                let text = leg.text_of(&f).map(|t| t.into_owned());
                frames.push(f.bytes);
                let Some(text) = text else {
                    continue;
                };
                let Ok(text) = String::from_utf8(text) else {
                    return Err(DialError::FirstEvent {
                        event_type: None,
                        frame: None,
                    });
                };
                let kind = event_type(&text).map(|t| t.into_owned());
                return match kind {
                    Some(t) if SESSION_STARTED.contains(&t.as_str()) => Ok(Warm {
                        leg,
                        session_created: text,
                        created_frames: frames,
                        connected_at: Instant::now(),
                    }),
                    event_type => Err(DialError::FirstEvent {
                        event_type,
                        frame: Some(text),
                    }),
                };
            }
        }
    }
}

/// The upstream URL with the model (OpenAI, Azure GA) or deployment (Azure
/// preview) in the query; other query parameters (`api-version`) are kept.
pub fn upstream_url(up: &UpstreamConfig, upstream_model: &str) -> Result<Url, String> {
    url_with(up, Some(upstream_model), None)
}

/// The URL a route's upstream is dialled at: an intent route's
/// (`intent = "transcription"`) names its intent, and a model only when its
/// `upstream_model` is set (OpenAI's own form, `?intent=transcription`,
/// names none: the client picks the model in `session.update`).
pub fn route_upstream_url(route: &RouteConfig, up: &UpstreamConfig) -> Result<Url, String> {
    if route.endpoint == Endpoint::Live {
        // The model goes in `session.start`, never in the URL (openai-python
        // `types/live/session_resource.py`, `model`).
        return url_with(up, None, None);
    }
    match route.intent {
        None => upstream_url(up, up.upstream_model(route)),
        Some(intent) => url_with(
            up,
            up.upstream_model
                .as_deref()
                .or(route.upstream_model.as_deref()),
            Some(intent.as_str()),
        ),
    }
}

fn url_with(up: &UpstreamConfig, model: Option<&str>, intent: Option<&str>) -> Result<Url, String> {
    let mut url = Url::parse(&up.upstream_url).map_err(|e| format!("invalid upstream_url: {e}"))?;
    let param = match up.provider {
        Provider::Azure if !url.path().ends_with("/openai/v1/realtime") => "deployment",
        _ => "model",
    };
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != param && (intent.is_none() || k != "intent"))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let mut pairs = url.query_pairs_mut();
    pairs.clear().extend_pairs(kept);
    if let Some(model) = model {
        pairs.append_pair(param, model);
    }
    if let Some(intent) = intent {
        pairs.append_pair("intent", intent);
    }
    drop(pairs);
    Ok(url)
}

/// The header that carries the upstream key for `provider`.
fn auth_header_name(provider: Provider) -> HeaderName {
    match provider {
        Provider::Openai => http::header::AUTHORIZATION,
        Provider::Azure => HeaderName::from_static("api-key"),
    }
}

/// The value of [`auth_header_name`] for `key`, checked as a header value
/// must be (visible ASCII, spaces and tabs; RFC 9110 §5.5).
fn auth_value(provider: Provider, key: &Secret) -> Result<Secret, String> {
    let key = key.expose();
    if !key
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return Err("the upstream key holds characters not allowed in a header".into());
    }
    Ok(match provider {
        Provider::Openai => Secret::new(format!("Bearer {key}")),
        Provider::Azure => Secret::new(key),
    })
}

/// The credential header carrying `key` for `provider` (marked sensitive).
pub fn auth_header(provider: Provider, key: &Secret) -> Result<(HeaderName, HeaderValue), String> {
    let value = auth_value(provider, key)?;
    let mut value = HeaderValue::from_str(value.expose())
        .map_err(|_| "the upstream key holds characters not allowed in a header".to_string())?;
    value.set_sensitive(true);
    Ok((auth_header_name(provider), value))
}

/// Authentication and protocol headers for a dial of `up` (its key as it
/// is now: a rotated key file applies from the next dial).
pub fn upstream_headers(
    up: &UpstreamConfig,
    protocol: Protocol,
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut headers = vec![auth_header(up.provider, &up.api_key.current())?];
    if protocol == Protocol::Beta {
        headers.push((
            HeaderName::from_static("openai-beta"),
            HeaderValue::from_static("realtime=v1"),
        ));
    }
    headers.push((
        http::header::USER_AGENT,
        HeaderValue::from_static(concat!("patchbay-gateway/", env!("CARGO_PKG_VERSION"))),
    ));
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url_of(r: &RouteConfig) -> Url {
        let list = r.upstream_list();
        upstream_url(&list[0], list[0].upstream_model(r)).unwrap()
    }

    fn headers_of(r: &RouteConfig) -> Vec<(HeaderName, HeaderValue)> {
        upstream_headers(&r.upstream_list()[0], r.protocol).unwrap()
    }

    fn route(provider: Provider, url: &str, protocol: Protocol) -> RouteConfig {
        RouteConfig {
            model: "gpt-realtime".into(),
            provider,
            upstream_url: url.into(),
            upstream_model: Some("dep-1".into()),
            protocol,
            api_key: crate::upstream_key::UpstreamKey::new(Secret::new("sk-up")),
            ..RouteConfig::default()
        }
    }

    #[test]
    fn openai_ga_request_carries_bearer_and_model_and_no_beta_header() {
        let r = route(
            Provider::Openai,
            "wss://api.openai.com/v1/realtime",
            Protocol::Ga,
        );
        assert_eq!(
            url_of(&r).as_str(),
            "wss://api.openai.com/v1/realtime?model=dep-1"
        );
        let h = headers_of(&r);
        assert_eq!(h[0].0, http::header::AUTHORIZATION);
        assert_eq!(h[0].1, "Bearer sk-up");
        assert!(h[0].1.is_sensitive());
        assert!(!h.iter().any(|(n, _)| n == "openai-beta"));
    }

    #[test]
    fn a_wss_upstream_is_checked_against_its_name_or_its_ip_address() {
        use rustls_pki_types::ServerName;
        let name = |u: &str| tls_server_name(&Url::parse(u).unwrap()).unwrap();
        assert!(matches!(
            name("wss://api.openai.com/v1/realtime"),
            ServerName::DnsName(d) if d.as_ref() == "api.openai.com"
        ));
        assert_eq!(
            name("wss://127.0.0.1:8443/v1/realtime"),
            ServerName::from(std::net::IpAddr::from([127, 0, 0, 1]))
        );
        // The URL's brackets are not part of the address.
        assert_eq!(
            name("wss://[::1]:8443/v1/realtime"),
            ServerName::from(std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST))
        );
        let r = route(
            Provider::Openai,
            "wss://[::1]:8443/v1/realtime",
            Protocol::Ga,
        );
        Upstream::new(&r, Duration::from_secs(1), 1 << 20).expect("an IPv6 literal upstream");
    }

    #[test]
    fn beta_protocol_adds_the_openai_beta_header() {
        let r = route(
            Provider::Openai,
            "wss://api.openai.com/v1/realtime",
            Protocol::Beta,
        );
        let h = headers_of(&r);
        assert!(h
            .iter()
            .any(|(n, v)| n == "openai-beta" && v == "realtime=v1"));
    }

    #[test]
    fn azure_preview_uses_deployment_and_api_key_header() {
        let r = route(
            Provider::Azure,
            "wss://res.openai.azure.com/openai/realtime?api-version=2024-10-01-preview",
            Protocol::Beta,
        );
        assert_eq!(
            url_of(&r).as_str(),
            "wss://res.openai.azure.com/openai/realtime?api-version=2024-10-01-preview&deployment=dep-1"
        );
        let h = headers_of(&r);
        assert_eq!(h[0].0, "api-key");
        assert_eq!(h[0].1, "sk-up");
        assert!(!h.iter().any(|(n, _)| n == http::header::AUTHORIZATION));
    }

    #[test]
    fn azure_ga_uses_model() {
        let r = route(
            Provider::Azure,
            "wss://res.openai.azure.com/openai/v1/realtime",
            Protocol::Ga,
        );
        assert_eq!(
            url_of(&r).as_str(),
            "wss://res.openai.azure.com/openai/v1/realtime?model=dep-1"
        );
    }

    #[test]
    fn only_session_selecting_parameters_pass_through_once_each() {
        assert_eq!(
            session_params("model=x&intent=transcription&api-version=1&intent=other&foo=bar"),
            vec![("intent".to_string(), "transcription".to_string())]
        );
        assert!(session_params("model=gpt-realtime&deployment=d").is_empty());
        assert!(session_params("").is_empty());
        assert_eq!(
            session_params("intent=a%20b"),
            vec![("intent".to_string(), "a b".to_string())]
        );
    }

    #[test]
    fn forwarded_parameters_follow_the_routes_own() {
        let r = route(
            Provider::Azure,
            "wss://res.openai.azure.com/openai/realtime?api-version=2024-10-01-preview",
            Protocol::Beta,
        );
        let u = Upstream::new(&r, Duration::from_secs(1), 1 << 20).unwrap();
        let params = vec![("intent".to_string(), "transcription".to_string())];
        let with = head_text(&u, &params);
        assert!(
            with.starts_with("GET /openai/realtime?api-version=2024-10-01-preview&deployment=dep-1&intent=transcription HTTP/1.1\r\nHost: res.openai.azure.com\r\n"),
            "{with}"
        );
        let without = head_text(&u, &[]);
        assert!(
            without.starts_with(
                "GET /openai/realtime?api-version=2024-10-01-preview&deployment=dep-1 HTTP/1.1\r\n"
            ),
            "{without}"
        );
        // Every other line is the same with and without parameters.
        assert_eq!(
            with.lines().skip(1).collect::<Vec<_>>(),
            without.lines().skip(1).collect::<Vec<_>>()
        );
    }

    #[test]
    fn an_intent_route_is_dialled_with_its_intent_and_a_model_only_when_configured() {
        let mut r = route(
            Provider::Openai,
            "wss://api.openai.com/v1/realtime",
            Protocol::Ga,
        );
        r.model = "transcribe".into();
        r.upstream_model = None;
        r.intent = Some(crate::config::Intent::Transcription);
        let up = r.upstream_list()[0].clone();
        assert_eq!(
            route_upstream_url(&r, &up).unwrap().as_str(),
            "wss://api.openai.com/v1/realtime?intent=transcription"
        );
        r.upstream_model = Some("gpt-4o-transcribe".into());
        let up = r.upstream_list()[0].clone();
        assert_eq!(
            route_upstream_url(&r, &up).unwrap().as_str(),
            "wss://api.openai.com/v1/realtime?model=gpt-4o-transcribe&intent=transcription"
        );
        // A conversation route keeps what its URL says and adds its model.
        let mut r = route(
            Provider::Openai,
            "wss://api.openai.com/v1/realtime?intent=x",
            Protocol::Ga,
        );
        r.upstream_model = None;
        let up = r.upstream_list()[0].clone();
        assert_eq!(
            route_upstream_url(&r, &up).unwrap().as_str(),
            format!(
                "wss://api.openai.com/v1/realtime?intent=x&model={}",
                r.model
            )
        );
    }

    fn head_text(u: &Upstream, params: &[(String, String)]) -> String {
        String::from_utf8(u.head(params).unwrap()).unwrap()
    }

    #[test]
    fn the_head_carries_the_key_as_it_is_now_once_and_the_routes_headers() {
        let r = route(
            Provider::Openai,
            "ws://127.0.0.1:8123/v1/realtime",
            Protocol::Beta,
        );
        let u = Upstream::new(&r, Duration::from_secs(1), 1 << 20).unwrap();
        let head = head_text(&u, &[]);
        assert!(
            head.starts_with("GET /v1/realtime?model=dep-1 HTTP/1.1\r\nHost: 127.0.0.1:8123\r\n")
        );
        assert_eq!(
            head.matches("authorization: Bearer sk-up\r\n").count(),
            1,
            "{head}"
        );
        assert!(head.contains("openai-beta: realtime=v1\r\n"));
        assert!(head.contains("user-agent: patchbay-gateway/"));
        assert!(
            head.ends_with("\r\n") && !head.ends_with("\r\n\r\n"),
            "the key and the blank line come at the dial"
        );

        r.api_key.replace(Secret::new("sk-rotated"));
        let head = head_text(&u, &[]);
        assert!(
            head.contains("authorization: Bearer sk-rotated\r\n"),
            "{head}"
        );
        assert!(!head.contains("sk-up"));

        r.api_key.replace(Secret::new("sk-bad\nkey"));
        assert!(
            matches!(u.head(&[]), Err(DialError::Handshake { message }) if message.contains("not allowed"))
        );

        let azure = route(
            Provider::Azure,
            "wss://res.openai.azure.com/openai/v1/realtime",
            Protocol::Ga,
        );
        let head = head_text(
            &Upstream::new(&azure, Duration::from_secs(1), 1 << 20).unwrap(),
            &[],
        );
        assert!(
            head.contains("\r\nHost: res.openai.azure.com\r\n"),
            "a default port is not written"
        );
        assert_eq!(head.matches("api-key: sk-up\r\n").count(), 1, "{head}");
        assert!(!head.to_ascii_lowercase().contains("authorization"));
    }

    /// The dial runs inside every session's future (and every pool
    /// refill's task): it must not hold buffers or futures twice. It was
    /// 11.7 KiB with a 4 KiB read buffer on its stack and each phase's
    /// future stored twice by an `async fn` wrapper.
    #[test]
    fn the_dials_future_stays_small() {
        let r = route(
            Provider::Openai,
            "ws://127.0.0.1:9/v1/realtime",
            Protocol::Ga,
        );
        let u = Upstream::new(&r, Duration::from_secs(1), 1 << 20).unwrap();
        let dial = u.dial_with(&[]);
        let size = std::mem::size_of_val(&dial);
        assert!(size <= 2 * 1024, "the dial's future is {size} bytes");
    }

    #[test]
    fn a_refusals_body_is_kept_on_one_line() {
        let e = handshake_error(HandshakeError::Refused {
            status: 503,
            retry_after: None,
            body: b"{\n  \"error\": {\r\n    \"message\": \"busy\"\t}\n}\n\x1b[31m".to_vec(),
        });
        assert_eq!(
            e.to_string(),
            "upstream refused the connection: HTTP 503: { \"error\": { \"message\": \"busy\" } } [31m"
        );
    }

    #[test]
    fn upstream_debug_never_shows_the_key() {
        let r = route(
            Provider::Openai,
            "ws://127.0.0.1:1/v1/realtime",
            Protocol::Ga,
        );
        let u = Upstream::new(&r, Duration::from_secs(1), 1 << 20).unwrap();
        assert!(!format!("{u:?}").contains("sk-up"));
        let h = headers_of(&r);
        assert!(!format!("{h:?}").contains("sk-up"));
    }
}
