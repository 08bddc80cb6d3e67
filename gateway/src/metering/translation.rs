//! Metering a translation session (`/v1/realtime/translations`) by the audio
//! it carries: no translation event reports usage (openai-python
//! `types/realtime/realtime_translation_server_event.py`: created, updated,
//! closed, transcript and audio deltas, errors), and OpenAI prices
//! `gpt-realtime-translate` per minute of audio, so the gateway measures it.
//!
//! - **Input** is every `session.input_audio_buffer.append`'s `audio`:
//!   base64 of 24 kHz PCM16 mono, the only input a WebSocket translation
//!   session accepts (`realtime_translation_input_audio_buffer_append_event.py`),
//!   [`INPUT_BYTES_PER_SEC`] = 48,000 bytes a second. Its decoded length is
//!   read from the base64 text's length ([`base64_decoded_len`]), never by
//!   decoding: the frame is scanned once for the string's end, in place
//!   (masked), and only the first 256 bytes are unmasked.
//! - **Output** is every `session.output_audio.delta`'s `delta`, at its
//!   `sample_rate` (default 24,000) and `channels` (default 1), PCM16.
//! - **Billed** is the input ([`billed_seconds`]): the model's price is one
//!   "realtime audio duration" rate, the duration of the stream the session
//!   translates; the output follows the input in real time (the simulator's
//!   too: it answers each append with audio of the same length). Output
//!   seconds are measured and written in the row beside it
//!   (`output_audio_seconds`), so a reconciliation can tell if that ever
//!   changes.
//!
//! The counts leave the relay through two relaxed atomics
//! ([`AudioCounters`], written only by the session's own task); the meter
//! takes them every flush window and writes one row per window that carried
//! audio, charged like any row (so a spent budget ends the session within a
//! window), and a last one at the end.
//!
//! Safety of the count (nothing a client sends may lower it): a translation
//! session takes each event as one WebSocket message (a fragmented one is
//! refused, so no append is split where it cannot be counted); an append
//! whose `audio` is not in its first 256 bytes, or whose text goes on for
//! more than [`TAIL_BYTES`] after its `audio` (room for a second `audio`),
//! is read whole, and a duplicate key refuses it. Any other message longer
//! than [`OTHER_MAX_BYTES`] is read whole too (a duplicate `type` could make
//! it an append). A base64 text's length never undercounts: JSON escapes
//! only lengthen it.

use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::LazyLock;

use memchr::memmem::Finder;
use serde::Deserialize;

use crate::relay::client_text::Peek;
use crate::relay::frame::unmask;
use crate::relay::reader::RawFrame;

/// Bytes a second of a WebSocket translation session's input (24 kHz PCM16
/// mono).
pub const INPUT_BYTES_PER_SEC: u64 = 48_000;
/// The output sample rate when a delta names none.
pub const DEFAULT_OUTPUT_RATE: u64 = 24_000;
/// Bytes an append may carry after its `audio` string before it is read
/// whole (a closing brace, an `event_id`).
pub const TAIL_BYTES: usize = 256;
/// Longest message of another type forwarded without being read whole.
pub const OTHER_MAX_BYTES: usize = 1024;

const APPEND: &[u8] = b"session.input_audio_buffer.append";
const OUTPUT_DELTA: &[u8] = b"session.output_audio.delta";
const AUDIO_KEY: &[u8] = b"\"audio\":\"";
const DELTA_KEY: &[u8] = b"\"delta\":\"";

/// Searchers built once per process: `memmem::find` builds one per call,
/// which was most of what a search cost on these short keys.
static AUDIO_FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(AUDIO_KEY));
static DELTA_FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(DELTA_KEY));
static RATE_FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"sample_rate\":"));
static CHANNELS_FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"channels\":"));

/// What a translation session carried since the meter last took it.
#[derive(Debug, Default)]
pub struct AudioCounters {
    /// Decoded input audio bytes.
    input_bytes: AtomicU64,
    /// Output audio, in microseconds.
    output_us: AtomicU64,
}

