//! The turn tracker: sees every upstream text frame on its way to the
//! client and turns `response.created` … `response.done` into turn records.
//!
//! It is owned by the relay task and called through `&mut` ([`Tap`]), so
//! there is no lock or atomic per frame. Closed turns leave through a
//! bounded channel ([`CHANNEL_CAPACITY`]) to the meter. A closing record
//! (a `response.done`, a transcription's usage, a turn cut short by the
//! session's end) is never dropped: when the channel is full it waits in
//! the tracker, and the relay reads no further upstream frame until the
//! meter has taken it ([`Tap::poll_ready`]): a burst slows the relay, it
//! cannot lose a billed turn. Only a turn evicted as `never_done` (more
//! than [`MAX_OPEN_TURNS`] in flight) is dropped when the channel is full
//! or a closing record waits, counted on
//! `patchbay_usage_records_dropped_total`. Memory stays bounded: the relay
//! checks before every upstream frame, and one frame closes at most one
//! turn (the session's end at most [`MAX_OPEN_TURNS`]).
//!
//! Cost per frame. The event type is read without parsing the frame:
//! 1. from the leading bytes (first key, or second behind `event_id`:
//!    [`crate::event::leading_event_type`]);
//! 2. else from the trailing bytes (`…,"type":"x"}`: the shape of encoders
//!    that sort keys, such as serde_json's default map, which the simulator
//!    uses);
//! 3. else a substring scan for `"response.`, `"session.` and the
//!    transcription event's name; only a frame that contains one is given to
//!    [`crate::event::event_type`]'s full (but allocation-free) fallback.
//!
//! Only `response.created`, `response.done`,
//! `conversation.item.input_audio_transcription.completed` and the rare
//! `session.created`/`session.updated` are deserialised, each into a struct
//! that skips every field it does not name ([`super::upstream_events`]). Deltas matter only until their
//! turn has its first token: then the tracker looks for `"response_id"` in
//! the delta, and afterwards skips deltas after step 1 or 2.
//!
//! Semantics:
//! - `response.created` opens a turn (its clock starts); `response.done`
//!   closes the turn with the same response id. The turn keeps the
//!   response's id and its `conversation_id` (read in the same pass) for
//!   telemetry. A `done` whose `created` was
//!   never seen is still billed, with zero latency.
//! - A response id is charged once per session: a `response.done` for a
//!   response this session already metered (a replayed event) makes no
//!   record and is counted on `patchbay_usage_duplicates_total`, and a
//!   `response.created` for one opens no turn. The last
//!   [`METERED_IDS_KEPT`] ids are remembered (as keyed 64-bit hashes, 8
//!   bytes each; a `done` without an id cannot be matched and is billed).
//! - Time to first token: the first `response.*.delta` (GA or beta name)
//!   naming the turn's response, or naming none. Deltas of another response
//!   and `conversation.item.input_audio_transcription.delta` never stamp it.
//! - `response.done` status: `completed`/`incomplete` → 200, `cancelled` →
//!   499, `failed` → 502; usage is billed whenever it is reported. Once the
//!   session is ending ([`Tap::ending`]), a `cancelled` one answers the
//!   teardown's cancel: its row gets the cause's status and `end_reason`
//!   ([`EndReason`]) with the usage it reports.
//! - Transcription usage is its own record, priced on the transcription
//!   model, learnt from `session.created`/`session.updated`
//!   (`session.audio.input.transcription.model`, beta
//!   `session.input_audio_transcription.model`).
//! - [`TurnTracker::finish`] turns every response still in flight into a
//!   record with unknown usage and a status for why the session ended
//!   ([`EndReason`]), then closes the channel so the meter's final flush
//!   runs. Dropping the tracker without `finish` does the same with
//!   [`EndReason::Aborted`].
//!
//! Caveats: an event type written with JSON escapes is recognised only if a
//! scanned substring still matches; at most [`MAX_OPEN_TURNS`] responses are
//! tracked at once (the oldest is closed as unknown past that).

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use memchr::memmem::{Finder, FinderRev};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::PollSender;

use super::pricing::Usage;
use super::upstream_events::{CreatedEvent, DoneEvent, SessionEvent, TranscriptionEvent};
use crate::event::{event_type, leading_event_type, plain_string, skip_ws};
use crate::relay::{End, Tap};

/// Capacity of the tracker → meter channel.
pub const CHANNEL_CAPACITY: usize = 1024;

/// A record as the channel carries it: boxed, because tokio's channel
/// allocates its slots 32 at a time and keeps that block for the channel's
/// life. Records by value made it 32 × ~230 bytes, ~7 KB held by every
/// session from its start, idle or not (heap profile of idle calls,
/// `benchmarks/HISTORY.md`, 2026-12-04); boxed it is 32 pointers, for one
/// allocation per closed turn.
pub type SentRecord = Box<TurnRecord>;
/// Responses tracked at once; the Realtime API runs one per conversation,
/// plus out-of-band ones.
pub const MAX_OPEN_TURNS: usize = 16;
/// Metered response ids a session remembers to charge each once: a replay
/// comes right after its original, and this covers thousands of turns (the
/// hashes take at most 32 KiB, grown as turns are metered).
pub const METERED_IDS_KEPT: usize = 4096;

/// Keys the hashes of metered response ids (random per process, so an
/// upstream cannot choose ids that collide).
static ID_HASHER: LazyLock<RandomState> = LazyLock::new(RandomState::new);

const CREATED: &str = "response.created";
const DONE: &str = "response.done";
const TRANSCRIPTION_COMPLETED: &str = "conversation.item.input_audio_transcription.completed";
const TRANSCRIPTION_COMPLETED_QUOTED: &str =
    "\"conversation.item.input_audio_transcription.completed\"";

/// `kill` outcome label of a session closed for a spent budget.
pub const OUTCOME_BUDGET_EXHAUSTED: &str = "budget_exhausted";
/// `kill` outcome label of a session whose key was removed or disabled.
pub const OUTCOME_KEY_REVOKED: &str = "key_revoked";
/// `kill` outcome label of a session the upstream moved to a model the key
/// may not use ([`super::client_models`]).
pub const OUTCOME_MODEL_REFUSED: &str = "model_refused";

/// Why a session ended, as far as its in-flight responses are concerned:
/// one value per cause, each with the status its cut-short rows carry.
/// A response the teardown cancelled keeps the cause's status and
/// `end_reason` and carries the usage of its cancelled `response.done`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// The client sent a close. 499.
    ClientClosed,
    /// The client's connection dropped without a close. 499.
    ClientLeft,
    /// The client sent a frame or message over `max_message_bytes`. 499.
    ClientOversizeFrame,
    /// The client broke the WebSocket protocol (invalid UTF-8 included). 499.
    ClientProtocolError,
    /// The upstream closed the session. 502.
    UpstreamClosed,
    /// The upstream's connection was lost. 502.
    UpstreamFailed,
    /// The upstream sent a message over `max_message_bytes`. 502.
    UpstreamOversizeFrame,
    /// No frame either way for `idle_timeout_secs`. 408.
    IdleTimeout,
    /// The session reached `max_session_secs`. 408.
    MaxDuration,
    /// Closed for a spent budget. 402.
    Budget,
    /// Closed because the key was removed or disabled. 403.
    KeyRevoked,
    /// Closed because its session took a model the key may not use. 403.
    ModelRefused,
    /// The gateway is shutting down. 503.
    Shutdown,
    /// The tracker was dropped without [`TurnTracker::finish`]. 500.
    Aborted,
}

