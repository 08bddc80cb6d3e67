//! A running simulator as a test sees it: counters and recordings
//! ([`SimStats`]) and the commands it can send to every open session
//! ([`SimHandle`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::SinkExt;
use tokio::sync::broadcast;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use crate::calls::SimCalls;
use crate::wire::{event_text, SimIo};

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
    /// Decoded audio bytes received by translation sessions
    /// (`session.input_audio_buffer.append`): what the simulated upstream
    /// bills, at 48,000 bytes a second.
    pub translation_input_bytes: AtomicU64,
    /// Decoded audio bytes translation sessions sent
    /// (`session.output_audio.delta`).
    pub translation_output_bytes: AtomicU64,
    /// Live sessions started (`session.started` sent).
    pub live_sessions: AtomicU64,
    /// The final cumulative billed seconds of every Live session that
    /// ended: what the simulated upstream bills.
    pub live_seconds: AtomicU64,
    /// Delegated responses made by Live sessions
    /// ([`crate::live_delegation`]).
    pub live_delegated_responses: AtomicU64,
}

#[derive(Debug, Clone)]
pub(crate) enum Command {
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
    pub(crate) commands: broadcast::Sender<Command>,
    pub(crate) shutdown: CancellationToken,
}

impl SimHandle {
    /// Writes one event of session `session_id` (`sess_…`, `live_…`) as
    /// OpenAI writes it (`type`, then `event_id` `event_<id>_<seq>`, then
    /// `rest`), kept in [`SimStats::sent`] when `record`; false when the
    /// connection is gone.
    pub(crate) async fn send_event(
        &self,
        ws: &mut WebSocketStream<SimIo>,
        record: bool,
        (session_id, seq): (&str, u64),
        kind: &str,
        rest: &serde_json::Value,
    ) -> bool {
        let id = format!("event_{}_{seq}", &session_id[5..13]);
        let text = event_text(kind, &id, &rest.to_string());
        if record {
            if let Ok(mut sent) = self.stats.sent.lock() {
                sent.push(text.clone());
            }
        }
        ws.send(Message::text(text)).await.is_ok()
    }

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
