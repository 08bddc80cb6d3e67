//! A simulated OpenAI Realtime upstream (GA protocol, beta names when the
//! client sends `OpenAI-Beta: realtime=v1`), for the demo, the tests and the
//! benchmarks. Event shapes follow openai-python's
//! `src/openai/types/realtime/*.py`.
//!
//! Behaviour per connection: optional upgrade delay (before the 101), key
//! check (`Authorization: Bearer` or `api-key`), `session.created` after the
//! session delay (with `?intent=transcription`: beta
//! `transcription_session.created`, GA a `session.created` whose session
//! has `type: transcription`), then:
//! - `session.update` → `session.updated` with the session's config, its
//!   `instructions` kept for the rest of the session; an invalid one (no
//!   `session` object, a `session.type` other than `realtime` on GA,
//!   non-string `instructions`) → an `error` event (`invalid_request_error`,
//!   `param` naming the field), the session unchanged;
//! - `conversation.item.create` → `conversation.item.added` + `.done`
//!   (beta: `conversation.item.created`);
//! - `input_audio_buffer.commit` → `input_audio_buffer.committed`,
//!   `conversation.item.added`, then
//!   `conversation.item.input_audio_transcription.completed` with token usage;
//! - `response.create` → `response.created`, after the inference delay N
//!   `response.output_audio.delta` (base64 PCM16 silence of a set size) each
//!   followed by a `response.output_audio_transcript.delta`, the `.done`
//!   events and `response.done` with deterministic usage ([`usage_for`]);
//! - `response.cancel` (with the response's `response_id`, or none) → the
//!   response in flight ends at once with a `response.done` of status
//!   `cancelled`, usage for what was sent; a cancel naming another response,
//!   or sent with none in flight, gets an `error`
//!   `response_cancel_not_active`.
//!
//! A response in flight keeps reading the client: a close ends it at once
//! (the close is answered, nothing more is sent), a cancel as above, and
//! other events wait until the response is done, in order.
//!
//! Calls (WebRTC and SIP, `POST /v1/realtime/calls…` and the `?call_id=`
//! sideband) are in [`calls`].
//!
//! Faults ([`SimFault`]): refuse the upgrade with a status, send an `error`
//! as the first event, drop the TCP connection mid-response, or close with a
//! given code after a response. [`SimHandle`] exposes counters and commands
//! (ping or close every open session) for tests.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use futures_util::{FutureExt, SinkExt, StreamExt};
use http::StatusCode;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio_tungstenite::tungstenite::handshake::server::{
    Callback, ErrorResponse, Request, Response,
};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Bytes, Message};
use tokio_tungstenite::WebSocketStream;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use crate::event::event_type;

mod calls;
pub use calls::{answer_for, CallAction, CallKind, CreatedCall, SimCalls};

/// Tokens the simulator reports per audio delta it sent.
pub const AUDIO_TOKENS_PER_DELTA: u64 = 10;
/// Text (transcript) output tokens per response.
pub const TEXT_OUTPUT_TOKENS: u64 = 12;

#[derive(Debug, Clone)]
pub enum SimFault {
    /// Answer the upgrade with this HTTP status and an OpenAI-style body.
    Refuse { status: u16 },
    /// Send an `error` event instead of `session.created`, then close.
    ErrorFirst,
    /// Accept any key's upgrade, then refuse the key with an
    /// `invalid_api_key` error event quoting it masked, then close (how
    /// some deployments have answered a bad key, instead of a 401).
    KeyErrorFirst,
    /// Drop the TCP connection (no close frame) after this many audio deltas.
    DropMidResponse { after_deltas: usize },
    /// Close with this code and reason after each `response.done`.
    CloseAfterResponse { code: u16, reason: String },
    /// Read nothing while a response is in flight: a close is answered only
    /// after its `response.done`, as when that event was already on its way
    /// when the close arrived.
    FinishResponseBeforeClose,
    /// Refuse upgrades with 429 (`Retry-After: 2`, as OpenAI's rate limits
    /// answer) while this many sessions are open: a key at its limit, whose
    /// slots free up as sessions end.
    SessionLimit { max: usize },
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Accepted upstream keys; empty accepts any non-empty key.
    pub keys: Vec<String>,
    pub upgrade_delay: Duration,
    pub session_delay: Duration,
    /// `response.create` → first audio delta.
    pub inference_delay: Duration,
    pub audio_deltas: usize,
    /// Decoded bytes of audio per delta (PCM16 24 kHz: 2400 bytes = 50 ms).
    pub audio_delta_bytes: usize,
    pub delta_interval: Duration,
    pub fault: Option<SimFault>,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub max_message_bytes: usize,
    /// Keep a copy of every text frame sent and received, in
    /// [`SimStats::sent`] and [`SimStats::received`].
    pub record: bool,
    /// Response turns the simulated caller speaks per call, on the call's
    /// sideband (none: turns only on the sideband's `response.create`).
    pub caller_turns: usize,
    /// Time before each of the caller's turns.
    pub caller_turn_interval: Duration,
    /// How long the calls API takes to answer an `accept` it has already
    /// carried out (a slow upstream whose answer comes too late).
    pub accept_answer_delay: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            upgrade_delay: Duration::ZERO,
            session_delay: Duration::ZERO,
            inference_delay: Duration::ZERO,
            audio_deltas: 5,
            audio_delta_bytes: 2400,
            delta_interval: Duration::ZERO,
            fault: None,
            tls: None,
            max_message_bytes: 64 << 20,
            record: false,
            caller_turns: 0,
            caller_turn_interval: Duration::from_millis(50),
            accept_answer_delay: Duration::ZERO,
        }
    }
}