impl EndReason {
    pub fn status(self) -> u16 {
        match self {
            EndReason::ClientClosed
            | EndReason::ClientLeft
            | EndReason::ClientOversizeFrame
            | EndReason::ClientProtocolError => 499,
            EndReason::UpstreamClosed
            | EndReason::UpstreamFailed
            | EndReason::UpstreamOversizeFrame => 502,
            EndReason::IdleTimeout | EndReason::MaxDuration => 408,
            EndReason::Budget => 402,
            EndReason::KeyRevoked | EndReason::ModelRefused => 403,
            EndReason::Shutdown => 503,
            EndReason::Aborted => 500,
        }
    }

    /// The row's `end_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::ClientClosed => "client_closed",
            EndReason::ClientLeft => "client_left",
            EndReason::ClientOversizeFrame => "client_oversize_frame",
            EndReason::ClientProtocolError => "client_protocol_error",
            EndReason::UpstreamClosed => "upstream_closed",
            EndReason::UpstreamFailed => "upstream_failed",
            EndReason::UpstreamOversizeFrame => "upstream_oversize_frame",
            EndReason::IdleTimeout => "idle_timeout",
            EndReason::MaxDuration => "max_session_duration",
            EndReason::Budget => OUTCOME_BUDGET_EXHAUSTED,
            EndReason::KeyRevoked => OUTCOME_KEY_REVOKED,
            EndReason::ModelRefused => OUTCOME_MODEL_REFUSED,
            EndReason::Shutdown => "shutdown",
            EndReason::Aborted => "aborted",
        }
    }

    /// How the relay's end maps to a cause.
    pub fn from_end(end: &End) -> Self {
        match end {
            End::ClientClosed(_) => EndReason::ClientClosed,
            End::ClientGone => EndReason::ClientLeft,
            End::ClientTooBig => EndReason::ClientOversizeFrame,
            End::ClientProtocolError(_) => EndReason::ClientProtocolError,
            End::UpstreamClosed(_) => EndReason::UpstreamClosed,
            End::UpstreamGone => EndReason::UpstreamFailed,
            End::UpstreamTooBig => EndReason::UpstreamOversizeFrame,
            End::IdleTimeout => EndReason::IdleTimeout,
            End::MaxDuration => EndReason::MaxDuration,
            End::Killed(k) => match k.outcome {
                OUTCOME_BUDGET_EXHAUSTED => EndReason::Budget,
                OUTCOME_KEY_REVOKED => EndReason::KeyRevoked,
                OUTCOME_MODEL_REFUSED => EndReason::ModelRefused,
                _ => EndReason::Shutdown,
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum TurnKind {
    Response,
    /// Input-audio transcription, on the session's transcription model
    /// (`None` when no session event named one).
    Transcription {
        model: Option<String>,
    },
    /// A translation session's window of audio, measured by the gateway
    /// ([`super::translation`], [`super::call_time`]); its usage is the
    /// billed seconds; `output_seconds` is `None` where the output audio is
    /// not seen (a WebRTC call's media).
    Translation {
        output_seconds: Option<f64>,
    },
    /// A Live session's window of billed seconds, from the upstream's
    /// cumulative figures ([`super::live`]); `estimated` when the last
    /// figure never came and the time since the one before is charged.
    Live {
        estimated: bool,
    },
    /// A response a Live session delegated to a Responses backend
    /// ([`super::delegated`]): text tokens of its own `model`, its row
    /// named by the record's `response_id`.
    Delegated {
        model: String,
        delegation_id: Option<String>,
    },
}

/// A closed turn, on its way to the meter.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRecord {
    /// 1-based, per session; the row's `request_id` is `<session>:<n>`.
    pub n: u64,
    pub kind: TurnKind,
    pub started_at: SystemTime,
    pub ended_at: SystemTime,
    pub latency: Duration,
    pub ttft: Option<Duration>,
    pub status: u16,
    pub end_reason: &'static str,
    /// `None`: usage unknown (cut short, or not reported).
    pub usage: Option<Usage>,
    /// The response's id, as its events named it (moved from the open
    /// turn, never parsed again); `None` for other kinds of turn.
    pub response_id: Option<String>,
    /// The conversation the response was added to, as its `response.done`
    /// (else its `response.created`) named it: `None` for a response out
    /// of band, and for other kinds of turn.
    pub conversation_id: Option<String>,
}

#[derive(Debug)]
struct OpenTurn {
    n: u64,
    response_id: Option<String>,
    conversation_id: Option<String>,
    started: Instant,
    started_at: SystemTime,
    ttft: Option<Duration>,
}

/// Tracks the turns of one session. See the module docs.
#[derive(Debug)]
pub struct TurnTracker {
    tx: mpsc::Sender<SentRecord>,
    /// The same channel, for waiting on room ([`Tap::poll_ready`]).
    room: PollSender<SentRecord>,
    /// Closing records the full channel could not take yet, in order.
    waiting: VecDeque<SentRecord>,
    dropped: Counter,
    open: Vec<OpenTurn>,
    /// Open turns without a first token yet; deltas are looked at only
    /// while this is non-zero.
    waiting_ttft: usize,
    turns: u64,
    transcription_model: Option<String>,
    /// Session events (`session.created`/`updated`) seen.
    session_events: u64,
    /// Set when the session started ending: cancelled responses are then
    /// the teardown's, and their rows carry this cause.
    ending: Option<EndReason>,
    /// Hashes of the response ids metered so far, oldest first (at most
    /// [`METERED_IDS_KEPT`]).
    metered: VecDeque<u64>,
    /// Counts `response.done` events for an already metered response.
    duplicates: Counter,
}

impl TurnTracker {
    /// A tracker sending to `tx`; `dropped` counts `never_done` evictions
    /// lost to a full channel (and records the meter can no longer take).
    pub fn new(tx: mpsc::Sender<SentRecord>, dropped: Counter) -> Self {
        Self {
            room: PollSender::new(tx.clone()),
            tx,
            waiting: VecDeque::new(),
            dropped,
            open: Vec::new(),
            waiting_ttft: 0,
            turns: 0,
            transcription_model: None,
            session_events: 0,
            ending: None,
            metered: VecDeque::new(),
            duplicates: Counter::default(),
        }
    }

    /// Counts repeated `response.done` events on `duplicates` (a counter of
    /// its own otherwise).
    pub fn counting_duplicates(mut self, duplicates: Counter) -> Self {
        self.duplicates = duplicates;
        self
    }

    /// Whether the response `id` was metered in this session.
    fn metered(&self, id: &str) -> bool {
        let h = ID_HASHER.hash_one(id);
        self.metered.contains(&h)
    }

    fn remember_metered(&mut self, id: &str) {
        if self.metered.len() >= METERED_IDS_KEPT {
            self.metered.pop_front();
        }
        self.metered.push_back(ID_HASHER.hash_one(id));
    }

    /// Responses in flight.
    pub fn open_turns(&self) -> usize {
        self.open.len()
    }

    /// The transcription model the last session event named.
    pub fn transcription_model(&self) -> Option<&str> {
        self.transcription_model.as_deref()
    }

    /// Session events seen so far: a change says the session's settings
    /// (its transcription model) may have changed.
    pub fn session_events(&self) -> u64 {
        self.session_events
    }

    /// Ends tracking: responses in flight become records with unknown usage
    /// and `reason`'s status, and the channel closes, which lets the meter
    /// run its final flush and end.
    pub fn finish(mut self, reason: EndReason) {
        self.cut_short(reason);
        self.hand_over_waiting();
    }

    /// Closing records still waiting for room: a task delivers them and
    /// holds the channel open until it has, so the meter's final flush
    /// counts them.
    fn hand_over_waiting(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut self.waiting);
        let lost = waiting.len() as u64;
        let tx = self.tx.clone();
        let dropped = self.dropped.clone();
        let deliver = async move {
            for rec in waiting {
                if tx.send(rec).await.is_err() {
                    dropped.inc();
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(deliver)),
            // Outside a runtime (a tracker dropped by a test's thread):
            // nothing can wait for the meter.
            Err(_) => {
                self.dropped.inc_by(lost);
            }
        }
    }

    /// Closing records waiting for room in the channel.
    pub fn waiting_records(&self) -> usize {
        self.waiting.len()
    }

    fn cut_short(&mut self, reason: EndReason) {
        let now = Instant::now();
        let wall = SystemTime::now();
        for t in std::mem::take(&mut self.open) {
            let rec = TurnRecord {
                n: t.n,
                kind: TurnKind::Response,
                started_at: t.started_at,
                ended_at: wall,
                latency: now - t.started,
                ttft: t.ttft,
                status: reason.status(),
                end_reason: reason.as_str(),
                usage: None,
                response_id: t.response_id,
                conversation_id: t.conversation_id,
            };
            self.emit(rec);
        }
        self.waiting_ttft = 0;
    }

    /// Sends a closing record, or keeps it until the channel has room.
    fn emit(&mut self, rec: TurnRecord) {
        let rec = Box::new(rec);
        if !self.waiting.is_empty() {
            self.waiting.push_back(rec);
            return;
        }
        match self.tx.try_send(rec) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(rec)) => self.waiting.push_back(rec),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.dropped.inc();
            }
        }
    }

    /// Sends a record worth less than the relay's pace (a `never_done`
    /// eviction): dropped and counted when the channel is full or a closing
    /// record waits.
    fn emit_junk(&mut self, rec: TurnRecord) {
        if !self.waiting.is_empty() || self.tx.try_send(Box::new(rec)).is_err() {
            self.dropped.inc();
        }
    }

    fn next_n(&mut self) -> u64 {
        self.turns += 1;
        self.turns
    }

    fn on_created(&mut self, text: &str) {
        let (id, conversation_id) = serde_json::from_str::<CreatedEvent>(text)
            .ok()
            .and_then(|e| e.response)
            .map_or((None, None), |r| (r.id, r.conversation_id));
        if id.is_some() && self.open.iter().any(|t| t.response_id == id) {
            return;
        }
        // A replayed `created` of a response already metered: no new turn
        // (it would be cut short as unknown at the session's end).
        if id.as_deref().is_some_and(|id| self.metered(id)) {
            return;
        }
        if self.open.len() >= MAX_OPEN_TURNS {
            let oldest = self.open.remove(0);
            if oldest.ttft.is_none() {
                self.waiting_ttft -= 1;
            }
            let rec = TurnRecord {
                n: oldest.n,
                kind: TurnKind::Response,
                started_at: oldest.started_at,
                ended_at: SystemTime::now(),
                latency: oldest.started.elapsed(),
                ttft: oldest.ttft,
                status: 502,
                end_reason: "never_done",
                usage: None,
                response_id: oldest.response_id,
                conversation_id: oldest.conversation_id,
            };
            self.emit_junk(rec);
        }
        let n = self.next_n();
        self.open.push(OpenTurn {
            n,
            response_id: id,
            conversation_id,
            started: Instant::now(),
            started_at: SystemTime::now(),
            ttft: None,
        });
        self.waiting_ttft += 1;
    }

    fn on_delta(&mut self, text: &[u8]) {
        let named = response_id_of(text);
        let now = Instant::now();
        for t in &mut self.open {
            let matches = match (named, t.response_id.as_deref()) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            if t.ttft.is_none() && matches {
                t.ttft = Some(now - t.started);
                self.waiting_ttft -= 1;
            }
        }
    }

    fn on_done(&mut self, text: &str) {
        let Ok(event) = serde_json::from_str::<DoneEvent>(text) else {
            return;
        };
        let response = event.response.unwrap_or_default();
        if let Some(id) = &response.id {
            if self.metered(id) {
                self.duplicates.inc();
                return;
            }
            self.remember_metered(id);
        }
        let (status, end_reason) = match response.status.as_deref() {
            Some("completed") | None => (200, "completed"),
            Some("incomplete") => (200, "incomplete"),
            // Cancelled by the teardown: the row names why the session ended.
            Some("cancelled") => match self.ending {
                Some(reason) => (reason.status(), reason.as_str()),
                None => (499, "cancelled"),
            },
            Some("failed") => (502, "failed"),
            Some(_) => (200, "other"),
        };
        let usage = response.usage.as_ref().map(Usage::from_json);
        let position = match &response.id {
            Some(id) => self
                .open
                .iter()
                .position(|t| t.response_id.as_ref() == Some(id)),
            None if !self.open.is_empty() => Some(0),
            None => None,
        };
        let wall = SystemTime::now();
        let rec = match position {
            Some(i) => {
                let t = self.open.remove(i);
                if t.ttft.is_none() {
                    self.waiting_ttft -= 1;
                }
                TurnRecord {
                    n: t.n,
                    kind: TurnKind::Response,
                    started_at: t.started_at,
                    ended_at: wall,
                    latency: t.started.elapsed(),
                    ttft: t.ttft,
                    status,
                    end_reason,
                    usage,
                    response_id: t.response_id,
                    conversation_id: response.conversation_id.or(t.conversation_id),
                }
            }
            None => TurnRecord {
                n: self.next_n(),
                kind: TurnKind::Response,
                started_at: wall,
                ended_at: wall,
                latency: Duration::ZERO,
                ttft: None,
                status,
                end_reason,
                usage,
                response_id: response.id,
                conversation_id: response.conversation_id,
            },
        };
        self.emit(rec);
    }

    fn on_transcription(&mut self, text: &str) {
        let Ok(event) = serde_json::from_str::<TranscriptionEvent>(text) else {
            return;
        };
        let wall = SystemTime::now();
        let rec = TurnRecord {
            n: self.next_n(),
            kind: TurnKind::Transcription {
                model: self.transcription_model.clone(),
            },
            started_at: wall,
            ended_at: wall,
            latency: Duration::ZERO,
            ttft: None,
            status: 200,
            end_reason: "completed",
            usage: event.usage.as_ref().map(Usage::from_json),
            response_id: None,
            conversation_id: None,
        };
        self.emit(rec);
    }

    fn on_session(&mut self, text: &str) {
        self.session_events += 1;
        // Most sessions transcribe no input (`"transcription": null`): then
        // there is no model to read, and the event (the whole session
        // config) is not parsed.
        if !has_transcription_config(text.as_bytes()) {
            self.transcription_model = None;
            return;
        }
        let Ok(SessionEvent {
            session: Some(session),
        }) = serde_json::from_str::<SessionEvent>(text)
        else {
            return;
        };
        let ga = session
            .audio
            .and_then(|a| a.input)
            .and_then(|i| i.transcription)
            .and_then(|t| t.model);
        let beta = session.input_audio_transcription.and_then(|t| t.model);
        self.transcription_model = ga.or(beta);
    }
}