impl AudioCounters {
    fn add_input(&self, bytes: u64) {
        self.input_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn add_output_us(&self, us: u64) {
        self.output_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Input and output seconds since the last take.
    pub fn take(&self) -> (f64, f64) {
        let input = self.input_bytes.swap(0, Ordering::Relaxed);
        let output = self.output_us.swap(0, Ordering::Relaxed);
        (
            input as f64 / INPUT_BYTES_PER_SEC as f64,
            output as f64 / 1e6,
        )
    }
}

/// The seconds a window is billed for: its input audio (see the module
/// docs for why).
pub fn billed_seconds(input_secs: f64, _output_secs: f64) -> f64 {
    input_secs
}

/// Bytes a base64 text of `len` characters decodes to, `padding` of them
/// being `=`; a length that is not a multiple of four (unpadded base64)
/// counts its whole groups and the bytes its last partial group holds.
pub fn base64_decoded_len(len: usize, padding: usize) -> u64 {
    let len = len as u64;
    let bytes = len / 4 * 3
        + match len % 4 {
            2 => 1,
            3 => 2,
            _ => 0,
        };
    bytes.saturating_sub(padding.min(2) as u64)
}

/// Bytes the base64 text `b64` decodes to (its `=` padding read from its
/// end).
fn decoded_len_of(b64: &[u8]) -> u64 {
    let padding = b64.iter().rev().take(2).filter(|&&b| b == b'=').count();
    base64_decoded_len(b64.len(), padding)
}

/// The audio of a translation session, measured as its frames pass.
#[derive(Debug)]
pub struct TranslationAudio {
    counters: std::sync::Arc<AudioCounters>,
}

/// An append read whole: its `type` and `audio`, each at most once.
#[derive(Deserialize)]
struct Whole<'a> {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(borrow)]
    audio: Option<std::borrow::Cow<'a, str>>,
}

impl TranslationAudio {
    pub fn new(counters: std::sync::Arc<AudioCounters>) -> Self {
        Self { counters }
    }

    /// A client message's first frame: an append is counted from the frame
    /// in place (`Forward`), or asked for whole.
    pub fn peek_client(&self, leading: &[u8], f: &RawFrame) -> Peek {
        self.peek_typed(crate::event::leading_event_type_bytes(leading), leading, f)
    }

    /// [`Self::peek_client`] with the message's type already read from
    /// `leading` (`None`: not there), so a tap reads it once per frame.
    pub fn peek_typed(&self, kind: Option<&[u8]>, leading: &[u8], f: &RawFrame) -> Peek {
        let payload = f.payload();
        match kind {
            Some(APPEND) => {}
            Some(_) if payload.len() <= OTHER_MAX_BYTES => return Peek::Forward,
            _ => return Peek::Whole,
        }
        let Some(at) = AUDIO_FINDER.find(leading) else {
            return Peek::Whole;
        };
        let start = at + AUDIO_KEY.len();
        let Some(end) = find_quote(payload, f.header.mask, start) else {
            return Peek::Whole;
        };
        if payload.len() - end > TAIL_BYTES {
            return Peek::Whole;
        }
        let padding = (end.saturating_sub(2)..end)
            .filter(|&i| i >= start && unmasked_at(payload, f.header.mask, i) == b'=')
            .count();
        self.counters
            .add_input(base64_decoded_len(end - start, padding));
        Peek::Forward
    }

    /// A whole client message (asked for by [`Self::peek_client`]): an
    /// append is counted; one that cannot be read (a duplicate key) is
    /// refused, since the upstream might read it otherwise.
    pub fn on_client_text(&self, text: &[u8]) -> Result<(), &'static str> {
        match serde_json::from_slice::<Whole<'_>>(text) {
            Ok(w) if w.kind.as_deref().map(str::as_bytes) == Some(APPEND) => {
                let audio = w.audio.unwrap_or_default();
                self.counters.add_input(decoded_len_of(audio.as_bytes()));
                Ok(())
            }
            Ok(_) => Ok(()),
            // Not JSON at all: nothing the upstream takes as an event.
            Err(e) if !e.is_data() => Ok(()),
            Err(_) => Err("the event could not be read to measure its audio; it was not forwarded"),
        }
    }

    /// An upstream text message: output audio is counted.
    pub fn on_upstream(&self, text: &[u8]) {
        if crate::event::leading_event_type_bytes(text) != Some(OUTPUT_DELTA) {
            return;
        }
        let Some(at) = DELTA_FINDER.find(text) else {
            return;
        };
        let start = at + DELTA_KEY.len();
        let Some(len) = memchr::memchr(b'"', &text[start..]) else {
            return;
        };
        let end = start + len;
        let bytes = decoded_len_of(&text[start..end]);
        // The other keys are outside the audio (base64 holds no quote):
        // searched before it, then after it, never through it.
        let number = |finder: &Finder<'_>| {
            number_after(&text[..at], finder).or_else(|| number_after(&text[end..], finder))
        };
        let rate = number(&RATE_FINDER).unwrap_or(DEFAULT_OUTPUT_RATE);
        let channels = number(&CHANNELS_FINDER).unwrap_or(1);
        let per_sec = 2 * rate.max(1) * channels.max(1);
        self.counters.add_output_us(bytes * 1_000_000 / per_sec);
    }
}