/// Counters a test can read.
#[derive(Debug, Default)]
pub struct SimStats {
    pub tcp_accepted: AtomicU64,
    pub upgrades: AtomicU64,
    pub refused: AtomicU64,
    pub sessions_active: AtomicUsize,
    pub audio_bytes_sent: AtomicU64,
    pub responses_done: AtomicU64,
    /// Close codes received from clients (the gateway's upstream leg).
    pub close_codes: Mutex<Vec<u16>>,
    /// The query string of every upgrade request, as received.
    pub queries: Mutex<Vec<String>>,
    /// The credential headers of every upgrade request, as received.
    pub auth_headers: Mutex<Vec<String>>,
    /// Text frames sent, when [`SimConfig::record`] is set.
    pub sent: Mutex<Vec<String>>,
    /// Text frames received from clients, in arrival order, when
    /// [`SimConfig::record`] is set.
    pub received: Mutex<Vec<String>>,
    pub pongs: AtomicU64,
    /// The `response_id` of every `response.cancel` received (`None`: the
    /// cancel named no response).
    pub cancels: Mutex<Vec<Option<String>>>,
    /// While set, every upgrade is refused with 401 (see [`SimHandle::set_refusing`]).
    pub refusing: std::sync::atomic::AtomicBool,
    /// Sessions holding a slot of [`SimFault::SessionLimit`] (taken by the
    /// upgrade's check, given back when the session ends).
    pub limited: AtomicUsize,
    /// Calls and what was asked of them.
    pub calls: SimCalls,
}

#[derive(Debug, Clone)]
enum Command {
    Ping,
    Close(u16),
    /// Drop the connection without a close frame (a lost connection).
    Drop,
}

/// A running simulator.
#[derive(Debug, Clone)]
pub struct SimHandle {
    pub addr: SocketAddr,
    pub stats: Arc<SimStats>,
    commands: broadcast::Sender<Command>,
    shutdown: CancellationToken,
}

impl SimHandle {
    /// `ws://addr/v1/realtime` (or `wss://` with TLS).
    pub fn url(&self, tls: bool) -> String {
        let scheme = if tls { "wss" } else { "ws" };
        format!("{scheme}://{}/v1/realtime", self.addr)
    }

    /// Sends a Ping to every open session.
    pub fn ping_all(&self) {
        let _ = self.commands.send(Command::Ping);
    }

    /// Closes every open session with `code`.
    pub fn close_all(&self, code: u16) {
        let _ = self.commands.send(Command::Close(code));
    }

    /// Drops every open session's connection without a close frame, as a
    /// lost connection (an idle timeout in a middlebox, a reset).
    pub fn drop_all(&self) {
        let _ = self.commands.send(Command::Drop);
    }

    /// Refuse (401) or accept new upgrades from now on.
    pub fn set_refusing(&self, refusing: bool) {
        self.stats.refusing.store(refusing, Ordering::Relaxed);
    }

    pub fn stop(&self) {
        self.shutdown.cancel();
    }
}

/// Binds and serves until [`SimHandle::stop`].
pub async fn start(listen: SocketAddr, config: SimConfig) -> std::io::Result<SimHandle> {
    let listener = crate::server::bind(listen)?;
    let addr = listener.local_addr()?;
    let (commands, _) = broadcast::channel(16);
    let handle = SimHandle {
        addr,
        stats: Arc::default(),
        commands,
        shutdown: CancellationToken::new(),
    };
    tokio::spawn(accept_loop(listener, Arc::new(config), handle.clone()));
    Ok(handle)
}

async fn accept_loop(listener: TcpListener, config: Arc<SimConfig>, handle: SimHandle) {
    loop {
        let accepted = tokio::select! {
            _ = handle.shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((tcp, _)) = accepted else { continue };
        let _ = tcp.set_nodelay(true);
        handle.stats.tcp_accepted.fetch_add(1, Ordering::Relaxed);
        let config = config.clone();
        let handle = handle.clone();
        tokio::spawn(async move {
            let shutdown = handle.shutdown.clone();
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = connection(tcp, config, handle) => {}
            }
        });
    }
}

type SimIo = Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>;