impl Tap for TurnTracker {
    /// Ready once no closing record waits for room in the channel; while
    /// one does, the relay reads no upstream frame (the meter's taking a
    /// record wakes it).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while !self.waiting.is_empty() {
            match self.room.poll_reserve(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) => {
                    if let Some(rec) = self.waiting.pop_front() {
                        if self.room.send_item(rec).is_err() {
                            self.dropped.inc();
                        }
                    }
                }
                Poll::Ready(Err(_)) => {
                    // The meter is gone: nothing can take them any more.
                    for _ in self.waiting.drain(..) {
                        self.dropped.inc();
                    }
                }
            }
        }
        Poll::Ready(())
    }

    fn responses_in_flight(&self) -> Vec<Option<String>> {
        self.open.iter().map(|t| t.response_id.clone()).collect()
    }

    fn ending(&mut self, end: &End) {
        self.ending = Some(EndReason::from_end(end));
    }

    /// Most upstream messages are deltas: when the leading bytes name a
    /// type metering has no use for, the message is skipped without
    /// validating it as UTF-8.
    fn on_upstream_frame(&mut self, text: &[u8]) {
        if let Some(t) = crate::event::leading_event_type_bytes(text) {
            match classify(t) {
                Sniffed::Other => return,
                Sniffed::Delta if self.waiting_ttft == 0 => return,
                // The first delta of a response: its payload is most of
                // it, so only its `response_id` is read, in place.
                Sniffed::Delta => return self.on_delta(text),
                _ => {}
            }
        }
        if let Ok(text) = std::str::from_utf8(text) {
            self.on_upstream_text(text);
        }
    }

    fn on_upstream_text(&mut self, text: &str) {
        match sniff(text) {
            Sniffed::Created => self.on_created(text),
            Sniffed::Done => self.on_done(text),
            Sniffed::Delta if self.waiting_ttft > 0 => self.on_delta(text.as_bytes()),
            Sniffed::Transcription => self.on_transcription(text),
            Sniffed::Session => self.on_session(text),
            Sniffed::Delta | Sniffed::Other => {}
        }
    }
}

