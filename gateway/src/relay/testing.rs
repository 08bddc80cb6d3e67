//! Test helpers shared by the relay's tests (and the metering's, which read
//! client frames): a replayable generator, frames built by tungstenite,
//! random frame streams, the reference decoder, and one masked client text
//! frame as the reader returns it ([`masked_text`]).

use std::io::Cursor;

use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader as WsHeader};
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// A small deterministic generator (xorshift64*), so failures replay.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn frame(fin: bool, op: OpCode, mask: Option<[u8; 4]>, payload: Vec<u8>) -> Vec<u8> {
    let h = WsHeader {
        is_final: fin,
        opcode: op,
        mask,
        ..WsHeader::default()
    };
    let mut out = Vec::new();
    Frame::from_payload(h, payload.into())
        .format(&mut out)
        .unwrap();
    out
}

/// Reads from a buffer and discards what is written (tungstenite's
/// pongs), so writes cannot overwrite input not yet read.
struct ReadOnly(Cursor<Vec<u8>>);
impl std::io::Read for ReadOnly {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        std::io::Read::read(&mut self.0, buf)
    }
}
impl std::io::Write for ReadOnly {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Decodes `bytes` with tungstenite in `role` (the reference decoder).
pub fn reference_messages(bytes: Vec<u8>, role: Role) -> Vec<WsMessage> {
    let cfg = WebSocketConfig::default().max_message_size(None);
    let mut ws = WebSocket::from_raw_socket(ReadOnly(Cursor::new(bytes)), role, Some(cfg));
    let mut out = Vec::new();
    while let Ok(m) = ws.read() {
        out.push(m);
    }
    out
}

/// A random sequence of messages, some fragmented with control frames
/// between the fragments, framed masked (from a client) or not.
pub fn random_stream(rng: &mut Rng, masked: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mask = |rng: &mut Rng| masked.then(|| (rng.next() as u32).to_be_bytes());
    for _ in 0..rng.below(12) + 1 {
        let text = rng.below(2) == 0;
        let len = match rng.below(6) {
            0 => 0,
            1 => 125,
            2 => 126,
            3 => 65535,
            4 => 65536,
            _ => rng.below(3000),
        } as usize;
        let payload: Vec<u8> = if text {
            // Multi-byte characters, so fragments split some of them.
            let mut s = String::with_capacity(len);
            for c in "aé€𝄞".chars().cycle() {
                if s.len() + c.len_utf8() > len {
                    break;
                }
                s.push(c);
            }
            while s.len() < len {
                s.push('x');
            }
            s.into_bytes()
        } else {
            (0..len).map(|_| rng.next() as u8).collect()
        };
        let pieces = rng.below(4) as usize + 1;
        let mut cuts: Vec<usize> = (0..pieces - 1)
            .map(|_| rng.below(len as u64 + 1) as usize)
            .collect();
        cuts.sort_unstable();
        cuts.push(len);
        let mut from = 0;
        for (i, &c) in cuts.iter().enumerate() {
            let op = match (i, text) {
                (0, true) => OpCode::Data(Data::Text),
                (0, false) => OpCode::Data(Data::Binary),
                _ => OpCode::Data(Data::Continue),
            };
            let m = mask(rng);
            out.extend(frame(i + 1 == cuts.len(), op, m, payload[from..c].to_vec()));
            from = c;
            if rng.below(3) == 0 {
                let m = mask(rng);
                let ping = (0..rng.below(126)).map(|_| rng.next() as u8).collect();
                out.extend(frame(true, OpCode::Control(Control::Ping), m, ping));
            }
        }
    }
    out
}

/// A whole client text message of `text` in one frame masked with `mask`,
/// as the reader returns it.
pub fn masked_text(text: &[u8], mask: [u8; 4]) -> super::reader::RawFrame {
    let mut bytes = vec![0x81];
    match text.len() {
        n if n < 126 => bytes.push(0x80 | n as u8),
        n => {
            bytes.push(0x80 | 126);
            bytes.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    bytes.extend_from_slice(&mask);
    let mut payload = text.to_vec();
    super::frame::unmask(&mut payload, mask, 0);
    bytes.extend_from_slice(&payload);
    let header = super::frame::parse_header(&bytes).unwrap().unwrap();
    super::reader::RawFrame {
        header,
        role: super::frame::FrameRole::Data {
            text: true,
            last: true,
        },
        bytes: bytes::Bytes::from(bytes),
    }
}
