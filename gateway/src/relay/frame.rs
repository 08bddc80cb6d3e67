//! The WebSocket frame codec of the frame-passthrough relay: pure functions
//! and small state machines over bytes, no I/O.
//!
//! A passthrough forwards each data frame as the bytes it received (header
//! and payload): a client frame is already a valid masked frame for the
//! upstream, an upstream frame a valid unmasked frame for the client. What
//! it needs from a codec is therefore only:
//! - [`parse_header`]: where a frame starts and ends, read from its header
//!   alone, with the RFC 6455 §5.2 checks that do not need the payload
//!   (reserved bits without an extension, reserved opcodes, fragmented or
//!   oversize control frames, a 64-bit length with its top bit set);
//! - [`Message`]: the fragmentation state of one direction — a continuation
//!   without a start or a new data frame inside a fragmented message is a
//!   protocol error (1002), the size of a message summed over its frames is
//!   checked against `max_message_bytes` from each header *before* its
//!   payload is read (1009), and [`Message::at_boundary`] says when the
//!   gateway may inject a frame of its own into that leg;
//! - [`Utf8Stream`]: incremental UTF-8 validation of client text across
//!   frames and reads (1007), holding at most three bytes of an unfinished
//!   character between calls;
//! - [`unmask`]: the XOR of a masked payload from any offset, so a client
//!   payload can be validated in the pieces it arrives in;
//! - [`encode_header`]: the header of a frame the gateway writes itself.
//!
//! Caveat: nothing here reads a socket or holds a payload; the relay that
//! uses it owns the buffers and the order of writes.

/// The longest header: 2 bytes, an 8-byte length, a 4-byte mask.
pub const MAX_HEADER_BYTES: usize = 14;
/// The longest control-frame payload (RFC 6455 §5.5).
pub const MAX_CONTROL_PAYLOAD_BYTES: u64 = 125;

/// Frame opcodes (RFC 6455 §5.2).
pub mod opcode {
    pub const CONTINUATION: u8 = 0x0;
    pub const TEXT: u8 = 0x1;
    pub const BINARY: u8 = 0x2;
    pub const CLOSE: u8 = 0x8;
    pub const PING: u8 = 0x9;
    pub const PONG: u8 = 0xA;
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub fin: bool,
    pub opcode: u8,
    pub mask: Option<[u8; 4]>,
    pub payload_len: u64,
    /// Bytes of the header itself: the payload starts here.
    pub header_len: usize,
}

impl FrameHeader {
    pub fn is_control(&self) -> bool {
        self.opcode & 0x8 != 0
    }

    /// Header and payload: the bytes of the whole frame.
    pub fn frame_len(&self) -> u64 {
        self.header_len as u64 + self.payload_len
    }
}

/// Why a frame or message is refused; each maps to a close code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("reserved bits set without a negotiated extension")]
    ReservedBits,
    #[error("reserved opcode {0:#x}")]
    ReservedOpcode(u8),
    #[error("control frame fragmented or over 125 bytes")]
    BadControlFrame,
    #[error("payload length with the most significant bit set")]
    LengthTooLarge,
    #[error("continuation frame without a message to continue")]
    UnexpectedContinuation,
    #[error("new data frame inside a fragmented message")]
    ExpectedContinuation,
    #[error("message of {size} bytes over the limit of {max}")]
    MessageTooBig { size: u64, max: u64 },
    #[error("text is not valid UTF-8")]
    InvalidUtf8,
    #[error("unmasked frame from a client")]
    Unmasked,
    #[error("masked frame from a server")]
    Masked,
}

impl FrameError {
    /// The close code this error ends the leg with.
    pub fn close_code(&self) -> u16 {
        match self {
            FrameError::MessageTooBig { .. } => super::code::TOO_BIG,
            FrameError::InvalidUtf8 => super::code::INVALID_PAYLOAD,
            _ => super::code::PROTOCOL_ERROR,
        }
    }
}