impl Drop for TurnTracker {
    fn drop(&mut self) {
        if !self.open.is_empty() {
            self.cut_short(EndReason::Aborted);
        }
        self.hand_over_waiting();
    }
}

/// What a frame is, as far as metering cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sniffed {
    Created,
    Done,
    Delta,
    Transcription,
    Session,
    Other,
}

/// On the type's bytes: the frame path does not UTF-8-check a type it skips.
fn classify(t: &[u8]) -> Sniffed {
    const C: &[u8] = CREATED.as_bytes();
    const D: &[u8] = DONE.as_bytes();
    const T: &[u8] = TRANSCRIPTION_COMPLETED.as_bytes();
    match t {
        C => Sniffed::Created,
        D => Sniffed::Done,
        T => Sniffed::Transcription,
        b"session.created"
        | b"session.updated"
        | b"transcription_session.created"
        | b"transcription_session.updated" => Sniffed::Session,
        t if t.starts_with(b"response.") && t.ends_with(b".delta") => Sniffed::Delta,
        _ => Sniffed::Other,
    }
}

pub(crate) fn sniff(text: &str) -> Sniffed {
    if let Some(t) = leading_event_type(text).or_else(|| trailing_type(text)) {
        return classify(t.as_bytes());
    }
    let candidate = text.contains("\"response.")
        || text.contains("\"session.")
        || text.contains(TRANSCRIPTION_COMPLETED_QUOTED);
    if !candidate {
        return Sniffed::Other;
    }
    event_type(text).map_or(Sniffed::Other, |t| classify(t.as_bytes()))
}

fn skip_ws_back(b: &[u8], mut end: usize) -> usize {
    while end > 0 && matches!(b[end - 1], b' ' | b'\n' | b'\r' | b'\t') {
        end -= 1;
    }
    end
}

/// The type value when it is the object's last member (`…,"type":"x"}`),
/// holds no escapes, and the key is `type` exactly. For a JSON object the
/// final `}` closes the top level, so the member found is a top-level one.
fn trailing_type(text: &str) -> Option<&str> {
    let b = text.as_bytes();
    let mut i = skip_ws_back(b, b.len());
    if i == 0 || b[i - 1] != b'}' {
        return None;
    }
    i = skip_ws_back(b, i - 1);
    if i == 0 || b[i - 1] != b'"' {
        return None;
    }
    let value_end = i - 1;
    let value_start = b[..value_end].iter().rposition(|&c| c == b'"')? + 1;
    // Escapes (an escaped quote found above, or any backslash inside) are
    // left to the parser, which decodes them.
    if (value_start >= 2 && b[value_start - 2] == b'\\')
        || b[value_start..value_end].contains(&b'\\')
    {
        return None;
    }
    i = skip_ws_back(b, value_start - 1);
    if i == 0 || b[i - 1] != b':' {
        return None;
    }
    i = skip_ws_back(b, i - 1);
    let key = b"\"type\"";
    if i < key.len() || &b[i - key.len()..i] != key {
        return None;
    }
    let before = skip_ws_back(b, i - key.len());
    if before == 0 || !matches!(b[before - 1], b',' | b'{') {
        return None;
    }
    Some(&text[value_start..value_end])
}

/// Whether a key ending in `transcription"` has an object for its value:
/// GA's `"transcription": {…}` or beta's `"input_audio_transcription": {…}`.
/// `false` means the event names no transcription model; `true` only that
/// it may (the parser decides).
fn has_transcription_config(b: &[u8]) -> bool {
    const KEY: &[u8] = b"transcription\"";
    // Built once: building a searcher costs more than most searches.
    static FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(KEY));
    FINDER.find_iter(b).any(|at| {
        let i = skip_ws(b, at + KEY.len());
        b.get(i) == Some(&b':') && b.get(skip_ws(b, i + 1)) == Some(&b'{')
    })
}

