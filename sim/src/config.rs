//! What a simulator is asked to be: its timing, sizes, faults and keys
//! ([`SimConfig`], [`SimFault`]) and the fixed figures its usage reports
//! are built from.

use std::sync::Arc;
use std::time::Duration;

/// Tokens the simulator reports per audio delta it sent.
pub const AUDIO_TOKENS_PER_DELTA: u64 = 10;
/// Text (transcript) output tokens per response.
pub const TEXT_OUTPUT_TOKENS: u64 = 12;

/// The transcription model a transcription session starts with.
pub const TRANSCRIPTION_MODEL: &str = "gpt-4o-transcribe";

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
    /// Before each `response.done`, a burst of this many `response.created`
    /// events of responses that never finish, written in one flush: a
    /// hostile or broken upstream flooding the gateway's turn tracking.
    CreatedBurst { count: usize },
    /// Report every count of each `response.done`'s usage as 2^64-1
    /// (`u64::MAX`): a usage no turn can have, which the protocol does not
    /// rule out (openai-python's `types/realtime/realtime_response_usage.py`
    /// types each count as an unbounded `Optional[int]`).
    UsageMax,
    /// Send each completed response's `response.done` twice, the same event
    /// with the same response id (openai-python's
    /// `types/realtime/response_done_event.py`): a replayed event.
    DoneTwice,
}

/// The shape of the usage a `conversation.item.input_audio_transcription.completed` reports:
/// openai-python's `types/realtime/conversation_item_input_audio_transcription_completed_event.py`
/// types `usage` as a union of `UsageTranscriptTextUsageTokens` (`type: "tokens"`,
/// `input_tokens`, `output_tokens`, `total_tokens`, `input_token_details{audio_tokens,
/// text_tokens}`) and `UsageTranscriptTextUsageDuration` (`type: "duration"`, `seconds: float`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum TranscriptionUsage {
    /// `{"type": "tokens", "input_tokens": 30, "output_tokens": 5, "total_tokens": 35,
    /// "input_token_details": {"audio_tokens": 30, "text_tokens": 0}}` (token-billed models such
    /// as `gpt-4o-transcribe`).
    #[default]
    Tokens,
    /// `{"type": "duration", "seconds": S}` (models billed per minute of audio, such as
    /// `whisper-1`, `gpt-realtime-whisper`, `gpt-live-transcribe`).
    Duration { seconds: f64 },
}

impl TranscriptionUsage {
    /// The `usage` object of a transcription's completed event.
    pub fn json(self) -> serde_json::Value {
        match self {
            TranscriptionUsage::Tokens => serde_json::json!({
                "type": "tokens", "input_tokens": 30, "output_tokens": 5, "total_tokens": 35,
                "input_token_details": {"audio_tokens": 30, "text_tokens": 0}}),
            TranscriptionUsage::Duration { seconds } => {
                serde_json::json!({"type": "duration", "seconds": seconds})
            }
        }
    }
}

/// What goes wrong with a Live session's usage reports (openai-python
/// `types/live/session_usage.py`: cumulative, "Do not sum values across
/// usage events"; `session_closed_event.py`: "A connection closing without
/// this event does not confirm successful finalization").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveFault {
    /// Every other `session.usage.updated` is never sent.
    UsageLost,
    /// Every `session.usage.updated` is sent twice.
    UsageRepeated,
    /// Reports go out in pairs, the newer figure first.
    UsageReordered,
    /// `session.close` closes the socket without `session.closed` (a WebRTC
    /// session's sideband, once the session ends, likewise).
    NoClosed,
    /// A delegated response's nested `response.completed` is sent twice
    /// ([`crate::live_delegation`]).
    DelegatedCompletedRepeated,
}

/// How a simulated Live session reports its usage.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveSim {
    /// Real time between `session.usage.updated` events.
    pub usage_interval: Duration,
    /// Billed seconds per real second (1.0: real time).
    pub time_scale: f64,
    pub fault: Option<LiveFault>,
}

impl Default for LiveSim {
    fn default() -> Self {
        Self {
            usage_interval: Duration::from_secs(1),
            time_scale: 1.0,
            fault: None,
        }
    }
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
    /// Timestamp frames for the calls benchmark ([`crate::stamp`]): each
    /// audio delta's `event_id` carries its send time, and each
    /// `input_audio_buffer.committed` the transit times of the stamped
    /// appends it commits.
    pub stamp_frames: bool,
    /// What each input-audio transcription's usage reports.
    pub transcription_usage: TranscriptionUsage,
    /// How Live sessions report usage.
    pub live: LiveSim,
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
            stamp_frames: false,
            transcription_usage: TranscriptionUsage::Tokens,
            live: LiveSim::default(),
        }
    }
}
