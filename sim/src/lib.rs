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
//! GPT-Live sessions (`GET /v1/live/sessions`, cumulative usage by the
//! second) are in [`live`]; their WebRTC sessions (create, call control,
//! recording, forks, the `/attach` sideband) in [`live_webrtc`].
//!
//! Calls (WebRTC and SIP, `POST /v1/realtime/calls…` and the `?call_id=`
//! sideband) are in [`calls_api`].
//!
//! Faults ([`SimFault`]): refuse the upgrade with a status, send an `error`
//! as the first event, drop the TCP connection mid-response, close with a
//! given code after a response, report impossible usage (every count
//! 2^64-1), or send each `response.done` twice.
//!
//! With [`SimConfig::stamp_frames`], frames carry timestamps for the calls
//! benchmark ([`stamp`]). [`SimHandle`] exposes counters and commands
//! (ping or close every open session) for tests.

mod calls;
mod calls_api;
pub mod cli;
mod config;
mod handle;
mod live;
mod live_delegation;
mod live_webrtc;
mod offer;
mod realtime;
mod server;
pub mod stamp;
#[cfg(test)]
mod testing;
mod translation;
mod upgrade;
mod wire;

pub use calls::{CallAction, CallKind, CreatedCall, SimCalls};
pub use config::{
    LiveFault, LiveSim, SimConfig, SimFault, TranscriptionUsage, AUDIO_TOKENS_PER_DELTA,
    TEXT_OUTPUT_TOKENS, TRANSCRIPTION_MODEL,
};
pub use handle::{SimHandle, SimStats};
pub use live::LIVE_PATH_SUFFIX;
pub use live_delegation::{
    DELEGATED_CACHED_TOKENS, DELEGATED_INPUT_TOKENS, DELEGATED_OUTPUT_TOKENS,
    DELEGATED_REASONING_TOKENS,
};
pub use live_webrtc::{recording as live_recording, RECORDING_BYTES as LIVE_RECORDING_BYTES};
pub use offer::answer_for;
pub use realtime::{usage_for, usage_max};
pub use server::start;
pub use translation::TRANSLATION_BYTES_PER_SEC;
pub use wire::mask_key;