/// The string value of a delta's `"response_id"`, found by substring and
/// read without validating the rest of the message. The key comes before
/// the delta's payload (tens of KB of base64) or after it, depending on
/// the sender's field order: the first and the last `ENDS_BYTES` are
/// searched before the whole. (A delta is a flat object and a string's
/// quotes are escaped, so the key occurs once.)
fn response_id_of(b: &[u8]) -> Option<&str> {
    const KEY: &[u8] = b"\"response_id\"";
    const ENDS_BYTES: usize = 512;
    static FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(KEY));
    static FINDER_REV: LazyLock<FinderRev<'static>> = LazyLock::new(|| FinderRev::new(KEY));
    let head = &b[..b.len().min(ENDS_BYTES)];
    let tail_start = b.len().saturating_sub(ENDS_BYTES);
    let at = FINDER
        .find(head)
        .or_else(|| FINDER_REV.rfind(&b[tail_start..]).map(|i| tail_start + i))
        .or_else(|| FINDER.find(b))?;
    let i = skip_ws(b, at + KEY.len());
    if b.get(i) != Some(&b':') {
        return None;
    }
    let (start, end) = plain_string(b, skip_ws(b, i + 1))?;
    std::str::from_utf8(&b[start..end]).ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tracker() -> (TurnTracker, mpsc::Receiver<SentRecord>, Counter) {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let dropped = Counter::default();
        (TurnTracker::new(tx, dropped.clone()), rx, dropped)
    }

    fn drain(rx: &mut mpsc::Receiver<SentRecord>) -> Vec<TurnRecord> {
        let mut out = Vec::new();
        while let Ok(r) = rx.try_recv() {
            out.push(*r);
        }
        out
    }

    fn created(id: &str) -> String {
        format!(
            r#"{{"type":"response.created","event_id":"e1","response":{{"id":"{id}","status":"in_progress","usage":null}}}}"#
        )
    }

    fn done(id: &str, status: &str) -> String {
        json!({"type": "response.done", "event_id": "e9", "response": {
            "id": id, "status": status, "output": [{"type": "message", "content": [{"type": "output_audio", "transcript": "response.done \"x\""}]}],
            "usage": patchbay_sim::usage_for(1, 5)}})
        .to_string()
    }

    /// A no-op waker's context, for polling the tracker by hand.
    fn noop_cx() -> Context<'static> {
        Context::from_waker(std::task::Waker::noop())
    }

    #[test]
    fn a_burst_of_evictions_never_drops_the_closing_record_that_carries_usage() {
        let (tx, mut rx) = mpsc::channel(8);
        let dropped = Counter::default();
        let mut t = TurnTracker::new(tx, dropped.clone());
        // 5,000 responses opened and never finished, then the one billed.
        for i in 0..5_000 {
            t.on_upstream_text(&created(&format!("resp_{i}")));
        }
        t.on_upstream_text(&done("resp_4999", "completed"));
        // The channel (8) is full of evictions; the billed record waits and
        // the relay is told to stop reading.
        assert_eq!(t.waiting_records(), 1);
        assert!(t.poll_ready(&mut noop_cx()).is_pending());
        let junk = drain(&mut rx);
        assert_eq!(junk.len(), 8);
        assert!(junk.iter().all(|r| r.end_reason == "never_done"));
        assert_eq!(dropped.get(), 5_000 - MAX_OPEN_TURNS as u64 - 8);
        // Room again: it goes out, in order, and reading resumes.
        assert!(t.poll_ready(&mut noop_cx()).is_ready());
        assert_eq!(t.waiting_records(), 0);
        let billed = drain(&mut rx);
        assert_eq!(billed.len(), 1);
        assert_eq!(billed[0].status, 200);
        assert!(billed[0].usage.is_some());
    }

    #[tokio::test]
    async fn records_still_waiting_at_the_end_reach_the_meter_before_the_channel_closes() {
        let (tx, mut rx) = mpsc::channel(1);
        let mut t = TurnTracker::new(tx, Counter::default());
        for i in 0..3 {
            t.on_upstream_text(&created(&format!("r{i}")));
            t.on_upstream_text(&done(&format!("r{i}"), "completed"));
        }
        t.on_upstream_text(&created("r3"));
        assert_eq!(t.waiting_records(), 2);
        t.finish(EndReason::ClientClosed);
        let mut got = Vec::new();
        while let Some(r) = rx.recv().await {
            got.push(r);
        }
        let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
        assert_eq!(got.len(), 4, "three billed turns and the one cut short");
        assert_eq!(&statuses[..3], &[200, 200, 200]);
        assert!(got[..3].iter().all(|r| r.usage.is_some()));
        assert!(got[3].usage.is_none());
    }

    fn delta(kind: &str, response_id: Option<&str>) -> String {
        match response_id {
            Some(r) => format!(
                r#"{{"type":"{kind}","event_id":"e2","response_id":"{r}","item_id":"i","delta":"AAAA"}}"#
            ),
            None => format!(r#"{{"type":"{kind}","event_id":"e2","item_id":"i","delta":"AAAA"}}"#),
        }
    }

    #[test]
    fn type_is_read_as_first_key_behind_event_id_and_elsewhere() {
        assert_eq!(
            sniff(r#"{"type":"response.done","response":{}}"#),
            Sniffed::Done
        );
        assert_eq!(
            sniff(r#"{"event_id":"e","type":"response.created"}"#),
            Sniffed::Created
        );
        // Sorted keys: type last.
        assert_eq!(
            sniff(
                r#"{"delta":"AAAA","event_id":"e","response_id":"r","type":"response.output_audio.delta"}"#
            ),
            Sniffed::Delta
        );
        // Neither first nor last: the scan and the parser find it.
        assert_eq!(
            sniff(r#"{"event_id":"e","response":{"type":"x"},"type":"response.done","z":1}"#),
            Sniffed::Done
        );
        // Nested types never count.
        assert_eq!(
            sniff(
                r#"{"event_id":"e","item":{"type":"response.done"},"type":"conversation.item.added"}"#
            ),
            Sniffed::Other
        );
        assert_eq!(sniff(r#"{"a":{"type":"response.done"}}"#), Sniffed::Other);
        assert_eq!(
            sniff(r#"{"k":"x\"type\":\"response.done"}"#),
            Sniffed::Other
        );
        assert_eq!(sniff(r#"{"type":"session.updated"}"#), Sniffed::Session);
        assert_eq!(
            sniff(&format!(
                r#"{{"usage":{{}},"type":"{TRANSCRIPTION_COMPLETED}"}}"#
            )),
            Sniffed::Transcription
        );
    }

    #[test]
    fn trailing_type_agrees_with_the_parser() {
        for t in [
            r#"{"a":1,"type":"x"}"#,
            r#"{ "a" : 1 , "type" : "x" } "#,
            r#"{"type":"x"}"#,
            r#"{"a":"type","b":"x"}"#,
            r#"{"a\"type":"x"}"#,
            r#"{"a":{"type":"x"}}"#,
            r#"["type","x"]"#,
            r#"{"a":"\\","type":"x"}"#,
            r#"{"type":"x\"y"}"#,
            r#"{"type":"x\\"}"#,
            r#"{"atype":"x"}"#,
        ] {
            if let Some(found) = trailing_type(t) {
                assert_eq!(event_type(t).as_deref(), Some(found), "{t}");
            }
        }
        assert_eq!(trailing_type(r#"{"a":1,"type":"x"}"#), Some("x"));
        assert_eq!(trailing_type(r#"{"a\"type":"x"}"#), None);
        assert_eq!(trailing_type(r#"{"atype":"x"}"#), None);
        assert_eq!(trailing_type(r#"{"type":"x\\"}"#), None);
    }

    #[test]
    fn a_completed_turn_carries_usage_latency_and_ttft() {
        let (mut t, mut rx, _) = tracker();
        t.on_upstream_text(&created("resp_1"));
        assert_eq!(t.open_turns(), 1);
        t.on_upstream_text(&delta("response.output_audio.delta", Some("resp_1")));
        t.on_upstream_text(&done("resp_1", "completed"));
        let recs = drain(&mut rx);
        assert_eq!(recs.len(), 1);
        let r = &recs[0];
        assert_eq!((r.n, r.status, r.end_reason), (1, 200, "completed"));
        assert!(r.ttft.is_some());
        assert!(r.ttft.unwrap() <= r.latency);
        assert_eq!(r.usage.unwrap().total, 187);
        assert_eq!(t.open_turns(), 0);
    }

    /// openai-python `types/realtime/realtime_response.py`:
    /// `conversation_id` is in `response.created` and `response.done`, null
    /// for a response out of band (`"conversation": "none"`).
    #[test]
    fn a_turn_carries_the_conversation_its_response_names() {
        let (mut t, mut rx, _) = tracker();
        let created = |id: &str, conv: &str| {
            format!(
                r#"{{"type":"response.created","event_id":"e1","response":{{"id":"{id}","conversation_id":{conv},"status":"in_progress"}}}}"#
            )
        };
        let done = |id: &str, conv: &str| {
            format!(
                r#"{{"type":"response.done","event_id":"e9","response":{{"id":"{id}","conversation_id":{conv},"status":"completed","usage":null}}}}"#
            )
        };
        t.on_upstream_text(&created("r1", r#""conv_1""#));
        t.on_upstream_text(&done("r1", r#""conv_1""#));
        // Out of band: null in both events.
        t.on_upstream_text(&created("r2", "null"));
        t.on_upstream_text(&done("r2", "null"));
        // Only its `response.created` named it; and a turn cut short.
        t.on_upstream_text(&created("r3", r#""conv_1""#));
        t.on_upstream_text(
            r#"{"type":"response.done","response":{"id":"r3","status":"completed"}}"#,
        );
        t.on_upstream_text(&created("r4", r#""conv_1""#));
        t.finish(EndReason::ClientLeft);
        let convs: Vec<_> = drain(&mut rx)
            .into_iter()
            .map(|r| (r.response_id.unwrap(), r.conversation_id))
            .collect();
        let conv = Some("conv_1".to_string());
        assert_eq!(
            convs,
            [
                ("r1".into(), conv.clone()),
                ("r2".into(), None),
                ("r3".into(), conv.clone()),
                ("r4".into(), conv),
            ]
        );
    }

    #[test]
    fn ga_and_beta_delta_names_both_stamp_ttft() {
        for kind in [
            "response.output_audio.delta",
            "response.audio.delta",
            "response.output_text.delta",
            "response.text.delta",
            "response.output_audio_transcript.delta",
            "response.audio_transcript.delta",
            "response.function_call_arguments.delta",
        ] {
            let (mut t, mut rx, _) = tracker();
            t.on_upstream_text(&created("r"));
            t.on_upstream_text(&delta(kind, Some("r")));
            t.on_upstream_text(&done("r", "completed"));
            assert!(drain(&mut rx)[0].ttft.is_some(), "{kind}");
        }
    }

    #[test]
    fn deltas_of_another_response_do_not_stamp_ttft_but_unnamed_ones_do() {
        let (mut t, mut rx, _) = tracker();
        t.on_upstream_text(&created("mine"));
        t.on_upstream_text(&delta("response.output_audio.delta", Some("other")));
        t.on_upstream_text(&done("mine", "completed"));
        assert_eq!(drain(&mut rx)[0].ttft, None);

        t.on_upstream_text(&created("mine2"));
        t.on_upstream_text(&delta("response.output_text.delta", None));
        t.on_upstream_text(&done("mine2", "completed"));
        assert!(drain(&mut rx)[0].ttft.is_some());
    }

    /// The relay's path: a first delta is read in place, wherever its
    /// `response_id` is: before the payload, after it at the end, or after
    /// it with another long field behind (past the ends searched first).
    #[test]
    fn a_frames_response_id_is_found_before_or_after_a_long_payload() {
        let payload = "A".repeat(64 * 1024);
        let item = "i".repeat(2048);
        let kind = "response.output_audio.delta";
        let frame = |r: &str, at: usize| match at {
            0 => format!(
                r#"{{"type":"{kind}","event_id":"e2","response_id":"{r}","delta":"{payload}"}}"#
            ),
            1 => format!(
                r#"{{"type":"{kind}","event_id":"e2","delta":"{payload}","response_id":"{r}"}}"#
            ),
            _ => format!(
                r#"{{"type":"{kind}","event_id":"e2","delta":"{payload}","response_id":"{r}","item_id":"{item}"}}"#
            ),
        };
        for at in 0..3 {
            let (mut t, mut rx, _) = tracker();
            t.on_upstream_frame(created("mine").as_bytes());
            t.on_upstream_frame(frame("other", at).as_bytes());
            t.on_upstream_frame(done("mine", "completed").as_bytes());
            assert_eq!(drain(&mut rx)[0].ttft, None, "id at {at}");

            t.on_upstream_frame(created("mine2").as_bytes());
            t.on_upstream_frame(frame("mine2", at).as_bytes());
            t.on_upstream_frame(done("mine2", "completed").as_bytes());
            assert!(drain(&mut rx)[0].ttft.is_some(), "id at {at}");
        }
    }

    #[test]
    fn input_transcription_deltas_do_not_stamp_ttft() {
        let (mut t, mut rx, _) = tracker();
        t.on_upstream_text(&created("r"));
        t.on_upstream_text(&delta(
            "conversation.item.input_audio_transcription.delta",
            None,
        ));
        t.on_upstream_text(&delta(
            "conversation.item.input_audio_transcription.delta",
            Some("r"),
        ));
        t.on_upstream_text(&done("r", "completed"));
        assert_eq!(drain(&mut rx)[0].ttft, None);
    }

    #[test]
    fn a_done_without_its_created_is_still_billed() {
        let (mut t, mut rx, _) = tracker();
        t.on_upstream_text(&done("ghost", "completed"));
        let r = &drain(&mut rx)[0];
        assert_eq!((r.n, r.latency, r.status), (1, Duration::ZERO, 200));
        assert!(r.usage.is_some());
    }

    /// A `response.done` for a response this session already metered (a
    /// replayed event) is a duplicate: no second record, so no second
    /// charge; a replayed `response.created` opens no turn.
    #[test]
    fn a_repeated_done_for_a_metered_response_is_a_duplicate_and_not_charged_again() {
        let (t, mut rx, _) = tracker();
        let duplicates = Counter::default();
        let mut t = t.counting_duplicates(duplicates.clone());
        t.on_upstream_text(&created("r1"));
        t.on_upstream_text(&done("r1", "completed"));
        t.on_upstream_text(&done("r1", "completed"));
        t.on_upstream_text(&created("r1"));
        assert_eq!(t.open_turns(), 0, "a created for a metered response");
        t.on_upstream_text(&done("r1", "completed"));
        // A done without its created, replayed.
        t.on_upstream_text(&done("ghost", "completed"));
        t.on_upstream_text(&done("ghost", "completed"));
        t.on_upstream_text(&created("r2"));
        t.on_upstream_text(&done("r2", "completed"));
        let recs = drain(&mut rx);
        let ids: Vec<u64> = recs.iter().map(|r| r.n).collect();
        assert_eq!(ids, [1, 2, 3], "{recs:?}");
        assert_eq!(t.open_turns(), 0);
        assert_eq!(duplicates.get(), 3);
    }

    #[test]
    fn the_oldest_metered_ids_are_forgotten_past_the_bound() {
        let (mut t, mut rx, _) = tracker();
        for i in 0..=METERED_IDS_KEPT {
            t.on_upstream_text(&done(&format!("r{i}"), "completed"));
        }
        assert_eq!(t.metered.len(), METERED_IDS_KEPT);
        // More records than the channel holds: they wait, none is lost.
        let mut delivered = 0;
        loop {
            delivered += drain(&mut rx).len();
            if t.waiting_records() == 0 {
                break;
            }
            // Refills the channel from the waiting records (pending again
            // once it is full).
            let _ = t.poll_ready(&mut noop_cx());
        }
        assert_eq!(delivered, METERED_IDS_KEPT + 1);
        t.on_upstream_text(&done("r1", "completed"));
        assert!(drain(&mut rx).is_empty(), "r1 is still known");
        t.on_upstream_text(&done("r0", "completed"));
        assert_eq!(drain(&mut rx).len(), 1, "r0 was forgotten");
    }

    /// A field of an unexpected shape is taken as absent; the rest of its
    /// event still counts.
    #[test]
    fn an_odd_field_never_loses_the_rest_of_its_event() {
        let (mut t, mut rx, _) = tracker();
        let usage = patchbay_sim::usage_for(1, 5);
        t.on_upstream_text(
            &json!({"type": "response.done", "response": {"id": 7, "status": {"x": [1]}, "usage": usage}})
                .to_string(),
        );
        t.on_upstream_text(
            &json!({"type": "response.done", "response": {"id": "r2", "status": "failed", "usage": "odd"}})
                .to_string(),
        );
        let recs = drain(&mut rx);
        assert_eq!((recs[0].status, recs[0].end_reason), (200, "completed"));
        assert!(
            recs[0].usage.is_some(),
            "the usage of a done with odd id and status"
        );
        assert_eq!((recs[1].status, recs[1].end_reason), (502, "failed"));
        assert!(recs[1].usage.is_none(), "usage of the wrong shape");

        t.on_upstream_text(
            &json!({"type": "session.updated", "session": {"audio": "odd",
                "input_audio_transcription": {"model": "whisper-1"}}})
            .to_string(),
        );
        assert_eq!(t.transcription_model(), Some("whisper-1"));
        t.on_upstream_text(
            &json!({"type": "session.updated", "session": {"audio": {"input": {"transcription": {"model": 5}}},
                "input_audio_transcription": {"model": "gpt-4o-transcribe"}}})
            .to_string(),
        );
        assert_eq!(t.transcription_model(), Some("gpt-4o-transcribe"));
    }

    /// A session event without a transcription object is not parsed, and
    /// ends the transcription model in force; one with it, in any spacing,
    /// is.
    #[test]
    fn a_session_without_transcription_has_no_transcription_model() {
        let (mut t, _rx, _) = tracker();
        let with = r#"{"type":"session.updated","session":{"instructions":"say \"transcription\": {x}","audio":{"input":{"transcription" :
            { "model":"gpt-4o-transcribe"}}}}}"#;
        t.on_upstream_text(with);
        assert_eq!(t.transcription_model(), Some("gpt-4o-transcribe"));
        let without = r#"{"type":"session.updated","session":{"instructions":"say \"transcription\": {x}","audio":{"input":{"transcription":null}}}}"#;
        assert!(!has_transcription_config(without.as_bytes()));
        t.on_upstream_text(without);
        assert_eq!(t.transcription_model(), None);
        let beta = r#"{"type":"transcription_session.updated","session":{"input_audio_transcription":{"model":"whisper-1"}}}"#;
        t.on_upstream_text(beta);
        assert_eq!(t.transcription_model(), Some("whisper-1"));
    }

    #[test]
    fn failed_and_cancelled_statuses_map_and_keep_reported_usage() {
        let (mut t, mut rx, _) = tracker();
        t.on_upstream_text(&created("a"));
        t.on_upstream_text(&done("a", "failed"));
        t.on_upstream_text(&created("b"));
        t.on_upstream_text(&done("b", "cancelled"));
        let recs = drain(&mut rx);
        assert_eq!((recs[0].status, recs[0].end_reason), (502, "failed"));
        assert!(recs[0].usage.is_some());
        assert_eq!((recs[1].status, recs[1].end_reason), (499, "cancelled"));
    }

    #[test]
    fn finish_cuts_in_flight_responses_short_with_unknown_usage_and_closes_the_channel() {
        let (mut t, mut rx, _) = tracker();
        t.on_upstream_text(&created("a"));
        t.finish(EndReason::ClientLeft);
        let recs = drain(&mut rx);
        assert_eq!(recs.len(), 1);
        assert_eq!(
            (recs[0].status, recs[0].end_reason, recs[0].usage),
            (499, "client_left", None)
        );
        assert!(rx.try_recv().is_err());
        assert!(rx.is_closed());
    }

    #[test]
    fn end_reasons_have_the_documented_statuses() {
        use crate::relay::Kill;
        let kill = |outcome| {
            End::Killed(Kill {
                code: 1008,
                reason: String::new(),
                error_event: None,
                outcome,
            })
        };
        for (end, status, reason) in [
            (End::ClientClosed(Some(1000)), 499, "client_closed"),
            (End::ClientGone, 499, "client_left"),
            (End::ClientTooBig, 499, "client_oversize_frame"),
            (End::ClientProtocolError(1007), 499, "client_protocol_error"),
            (End::UpstreamClosed(Some(1011)), 502, "upstream_closed"),
            (End::UpstreamGone, 502, "upstream_failed"),
            (End::UpstreamTooBig, 502, "upstream_oversize_frame"),
            (End::IdleTimeout, 408, "idle_timeout"),
            (End::MaxDuration, 408, "max_session_duration"),
            (kill(OUTCOME_BUDGET_EXHAUSTED), 402, "budget_exhausted"),
            (kill(OUTCOME_KEY_REVOKED), 403, "key_revoked"),
            (kill("shutdown"), 503, "shutdown"),
        ] {
            let r = EndReason::from_end(&end);
            assert_eq!((r.status(), r.as_str()), (status, reason), "{end:?}");
        }
    }

    #[test]
    fn a_response_the_teardown_cancelled_carries_the_cause_and_its_usage() {
        let (mut t, mut rx, _) = tracker();
        t.on_upstream_text(&created("a"));
        t.on_upstream_text(&created("b"));
        assert_eq!(
            t.responses_in_flight(),
            vec![Some("a".to_string()), Some("b".to_string())]
        );
        t.ending(&End::IdleTimeout);
        t.on_upstream_text(&done("a", "cancelled"));
        // A response that completed before the cancel reached it is an
        // ordinary turn.
        t.on_upstream_text(&done("b", "completed"));
        assert!(t.responses_in_flight().is_empty());
        t.finish(EndReason::IdleTimeout);
        let recs = drain(&mut rx);
        assert_eq!(recs.len(), 2);
        assert_eq!((recs[0].status, recs[0].end_reason), (408, "idle_timeout"));
        assert!(
            recs[0].usage.is_some(),
            "the cancelled done's usage is kept"
        );
        assert_eq!((recs[1].status, recs[1].end_reason), (200, "completed"));
    }

    #[test]
    fn transcription_usage_is_recorded_on_the_session_transcription_model() {
        let (mut t, mut rx, _) = tracker();
        let completed = json!({"type": TRANSCRIPTION_COMPLETED, "event_id": "e", "item_id": "i",
            "usage": {"type": "tokens", "input_tokens": 30, "output_tokens": 5, "total_tokens": 35,
                      "input_token_details": {"audio_tokens": 30, "text_tokens": 0}}})
        .to_string();
        t.on_upstream_text(&completed);
        t.on_upstream_text(
            &json!({"type": "session.updated", "session": {"audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}}})
                .to_string(),
        );
        t.on_upstream_text(&completed);
        // Beta shape.
        t.on_upstream_text(
            &json!({"type": "session.updated", "session": {"input_audio_transcription": {"model": "whisper-1"}}})
                .to_string(),
        );
        t.on_upstream_text(&completed);
        let models: Vec<TurnKind> = drain(&mut rx).into_iter().map(|r| r.kind).collect();
        assert_eq!(
            models,
            [
                TurnKind::Transcription { model: None },
                TurnKind::Transcription {
                    model: Some("gpt-4o-transcribe".into())
                },
                TurnKind::Transcription {
                    model: Some("whisper-1".into())
                },
            ]
        );
    }

    #[test]
    fn a_full_channel_keeps_a_billed_record_waiting_instead_of_dropping_it() {
        let (tx, mut rx) = mpsc::channel(1);
        let dropped = Counter::default();
        let mut t = TurnTracker::new(tx, dropped.clone());
        t.on_upstream_text(&done("a", "completed"));
        t.on_upstream_text(&done("b", "completed"));
        assert_eq!(dropped.get(), 0);
        assert_eq!(t.waiting_records(), 1);
        assert!(t.poll_ready(&mut noop_cx()).is_pending());
        assert_eq!(drain(&mut rx).len(), 1);
        assert!(t.poll_ready(&mut noop_cx()).is_ready());
        assert_eq!(drain(&mut rx).len(), 1);
    }

    /// tokio's channel allocates its first block of 32 slots when it is
    /// made and keeps it for the channel's life: with records by value
    /// that was ~7 KB held by every session, idle or not.
    #[test]
    fn the_channel_holds_a_pointer_per_slot_not_a_record() {
        assert_eq!(
            std::mem::size_of::<SentRecord>(),
            std::mem::size_of::<usize>()
        );
        assert!(std::mem::size_of::<TurnRecord>() > 100);
    }

    #[test]
    fn open_turns_are_bounded() {
        let (mut t, mut rx, _) = tracker();
        for i in 0..MAX_OPEN_TURNS + 3 {
            t.on_upstream_text(&created(&format!("r{i}")));
        }
        assert_eq!(t.open_turns(), MAX_OPEN_TURNS);
        let evicted = drain(&mut rx);
        assert_eq!(evicted.len(), 3);
        assert!(evicted.iter().all(|r| r.usage.is_none() && r.status == 502));
        // The bookkeeping of waiting turns stays consistent.
        t.on_upstream_text(&delta("response.output_audio.delta", None));
        assert_eq!(t.waiting_ttft, 0);
    }

    #[test]
    fn extreme_usage_numbers_saturate_instead_of_overflowing() {
        let (mut t, mut rx, _) = tracker();
        let max = u64::MAX;
        t.on_upstream_text(
            &json!({"type": "response.done", "response": {"id": "r", "status": "completed", "usage": {
                "total_tokens": max, "input_tokens": max, "output_tokens": max,
                "input_token_details": {"text_tokens": max, "audio_tokens": max, "image_tokens": max,
                    "cached_tokens": max, "cached_tokens_details": {"text_tokens": max, "audio_tokens": max}},
                "output_token_details": {"text_tokens": max, "audio_tokens": max}}}})
            .to_string(),
        );
        let u = drain(&mut rx)[0].usage.unwrap();
        assert_eq!(u.input_text + u.input_audio + u.input_image, u.input);
        assert!(u.cached_text <= u.input_text && u.cached_audio <= u.input_audio);
    }

    /// xorshift64*: deterministic pseudo-random input without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn arbitrary_input_never_panics_the_tracker() {
        const PIECES: [&str; 24] = [
            "{",
            "}",
            "[",
            "]",
            ":",
            ",",
            "\"",
            "\\",
            " ",
            "\"type\"",
            "\"event_id\"",
            "\"response.created\"",
            "\"response.done\"",
            "\"response.output_audio.delta\"",
            "\"response_id\"",
            "\"response\"",
            "\"usage\"",
            "\"id\"",
            "\"session.updated\"",
            "\"conversation.item.input_audio_transcription.completed\"",
            "null",
            "18446744073709551615",
            "-1",
            "\u{e9}",
        ];
        let (tx, _rx) = mpsc::channel(CHANNEL_CAPACITY);
        let mut t = TurnTracker::new(tx, Counter::default());
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut bytes = Vec::new();
        for round in 0..20_000 {
            bytes.clear();
            let len = rng.below(48);
            for _ in 0..len {
                if round % 2 == 0 {
                    bytes.extend_from_slice(PIECES[rng.below(PIECES.len())].as_bytes());
                } else {
                    bytes.push(rng.next() as u8);
                }
            }
            let text = String::from_utf8_lossy(&bytes);
            t.on_upstream_text(&text);
            assert!(t.open_turns() <= MAX_OPEN_TURNS);
        }
        // Well-formed events mutated one byte at a time.
        let seeds = [
            created("r"),
            done("r", "completed"),
            delta("response.audio.delta", Some("r")),
        ];
        for seed in &seeds {
            for i in 0..seed.len() {
                for b in [b'"', b'\\', b'}', b'{', b' ', b'0'] {
                    let mut m = seed.as_bytes().to_vec();
                    m[i] = b;
                    t.on_upstream_text(&String::from_utf8_lossy(&m));
                }
                t.on_upstream_text(&String::from_utf8_lossy(&seed.as_bytes()[..i]));
            }
        }
        t.finish(EndReason::ClientLeft);
    }
}