/// The header at the start of `buf`: `Ok(None)` while `buf` holds only part
/// of it.
pub fn parse_header(buf: &[u8]) -> Result<Option<FrameHeader>, FrameError> {
    let [b0, b1, ..] = *buf else {
        return Ok(None);
    };
    if b0 & 0x70 != 0 {
        return Err(FrameError::ReservedBits);
    }
    let fin = b0 & 0x80 != 0;
    let opcode = b0 & 0x0F;
    if !matches!(
        opcode,
        opcode::CONTINUATION
            | opcode::TEXT
            | opcode::BINARY
            | opcode::CLOSE
            | opcode::PING
            | opcode::PONG
    ) {
        return Err(FrameError::ReservedOpcode(opcode));
    }
    let masked = b1 & 0x80 != 0;
    let (payload_len, len_bytes) = match b1 & 0x7F {
        126 => match buf.get(2..4) {
            Some(b) => (u64::from(u16::from_be_bytes([b[0], b[1]])), 2),
            None => return Ok(None),
        },
        127 => match buf.get(2..10) {
            Some(b) => {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                (u64::from_be_bytes(a), 8)
            }
            None => return Ok(None),
        },
        n => (u64::from(n), 0),
    };
    if payload_len >> 63 != 0 {
        return Err(FrameError::LengthTooLarge);
    }
    let header = FrameHeader {
        fin,
        opcode,
        mask: None,
        payload_len,
        header_len: 2 + len_bytes + if masked { 4 } else { 0 },
    };
    if header.is_control() && (!fin || payload_len > MAX_CONTROL_PAYLOAD_BYTES) {
        return Err(FrameError::BadControlFrame);
    }
    if !masked {
        return Ok(Some(header));
    }
    let at = 2 + len_bytes;
    match buf.get(at..at + 4) {
        Some(m) => Ok(Some(FrameHeader {
            mask: Some([m[0], m[1], m[2], m[3]]),
            ..header
        })),
        None => Ok(None),
    }
}

/// Writes the header of a frame into `out`; returns its length. The
/// payload that follows must be masked with `mask` by the caller.
pub fn encode_header(
    fin: bool,
    opcode: u8,
    mask: Option<[u8; 4]>,
    payload_len: u64,
    out: &mut [u8; MAX_HEADER_BYTES],
) -> usize {
    out[0] = if fin { 0x80 } else { 0 } | (opcode & 0x0F);
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    let mut at = match payload_len {
        0..=125 => {
            out[1] = mask_bit | payload_len as u8;
            2
        }
        126..=0xFFFF => {
            out[1] = mask_bit | 126;
            out[2..4].copy_from_slice(&(payload_len as u16).to_be_bytes());
            4
        }
        _ => {
            out[1] = mask_bit | 127;
            out[2..10].copy_from_slice(&payload_len.to_be_bytes());
            10
        }
    };
    if let Some(m) = mask {
        out[at..at + 4].copy_from_slice(&m);
        at += 4;
    }
    at
}

/// XORs `data` with `mask`, `data` being the payload from byte `offset` on
/// (so a payload can be unmasked in the pieces it arrives in). Eight bytes
/// at a time: a word of eight is two whole mask periods, so one pattern in
/// the piece's phase serves every word.
pub fn unmask(data: &mut [u8], mask: [u8; 4], offset: u64) {
    let phase = (offset % 4) as usize;
    let pattern: [u8; 8] = std::array::from_fn(|i| mask[(phase + i) % 4]);
    let word = u64::from_ne_bytes(pattern);
    let mut words = data.chunks_exact_mut(8);
    for w in &mut words {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(w);
        w.copy_from_slice(&(u64::from_ne_bytes(bytes) ^ word).to_ne_bytes());
    }
    for (b, m) in words.into_remainder().iter_mut().zip(pattern) {
        *b ^= m;
    }
}

