//! One leg of the passthrough relay: a socket past its WebSocket handshake,
//! the frames read from it, and the frames queued for it.
//!
//! Guarantees:
//! - Frames read are returned as received ([`FrameReader`]); a client frame
//!   must be masked and an upstream frame must not be (RFC 6455 §5.1), or
//!   the leg fails with a protocol error (1002).
//! - Frames queued ([`Leg::queue`] for forwarded bytes, [`Leg::queue_frame`]
//!   for the gateway's own) leave in order, whole, with as few writes as the
//!   socket allows: one vectored write carries every queued frame
//!   ([`MAX_WRITE_SLICES`] at most; a lone frame goes in a plain write), a
//!   partial write resumes where it stopped. Forwarded frames are never copied: the queue holds the
//!   reader's own buffers.
//! - The gateway's own frames are masked with a fresh random key on a leg
//!   where it is the client (the upstream), and unmasked where it is the
//!   server (the client leg).
//! - Ping is answered with a pong carrying its payload (unless
//!   [`PONG_BACKLOG_BYTES`] are already waiting to be written); a received
//!   close is answered with the same code (once: nothing is queued after a
//!   close).
//!   Both are control frames, which may go between the fragments of a
//!   message.
//! - Cancel-safe: all state lives in the leg, so a poll that is dropped
//!   loses nothing and a write cut short resumes at the next flush.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

use super::frame::{self, opcode, FrameRole, MAX_HEADER_BYTES};
use super::reader::{FrameReader, RawFrame, ReadError, Utf8Check};

/// Most frames handed to one vectored write.
pub const MAX_WRITE_SLICES: usize = 64;
/// Past this many bytes queued and unwritten, a ping is not answered: a
/// peer that sends pings without reading cannot grow the queue with pongs
/// (RFC 6455 §5.5.3 lets an endpoint answer only some of several pings).
pub const PONG_BACKLOG_BYTES: usize = 64 * 1024;

/// What the gateway is on a leg.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client leg: the peer's frames are masked and their text is
    /// validated; the gateway's are not masked.
    Server,
    /// The upstream leg: the peer's frames are unmasked and trusted; the
    /// gateway masks its own.
    Client,
}

/// A control frame, once the leg has answered it.
#[derive(Debug, Clone, PartialEq)]
pub enum Control {
    /// A ping (its pong is queued) or a pong.
    PingPong,
    /// A close, with its code and reason if it had any; the reply is queued.
    Close(Option<CloseFrame>),
}

/// One WebSocket connection past its handshake.
pub struct Leg<S> {
    io: S,
    reader: FrameReader,
    side: Side,
    out: VecDeque<Bytes>,
    out_bytes: usize,
    /// A close has been queued: nothing may follow it.
    close_queued: bool,
    /// A text message arriving in fragments, kept for [`Leg::text_of`].
    assembling: Option<Vec<u8>>,
}

