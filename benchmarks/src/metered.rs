//! The least a *metering* WebSocket gateway can do after its handshakes:
//! `ws-relay` with `WS_RELAY_METER=1` runs this instead of copying bytes.
//!
//! Client to upstream, bytes are copied as `ws-relay` copies them. Upstream
//! to client, the bytes are read into one buffer and forwarded a whole
//! frame at a time (a metering relay must see a frame whole to read it),
//! and every unfragmented text frame whose type is `response.done` is
//! parsed for its response's id, status and usage, which become one
//! request-log row (the gateway's own [`RequestLogRow`], written as the
//! gateway writes it, one line on stdout per turn).
//!
//! Left out, each of which the gateway does: other events (no
//! time-to-first-token, no `response.created`), fragmented messages, client
//! frames (not parsed, masks not checked, UTF-8 not validated), control
//! frames (forwarded, never answered), prices, budgets and counters, log
//! lines, close handshakes, limits. What the gateway costs over this is
//! those, and its generality.

use std::io::Write;
use std::sync::{Arc, Mutex};

use patchbay_gateway::logs::RequestLogRow;
use patchbay_gateway::metering::pricing::{Usage, UsageJson};
use patchbay_gateway::relay::frame;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A read asks for at least this much room.
const READ_BYTES: usize = 64 * 1024;

/// Where rows go.
#[derive(Clone, Debug)]
pub enum Rows {
    /// One line each on stdout, as the gateway writes them.
    Stdout,
    /// Kept (tests).
    Kept(Arc<Mutex<Vec<String>>>),
}

impl Rows {
    fn write(&self, line: String) {
        match self {
            Rows::Stdout => {
                let _ = std::io::stdout().lock().write_all(line.as_bytes());
            }
            Rows::Kept(rows) => rows.lock().unwrap_or_else(|p| p.into_inner()).push(line),
        }
    }
}

/// Relays a session whose handshakes are done; `early` is what the
/// upstream sent with its `101`.
pub async fn relay(
    client: TcpStream,
    upstream: TcpStream,
    early: Vec<u8>,
    session_id: String,
    rows: &Rows,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut up_read, mut up_write) = upstream.into_split();
    let upward = async {
        let _ = tokio::io::copy(&mut client_read, &mut up_write).await;
        let _ = up_write.shutdown().await;
    };
    let downward = async {
        let _ = downstream(&mut up_read, &mut client_write, early, &session_id, rows).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(upward, downward);
}

async fn downstream(
    up: &mut (impl AsyncReadExt + Unpin),
    client: &mut (impl AsyncWriteExt + Unpin),
    early: Vec<u8>,
    session_id: &str,
    rows: &Rows,
) -> std::io::Result<()> {
    let mut buf = early;
    let mut turns = 0u64;
    loop {
        let whole = whole_frames(&buf, |text| {
            if let Some(line) = row_of(text, session_id, turns + 1) {
                turns += 1;
                rows.write(line);
            }
        });
        if whole > 0 {
            client.write_all(&buf[..whole]).await?;
            buf.drain(..whole);
        }
        buf.reserve(READ_BYTES);
        if up.read_buf(&mut buf).await? == 0 {
            return client.write_all(&buf).await;
        }
    }
}

/// The length of the whole frames at the start of `bytes` (headers read by
/// the gateway's own [`frame::parse_header`]), calling `text` with the
/// payload of each unfragmented, unmasked text frame among them. Bytes that
/// are not a frame are passed on as they are, unread.
pub fn whole_frames(bytes: &[u8], mut text: impl FnMut(&[u8])) -> usize {
    let mut at = 0;
    loop {
        let header = match frame::parse_header(&bytes[at..]) {
            Ok(Some(h)) => h,
            Ok(None) => return at,
            Err(_) => return bytes.len(),
        };
        let end = match usize::try_from(header.frame_len())
            .ok()
            .and_then(|n| at.checked_add(n))
        {
            Some(end) if end <= bytes.len() => end,
            _ => return at,
        };
        if header.fin && header.opcode == frame::opcode::TEXT && header.mask.is_none() {
            text(&bytes[at + header.header_len..end]);
        }
        at = end;
    }
}

#[derive(Deserialize)]
struct Done {
    response: Option<DoneResponse>,
}

