//! One benchmark session: connect, upgrade, wait for `session.created`, send
//! `response.create`, read until `response.done`, close.
//!
//! Phases (all on the bench's monotonic clock):
//! - `dial`: TCP connect start → WebSocket upgrade response read;
//! - `session`: upgrade complete → `session.created` received;
//! - `first_audio`: `response.create` written → first audio delta received
//!   (GA `response.output_audio.delta` or beta `response.audio.delta`);
//! - `turn`: `response.create` written → `response.done` received;
//! - `total`: TCP connect start → `response.done` received;
//! - `close`: the client's close frame written → the server closed the TCP
//!   connection (what a client's `close()` waits for: RFC 6455 §7.1.1 has
//!   the server close TCP first), bounded by [`CLOSE_WAIT`] (a close that
//!   took longer counts as [`CLOSE_WAIT`]).
//!
//! A session closes after `response.done`, or with [`CloseAt::FirstAudio`]
//! right after its first audio delta, while the response is still in
//! flight (then `turn` and `total` are not measured): the close an
//! interrupting client makes, which the gateway answers while it cancels
//! the response upstream.
//!
//! The hot loop reads each frame's type from its leading bytes
//! ([`patchbay_gateway::event::event_type`]) and never parses audio; it keeps
//! no copy of a frame, so the only allocation per frame is tungstenite's own
//! buffer for the message.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::{HeaderName, HeaderValue, Uri};
use patchbay_gateway::event::event_type;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};
use tokio_tungstenite::WebSocketStream;

/// How long the close handshake may take once the turn is measured.
pub const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Read buffer per connection. tungstenite's default (128 KiB) costs an
/// mmap per connection at this churn; 16 KiB holds several audio deltas.
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// The one client event a session sends.
const RESPONSE_CREATE: &str = r#"{"type":"response.create"}"#;

/// The phases, in the order a session goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Dial,
    Session,
    FirstAudio,
    Turn,
    Total,
    Close,
}

impl Phase {
    pub const ALL: [Phase; 6] = [
        Phase::Dial,
        Phase::Session,
        Phase::FirstAudio,
        Phase::Turn,
        Phase::Total,
        Phase::Close,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Dial => "dial",
            Phase::Session => "session",
            Phase::FirstAudio => "first_audio",
            Phase::Turn => "turn",
            Phase::Total => "total",
            Phase::Close => "close",
        }
    }
}

/// Why a session failed; the phase it was in is part of the fact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("connect: {0}")]
    Connect(std::io::ErrorKind),
    #[error("upgrade refused: HTTP {0}")]
    Refused(u16),
    #[error("upgrade failed")]
    Upgrade,
    #[error("timed out in {}", .0.name())]
    Timeout(Phase),
    #[error("closed in {} (code {})", .phase.name(), .code.map_or("none".into(), |c| c.to_string()))]
    Closed { phase: Phase, code: Option<u16> },
    #[error("connection lost in {}", .0.name())]
    Lost(Phase),
    #[error("error event in {}: {code}", .phase.name())]
    ErrorEvent { phase: Phase, code: String },
    #[error("send failed")]
    Send,
}

/// A resolved target: what every session to it needs, prepared once.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub uri: Uri,
    /// Extra upgrade headers: credential, protocol.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// The measured phases of one session; a phase is `None` if the session
/// failed before reaching its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timings {
    pub dial: Option<Duration>,
    pub session: Option<Duration>,
    pub first_audio: Option<Duration>,
    pub turn: Option<Duration>,
    pub total: Option<Duration>,
    pub close: Option<Duration>,
    /// Audio delta frames received, and their bytes (JSON text, as framed).
    pub audio_frames: u32,
    pub audio_bytes: u64,
}

impl Timings {
    pub fn get(&self, phase: Phase) -> Option<Duration> {
        match phase {
            Phase::Dial => self.dial,
            Phase::Session => self.session,
            Phase::FirstAudio => self.first_audio,
            Phase::Turn => self.turn,
            Phase::Total => self.total,
            Phase::Close => self.close,
        }
    }
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default().read_buffer_size(READ_BUFFER_BYTES)
}

pub fn is_audio_delta(kind: &str) -> bool {
    kind == "response.output_audio.delta" || kind == "response.audio.delta"
}

pub type Ws = WebSocketStream<TcpStream>;

/// When a session closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CloseAt {
    /// After `response.done`.
    #[default]
    Done,
    /// Right after the first audio delta, the response still in flight.
    FirstAudio,
}

/// Runs one session against `endpoint`, filling `t` as phases complete.
/// The whole session is bounded by `deadline` (the close by [`CLOSE_WAIT`]
/// more).
pub async fn run(
    endpoint: &Endpoint,
    deadline: Instant,
    close_at: CloseAt,
    t: &mut Timings,
) -> Result<(), SessionError> {
    let t0 = Instant::now();
    let mut ws = connect(endpoint, deadline).await?;
    let t_upgraded = Instant::now();
    t.dial = Some(t_upgraded - t0);

    let result = turn(&mut ws, deadline, t0, t_upgraded, close_at, t).await;
    let closed = close(&mut ws).await;
    if result.is_ok() {
        t.close = Some(closed);
    }
    result
}

/// Closes politely and waits for the server to close the connection, but
/// never longer than [`CLOSE_WAIT`]; how long that took.
pub async fn close(ws: &mut Ws) -> Duration {
    let started = Instant::now();
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        if ws.close(None).await.is_ok() {
            while let Some(Ok(_)) = ws.next().await {}
        }
    })
    .await;
    started.elapsed().min(CLOSE_WAIT)
}

