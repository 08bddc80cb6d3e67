//! The client's text messages as a [`super::Tap`] sees them before they are
//! forwarded, for a gateway policy on what a client may ask the upstream
//! (the models a `session.update` names).
//!
//! Cost per client frame: nothing for a tap that does not inspect client
//! messages ([`super::Tap::inspects_client`]); otherwise the first
//! [`PEEK_BYTES`] of the first frame of each text message are unmasked into
//! a stack buffer and handed to [`super::Tap::peek_client`], which decides
//! from the event type there whether it needs the whole message. Only then
//! is the payload unmasked whole (into a buffer dropped right after), so an
//! `input_audio_buffer.append` costs a 256-byte XOR, not a copy of its
//! audio.
//!
//! A message read whole may also be replaced ([`Verdict::Replace`]): the
//! tap's text goes upstream instead, as one frame of the gateway's own.
//!
//! The relay never holds fragments back: a fragmented message the tap
//! wants whole is refused or let through by
//! [`super::Tap::on_client_fragmented`] from its first frame; a refused
//! message is dropped to its last frame. The official SDKs send each event
//! as one frame.

use super::frame::unmask;
use super::reader::RawFrame;

/// Bytes of a client text message a tap is shown to decide whether it
/// needs the rest: room for `{"event_id":"<a long id>","type":"<type>"`.
pub const PEEK_BYTES: usize = 256;

/// What a tap wants of a client text message, from its leading bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peek {
    /// Forward it unseen.
    Forward,
    /// Show it whole before it is forwarded.
    Whole,
}

/// What becomes of a client message a tap read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Forwarded as received.
    Forward,
    /// Forwarded as this text instead (a message the tap changed; sent as
    /// one frame of the gateway's own, masked).
    Replace(String),
    /// Dropped; the client gets this `error` event.
    Refuse(String),
}

/// The first bytes (at most [`PEEK_BYTES`]) of `f`'s payload, unmasked.
pub fn peek<'b>(f: &RawFrame, buf: &'b mut [u8; PEEK_BYTES]) -> &'b [u8] {
    let payload = f.payload();
    let n = payload.len().min(PEEK_BYTES);
    let out = &mut buf[..n];
    out.copy_from_slice(&payload[..n]);
    if let Some(mask) = f.header.mask {
        unmask(out, mask, 0);
    }
    out
}

/// `f`'s whole payload, unmasked.
pub fn unmasked(f: &RawFrame) -> Vec<u8> {
    let mut out = f.payload().to_vec();
    if let Some(mask) = f.header.mask {
        unmask(&mut out, mask, 0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::testing::masked_text;

    #[test]
    fn the_peek_is_the_unmasked_start_and_the_whole_is_the_unmasked_payload() {
        let long = format!(
            "{{\"type\":\"input_audio_buffer.append\",\"audio\":\"{}\"}}",
            "A".repeat(1000)
        );
        let f = masked_text(long.as_bytes(), [0x11, 0x22, 0x33, 0x44]);
        let mut buf = [0; PEEK_BYTES];
        assert_eq!(peek(&f, &mut buf), &long.as_bytes()[..PEEK_BYTES]);
        assert_eq!(unmasked(&f), long.as_bytes());

        let short = br#"{"type":"session.update"}"#;
        let f = masked_text(short, [1, 2, 3, 4]);
        assert_eq!(peek(&f, &mut buf), short);
        assert_eq!(unmasked(&f), short);
    }
}