async fn connection(tcp: TcpStream, config: Arc<SimConfig>, handle: SimHandle) {
    if config.tls.is_none() {
        // A WebSocket upgrade is a GET; the calls API is POST (or OPTIONS).
        let mut first = [0u8; 4];
        let peeked = tokio::time::timeout(Duration::from_secs(10), tcp.peek(&mut first)).await;
        if matches!(peeked, Ok(Ok(4))) && (&first == b"POST" || &first == b"OPTI") {
            calls::serve(tcp, config, handle).await;
            return;
        }
    }
    let io: SimIo = match &config.tls {
        Some(tls) => match tokio_rustls::TlsAcceptor::from(tls.clone())
            .accept(tcp)
            .await
        {
            Ok(s) => Either::Right(s),
            Err(_) => return,
        },
        None => Either::Left(tcp),
    };
    if !config.upgrade_delay.is_zero() {
        tokio::time::sleep(config.upgrade_delay).await;
    }
    let mut beta = false;
    let mut transcription = false;
    let mut call = None;
    let mut slot = false;
    let check = UpgradeCheck {
        config: &config,
        stats: &handle.stats,
        beta: &mut beta,
        transcription: &mut transcription,
        call: &mut call,
        slot: &mut slot,
    };
    let ws_config = WebSocketConfig::default()
        .max_message_size(Some(config.max_message_bytes))
        .max_frame_size(Some(config.max_message_bytes));
    let accepted =
        tokio_tungstenite::accept_hdr_async_with_config(io, check, Some(ws_config)).await;
    match accepted {
        Ok(ws) => {
            handle.stats.upgrades.fetch_add(1, Ordering::Relaxed);
            handle.stats.sessions_active.fetch_add(1, Ordering::Relaxed);
            let mut session = Session::new(config, handle.clone(), beta);
            session.transcription = transcription;
            if transcription {
                session.input_transcription =
                    json!({"model": TRANSCRIPTION_MODEL, "language": null, "prompt": ""});
            }
            session.call = call;
            session.run(ws).await;
            handle.stats.sessions_active.fetch_sub(1, Ordering::Relaxed);
        }
        Err(_) => {
            handle.stats.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
    if slot {
        handle.stats.limited.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The upgrade's key check (a `Callback` rather than a closure: the return
/// type is tungstenite's, fixed by the trait).
struct UpgradeCheck<'a> {
    config: &'a SimConfig,
    stats: &'a SimStats,
    beta: &'a mut bool,
    transcription: &'a mut bool,
    /// The call a sideband (`?call_id=`) attached to.
    call: &'a mut Option<(String, CancellationToken)>,
    /// Set when the upgrade took a [`SimFault::SessionLimit`] slot.
    slot: &'a mut bool,
}

impl Callback for UpgradeCheck<'_> {
    fn on_request(self, req: &Request, resp: Response) -> Result<Response, ErrorResponse> {
        let header = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok());
        let key = header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .or_else(|| header("api-key"))
            .unwrap_or("");
        if let Ok(mut seen) = self.stats.auth_headers.lock() {
            seen.push(key.to_string());
        }
        *self.beta = header("openai-beta") == Some("realtime=v1");
        let query = req.uri().query().unwrap_or("").to_string();
        let params: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        *self.transcription = params
            .iter()
            .any(|(k, v)| k == "intent" && v == "transcription");
        let call_id = params
            .iter()
            .find(|(k, _)| k == "call_id")
            .map(|(_, v)| v.clone());
        // What the session is for: a model (Azure: a deployment) or a call.
        let names_what = params.iter().any(|(k, v)| {
            matches!(k.as_str(), "model" | "deployment" | "call_id") && !v.is_empty()
        });
        if let Ok(mut seen) = self.stats.queries.lock() {
            seen.push(query);
        }
        if let Some(SimFault::Refuse { status }) = &self.config.fault {
            return Err(refusal(*status, "simulated refusal"));
        }
        // Where the SDKs connect: `…/realtime` (`/v1/realtime`, Azure's
        // `/openai/realtime` and `/openai/v1/realtime`) naming the model
        // (Azure: the deployment) or, for a call's sideband, the call.
        if !req.uri().path().ends_with("/realtime") {
            return Err(refusal_coded(
                404,
                "invalid_url",
                "Invalid URL: no WebSocket endpoint here.",
            ));
        }
        if !names_what {
            return Err(refusal(400, "Missing required parameter: 'model'."));
        }
        if self.stats.refusing.load(Ordering::Relaxed) {
            return Err(refusal(401, "Incorrect API key provided."));
        }
        let known = self.config.keys.is_empty() || self.config.keys.iter().any(|k| k == key);
        if key.is_empty() || !known {
            // OpenAI's wording, with the key masked the way it masks it.
            let message = format!(
                "Incorrect API key provided: {}. You can find your API key at https://platform.openai.com/account/api-keys.",
                mask_key(key)
            );
            return Err(refusal(401, &message));
        }
        if let Some(SimFault::SessionLimit { max }) = &self.config.fault {
            let took = self
                .stats
                .limited
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < *max).then_some(n + 1)
                });
            if took.is_err() {
                return Err(refusal(429, "Too many concurrent sessions for this key."));
            }
            *self.slot = true;
        }
        if let Some(id) = call_id {
            match self.stats.calls.attach(&id) {
                Some(ended) => *self.call = Some((id, ended)),
                None => return Err(refusal(404, "call not found")),
            }
        }
        Ok(resp)
    }
}

/// The transcription model a transcription session starts with.
pub const TRANSCRIPTION_MODEL: &str = "gpt-4o-transcribe";

/// A key as OpenAI quotes it back: a short prefix, stars, the last four.
pub fn mask_key(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    if chars.len() <= 8 {
        return "*".repeat(chars.len());
    }
    let head: String = chars[..4].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}{}{tail}", "*".repeat(chars.len() - 8))
}

fn refusal(status: u16, message: &str) -> ErrorResponse {
    let code = match status {
        400 => "missing_required_parameter",
        401 => "invalid_api_key",
        404 => "call_not_found",
        429 => "rate_limit_exceeded",
        _ => "server_error",
    };
    refusal_coded(status, code, message)
}

fn refusal_coded(status: u16, code: &str, message: &str) -> ErrorResponse {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "code": code, "param": null}});
    let mut resp = http::Response::new(Some(body.to_string()));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if status == 429 {
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("2"),
        );
    }
    resp
}

/// Deterministic usage of the `n`-th response (1-based) of a session.
pub fn usage_for(n: u64, audio_deltas: usize) -> Value {
    let text_in = 20 + 5 * n;
    let audio_in = 100;
    let cached = if n > 1 { 64 } else { 0 };
    let text_out = TEXT_OUTPUT_TOKENS;
    let audio_out = AUDIO_TOKENS_PER_DELTA * audio_deltas as u64;
    let input = text_in + audio_in;
    let output = text_out + audio_out;
    json!({
        "total_tokens": input + output,
        "input_tokens": input,
        "output_tokens": output,
        "input_token_details": {
            "text_tokens": text_in,
            "audio_tokens": audio_in,
            "image_tokens": 0,
            "cached_tokens": cached,
            "cached_tokens_details": {"text_tokens": 0, "audio_tokens": cached, "image_tokens": 0}
        },
        "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out}
    })
}

struct Session {
    config: Arc<SimConfig>,
    handle: SimHandle,
    beta: bool,
    /// Opened with `?intent=transcription`.
    transcription: bool,
    id: String,
    seq: u64,
    responses: u64,
    items: u64,
    /// The session's instructions (`session.update` changes them).
    instructions: String,
    /// Input audio transcription (`audio.input.transcription` in GA,
    /// `input_audio_transcription` in beta): null (off) in a realtime
    /// session until a `session.update` sets it; a transcription session
    /// starts with [`TRANSCRIPTION_MODEL`]. A commit is transcribed only
    /// while it is set, as OpenAI's sessions do.
    input_transcription: Value,
    /// Events that arrived while a response was in flight, to handle next.
    deferred: std::collections::VecDeque<String>,
    /// Set on a call's sideband: the call id and its end.
    call: Option<(String, CancellationToken)>,
}

type Ws = WebSocketStream<SimIo>;

enum Flow {
    Continue,
    Stop,
}

/// What interrupted a response in flight.
enum Interrupt {
    Cancel,
    /// Closed by the client (answered) or the connection is gone.
    Ended,
}