/// The byte of a (maybe masked) payload at `i`, unmasked.
fn unmasked_at(payload: &[u8], mask: Option<[u8; 4]>, i: usize) -> u8 {
    let mut b = [payload[i]];
    if let Some(m) = mask {
        unmask(&mut b, m, i as u64);
    }
    b[0]
}

/// The index of the first `"` at or after `from` in a (maybe masked)
/// payload, unmasking on the fly: eight bytes at a time, against the quote
/// as the mask shows it at each of the eight positions (a word of eight is
/// two whole mask periods, so the pattern stays in phase), then the bytes
/// left one at a time. An append's audio is thousands of bytes: byte by
/// byte this scan was most of what metering it cost.
fn find_quote(payload: &[u8], mask: Option<[u8; 4]>, from: usize) -> Option<usize> {
    let Some(m) = mask else {
        return memchr::memchr(b'"', payload.get(from..)?).map(|i| from + i);
    };
    let rest = payload.get(from..)?;
    let quoted: [u8; 8] = std::array::from_fn(|i| b'"' ^ m[(from + i) % 4]);
    let pattern = u64::from_le_bytes(quoted);
    let mut words = rest.chunks_exact(8);
    let mut at = 0;
    for w in words.by_ref() {
        let mut word = [0; 8];
        word.copy_from_slice(w);
        // Zero where a byte is the masked quote.
        let x = u64::from_le_bytes(word) ^ pattern;
        let zero = x.wrapping_sub(LOW_BITS) & !x & HIGH_BITS;
        if zero != 0 {
            // The lowest flagged byte is the first zero (borrows only run
            // upwards from a true zero).
            return Some(from + at + zero.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .enumerate()
        .position(|(i, &b)| b == quoted[(at + i) % 4])
        .map(|i| from + at + i)
}

const LOW_BITS: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The unsigned number after `key` in `text`, if any.
fn number_after(text: &[u8], key: &Finder<'_>) -> Option<u64> {
    let at = key.find(text)? + key.needle().len();
    let digits = text[at..]
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit())
        .fold(None, |n: Option<u64>, &b| {
            Some(
                n.unwrap_or(0)
                    .saturating_mul(10)
                    .saturating_add(u64::from(b - b'0')),
            )
        });
    digits
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use std::sync::Arc;

    fn masked(text: &str) -> RawFrame {
        crate::relay::testing::masked_text(text.as_bytes(), [0x5a, 0x13, 0xc7, 0x01])
    }

    fn peek(audio: &TranslationAudio, text: &str) -> Peek {
        let f = masked(text);
        let mut buf = [0; crate::relay::client_text::PEEK_BYTES];
        let leading = crate::relay::client_text::peek(&f, &mut buf).to_vec();
        audio.peek_client(&leading, &f)
    }

    #[test]
    fn base64_lengths_give_the_decoded_bytes() {
        let b64 = base64::engine::general_purpose::STANDARD;
        for n in 0..50 {
            let text = b64.encode(vec![7u8; n]);
            let padding = text.bytes().filter(|&b| b == b'=').count();
            assert_eq!(base64_decoded_len(text.len(), padding), n as u64, "{n}");
            let unpadded = text.trim_end_matches('=');
            assert_eq!(
                base64_decoded_len(unpadded.len(), 0),
                n as u64,
                "{n} unpadded"
            );
        }
    }

    #[test]
    fn an_append_is_counted_in_place_and_other_events_pass() {
        let counters = Arc::new(AudioCounters::default());
        let audio = TranslationAudio::new(counters.clone());
        let b64 = base64::engine::general_purpose::STANDARD;
        // 200 ms of audio, with and without an event id after it.
        let chunk = b64.encode(vec![1u8; 9600]);
        let append = format!(r#"{{"type":"session.input_audio_buffer.append","audio":"{chunk}"}}"#);
        assert_eq!(peek(&audio, &append), Peek::Forward);
        let with_id = format!(
            r#"{{"event_id":"e1","type":"session.input_audio_buffer.append","audio":"{chunk}","x":1}}"#
        );
        assert_eq!(peek(&audio, &with_id), Peek::Forward);
        assert_eq!(counters.take().0, 0.4);
        assert_eq!(peek(&audio, r#"{"type":"session.close"}"#), Peek::Forward);
        assert_eq!(counters.take().0, 0.0);
    }

    #[test]
    fn an_append_that_could_hide_audio_is_read_whole_and_a_duplicate_refused() {
        let counters = Arc::new(AudioCounters::default());
        let audio = TranslationAudio::new(counters.clone());
        let big = "A".repeat(4000);
        let cases = [
            // A second `audio` after the first.
            format!(
                r#"{{"type":"session.input_audio_buffer.append","audio":"AAAA","audio":"{big}"}}"#
            ),
            // `audio` after the peek.
            format!(
                r#"{{"event_id":"{}","type":"session.input_audio_buffer.append","audio":"{big}"}}"#,
                "e".repeat(300)
            ),
            // A long message of another type (a duplicate `type` may follow).
            format!(
                r#"{{"type":"session.close","type":"session.input_audio_buffer.append","audio":"{big}"}}"#
            ),
        ];
        for text in &cases {
            assert_eq!(peek(&audio, text), Peek::Whole, "{}", &text[..80]);
        }
        assert!(audio.on_client_text(cases[0].as_bytes()).is_err());
        assert!(audio.on_client_text(cases[2].as_bytes()).is_err());
        assert_eq!(audio.on_client_text(cases[1].as_bytes()), Ok(()));
        assert_eq!(counters.take().0, 3000.0 / 48_000.0);
    }

    #[test]
    fn the_word_scan_finds_the_first_quote_at_every_offset_and_mask_phase() {
        let mask = [0x22 ^ 0x41, 0x13, 0x22, 0x80];
        for len in 0usize..40 {
            for quote in (0..len).map(Some).chain([None]) {
                for second in [None, len.checked_sub(1)] {
                    let mut text = vec![b'A'; len];
                    for q in [quote, second].into_iter().flatten() {
                        text[q] = b'"';
                    }
                    let mut masked = text.clone();
                    unmask(&mut masked, mask, 0);
                    for from in 0..=len {
                        let want = text[from..]
                            .iter()
                            .position(|&b| b == b'"')
                            .map(|i| from + i);
                        assert_eq!(
                            find_quote(&masked, Some(mask), from),
                            want,
                            "{len} {quote:?} {from}"
                        );
                        assert_eq!(find_quote(&text, None, from), want);
                    }
                }
            }
        }
    }

    #[test]
    fn output_deltas_are_counted_at_their_rate() {
        let counters = Arc::new(AudioCounters::default());
        let audio = TranslationAudio::new(counters.clone());
        let b64 = base64::engine::general_purpose::STANDARD;
        let delta = b64.encode(vec![0u8; 4800]);
        audio.on_upstream(format!(r#"{{"type":"session.output_audio.delta","event_id":"e","delta":"{delta}","sample_rate":24000}}"#).as_bytes());
        audio.on_upstream(format!(r#"{{"type":"session.output_audio.delta","delta":"{delta}","sample_rate":48000,"channels":2}}"#).as_bytes());
        audio.on_upstream(br#"{"type":"session.output_transcript.delta","delta":"hola"}"#);
        let (input, output) = counters.take();
        assert_eq!((input, output), (0.0, 0.1 + 0.025));
        // The rate read before the audio as well as after it.
        audio.on_upstream(format!(r#"{{"type":"session.output_audio.delta","channels":2,"sample_rate":48000,"delta":"{delta}"}}"#).as_bytes());
        assert_eq!(counters.take().1, 0.025);
        assert_eq!(billed_seconds(2.0, 3.0), 2.0);
    }
}