/// What the gateway reads of a `response.done` (the id matches it to its
/// turn there; here it is only read).
#[derive(Deserialize)]
struct DoneResponse {
    #[serde(rename = "id")]
    _id: Option<String>,
    status: Option<String>,
    usage: Option<UsageJson>,
}

/// The row of a `response.done` event (`None` for any other text).
pub fn row_of(text: &[u8], session_id: &str, n: u64) -> Option<String> {
    if !text.starts_with(br#"{"type":"response.done""#) {
        return None;
    }
    let response = serde_json::from_slice::<Done>(text).ok()?.response?;
    let usage = response.usage.as_ref().map(Usage::from_json);
    let u = usage.unwrap_or_default();
    let now = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let row = RequestLogRow {
        request_id: format!("{session_id}:{n}"),
        session_id: session_id.to_string(),
        key_id: "bench".into(),
        client_secret_id: None,
        transport: "websocket".into(),
        call_id: None,
        live_session_id: None,
        response_id: None,
        delegation_id: None,
        team: None,
        model: "gpt-realtime".into(),
        upstream_model: "gpt-realtime".into(),
        provider: "openai".into(),
        upstream: "gpt-realtime".into(),
        started_at: now.clone(),
        ended_at: now,
        latency_ms: 0,
        ttft_ms: None,
        status: if response.status.as_deref() == Some("failed") {
            502
        } else {
            200
        },
        input_tokens: u.input,
        output_tokens: u.output,
        total_tokens: u.total,
        input_text_tokens: u.input_text,
        input_audio_tokens: u.input_audio,
        input_image_tokens: u.input_image,
        input_cached_tokens: u.cached(),
        output_text_tokens: u.output_text,
        output_audio_tokens: u.output_audio,
        transcription_tokens: 0,
        audio_seconds: None,
        output_audio_seconds: None,
        cost_usd: 0.0,
        usage_unknown: usage.is_none(),
        usage_implausible: false,
        usage_estimated: false,
        usage_unpriced: false,
        end_reason: "completed".into(),
    };
    let mut line = row.to_json_line();
    line.push('\n');
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unmasked final frame, its header written by the gateway's own
    /// encoder.
    fn server_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut header = [0u8; frame::MAX_HEADER_BYTES];
        let n = frame::encode_header(true, opcode, None, payload.len() as u64, &mut header);
        let mut f = header[..n].to_vec();
        f.extend_from_slice(payload);
        f
    }

    const DONE: &str = r#"{"type":"response.done","event_id":"e","response":{"id":"resp_1","status":"completed","usage":{"total_tokens":30,"input_tokens":10,"output_tokens":20,"output_token_details":{"audio_tokens":15,"text_tokens":5}}}}"#;

    #[test]
    fn whole_frames_stop_at_the_first_partial_one_and_show_text_payloads() {
        let delta = format!(r#"{{"type":"x","delta":"{}"}}"#, "A".repeat(70_000));
        let mut bytes = server_frame(1, delta.as_bytes());
        bytes.extend(server_frame(2, &[0; 300]));
        bytes.extend(server_frame(1, DONE.as_bytes()));
        let complete = bytes.len();
        let next = server_frame(1, b"{}");
        bytes.extend_from_slice(&next[..1]);
        for cut in [0, 1, 3, 9, 100, 70_020, complete - 1] {
            let mut texts = Vec::new();
            let whole = whole_frames(&bytes[..cut], |t| texts.push(t.len()));
            assert!(whole <= cut, "{cut}");
            assert!(texts.len() < 2, "{cut}");
        }
        let mut texts = Vec::new();
        assert_eq!(whole_frames(&bytes, |t| texts.push(t.to_vec())), complete);
        assert_eq!(texts, vec![delta.into_bytes(), DONE.as_bytes().to_vec()]);
    }

    #[test]
    fn a_response_done_becomes_one_row_with_its_usage() {
        let line = row_of(DONE.as_bytes(), "s1", 1).unwrap();
        let row: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(row["request_id"], "s1:1");
        assert_eq!(row["output_audio_tokens"], 15);
        assert_eq!(row["total_tokens"], 30);
        assert_eq!(row["usage_unknown"], false);
        assert!(line.ends_with('\n'));
        assert_eq!(row_of(br#"{"type":"response.created"}"#, "s1", 2), None);
    }
}