impl Session {
    fn new(config: Arc<SimConfig>, handle: SimHandle, beta: bool) -> Self {
        Self {
            config,
            handle,
            beta,
            transcription: false,
            id: format!("sess_{}", crate::ids::short_id()),
            seq: 0,
            responses: 0,
            items: 0,
            instructions: "You are a helpful assistant.".into(),
            input_transcription: Value::Null,
            deferred: std::collections::VecDeque::new(),
            call: None,
        }
    }

    /// Records a client's close code and answers the close.
    async fn closed_by_client(&self, ws: &mut Ws, frame: Option<CloseFrame>) {
        if let (Some(f), Ok(mut codes)) = (frame, self.handle.stats.close_codes.lock()) {
            codes.push(u16::from(f.code));
        }
        let _ = ws.close(None).await;
    }

    /// Waits `wait` (zero: only what is readable now) while reading the
    /// client, as a response in flight does: a close or a lost connection
    /// ends the response, `response.cancel` cancels it, other events are
    /// kept for after it.
    async fn watch(&mut self, ws: &mut Ws, wait: Duration, response_id: &str) -> Option<Interrupt> {
        if matches!(self.config.fault, Some(SimFault::FinishResponseBeforeClose)) {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            return None;
        }
        let until = tokio::time::Instant::now() + wait;
        loop {
            let msg = if wait.is_zero() {
                match ws.next().now_or_never() {
                    Some(m) => m,
                    None => return None,
                }
            } else {
                match tokio::time::timeout_at(until, ws.next()).await {
                    Ok(m) => m,
                    Err(_) => return None,
                }
            };
            match msg {
                Some(Ok(Message::Text(text))) => {
                    self.record_received(&text);
                    if event_type(&text).as_deref() == Some("response.cancel") {
                        let target = cancel_target(&text);
                        if let Ok(mut seen) = self.handle.stats.cancels.lock() {
                            seen.push(target.clone());
                        }
                        // A cancel naming another response cancels nothing.
                        match target {
                            Some(id) if id != response_id => {
                                if !self.send(ws, cancel_not_active()).await {
                                    return Some(Interrupt::Ended);
                                }
                                continue;
                            }
                            _ => return Some(Interrupt::Cancel),
                        }
                    }
                    self.deferred.push_back(text.to_string());
                }
                Some(Ok(Message::Close(frame))) => {
                    self.closed_by_client(ws, frame).await;
                    return Some(Interrupt::Ended);
                }
                Some(Ok(Message::Pong(_))) => {
                    self.handle.stats.pongs.fetch_add(1, Ordering::Relaxed);
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return Some(Interrupt::Ended),
            }
        }
    }

    fn record_received(&self, text: &str) {
        if self.config.record {
            if let Ok(mut received) = self.handle.stats.received.lock() {
                received.push(text.to_string());
            }
        }
    }

    /// Applies a `session.update`, or gives the error's code, the invalid
    /// field and the message.
    fn update_session(&mut self, text: &str) -> Result<(), (&'static str, &'static str, String)> {
        let v: Value = serde_json::from_str(text).map_err(|_| {
            (
                "invalid_json",
                "",
                "The event could not be parsed.".to_string(),
            )
        })?;
        let Some(session) = v.get("session").and_then(Value::as_object) else {
            return Err((
                "missing_required_parameter",
                "session",
                "Missing required parameter: 'session'.".to_string(),
            ));
        };
        if !self.beta {
            // GA requires the session's type, and it cannot change.
            let own = if self.transcription {
                "transcription"
            } else {
                "realtime"
            };
            match session.get("type") {
                None => {
                    return Err((
                        "missing_required_parameter",
                        "session.type",
                        "Missing required parameter: 'session.type'.".to_string(),
                    ))
                }
                Some(Value::String(t)) if t == own => {}
                Some(other) => {
                    return Err((
                        "invalid_value",
                        "session.type",
                        format!("Invalid value: {other}. Supported values are: '{own}'."),
                    ))
                }
            }
        }
        let transcription = if self.beta {
            session.get("input_audio_transcription")
        } else {
            session
                .get("audio")
                .and_then(|a| a.get("input"))
                .and_then(|i| i.get("transcription"))
        };
        match transcription {
            None => {}
            Some(t @ Value::Null) => self.input_transcription = t.clone(),
            Some(t) if t.get("model").is_some_and(Value::is_string) => {
                self.input_transcription = t.clone()
            }
            Some(_) => {
                return Err((
                    "invalid_value",
                    if self.beta {
                        "session.input_audio_transcription.model"
                    } else {
                        "session.audio.input.transcription.model"
                    },
                    "Invalid value: a transcription needs a model.".to_string(),
                ))
            }
        }
        match session.get("instructions") {
            None => {}
            Some(Value::String(i)) => self.instructions = i.clone(),
            Some(_) => {
                return Err((
                    "invalid_type",
                    "session.instructions",
                    "Invalid type for 'session.instructions': expected a string.".to_string(),
                ))
            }
        }
        Ok(())
    }

    fn event_id(&mut self) -> String {
        self.seq += 1;
        format!("event_{}_{}", &self.id[5..13], self.seq)
    }

    async fn send(&mut self, ws: &mut Ws, mut event: Value) -> bool {
        // OpenAI writes `type` first, then `event_id`; serde_json's map is
        // sorted, so put those two in front by hand.
        let id = self.event_id();
        let kind = match event.as_object_mut().and_then(|o| o.remove("type")) {
            Some(Value::String(k)) => k,
            _ => String::new(),
        };
        let rest = event.to_string();
        let rest = rest.strip_prefix('{').unwrap_or("}");
        let sep = if rest == "}" { "" } else { "," };
        let text = format!(r#"{{"type":"{kind}","event_id":"{id}"{sep}{rest}"#);
        if self.config.record {
            if let Ok(mut sent) = self.handle.stats.sent.lock() {
                sent.push(text.clone());
            }
        }
        ws.send(Message::text(text)).await.is_ok()
    }

    async fn run(&mut self, mut ws: Ws) {
        let mut commands = self.handle.commands.subscribe();
        if !self.config.session_delay.is_zero() {
            tokio::time::sleep(self.config.session_delay).await;
        }
        let first_error = match self.config.fault {
            Some(SimFault::ErrorFirst) => {
                Some(("simulated_error", "simulated first-event error".to_string()))
            }
            Some(SimFault::KeyErrorFirst) => {
                let key = self
                    .handle
                    .stats
                    .auth_headers
                    .lock()
                    .ok()
                    .and_then(|k| k.last().cloned())
                    .unwrap_or_default();
                Some(("invalid_api_key", format!(
                    "Incorrect API key provided: {}. You can find your API key at https://platform.openai.com/account/api-keys.",
                    mask_key(&key)
                )))
            }
            _ => None,
        };
        if let Some((code, message)) = first_error {
            let error = json!({"type": "error", "error": {"type": "invalid_request_error",
                "code": code, "message": message, "param": null, "event_id": null}});
            self.send(&mut ws, error).await;
            let _ = ws.close(None).await;
            return;
        }
        let created = match (self.transcription, self.beta) {
            (true, true) => json!({"type": "transcription_session.created",
                                   "session": self.transcription_session_object()}),
            (true, false) => {
                let mut session = self.session_object();
                session["type"] = Value::from("transcription");
                json!({"type": "session.created", "session": session})
            }
            (false, _) => json!({"type": "session.created", "session": self.session_object()}),
        };
        if !self.send(&mut ws, created).await {
            return;
        }
        let call_ended = self
            .call
            .as_ref()
            .map(|(_, t)| t.clone())
            .unwrap_or_default();
        let mut next_turn = tokio::time::Instant::now() + self.config.caller_turn_interval;
        loop {
            if let Some(text) = self.deferred.pop_front() {
                if let Flow::Stop = self.on_event(&mut ws, &text).await {
                    return;
                }
                continue;
            }
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    Ok(Command::Ping) => { let _ = ws.send(Message::Ping(Bytes::from_static(b"sim"))).await; }
                    Ok(Command::Close(code)) => { close(&mut ws, code, "simulator closed the session").await; return; }
                    Ok(Command::Drop) => return,
                    Err(_) => {}
                },
                _ = call_ended.cancelled(), if self.call.is_some() => {
                    close(&mut ws, 1000, "call ended").await;
                    return;
                }
                _ = tokio::time::sleep_until(next_turn), if self.call.is_some() && self.config.caller_turns > 0 => {
                    next_turn = tokio::time::Instant::now() + self.config.caller_turn_interval;
                    let id = self.call.as_ref().map(|(id, _)| id.clone()).unwrap_or_default();
                    if self.handle.stats.calls.take_turn(&id, self.config.caller_turns) {
                        if let Flow::Stop = self.respond(&mut ws).await { return; }
                    }
                }
                msg = ws.next() => match msg {
                    Some(Ok(Message::Text(text))) => {
                        self.record_received(&text);
                        if let Flow::Stop = self.on_event(&mut ws, &text).await { return; }
                    }
                    Some(Ok(Message::Close(frame))) => {
                        self.closed_by_client(&mut ws, frame).await;
                        return;
                    }
                    Some(Ok(Message::Pong(_))) => {
                        self.handle.stats.pongs.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => return,
                },
            }
        }
    }

    fn session_object(&self) -> Value {
        json!({
            "type": "realtime",
            "object": "realtime.session",
            "id": self.id,
            "model": "gpt-realtime",
            "output_modalities": ["audio"],
            "instructions": self.instructions,
            "tools": [],
            "tool_choice": "auto",
            "max_output_tokens": "inf",
            "tracing": null,
            "prompt": null,
            "expires_at": 0,
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 24000},
                          "transcription": self.input_transcription,
                          "noise_reduction": null,
                          "turn_detection": {"type": "server_vad", "threshold": 0.5,
                                              "prefix_padding_ms": 300, "silence_duration_ms": 200}},
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy", "speed": 1.0}
            },
            "include": null
        })
    }

    /// The beta protocol's transcription session
    /// (`transcription_session.created`).
    fn transcription_session_object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "realtime.transcription_session",
            "modalities": ["text"],
            "input_audio_format": "pcm16",
            "input_audio_transcription": self.input_transcription,
            "turn_detection": {"type": "server_vad", "threshold": 0.5,
                               "prefix_padding_ms": 300, "silence_duration_ms": 500},
            "input_audio_noise_reduction": null,
            "include": null
        })
    }

    fn name<'a>(&self, ga: &'a str, beta: &'a str) -> &'a str {
        if self.beta {
            beta
        } else {
            ga
        }
    }

    async fn on_event(&mut self, ws: &mut Ws, text: &str) -> Flow {
        let kind = event_type(text).map(|t| t.into_owned());
        let ok = match kind.as_deref() {
            Some("session.update") => match self.update_session(text) {
                Ok(()) => {
                    let session = self.session_object();
                    self.send(ws, json!({"type": "session.updated", "session": session}))
                        .await
                }
                Err((code, param, message)) => {
                    let client_event_id = serde_json::from_str::<Value>(text)
                        .ok()
                        .and_then(|v| v.get("event_id").cloned())
                        .unwrap_or(Value::Null);
                    let error = json!({"type": "error", "error": {"type": "invalid_request_error",
                        "code": code, "message": message,
                        "param": if param.is_empty() { Value::Null } else { Value::String(param.into()) },
                        "event_id": client_event_id}});
                    self.send(ws, error).await
                }
            },
            Some("conversation.item.create") => {
                self.items += 1;
                let item = json!({"id": format!("item_{}", self.items), "type": "message",
                    "object": "realtime.item", "status": "completed", "role": "user",
                    "content": [{"type": "input_text", "text": "hello"}]});
                let added = self.name("conversation.item.added", "conversation.item.created");
                let ok = self
                    .send(
                        ws,
                        json!({"type": added, "previous_item_id": null, "item": item.clone()}),
                    )
                    .await;
                if ok && !self.beta {
                    self.send(ws, json!({"type": "conversation.item.done", "previous_item_id": null, "item": item}))
                        .await
                } else {
                    ok
                }
            }
            Some("input_audio_buffer.commit") => {
                self.items += 1;
                let item_id = format!("item_{}", self.items);
                let item = json!({"id": item_id, "type": "message", "object": "realtime.item",
                    "status": "completed", "role": "user",
                    "content": [{"type": "input_audio", "transcript": null}]});
                let added = self.name("conversation.item.added", "conversation.item.created");
                let transcribed = !self.input_transcription.is_null();
                self.send(ws, json!({"type": "input_audio_buffer.committed", "previous_item_id": null, "item_id": item_id}))
                    .await
                    && self.send(ws, json!({"type": added, "previous_item_id": null, "item": item})).await
                    && (!transcribed || self
                        .send(ws, json!({
                            "type": "conversation.item.input_audio_transcription.completed",
                            "item_id": item_id, "content_index": 0, "transcript": "hello there",
                            "usage": {"type": "tokens", "input_tokens": 30, "output_tokens": 5,
                                      "total_tokens": 35,
                                      "input_token_details": {"audio_tokens": 30, "text_tokens": 0}}
                        }))
                        .await)
            }
            Some("response.create") => return self.respond(ws).await,
            Some("response.cancel") => {
                if let Ok(mut seen) = self.handle.stats.cancels.lock() {
                    seen.push(cancel_target(text));
                }
                self.send(ws, cancel_not_active()).await
            }
            Some(_) => true,
            None => {
                let error = json!({"type": "error", "error": {"type": "invalid_request_error",
                    "code": "invalid_json", "message": "The event could not be parsed.",
                    "param": null, "event_id": null}});
                self.send(ws, error).await
            }
        };
        if ok {
            Flow::Continue
        } else {
            Flow::Stop
        }
    }

    async fn respond(&mut self, ws: &mut Ws) -> Flow {
        self.responses += 1;
        let n = self.responses;
        let resp_id = format!("resp_{}_{n}", &self.id[5..13]);
        let item_id = format!("item_out_{n}");
        let response = |status: &str, usage: Value| {
            json!({"object": "realtime.response", "id": resp_id, "status": status,
                   "status_details": null, "output": [], "conversation_id": "conv_sim",
                   "output_modalities": ["audio"], "max_output_tokens": "inf",
                   "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy"}},
                   "usage": usage, "metadata": null})
        };
        if !self
            .send(ws, json!({"type": "response.created", "response": response("in_progress", Value::Null)}))
            .await
        {
            return Flow::Stop;
        }
        let mut sent = 0;
        let interrupt = 'deltas: {
            if let Some(i) = self.watch(ws, self.config.inference_delay, &resp_id).await {
                break 'deltas Some(i);
            }
            let audio = base64::engine::general_purpose::STANDARD
                .encode(vec![0u8; self.config.audio_delta_bytes]);
            let audio_delta = self.name("response.output_audio.delta", "response.audio.delta");
            let transcript_delta = self.name(
                "response.output_audio_transcript.delta",
                "response.audio_transcript.delta",
            );
            for i in 0..self.config.audio_deltas {
                if let Some(i) = self.watch(ws, Duration::ZERO, &resp_id).await {
                    break 'deltas Some(i);
                }
                if let Some(SimFault::DropMidResponse { after_deltas }) = self.config.fault {
                    if i == after_deltas {
                        // Drop the TCP connection without a close frame.
                        return Flow::Stop;
                    }
                }
                let delta = json!({"type": audio_delta, "response_id": resp_id, "item_id": item_id,
                "output_index": 0, "content_index": 0, "delta": audio});
                if !self.send(ws, delta).await {
                    return Flow::Stop;
                }
                self.handle
                    .stats
                    .audio_bytes_sent
                    .fetch_add(audio.len() as u64, Ordering::Relaxed);
                let t = json!({"type": transcript_delta, "response_id": resp_id, "item_id": item_id,
                "output_index": 0, "content_index": 0, "delta": "la "});
                if !self.send(ws, t).await {
                    return Flow::Stop;
                }
                sent += 1;
                if let Some(i) = self.watch(ws, self.config.delta_interval, &resp_id).await {
                    break 'deltas Some(i);
                }
            }
            None
        };
        match interrupt {
            Some(Interrupt::Ended) => return Flow::Stop,
            Some(Interrupt::Cancel) => {
                let usage = usage_for(n, sent);
                return if self
                    .send(
                        ws,
                        json!({"type": "response.done", "response": response("cancelled", usage)}),
                    )
                    .await
                {
                    Flow::Continue
                } else {
                    Flow::Stop
                };
            }
            None => {}
        }
        let audio_done = self.name("response.output_audio.done", "response.audio.done");
        let transcript_done = self.name(
            "response.output_audio_transcript.done",
            "response.audio_transcript.done",
        );
        let ok = self
            .send(
                ws,
                json!({"type": audio_done, "response_id": resp_id, "item_id": item_id,
                "output_index": 0, "content_index": 0}),
            )
            .await
            && self
                .send(
                    ws,
                    json!({"type": transcript_done, "response_id": resp_id, "item_id": item_id,
                    "output_index": 0, "content_index": 0, "transcript": "la la la"}),
                )
                .await
            && self
                .send(
                    ws,
                    json!({"type": "response.done",
                    "response": response("completed", usage_for(n, self.config.audio_deltas))}),
                )
                .await;
        if !ok {
            return Flow::Stop;
        }
        self.handle
            .stats
            .responses_done
            .fetch_add(1, Ordering::Relaxed);
        if let Some(SimFault::CloseAfterResponse { code, reason }) = &self.config.fault {
            let (code, reason) = (*code, reason.clone());
            close(ws, code, &reason).await;
            return Flow::Stop;
        }
        Flow::Continue
    }
}