/// How many leading bytes of a masked payload unmask to ASCII, counted in
/// whole blocks of [`ASCII_BLOCK_BYTES`] and read in place: a byte unmasks
/// to ASCII exactly when its top bit equals its mask byte's, so no byte is
/// copied or unmasked. ASCII is valid UTF-8 on its own; a client text
/// message of JSON around base64 audio is ASCII throughout, and only what
/// follows the first block holding another byte needs unmasking to be
/// validated.
pub fn masked_ascii_prefix(payload: &[u8], mask: [u8; 4]) -> usize {
    let top_bits = u64::from_ne_bytes(std::array::from_fn(|i| mask[i % 4])) & HIGH_BITS;
    let mut blocks = payload.chunks_exact(ASCII_BLOCK_BYTES);
    let mut ascii = 0;
    for block in &mut blocks {
        let mut differ = 0;
        for w in block.chunks_exact(8) {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(w);
            differ |= (u64::from_ne_bytes(bytes) & HIGH_BITS) ^ top_bits;
        }
        if differ != 0 {
            break;
        }
        ascii += ASCII_BLOCK_BYTES;
    }
    ascii
}

/// The bytes [`masked_ascii_prefix`] judges at a time (a multiple of the
/// mask's period and of a word).
pub const ASCII_BLOCK_BYTES: usize = 32;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// What a frame is to the direction's message state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameRole {
    /// Ping, pong or close: answered or acted on per leg, never part of a
    /// message.
    Control,
    /// A data frame (first, middle or last of a message); `text` says
    /// whether the message is text; `last` whether this frame ends it.
    Data { text: bool, last: bool },
}

/// The fragmentation state of one direction of one leg.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Message {
    /// The message in progress: whether it is text, and its payload bytes
    /// so far (headers included in the check, payloads summed).
    open: Option<(bool, u64)>,
}

impl Message {
    /// Accounts for the frame `h` before its payload is read: refuses a
    /// continuation out of place, a new message inside a fragmented one,
    /// and a message whose payloads summed would pass `max_message_bytes`.
    pub fn on_header(
        &mut self,
        h: &FrameHeader,
        max_message_bytes: u64,
    ) -> Result<FrameRole, FrameError> {
        if h.is_control() {
            return Ok(FrameRole::Control);
        }
        let (text, so_far) = match (h.opcode, self.open) {
            (opcode::CONTINUATION, Some(open)) => open,
            (opcode::CONTINUATION, None) => return Err(FrameError::UnexpectedContinuation),
            (_, Some(_)) => return Err(FrameError::ExpectedContinuation),
            (op, None) => (op == opcode::TEXT, 0),
        };
        let size = so_far.saturating_add(h.payload_len);
        if size > max_message_bytes {
            return Err(FrameError::MessageTooBig {
                size,
                max: max_message_bytes,
            });
        }
        self.open = (!h.fin).then_some((text, size));
        Ok(FrameRole::Data { text, last: h.fin })
    }

    /// No fragmented message is in progress: a frame of the gateway's own
    /// may be written into this leg now.
    pub fn at_boundary(&self) -> bool {
        self.open.is_none()
    }
}

/// Incremental UTF-8 validation of one text message fed in pieces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Utf8Stream {
    /// The bytes of a character split across pieces (at most 3).
    pending: [u8; 3],
    pending_len: u8,
}

/// The longest UTF-8 encoding of one character.
const MAX_CHAR_BYTES: usize = 4;