impl<S> std::fmt::Debug for Leg<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leg")
            .field("side", &self.side)
            .field("out_bytes", &self.out_bytes)
            .field("close_queued", &self.close_queued)
            .finish_non_exhaustive()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Leg<S> {
    /// `already_read`: bytes read from the socket past the handshake.
    pub fn new(io: S, already_read: &[u8], side: Side, max_message_bytes: usize) -> Self {
        let check = match side {
            Side::Server => Utf8Check::Validate,
            Side::Client => Utf8Check::Trust,
        };
        Self {
            io,
            reader: FrameReader::new(already_read, check, max_message_bytes as u64)
                .expect_masked(side == Side::Server),
            side,
            out: VecDeque::new(),
            out_bytes: 0,
            close_queued: false,
            assembling: None,
        }
    }

    /// Lets go of what the leg keeps only to be quicker with its next
    /// frames: the reader's spare allocation
    /// ([`FrameReader::release_spare`]) and an empty write queue's room.
    /// For a leg that has gone quiet; nothing queued or half read is lost.
    pub fn release_idle_buffers(&mut self) {
        self.reader.release_spare();
        if self.out.is_empty() && self.out.capacity() > 0 {
            self.out = VecDeque::new();
        }
    }

    /// The next frame read; `Ok(None)` at EOF on a frame boundary.
    pub fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<RawFrame>, ReadError>> {
        // Masking is checked by the reader, at each frame's header.
        self.reader.poll_next(cx, &mut self.io)
    }

    pub async fn next_frame(&mut self) -> Result<Option<RawFrame>, ReadError> {
        std::future::poll_fn(|cx| self.poll_frame(cx)).await
    }

    /// No fragmented message is open among the frames read so far.
    pub fn at_boundary(&self) -> bool {
        self.reader.at_boundary()
    }

    /// See [`FrameReader::completion`].
    pub fn completion(&self) -> Option<Vec<u8>> {
        self.reader.completion()
    }

    /// Answers a control frame read from this leg: a ping's pong and a
    /// close's reply are queued. `Err` with a close code when the frame
    /// breaks the protocol (a close payload of one byte, a code that may not
    /// be sent, a reason that is not UTF-8).
    pub fn answer(&mut self, f: &RawFrame) -> Result<Control, u16> {
        let mut payload = f.payload().to_vec();
        if let Some(m) = f.header.mask {
            frame::unmask(&mut payload, m, 0);
        }
        match f.header.opcode {
            opcode::PING => {
                if !self.close_queued && self.out_bytes < PONG_BACKLOG_BYTES {
                    self.queue_frame(opcode::PONG, &payload);
                }
                Ok(Control::PingPong)
            }
            opcode::CLOSE => {
                let close = parse_close(&payload)?;
                // Echo the code, as peers commonly do (RFC 6455 §5.5.1).
                let reply = close.as_ref().map(|c| CloseFrame {
                    code: c.code,
                    reason: "".into(),
                });
                self.queue_close(reply);
                Ok(Control::Close(close))
            }
            _ => Ok(Control::PingPong),
        }
    }

    /// The text of a whole text message, when `f` completes one: borrowed
    /// from the frame when it is the whole message, assembled when it came
    /// in fragments. `None` for other frames. For the upstream leg (its
    /// frames are not masked).
    pub fn text_of<'f>(&mut self, f: &'f RawFrame) -> Option<Cow<'f, [u8]>> {
        let FrameRole::Data { text, last } = f.role else {
            return None;
        };
        if !text {
            return None;
        }
        if last && self.assembling.is_none() {
            return Some(Cow::Borrowed(f.payload()));
        }
        self.assembling
            .get_or_insert_with(Vec::new)
            .extend_from_slice(f.payload());
        if last {
            self.assembling.take().map(Cow::Owned)
        } else {
            None
        }
    }

    /// Queues bytes that are whole frames (forwarded as received).
    pub fn queue(&mut self, bytes: Bytes) {
        if !self.close_queued && !bytes.is_empty() {
            self.out_bytes += bytes.len();
            self.out.push_back(bytes);
        }
    }

    /// Queues a frame of the gateway's own, masked on the upstream leg.
    pub fn queue_frame(&mut self, op: u8, payload: &[u8]) {
        self.queue_fragment(true, op, payload);
    }

    /// [`Self::queue_frame`] with the FIN bit given.
    pub fn queue_fragment(&mut self, fin: bool, op: u8, payload: &[u8]) {
        let mask = match self.side {
            Side::Server => None,
            Side::Client => {
                let mut m = [0u8; 4];
                // A predictable mask only weakens what masking protects
                // against (proxy cache poisoning); never fatal.
                let _ = getrandom::fill(&mut m);
                Some(m)
            }
        };
        let mut header = [0u8; MAX_HEADER_BYTES];
        let n = frame::encode_header(fin, op, mask, payload.len() as u64, &mut header);
        let mut out = BytesMut::with_capacity(n + payload.len());
        out.extend_from_slice(&header[..n]);
        let start = out.len();
        out.extend_from_slice(payload);
        if let Some(m) = mask {
            frame::unmask(&mut out[start..], m, 0);
        }
        self.queue(out.freeze());
    }

    pub fn queue_text(&mut self, text: &str) {
        self.queue_frame(opcode::TEXT, text.as_bytes());
    }

    /// Queues a close (`None`: without a code); nothing is queued after it.
    pub fn queue_close(&mut self, close: Option<CloseFrame>) {
        if self.close_queued {
            return;
        }
        let payload = match close {
            Some(c) => {
                let mut p = u16::from(c.code).to_be_bytes().to_vec();
                // The reason fits a control frame (125 bytes in all).
                let mut end = c.reason.len().min(123);
                while !c.reason.is_char_boundary(end) {
                    end -= 1;
                }
                p.extend_from_slice(&c.reason.as_bytes()[..end]);
                p
            }
            None => Vec::new(),
        };
        self.queue_frame(opcode::CLOSE, &payload);
        self.close_queued = true;
    }

    /// Bytes queued and not yet written.
    pub fn queued_bytes(&self) -> usize {
        self.out_bytes
    }

    /// Writes everything queued, then flushes the socket.
    pub fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while let Some(front) = self.out.front() {
            if self.out.len() == 1 {
                // One frame (most wake-ups of an audio stream): a plain
                // write, without building the slice array.
                let written = ready!(Pin::new(&mut self.io).poll_write(cx, front))?;
                if written == 0 {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                self.advance(written);
                continue;
            }
            let mut slices = [IoSlice::new(&[]); MAX_WRITE_SLICES];
            let mut n = 0;
            for (slot, b) in slices.iter_mut().zip(self.out.iter()) {
                *slot = IoSlice::new(b);
                n += 1;
            }
            let written = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..n]))?;
            if written == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.advance(written);
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    pub async fn flush(&mut self) -> std::io::Result<()> {
        std::future::poll_fn(|cx| self.poll_flush(cx)).await
    }

    fn advance(&mut self, mut n: usize) {
        self.out_bytes -= n;
        while n > 0 {
            let Some(front) = self.out.front_mut() else {
                return;
            };
            if front.len() <= n {
                n -= front.len();
                self.out.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }

    /// Sends `close` (unless a close was queued already: then only what is
    /// queued) and reads until the peer's close or EOF, passing each text
    /// message to `on_text`. Unbounded: callers bound it.
    /// What the gateway is on this leg.
    pub fn side(&self) -> Side {
        self.side
    }

    pub async fn close(&mut self, close: Option<CloseFrame>, mut on_text: impl FnMut(&[u8])) {
        self.queue_close(close);
        if self.flush().await.is_err() {
            return;
        }
        while self.read_text(&mut on_text).await {}
    }

    /// Reads the next frame, answering a control frame and giving a whole
    /// text message to `on_text`; `false` when the leg ended (a close, a
    /// protocol error, EOF).
    pub async fn read_text(&mut self, mut on_text: impl FnMut(&[u8])) -> bool {
        let Ok(Some(f)) = self.next_frame().await else {
            return false;
        };
        if f.role == FrameRole::Control {
            return !matches!(self.answer(&f), Ok(Control::Close(_)) | Err(_));
        }
        if let Some(text) = self.text_of(&f) {
            on_text(&text);
        }
        true
    }
}

/// A close frame's payload: nothing, or a code and a UTF-8 reason.
fn parse_close(payload: &[u8]) -> Result<Option<CloseFrame>, u16> {
    use super::code::{INVALID_PAYLOAD, PROTOCOL_ERROR};
    match payload {
        [] => Ok(None),
        [_] => Err(PROTOCOL_ERROR),
        [a, b, reason @ ..] => {
            let code = CloseCode::from(u16::from_be_bytes([*a, *b]));
            if !code.is_allowed() {
                return Err(PROTOCOL_ERROR);
            }
            let reason = std::str::from_utf8(reason).map_err(|_| INVALID_PAYLOAD)?;
            Ok(Some(CloseFrame {
                code,
                reason: reason.to_string().into(),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::testing::frame as ws_frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control as WsControl, OpCode};

    #[tokio::test]
    async fn pings_from_a_peer_that_does_not_read_cannot_grow_the_queue() {
        // The peer's end of the pipe is never read: nothing queued leaves.
        let (ours, _theirs) = tokio::io::duplex(64);
        let ping = ws_frame(
            true,
            OpCode::Control(WsControl::Ping),
            Some([1, 2, 3, 4]),
            vec![7; 125],
        );
        let mut pings = Vec::new();
        for _ in 0..10_000 {
            pings.extend_from_slice(&ping);
        }
        let mut leg = Leg::new(ours, &pings, Side::Server, 1 << 20);
        let mut answered = 0;
        for _ in 0..10_000 {
            let f = leg.next_frame().await.unwrap().unwrap();
            assert_eq!(leg.answer(&f), Ok(Control::PingPong));
            answered += 1;
        }
        assert_eq!(answered, 10_000);
        // 10,000 pongs of 127 bytes would be 1.27 MB.
        assert!(
            leg.queued_bytes() < PONG_BACKLOG_BYTES + 200,
            "{}",
            leg.queued_bytes()
        );
        assert!(leg.queued_bytes() >= PONG_BACKLOG_BYTES - 200);
    }

    #[test]
    fn close_payloads_are_checked_as_the_rfc_says() {
        assert_eq!(parse_close(&[]), Ok(None));
        assert_eq!(parse_close(&[3]), Err(1002));
        let ok = parse_close(&[0x03, 0xE8, b'o', b'k']).unwrap().unwrap();
        assert_eq!((u16::from(ok.code), ok.reason.as_str()), (1000, "ok"));
        // 1005 and 1006 may never be sent; 999 is not a code.
        assert_eq!(parse_close(&1005u16.to_be_bytes()), Err(1002));
        assert_eq!(parse_close(&1006u16.to_be_bytes()), Err(1002));
        assert_eq!(parse_close(&999u16.to_be_bytes()), Err(1002));
        assert_eq!(parse_close(&[0x03, 0xE8, 0xFF]), Err(1007));
        assert!(parse_close(&4000u16.to_be_bytes()).unwrap().is_some());
    }
}