/// The `response_id` a `response.cancel` names, if any.
fn cancel_target(text: &str) -> Option<String> {
    serde_json::from_str::<Value>(text)
        .ok()?
        .get("response_id")?
        .as_str()
        .map(str::to_string)
}

/// OpenAI's answer to a cancel when no such response is in progress.
fn cancel_not_active() -> Value {
    json!({"type": "error", "error": {"type": "invalid_request_error",
        "code": "response_cancel_not_active",
        "message": "Cancellation failed: no active response found",
        "param": null, "event_id": null}})
}

async fn close(ws: &mut Ws, code: u16, reason: &str) {
    let _ = ws
        .close(Some(CloseFrame {
            code: CloseCode::from(code),
            reason: reason.to_string().into(),
        }))
        .await;
    // Drain until the peer answers the close (or goes away).
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    type Client = WebSocketStream<TcpStream>;
    const WAIT: Duration = Duration::from_secs(10);

    /// A response of 50 deltas 20 ms apart: one second in flight.
    async fn slow_sim(fault: Option<SimFault>) -> SimHandle {
        start(
            "127.0.0.1:0".parse().unwrap(),
            SimConfig {
                audio_deltas: 50,
                audio_delta_bytes: 16,
                delta_interval: Duration::from_millis(20),
                fault,
                ..SimConfig::default()
            },
        )
        .await
        .unwrap()
    }

    async fn connect(sim: &SimHandle) -> Client {
        let mut request = format!("{}?model=gpt-realtime", sim.url(false))
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("authorization", "Bearer sk-any".parse().unwrap());
        let tcp = TcpStream::connect(sim.addr).await.unwrap();
        let (mut ws, _) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
        assert_eq!(next_type(&mut ws).await.unwrap(), "session.created");
        ws
    }

    /// The next text frame's type and text; `None` at a close or the end.
    async fn next_event(ws: &mut Client) -> Option<(String, String)> {
        loop {
            match tokio::time::timeout(WAIT, ws.next())
                .await
                .expect("in time")
            {
                Some(Ok(Message::Text(t))) => {
                    let kind = event_type(&t).map(|k| k.into_owned()).unwrap_or_default();
                    return Some((kind, t.to_string()));
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return None,
                Some(Ok(_)) => {}
            }
        }
    }

    async fn next_type(ws: &mut Client) -> Option<String> {
        next_event(ws).await.map(|(k, _)| k)
    }

    async fn send_update(ws: &mut Client, session: Value) {
        let update = json!({"type": "session.update", "event_id": "evt_c1", "session": session});
        ws.send(Message::text(update.to_string())).await.unwrap();
    }

    #[tokio::test]
    async fn session_update_is_kept_and_an_invalid_one_is_an_error_naming_the_field() {
        let sim = start(
            "127.0.0.1:0".parse().unwrap(),
            SimConfig {
                record: true,
                ..SimConfig::default()
            },
        )
        .await
        .unwrap();
        let mut ws = connect(&sim).await;
        send_update(
            &mut ws,
            json!({"type": "realtime", "instructions": "Be brief."}),
        )
        .await;
        let (kind, text) = next_event(&mut ws).await.unwrap();
        assert_eq!(kind, "session.updated");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["session"]["instructions"], "Be brief.");
        for (session, code, param) in [
            (
                json!({"type": "transcription"}),
                "invalid_value",
                "session.type",
            ),
            (
                json!({"instructions": "x"}),
                "missing_required_parameter",
                "session.type",
            ),
            (
                json!({"type": "realtime", "instructions": 5}),
                "invalid_type",
                "session.instructions",
            ),
            (
                json!({"type": "realtime", "audio": {"input": {"transcription": {}}}}),
                "invalid_value",
                "session.audio.input.transcription.model",
            ),
            (Value::Null, "missing_required_parameter", "session"),
        ] {
            send_update(&mut ws, session).await;
            let (kind, text) = next_event(&mut ws).await.unwrap();
            assert_eq!(kind, "error", "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["error"]["code"], code, "{text}");
            assert_eq!(v["error"]["param"], param, "{text}");
            assert_eq!(v["error"]["event_id"], "evt_c1", "{text}");
        }
        // Unchanged by the refused updates, and kept for the session.
        send_update(&mut ws, json!({"type": "realtime"})).await;
        let (_, text) = next_event(&mut ws).await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["session"]["instructions"], "Be brief.");
        assert_eq!(v["session"]["audio"]["input"]["transcription"], Value::Null);
        let received = sim.stats.received.lock().unwrap().clone();
        assert_eq!(received.len(), 7, "{received:?}");
        assert!(received[0].contains("Be brief."), "{received:?}");
        sim.stop();
    }

    async fn send_type(ws: &mut Client, kind: &str) {
        ws.send(Message::text(format!(r#"{{"type":"{kind}"}}"#)))
            .await
            .unwrap();
    }

    async fn until_first_delta(ws: &mut Client) {
        while next_type(ws).await.expect("a delta before the end") != "response.output_audio.delta"
        {
        }
    }

    #[tokio::test]
    async fn cancel_ends_the_response_with_usage_for_what_was_sent() {
        let sim = slow_sim(None).await;
        let mut ws = connect(&sim).await;
        send_type(&mut ws, "response.create").await;
        until_first_delta(&mut ws).await;
        send_type(&mut ws, "response.cancel").await;
        let mut deltas = 1;
        let done = loop {
            let (kind, text) = next_event(&mut ws).await.expect("response.done");
            match kind.as_str() {
                "response.output_audio.delta" => deltas += 1,
                "response.done" => break serde_json::from_str::<Value>(&text).unwrap(),
                _ => {}
            }
        };
        assert_eq!(done["response"]["status"], "cancelled");
        assert!(deltas < 50, "cancelled early: {deltas} deltas");
        assert_eq!(
            done["response"]["usage"]["output_token_details"]["audio_tokens"],
            AUDIO_TOKENS_PER_DELTA * deltas
        );
        // The session goes on.
        send_update(&mut ws, json!({"type": "realtime"})).await;
        assert_eq!(next_type(&mut ws).await.unwrap(), "session.updated");
        sim.stop();
    }

    #[tokio::test]
    async fn a_cancel_for_another_response_or_none_in_flight_is_an_error() {
        let sim = slow_sim(None).await;
        let mut ws = connect(&sim).await;
        send_type(&mut ws, "response.cancel").await;
        let (kind, text) = next_event(&mut ws).await.unwrap();
        assert_eq!(kind, "error");
        assert!(text.contains("response_cancel_not_active"), "{text}");
        send_type(&mut ws, "response.create").await;
        let created = loop {
            let (kind, text) = next_event(&mut ws).await.unwrap();
            if kind == "response.created" {
                break serde_json::from_str::<Value>(&text).unwrap();
            }
        };
        let id = created["response"]["id"].as_str().unwrap().to_string();
        let cancel = |id: &str| {
            Message::text(json!({"type": "response.cancel", "response_id": id}).to_string())
        };
        ws.send(cancel("resp_other")).await.unwrap();
        // The response goes on; the wrong cancel is answered with an error.
        let mut saw_error = false;
        while !saw_error {
            let (kind, _) = next_event(&mut ws).await.unwrap();
            assert_ne!(kind, "response.done");
            saw_error = kind == "error";
        }
        ws.send(cancel(&id)).await.unwrap();
        let done = loop {
            let (kind, text) = next_event(&mut ws).await.unwrap();
            if kind == "response.done" {
                break serde_json::from_str::<Value>(&text).unwrap();
            }
        };
        assert_eq!(done["response"]["status"], "cancelled");
        assert_eq!(
            *sim.stats.cancels.lock().unwrap(),
            vec![None, Some("resp_other".to_string()), Some(id)]
        );
        sim.stop();
    }

    /// Starts a response, closes with `frame` after its first delta, and
    /// returns the event types that still came, and how long the simulator
    /// took to answer the close.
    async fn close_mid_response(
        sim: &SimHandle,
        frame: Option<CloseFrame>,
    ) -> (Vec<String>, Duration) {
        let mut ws = connect(sim).await;
        send_type(&mut ws, "response.create").await;
        until_first_delta(&mut ws).await;
        let started = std::time::Instant::now();
        ws.send(Message::Close(frame)).await.unwrap();
        let mut after_close = Vec::new();
        while let Some(kind) = next_type(&mut ws).await {
            after_close.push(kind);
        }
        (after_close, started.elapsed())
    }

    #[tokio::test]
    async fn a_close_during_a_response_is_answered_at_once() {
        let sim = slow_sim(None).await;
        let frame = CloseFrame {
            code: CloseCode::from(4000),
            reason: "bye".into(),
        };
        let (after_close, took) = close_mid_response(&sim, Some(frame)).await;
        // At most the frames already on their way, never the rest of a
        // one-second response.
        assert!(took < Duration::from_millis(500), "{took:?}");
        assert!(
            !after_close.iter().any(|k| k == "response.done"),
            "{after_close:?}"
        );
        assert_eq!(*sim.stats.close_codes.lock().unwrap(), vec![4000]);
        sim.stop();
    }

    #[tokio::test]
    async fn with_the_fault_a_close_waits_for_the_response_done() {
        let sim = slow_sim(Some(SimFault::FinishResponseBeforeClose)).await;
        let (after_close, _) = close_mid_response(&sim, None).await;
        assert_eq!(
            after_close.last().map(String::as_str),
            Some("response.done")
        );
        sim.stop();
    }

    /// Upgrades go to `…/realtime` and name a model, a deployment or a
    /// call, as the SDKs build them.
    #[tokio::test]
    async fn an_upgrade_elsewhere_or_naming_no_model_is_refused() {
        let sim = slow_sim(None).await;
        let status = |path: &'static str| {
            let addr = sim.addr;
            async move {
                let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
                request
                    .headers_mut()
                    .insert("authorization", "Bearer sk-any".parse().unwrap());
                let tcp = TcpStream::connect(addr).await.unwrap();
                match tokio_tungstenite::client_async(request, tcp).await {
                    Ok(_) => 101,
                    Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
                    Err(e) => panic!("{e}"),
                }
            }
        };
        assert_eq!(status("/v1/realtime?model=gpt-realtime").await, 101);
        assert_eq!(
            status("/openai/realtime?api-version=x&deployment=d").await,
            101
        );
        assert_eq!(status("/v1/realtime/?model=gpt-realtime").await, 404);
        assert_eq!(status("/v1/chat?model=gpt-realtime").await, 404);
        assert_eq!(status("/v1/realtime").await, 400);
        assert_eq!(status("/v1/realtime?model=").await, 400);
        sim.stop();
    }

    /// A commit is transcribed (and its usage reported) only while the
    /// session has transcription on, as a `session.update` sets it.
    #[tokio::test]
    async fn a_commit_is_transcribed_only_with_transcription_on() {
        let sim = slow_sim(None).await;
        let mut ws = connect(&sim).await;
        send_type(&mut ws, "input_audio_buffer.commit").await;
        send_type(&mut ws, "conversation.item.create").await;
        let mut kinds = Vec::new();
        while kinds.last().map(String::as_str) != Some("conversation.item.done") {
            kinds.push(next_type(&mut ws).await.expect("events"));
        }
        assert!(
            !kinds.iter().any(|k| k.contains("transcription")),
            "{kinds:?}"
        );
        send_update(
            &mut ws,
            json!({"type": "realtime", "audio": {"input": {"transcription": {"model": TRANSCRIPTION_MODEL}}}}),
        )
        .await;
        let (_, text) = next_event(&mut ws).await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["session"]["audio"]["input"]["transcription"]["model"],
            TRANSCRIPTION_MODEL
        );
        send_type(&mut ws, "input_audio_buffer.commit").await;
        while next_type(&mut ws).await.expect("events")
            != "conversation.item.input_audio_transcription.completed"
        {}
        sim.stop();
    }

    #[tokio::test]
    async fn events_sent_during_a_response_are_answered_after_it_in_order() {
        let sim = slow_sim(None).await;
        let mut ws = connect(&sim).await;
        send_type(&mut ws, "response.create").await;
        send_update(
            &mut ws,
            json!({"type": "realtime", "audio": {"input": {"transcription": {"model": TRANSCRIPTION_MODEL}}}}),
        )
        .await;
        send_type(&mut ws, "input_audio_buffer.commit").await;
        let mut order = Vec::new();
        while order.last().map(String::as_str)
            != Some("conversation.item.input_audio_transcription.completed")
        {
            let kind = next_type(&mut ws).await.expect("events");
            if !kind.contains("delta") {
                order.push(kind);
            }
        }
        let at = |k: &str| order.iter().position(|o| o == k).unwrap();
        assert!(at("response.done") < at("session.updated"), "{order:?}");
        assert!(
            at("session.updated") < at("input_audio_buffer.committed"),
            "{order:?}"
        );
        sim.stop();
    }
}