impl Utf8Stream {
    /// Validates the next piece of the message.
    pub fn feed(&mut self, mut piece: &[u8]) -> Result<(), FrameError> {
        if self.pending_len > 0 {
            // Complete the split character first, from at most 4 bytes.
            let have = usize::from(self.pending_len);
            let take = (MAX_CHAR_BYTES - have).min(piece.len());
            let mut buf = [0u8; MAX_CHAR_BYTES];
            buf[..have].copy_from_slice(&self.pending[..have]);
            buf[have..have + take].copy_from_slice(&piece[..take]);
            match std::str::from_utf8(&buf[..have + take]) {
                Ok(_) => {
                    self.pending_len = 0;
                    piece = &piece[take..];
                }
                Err(e) if e.valid_up_to() >= have => {
                    // The split character is complete; the rest of the
                    // piece is validated from where it ended.
                    self.pending_len = 0;
                    piece = &piece[e.valid_up_to() - have..];
                }
                Err(e) if e.error_len().is_none() => {
                    // Still unfinished: the whole piece was too short.
                    let n = have + take;
                    self.pending[..n].copy_from_slice(&buf[..n]);
                    self.pending_len = n as u8;
                    return Ok(());
                }
                Err(_) => return Err(FrameError::InvalidUtf8),
            }
        }
        match std::str::from_utf8(piece) {
            Ok(_) => Ok(()),
            Err(e) if e.error_len().is_none() => {
                let tail = &piece[e.valid_up_to()..];
                self.pending[..tail.len()].copy_from_slice(tail);
                self.pending_len = tail.len() as u8;
                Ok(())
            }
            Err(_) => Err(FrameError::InvalidUtf8),
        }
    }

    /// The bytes that complete the character left unfinished (empty when
    /// none is): the smallest valid continuation of the pending prefix.
    pub fn completion(&self) -> Vec<u8> {
        let have = &self.pending[..usize::from(self.pending_len)];
        let Some(&lead) = have.first() else {
            return Vec::new();
        };
        let total = match lead {
            0xF0..=0xF4 => 4,
            0xE0..=0xEF => 3,
            _ => 2,
        };
        (have.len()..total)
            .map(|i| match (i, lead) {
                (1, 0xE0) => 0xA0,
                (1, 0xF0) => 0x90,
                _ => 0x80,
            })
            .collect()
    }

    /// Whether no character is split across pieces so far (the next piece
    /// starts a character).
    pub fn at_char_boundary(&self) -> bool {
        self.pending_len == 0
    }

    /// The message ended: a character left unfinished is invalid.
    pub fn finish(&mut self) -> Result<(), FrameError> {
        let unfinished = self.pending_len != 0;
        *self = Self::default();
        if unfinished {
            Err(FrameError::InvalidUtf8)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::testing::Rng;
    use std::io::Cursor;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader as WsHeader};

    fn frame_bytes(fin: bool, op: u8, mask: Option<[u8; 4]>, payload: &[u8]) -> Vec<u8> {
        let mut h = [0u8; MAX_HEADER_BYTES];
        let n = encode_header(fin, op, mask, payload.len() as u64, &mut h);
        let mut out = h[..n].to_vec();
        let start = out.len();
        out.extend_from_slice(payload);
        if let Some(m) = mask {
            unmask(&mut out[start..], m, 0);
        }
        out
    }

    #[test]
    fn lengths_at_every_encoding_boundary_round_trip() {
        for len in [0u64, 1, 125, 126, 127, 65535, 65536, 1 << 32, (1 << 63) - 1] {
            for mask in [None, Some([1, 2, 3, 4])] {
                let mut out = [0u8; MAX_HEADER_BYTES];
                let n = encode_header(true, opcode::BINARY, mask, len, &mut out);
                let expected =
                    2 + match len {
                        0..=125 => 0,
                        126..=65535 => 2,
                        _ => 8,
                    } + if mask.is_some() { 4 } else { 0 };
                assert_eq!(n, expected, "len {len}");
                let h = parse_header(&out[..n]).unwrap().unwrap();
                assert_eq!(
                    h,
                    FrameHeader {
                        fin: true,
                        opcode: opcode::BINARY,
                        mask,
                        payload_len: len,
                        header_len: n,
                    }
                );
                // Every shorter prefix is "not yet", never an error.
                for cut in 0..n {
                    assert_eq!(parse_header(&out[..cut]), Ok(None), "len {len} cut {cut}");
                }
            }
        }
    }

    #[test]
    fn headers_agree_with_tungstenite_on_random_frames() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let ops = [
            OpCode::Data(Data::Continue),
            OpCode::Data(Data::Text),
            OpCode::Data(Data::Binary),
            OpCode::Control(Control::Close),
            OpCode::Control(Control::Ping),
            OpCode::Control(Control::Pong),
        ];
        for _ in 0..2000 {
            let op = ops[rng.below(ops.len() as u64) as usize];
            let control = matches!(op, OpCode::Control(_));
            // Control frames: at most 125 bytes (tungstenite's header parser
            // leaves that check to later; ours refuses it in the header).
            let len = match rng.below(4) {
                _ if control => rng.below(126),
                0 => rng.below(126),
                1 => 126 + rng.below(65536 - 126),
                2 => 65536 + rng.below(1 << 18),
                _ => 0,
            } as usize;
            let fin = control || rng.below(2) == 0;
            let header = WsHeader {
                is_final: fin,
                opcode: op,
                mask: (rng.below(2) == 0).then(|| (rng.next() as u32).to_be_bytes()),
                ..WsHeader::default()
            };
            let f = Frame::from_payload(header, vec![0x5Au8; len].into());
            let mut bytes = Vec::new();
            f.format(&mut bytes).unwrap();
            let (theirs, their_len) = WsHeader::parse(&mut Cursor::new(&bytes)).unwrap().unwrap();
            let ours = parse_header(&bytes).unwrap().unwrap();
            assert_eq!(ours.fin, theirs.is_final);
            assert_eq!(ours.opcode, u8::from(theirs.opcode));
            assert_eq!(ours.mask, theirs.mask);
            assert_eq!(ours.payload_len, their_len);
            assert_eq!(ours.frame_len(), bytes.len() as u64);
        }
    }