/// TCP connect (`TCP_NODELAY`) and WebSocket upgrade to `endpoint`, by
/// `deadline`.
pub async fn connect(endpoint: &Endpoint, deadline: Instant) -> Result<Ws, SessionError> {
    let within = |phase| move |_| SessionError::Timeout(phase);
    let tcp = tokio::time::timeout_at(deadline, TcpStream::connect(endpoint.addr))
        .await
        .map_err(within(Phase::Dial))?
        .map_err(|e| SessionError::Connect(e.kind()))?;
    let _ = tcp.set_nodelay(true);
    let mut request = endpoint
        .uri
        .clone()
        .into_client_request()
        .map_err(|_| SessionError::Upgrade)?;
    for (k, v) in &endpoint.headers {
        request.headers_mut().insert(k.clone(), v.clone());
    }
    let upgrade = tokio_tungstenite::client_async_with_config(request, tcp, Some(ws_config()));
    let (ws, _) = tokio::time::timeout_at(deadline, upgrade)
        .await
        .map_err(within(Phase::Dial))?
        .map_err(|e| match e {
            WsError::Http(resp) => SessionError::Refused(resp.status().as_u16()),
            _ => SessionError::Upgrade,
        })?;
    Ok(ws)
}

async fn turn(
    ws: &mut Ws,
    deadline: Instant,
    t0: Instant,
    t_upgraded: Instant,
    close_at: CloseAt,
    t: &mut Timings,
) -> Result<(), SessionError> {
    wait_for(ws, deadline, Phase::Session, |kind, _| {
        kind == "session.created"
    })
    .await?;
    t.session = Some(t_upgraded.elapsed());

    ws.send(Message::Text(Utf8Bytes::from_static(RESPONSE_CREATE)))
        .await
        .map_err(|_| SessionError::Send)?;
    let t_create = Instant::now();

    let mut phase = Phase::FirstAudio;
    wait_for(ws, deadline, phase, |kind, len| {
        if is_audio_delta(kind) {
            if t.first_audio.is_none() {
                t.first_audio = Some(t_create.elapsed());
                phase = Phase::Turn;
            }
            t.audio_frames += 1;
            t.audio_bytes += len as u64;
            if close_at == CloseAt::FirstAudio {
                return true;
            }
        }
        kind == "response.done"
    })
    .await
    .map_err(|e| e.in_phase(phase))?;
    if close_at == CloseAt::FirstAudio {
        return Ok(());
    }
    let now = Instant::now();
    t.turn = Some(now - t_create);
    t.total = Some(now - t0);
    Ok(())
}

impl SessionError {
    /// Re-labels a failure whose phase advanced while waiting.
    fn in_phase(self, phase: Phase) -> Self {
        match self {
            SessionError::Timeout(_) => SessionError::Timeout(phase),
            SessionError::Lost(_) => SessionError::Lost(phase),
            SessionError::Closed { code, .. } => SessionError::Closed { phase, code },
            SessionError::ErrorEvent { code, .. } => SessionError::ErrorEvent { phase, code },
            other => other,
        }
    }
}

/// The next text frame by `deadline` (other data frames skipped); a close,
/// a lost connection or the deadline fails `phase`.
pub async fn next_text(
    ws: &mut Ws,
    deadline: Instant,
    phase: Phase,
) -> Result<Utf8Bytes, SessionError> {
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .map_err(|_| SessionError::Timeout(phase))?;
        match msg {
            Some(Ok(Message::Text(text))) => return Ok(text),
            Some(Ok(Message::Close(frame))) => {
                return Err(SessionError::Closed {
                    phase,
                    code: frame.map(|f| u16::from(f.code)),
                })
            }
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return Err(SessionError::Lost(phase)),
        }
    }
}

/// Reads text frames until `done(type, len)` says so; an `error` event ends
/// the session.
pub async fn wait_for(
    ws: &mut Ws,
    deadline: Instant,
    phase: Phase,
    mut done: impl FnMut(&str, usize) -> bool,
) -> Result<(), SessionError> {
    loop {
        let text = next_text(ws, deadline, phase).await?;
        let kind = event_type(&text);
        let kind = kind.as_deref().unwrap_or("");
        if kind == "error" {
            return Err(SessionError::ErrorEvent {
                phase,
                code: error_code(&text),
            });
        }
        if done(kind, text.len()) {
            return Ok(());
        }
    }
}

/// `error.code` (or `error.type`) of an error event; parsed in full, as it
/// only happens once per failed session.
pub fn error_code(text: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    let e = &v["error"];
    e["code"]
        .as_str()
        .or_else(|| e["type"].as_str())
        .unwrap_or("unknown")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_protocols_audio_deltas_count_and_nothing_else() {
        assert!(is_audio_delta("response.output_audio.delta"));
        assert!(is_audio_delta("response.audio.delta"));
        assert!(!is_audio_delta("response.output_audio_transcript.delta"));
        assert!(!is_audio_delta("response.audio.done"));
    }

    #[test]
    fn error_code_falls_back_to_the_type() {
        let e = r#"{"type":"error","error":{"type":"server_error","code":"upstream_unavailable"}}"#;
        assert_eq!(error_code(e), "upstream_unavailable");
        let e = r#"{"type":"error","error":{"type":"server_error","code":null}}"#;
        assert_eq!(error_code(e), "server_error");
        assert_eq!(error_code("not json"), "unknown");
    }

    #[test]
    fn failure_messages_name_the_phase() {
        assert_eq!(
            SessionError::Timeout(Phase::FirstAudio).to_string(),
            "timed out in first_audio"
        );
        assert_eq!(
            SessionError::Closed {
                phase: Phase::Session,
                code: Some(1013)
            }
            .to_string(),
            "closed in session (code 1013)"
        );
        assert_eq!(
            SessionError::Lost(Phase::Session).in_phase(Phase::Turn),
            SessionError::Lost(Phase::Turn)
        );
    }
}