    #[test]
    fn protocol_violations_in_a_header_are_refused() {
        assert_eq!(parse_header(&[0xC1, 0]), Err(FrameError::ReservedBits));
        assert_eq!(parse_header(&[0x83, 0]), Err(FrameError::ReservedOpcode(3)));
        assert_eq!(
            parse_header(&[0x8B, 0]),
            Err(FrameError::ReservedOpcode(0xB))
        );
        // A fragmented ping, a 126-byte ping.
        assert_eq!(parse_header(&[0x09, 0]), Err(FrameError::BadControlFrame));
        assert_eq!(
            parse_header(&[0x89, 126, 0, 126]),
            Err(FrameError::BadControlFrame)
        );
        let mut huge = vec![0x82, 127];
        huge.extend_from_slice(&u64::MAX.to_be_bytes());
        assert_eq!(parse_header(&huge), Err(FrameError::LengthTooLarge));
        assert_eq!(FrameError::LengthTooLarge.close_code(), 1002);
        assert_eq!(
            FrameError::MessageTooBig { size: 2, max: 1 }.close_code(),
            1009
        );
        assert_eq!(FrameError::InvalidUtf8.close_code(), 1007);
    }

    #[test]
    fn unmasking_by_words_equals_unmasking_byte_by_byte_at_every_phase_and_length() {
        let mask = [0x9d, 0x21, 0x7f, 0xe4];
        let data: Vec<u8> = (0..61u8).map(|i| i.wrapping_mul(37)).collect();
        for offset in 0..8u64 {
            for len in 0..data.len() {
                let mut fast = data[..len].to_vec();
                unmask(&mut fast, mask, offset);
                let slow: Vec<u8> = (data[..len].iter().enumerate())
                    .map(|(i, b)| b ^ mask[(offset as usize + i) % 4])
                    .collect();
                assert_eq!(fast, slow, "offset {offset}, len {len}");
            }
        }
    }

    #[test]
    fn the_ascii_prefix_of_a_masked_payload_is_read_in_place_in_whole_blocks() {
        let mask = [0x80, 0x01, 0xff, 0x7f];
        let masked = |text: &[u8]| {
            let mut m = text.to_vec();
            unmask(&mut m, mask, 0);
            m
        };
        let ascii = vec![b'A'; 100];
        assert_eq!(masked_ascii_prefix(&masked(&ascii), mask), 96);
        for at in 0..100 {
            let mut text = ascii.clone();
            text[at] = 0xC3;
            let n = masked_ascii_prefix(&masked(&text), mask);
            assert_eq!(n, at / ASCII_BLOCK_BYTES * ASCII_BLOCK_BYTES, "{at}");
            assert!(text[..n].is_ascii());
        }
        assert_eq!(masked_ascii_prefix(&[], mask), 0);
    }

    #[test]
    fn unmasking_in_pieces_equals_unmasking_at_once() {
        let mask = [0xA1, 0xB2, 0xC3, 0xD4];
        let plain: Vec<u8> = (0..=255u8).collect();
        let mut masked = plain.clone();
        unmask(&mut masked, mask, 0);
        for cut in 0..plain.len() {
            let mut m = masked.clone();
            let (a, b) = m.split_at_mut(cut);
            unmask(a, mask, 0);
            unmask(b, mask, cut as u64);
            assert_eq!(m, plain, "cut {cut}");
        }
    }

    fn header(fin: bool, op: u8, len: u64) -> FrameHeader {
        FrameHeader {
            fin,
            opcode: op,
            mask: None,
            payload_len: len,
            header_len: 2,
        }
    }

    #[test]
    fn fragmented_messages_with_control_frames_inside() {
        let mut m = Message::default();
        assert!(m.at_boundary());
        assert_eq!(
            m.on_header(&header(false, opcode::TEXT, 10), 100),
            Ok(FrameRole::Data {
                text: true,
                last: false
            })
        );
        assert!(!m.at_boundary(), "an injected frame must wait");
        assert_eq!(
            m.on_header(&header(true, opcode::PING, 4), 100),
            Ok(FrameRole::Control)
        );
        assert!(!m.at_boundary(), "a ping does not end the message");
        assert_eq!(
            m.on_header(&header(false, opcode::CONTINUATION, 0), 100),
            Ok(FrameRole::Data {
                text: true,
                last: false
            })
        );
        assert_eq!(
            m.on_header(&header(true, opcode::CONTINUATION, 90), 100),
            Ok(FrameRole::Data {
                text: true,
                last: true
            })
        );
        assert!(m.at_boundary());
    }

    #[test]
    fn message_size_is_summed_over_fragments_before_any_payload() {
        let mut m = Message::default();
        m.on_header(&header(false, opcode::BINARY, 60), 100)
            .unwrap();
        assert_eq!(
            m.on_header(&header(true, opcode::CONTINUATION, 41), 100),
            Err(FrameError::MessageTooBig {
                size: 101,
                max: 100
            })
        );
        let mut m = Message::default();
        assert_eq!(
            m.on_header(&header(true, opcode::TEXT, 101), 100),
            Err(FrameError::MessageTooBig {
                size: 101,
                max: 100
            })
        );
        // Exactly the limit passes, and the count restarts per message.
        let mut m = Message::default();
        for _ in 0..3 {
            m.on_header(&header(true, opcode::TEXT, 100), 100).unwrap();
        }
    }

    #[test]
    fn continuations_out_of_place_are_protocol_errors() {
        let mut m = Message::default();
        assert_eq!(
            m.on_header(&header(true, opcode::CONTINUATION, 1), 100),
            Err(FrameError::UnexpectedContinuation)
        );
        m.on_header(&header(false, opcode::TEXT, 1), 100).unwrap();
        assert_eq!(
            m.on_header(&header(true, opcode::BINARY, 1), 100),
            Err(FrameError::ExpectedContinuation)
        );
    }

    /// Feeds `bytes` split at `cuts` and finishes.
    fn validate_split(bytes: &[u8], cuts: &[usize]) -> Result<(), FrameError> {
        let mut v = Utf8Stream::default();
        let mut from = 0;
        for &c in cuts.iter().chain(std::iter::once(&bytes.len())) {
            v.feed(&bytes[from..c])?;
            from = c;
        }
        v.finish()
    }

    #[test]
    fn utf8_split_anywhere_agrees_with_whole_validation() {
        let samples: Vec<Vec<u8>> = vec![
            "plain ascii".into(),
            "é€𝄞 mixed ü".into(),
            "𝄞𝄞𝄞".into(),
            vec![],
            vec![0xC3],                   // unfinished at the end
            vec![0xE2, 0x82],             // unfinished at the end
            vec![0xFF],                   // never valid
            vec![b'a', 0xED, 0xA0, 0x80], // a surrogate
            vec![0xF4, 0x90, 0x80, 0x80], // above U+10FFFF
            vec![0xC0, 0xAF],             // overlong
            vec![0xE2, 0x28, 0xA1],       // bad continuation
            [&b"ok "[..], "€".as_bytes(), &[0x80], b" tail"].concat(),
        ];
        for s in &samples {
            let whole = std::str::from_utf8(s).is_ok();
            for a in 0..=s.len() {
                for b in a..=s.len() {
                    assert_eq!(
                        validate_split(s, &[a, b]).is_ok(),
                        whole,
                        "{s:?} cut at {a}, {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn utf8_byte_by_byte_on_random_input_agrees() {
        let mut rng = Rng(42);
        let alphabet: Vec<&[u8]> = vec![
            b"a",
            "é".as_bytes(),
            "€".as_bytes(),
            "𝄞".as_bytes(),
            &[0x80],
            &[0xC3],
            &[0xF0, 0x9F],
            &[0xED, 0xA0],
        ];
        for _ in 0..3000 {
            let mut s = Vec::new();
            for _ in 0..rng.below(8) {
                s.extend_from_slice(alphabet[rng.below(alphabet.len() as u64) as usize]);
            }
            let cuts: Vec<usize> = (1..s.len()).filter(|_| rng.below(2) == 0).collect();
            assert_eq!(
                validate_split(&s, &cuts).is_ok(),
                std::str::from_utf8(&s).is_ok(),
                "{s:?} cut at {cuts:?}"
            );
        }
    }

    #[test]
    fn a_completion_finishes_every_unfinished_prefix_validly() {
        let mut chars = 0;
        for c in [
            'é',
            'ࠀ',
            '€',
            '\u{D7FF}',
            '\u{E000}',
            '𐀀',
            '𝄞',
            '\u{10FFFF}',
        ] {
            let mut bytes = [0u8; 4];
            let encoded = c.encode_utf8(&mut bytes).as_bytes();
            for cut in 1..encoded.len() {
                let mut v = Utf8Stream::default();
                v.feed(&[b"ok ", &encoded[..cut]].concat()).unwrap();
                let rest = v.completion();
                assert_eq!(rest.len(), encoded.len() - cut, "{c:?} cut {cut}");
                v.feed(&rest).unwrap();
                assert_eq!(v.finish(), Ok(()), "{c:?} cut {cut}");
                chars += 1;
            }
        }
        assert!(chars > 10);
        assert!(Utf8Stream::default().completion().is_empty());
    }

    #[test]
    fn a_frame_built_here_is_read_back_by_tungstenite() {
        for (len, mask) in [
            (0usize, None),
            (125, Some([9, 8, 7, 6])),
            (126, None),
            (65536, Some([1, 1, 1, 1])),
        ] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let bytes = frame_bytes(true, opcode::BINARY, mask, &payload);
            let mut cur = Cursor::new(&bytes);
            let (h, n) = WsHeader::parse(&mut cur).unwrap().unwrap();
            assert_eq!(n, len as u64);
            assert_eq!(h.mask, mask);
            let mut body = bytes[cur.position() as usize..].to_vec();
            if let Some(m) = mask {
                unmask(&mut body, m, 0);
            }
            assert_eq!(body, payload);
        }
    }
}
