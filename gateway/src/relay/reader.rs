//! Reads one leg's WebSocket frames as the bytes received, for forwarding
//! without decoding.
//!
//! Guarantees:
//! - Each [`RawFrame`] is one frame, header and payload exactly as they came
//!   off the socket (still masked if the peer masked it), so writing
//!   [`RawFrame::bytes`] to the other leg forwards it byte for byte.
//! - A frame's header is checked ([`frame::parse_header`]) and accounted to
//!   its message ([`frame::Message`]) before the reader asks for more of
//!   it: a message over `max_message_bytes` (summed over its fragments) is
//!   refused (1009) having read no more than the one read that brought its
//!   header (at most [`REUSE_MAX_BYTES`]).
//! - With [`Utf8Check::Validate`] (the client leg), text messages are
//!   validated as UTF-8 across fragments (1007): a frame's leading ASCII is
//!   judged in place on the masked bytes ([`frame::masked_ascii_prefix`]),
//!   and only what follows it is unmasked, through a small stack buffer,
//!   and validated; the forwarded bytes are never modified. Every client
//!   text byte is still validated: the gateway reads client text (the
//!   tap's event type, model checks, audio counts) and never parses text
//!   it has not validated, so trusting the upstream to refuse bad text
//!   was not taken.
//! - A frame is split off the read buffer without a copy. At a frame
//!   boundary the read goes into the allocation of an earlier frame of
//!   [`MIN_READ_BYTES`] to [`REUSE_MAX_BYTES`] once that frame has been
//!   written and dropped (the spare); else into a stack buffer
//!   ([`MIN_READ_BYTES`], not zero-filled), and what came is copied into
//!   one `BytesMut` sized for the frame it starts. Later reads of a frame
//!   go into its buffer's spare capacity. Memory held per leg: what was
//!   read past the last whole frame, the frame being assembled (at most
//!   `max_message_bytes` plus a header), and at most one spare allocation
//!   of [`REUSE_MAX_BYTES`], which [`FrameReader::release_spare`] lets go
//!   (the relay calls it when a session has gone quiet:
//!   [`super::RELEASE_IDLE_AFTER`]).
//!
//! Caveat: a frame is delivered whole, so a large frame waits until all of
//! it has arrived (as it did through tungstenite's decoder).

use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

use super::frame::{self, FrameError, FrameHeader, FrameRole, Message, Utf8Stream};

/// What a read of the buffer asks the socket for at least.
pub const MIN_READ_BYTES: usize = 4 * 1024;
/// The largest allocation the reader keeps (as its spare) once the frames
/// read into it are returned, to read later frames into when those have
/// been written and dropped: a stream of audio deltas then reuses buffers
/// instead of allocating one per delta, and takes a delta in one read
/// instead of a stack read, a copy and a second read. Bounds what an idle
/// leg holds.
pub const REUSE_MAX_BYTES: usize = 32 * 1024;
/// Scratch for unmasking client text while validating it.
const UNMASK_CHUNK_BYTES: usize = 512;

/// Whether text payloads are validated as UTF-8 on this leg.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Utf8Check {
    /// The client leg: invalid text ends the session (1007).
    Validate,
    /// The upstream leg: trusted.
    Trust,
}

/// One frame as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    pub header: FrameHeader,
    pub role: FrameRole,
    /// Header and payload, as received.
    pub bytes: Bytes,
}

impl RawFrame {
    /// The payload as received (masked if the peer masked it).
    pub fn payload(&self) -> &[u8] {
        &self.bytes[self.header.header_len..]
    }
}

/// Why reading a leg stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Frames of one leg, in order.
///
/// Cancel-safe: everything read, and the header of the frame being read,
/// are kept in the reader, so a [`Self::poll_next`] that is not polled again
/// (a `select!` that took another branch) loses nothing.
#[derive(Debug)]
pub struct FrameReader {
    buf: BytesMut,
    /// The size of `buf`'s allocation, when known and not grown since.
    buf_alloc: Option<usize>,
    /// The last allocation of [`MIN_READ_BYTES`] to [`REUSE_MAX_BYTES`]
    /// that frames were read into, kept to read later frames into once
    /// those have been written and dropped (see [`Self::take_spare`]).
    spare: Option<BytesMut>,
    /// The header of the frame being read and the message state it leads
    /// to, committed when the frame is returned.
    current: Option<(FrameHeader, FrameRole, Message)>,
    /// The message state of the frames returned so far.
    message: Message,
    /// The UTF-8 state of the text returned so far.
    utf8: Utf8Stream,
    check: Utf8Check,
    /// Whether every frame must be masked (a client's) or unmasked (a
    /// server's); `None` reads either (tests of the framing alone).
    masked: Option<bool>,
    max_message_bytes: u64,
}

impl FrameReader {
    /// `already_read`: bytes read from the socket past the handshake.
    pub fn new(already_read: &[u8], check: Utf8Check, max_message_bytes: u64) -> Self {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(already_read);
        Self {
            buf,
            buf_alloc: None,
            spare: None,
            current: None,
            message: Message::default(),
            utf8: Utf8Stream::default(),
            check,
            masked: None,
            max_message_bytes,
        }
    }

    /// Refuses, at its header, a frame masked otherwise than `masked` says
    /// (RFC 6455 §5.1): before anything of it is read or counted into its
    /// message, so a refused frame leaves the message state as the frames
    /// forwarded left it.
    pub fn expect_masked(mut self, masked: bool) -> Self {
        self.masked = Some(masked);
        self
    }

    /// No fragmented message is open among the frames returned so far: the
    /// gateway may inject a frame into the leg they are forwarded to.
    pub fn at_boundary(&self) -> bool {
        self.message.at_boundary()
    }

    /// The payload of a last continuation frame that would end the open
    /// message validly (`None` at a boundary): empty for binary, and for
    /// text the bytes that complete a character left unfinished. Used only
    /// when the sender of a fragmented message is gone and the gateway must
    /// still write into the leg its fragments went to.
    pub fn completion(&self) -> Option<Vec<u8>> {
        (!self.at_boundary()).then(|| self.utf8.completion())
    }

    /// Lets go of the spare allocation (whether kept beside the buffer or
    /// already made the buffer by a read that found nothing): for a leg
    /// that has gone quiet, so an idle session holds no read allocation.
    /// Bytes past the last whole frame, if any, are kept. The next frame
    /// is read as after a frame too large to keep: through the stack.
    pub fn release_spare(&mut self) {
        self.spare = None;
        if self.buf.is_empty() && self.buf.capacity() > 0 {
            // Empty at a frame boundary: nothing of a frame is in it (a
            // frame's header stays in the buffer until the frame is whole).
            self.buf = BytesMut::new();
            self.buf_alloc = None;
        }
    }

    /// A whole frame is already buffered: [`Self::next`] returns it without
    /// reading the socket.
    pub fn has_frame(&self) -> bool {
        matches!(frame::parse_header(&self.buf), Ok(Some(h)) if h.frame_len() <= self.buf.len() as u64)
    }

    /// The next frame; `Ok(None)` when the peer closed the connection at a
    /// frame boundary.
    pub async fn next<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
    ) -> Result<Option<RawFrame>, ReadError> {
        std::future::poll_fn(|cx| self.poll_next(cx, io)).await
    }

    /// [`Self::next`] as a poll.
    pub fn poll_next<R: AsyncRead + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut R,
    ) -> Poll<Result<Option<RawFrame>, ReadError>> {
        loop {
            let Some((header, role, message)) = self.current else {
                if let Some(h) = frame::parse_header(&self.buf)? {
                    self.begin(h)?;
                    continue;
                }
                if ready!(self.poll_fill(cx, io, frame::MAX_HEADER_BYTES))? {
                    continue;
                }
                return Poll::Ready(if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ReadError::Truncated)
                });
            };
            // Bounded by max_message_bytes (checked above) or 125 (control).
            let len = header.frame_len() as usize;
            if self.buf.len() < len {
                let want = len - self.buf.len();
                if ready!(self.poll_fill(cx, io, want))? {
                    continue;
                }
                return Poll::Ready(Err(ReadError::Truncated));
            }
            let bytes = self.buf.split_to(len).freeze();
            if self.buf.is_empty() {
                // The allocation the frame came in is kept (as the spare)
                // only if it is worth reading into again and small enough
                // to hold while idle; else it goes with the frame.
                let buf = std::mem::take(&mut self.buf);
                if self.buf_alloc.take().is_some_and(reusable) {
                    self.spare = Some(buf);
                }
            }
            self.current = None;
            let raw = RawFrame {
                header,
                role,
                bytes,
            };
            if let (Utf8Check::Validate, FrameRole::Data { text: true, last }) = (self.check, role)
            {
                let mut utf8 = self.utf8;
                validate(&mut utf8, &raw)?;
                if last {
                    utf8.finish()?;
                }
                self.utf8 = utf8;
            }
            self.message = message;
            return Poll::Ready(Ok(Some(raw)));
        }
    }

    /// Takes the header of the next frame: accounted to its message (which
    /// refuses one over `max_message_bytes`), committed when the frame is
    /// returned.
    fn begin(&mut self, h: FrameHeader) -> Result<(), FrameError> {
        match (self.masked, h.mask.is_some()) {
            (Some(true), false) => return Err(FrameError::Unmasked),
            (Some(false), true) => return Err(FrameError::Masked),
            _ => {}
        }
        let mut message = self.message;
        let role = message.on_header(&h, self.max_message_bytes)?;
        self.current = Some((h, role, message));
        Ok(())
    }

    /// Reads once; `false` at EOF. With bytes buffered, reads into the
    /// buffer's spare capacity, growing it (by at least [`MIN_READ_BYTES`])
    /// only when it has less than `want` bytes of room: a buffer sized for
    /// its frame takes the frame's rest without a reallocation.
    fn poll_fill<R: AsyncRead + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut R,
        want: usize,
    ) -> Poll<Result<bool, ReadError>> {
        // An empty buffer with capacity is the spare, taken at an earlier
        // poll whose read found nothing.
        if self.buf.capacity() == 0 && !self.take_spare() {
            return self.poll_fill_empty(cx, io);
        }
        if self.buf.capacity() - self.buf.len() < want {
            self.buf.reserve(want.max(MIN_READ_BYTES));
            // Grown, or moved to another allocation: its size is not known.
            self.buf_alloc = None;
        }
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(io),
            cx,
            &mut self.buf
        ))?;
        Poll::Ready(Ok(n > 0))
    }

    /// At a frame boundary: makes the spare allocation the read buffer, from
    /// its start, if no frame split off it is still held (queued for
    /// writing). `false` leaves the spare for a later frame.
    fn take_spare(&mut self) -> bool {
        let Some(spare) = &mut self.spare else {
            return false;
        };
        // Asking for one byte more than it has left makes `try_reclaim`
        // move it back to the start of its allocation, which it does only
        // when this is the allocation's last handle (it is empty: every
        // frame read into it was split off).
        let rem = spare.capacity();
        if !spare.try_reclaim(rem + 1) {
            return false;
        }
        self.buf_alloc = Some(spare.capacity());
        self.buf = std::mem::take(spare);
        self.spare = None;
        true
    }

    /// [`Self::poll_fill`] with nothing buffered (a frame boundary) and no
    /// spare to read into: reads into the stack, so a leg waiting for its
    /// next frame holds no read buffer of its own beyond the spare, then
    /// copies what came into one allocation sized for the frame it starts.
    /// When the frame's header came, it is taken here ([`Self::begin`], so
    /// an oversize frame is refused before anything is allocated for it);
    /// else the allocation holds what came.
    fn poll_fill_empty<R: AsyncRead + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut R,
    ) -> Poll<Result<bool, ReadError>> {
        let mut scratch = [MaybeUninit::<u8>::uninit(); MIN_READ_BYTES];
        let mut read = ReadBuf::uninit(&mut scratch);
        ready!(Pin::new(io).poll_read(cx, &mut read))?;
        let got = read.filled();
        if got.is_empty() {
            return Poll::Ready(Ok(false));
        }
        let frame_len = match frame::parse_header(got)? {
            Some(h) => {
                self.begin(h)?;
                // Bounded by max_message_bytes (begin checked it) or 125.
                h.frame_len() as usize
            }
            None => 0,
        };
        // A frame that may leave its allocation for reuse gets an eighth
        // more, so that the next frames of about its size (deltas differ
        // by a few bytes of ids) fit it too.
        let capacity = if reusable(frame_len) {
            (frame_len + frame_len / 8).min(REUSE_MAX_BYTES)
        } else {
            frame_len.max(got.len())
        };
        let mut buf = BytesMut::with_capacity(capacity);
        buf.extend_from_slice(got);
        // Kept for reuse only when sized for a frame of its own: one sized
        // for a read of small frames would have to grow for a large one.
        self.buf_alloc = (frame_len >= got.len()).then_some(buf.capacity());
        self.buf = buf;
        Poll::Ready(Ok(true))
    }
}

/// Whether an allocation (or a frame sized one) of `n` bytes is kept as
/// the spare: worth reading into again, and small enough to hold idle.
fn reusable(n: usize) -> bool {
    (MIN_READ_BYTES..=REUSE_MAX_BYTES).contains(&n)
}

/// Feeds a text frame's payload to `utf8`, unmasking through a small stack
/// buffer (the frame's bytes are never modified).
fn validate(utf8: &mut Utf8Stream, raw: &RawFrame) -> Result<(), FrameError> {
    let payload = raw.payload();
    let Some(mask) = raw.header.mask else {
        return utf8.feed(payload);
    };
    // Its ASCII prefix is valid and leaves the stream as it was, unless a
    // character split across frames is waiting for its next byte: judged
    // in place, never copied or unmasked (all of a typical append).
    let start = if utf8.at_char_boundary() {
        frame::masked_ascii_prefix(payload, mask)
    } else {
        0
    };
    let mut scratch = [0u8; UNMASK_CHUNK_BYTES];
    for (i, chunk) in payload[start..].chunks(UNMASK_CHUNK_BYTES).enumerate() {
        let piece = &mut scratch[..chunk.len()];
        piece.copy_from_slice(chunk);
        frame::unmask(piece, mask, (start + i * UNMASK_CHUNK_BYTES) as u64);
        utf8.feed(piece)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::testing::{frame, random_stream, reference_messages, Rng};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::Role;
    use tokio_tungstenite::tungstenite::Message as WsMessage;

    /// Gives its bytes in reads of at most `step` bytes, and fails any read
    /// past `limit` (to prove what was not read).
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
        limit: usize,
    }

    impl Trickle {
        fn new(data: Vec<u8>, step: usize) -> Self {
            let limit = data.len();
            Self {
                data,
                at: 0,
                step,
                limit,
            }
        }
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if self.at >= self.limit && self.at < self.data.len() {
                return Poll::Ready(Err(std::io::Error::other("read past the limit")));
            }
            let n = self
                .step
                .min(buf.remaining())
                .min(self.limit.min(self.data.len()) - self.at);
            let at = self.at;
            buf.put_slice(&self.data[at..at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    async fn read_all(
        bytes: Vec<u8>,
        step: usize,
        check: Utf8Check,
        max: u64,
    ) -> (Vec<RawFrame>, Result<(), String>) {
        let mut io = Trickle::new(bytes, step);
        let mut r = FrameReader::new(&[], check, max);
        let mut frames = Vec::new();
        loop {
            match r.next(&mut io).await {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => return (frames, Ok(())),
                Err(e) => return (frames, Err(e.to_string())),
            }
        }
    }

    /// Messages reassembled from our frames: payloads unmasked, data
    /// fragments joined, pings as pings.
    fn messages_of(frames: &[RawFrame]) -> Vec<WsMessage> {
        let mut out = Vec::new();
        let mut open: Vec<u8> = Vec::new();
        for f in frames {
            let mut payload = f.payload().to_vec();
            if let Some(m) = f.header.mask {
                frame::unmask(&mut payload, m, 0);
            }
            match f.role {
                FrameRole::Control => out.push(WsMessage::Ping(payload.into())),
                FrameRole::Data { text, last } => {
                    open.extend(payload);
                    if last {
                        let data = std::mem::take(&mut open);
                        out.push(if text {
                            WsMessage::Text(String::from_utf8(data).unwrap().into())
                        } else {
                            WsMessage::Binary(data.into())
                        });
                    }
                }
            }
        }
        out
    }

    #[tokio::test]
    async fn random_streams_pass_byte_for_byte_and_decode_as_tungstenite_does() {
        let mut rng = Rng(0x5EED_1234_ABCD_0001);
        for round in 0..60 {
            let masked = round % 2 == 0;
            let input = random_stream(&mut rng, masked);
            let step = [1usize, 7, 1000, 16 * 1024, usize::MAX][round % 5];
            let check = if masked {
                Utf8Check::Validate
            } else {
                Utf8Check::Trust
            };
            let (frames, end) = read_all(input.clone(), step, check, u64::MAX >> 1).await;
            assert_eq!(end, Ok(()), "round {round}");
            let forwarded: Vec<u8> = frames.iter().flat_map(|f| f.bytes.to_vec()).collect();
            assert_eq!(forwarded, input, "round {round}: byte for byte");
            // The messages our frame boundaries and roles make are the ones
            // tungstenite decodes (the receiving side of a client frame is a
            // server, and the other way round).
            let role = if masked { Role::Server } else { Role::Client };
            let reference = reference_messages(input, role);
            assert!(!reference.is_empty());
            assert_eq!(messages_of(&frames), reference, "round {round}");
        }
    }

    /// A large frame arriving in pieces is read into one allocation sized
    /// for it (with an eighth more, for the reuse of
    /// `a_written_deltas_allocation_takes_a_later_delta`), never grown as
    /// it arrives.
    #[tokio::test]
    async fn a_frame_gets_one_buffer_sized_for_it() {
        let payload = vec![b'a'; 22_000];
        let big = frame(true, OpCode::Data(Data::Text), None, payload);
        let small = frame(true, OpCode::Data(Data::Text), None, b"hi".to_vec());
        let mut input = big.clone();
        input.extend_from_slice(&small);
        // Every other read is Pending, so the frame arrives over polls.
        struct Stutter(Trickle, bool);
        impl AsyncRead for Stutter {
            fn poll_read(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<std::io::Result<()>> {
                self.1 = !self.1;
                if self.1 {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Pin::new(&mut self.0).poll_read(cx, buf)
            }
        }
        let mut io = Stutter(Trickle::new(input, 3000), false);
        let mut r = FrameReader::new(&[], Utf8Check::Trust, 1 << 20);
        assert_eq!(r.buf.capacity(), 0);

        let mut capacities = Vec::new();
        let got = std::future::poll_fn(|cx| {
            let polled = r.poll_next(cx, &mut io);
            capacities.push(r.buf.capacity());
            polled
        })
        .await;
        assert_eq!(got.unwrap().unwrap().bytes, big);
        // Nothing before the first read; sized for the frame at its first
        // read and never grown; what is left once the frame is split off is
        // the eighth more (the small frame behind it was read into it).
        assert!(capacities.len() > 5, "{capacities:?}");
        assert_eq!(capacities[0], 0);
        let (last, during) = capacities[1..].split_last().unwrap();
        let sized = big.len() + big.len() / 8;
        assert!(during.iter().all(|&c| c == sized), "{capacities:?}");
        assert_eq!(*last, sized - big.len());

        let second = r.next(&mut io).await.unwrap().unwrap();
        assert_eq!(second.bytes, small);
        assert_eq!(r.buf.capacity(), 0);
        assert!(r.next(&mut io).await.unwrap().is_none());
    }

    /// Audio deltas, each followed by a small event, the way an upstream
    /// sends them: a delta goes into the allocation of an earlier one once
    /// that was dropped (written), never while it is held; a frame over
    /// [`REUSE_MAX_BYTES`] is not kept.
    #[tokio::test]
    async fn a_written_deltas_allocation_takes_a_later_delta() {
        let text = |fill: u8, n: usize| frame(true, OpCode::Data(Data::Text), None, vec![fill; n]);
        let (a1, t1, a2, t2, a3) = (
            text(b'a', 20_000),
            text(b't', 100),
            text(b'b', 20_000),
            text(b'u', 100),
            text(b'c', 20_000),
        );
        // One frame per send: a read never takes bytes of two frames.
        struct Sends(std::collections::VecDeque<Vec<u8>>);
        impl AsyncRead for Sends {
            fn poll_read(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<std::io::Result<()>> {
                if let Some(front) = self.0.front_mut() {
                    let n = front.len().min(buf.remaining());
                    buf.put_slice(&front[..n]);
                    front.drain(..n);
                    if front.is_empty() {
                        self.0.pop_front();
                    }
                }
                Poll::Ready(Ok(()))
            }
        }
        let sends = [a1.clone(), t1.clone(), a2.clone(), t2.clone(), a3.clone()];
        let mut io = Sends(sends.into_iter().collect());
        let mut r = FrameReader::new(&[], Utf8Check::Trust, 1 << 20);
        let first = r.next(&mut io).await.unwrap().unwrap();
        assert_eq!(first.bytes, a1);
        let at = first.bytes.as_ptr();
        // Read while the delta is held: its allocation is not touched.
        let small = r.next(&mut io).await.unwrap().unwrap();
        assert_eq!(small.bytes, t1);
        assert!(
            !first.bytes.is_unique(),
            "the reader keeps the delta's allocation"
        );
        drop((first, small));
        let second = r.next(&mut io).await.unwrap().unwrap();
        assert_eq!(second.bytes, a2);
        assert_eq!(
            second.bytes.as_ptr(),
            at,
            "the written delta's allocation was reused"
        );
        // Held while the next delta is read: that one gets its own.
        let small = r.next(&mut io).await.unwrap().unwrap();
        assert_eq!(small.bytes, t2);
        let third = r.next(&mut io).await.unwrap().unwrap();
        assert_eq!(third.bytes, a3);
        assert_ne!(third.bytes.as_ptr(), at);
        assert_eq!(second.bytes, a2, "a held frame is never written over");

        let big = frame(
            true,
            OpCode::Data(Data::Binary),
            None,
            vec![b'd'; REUSE_MAX_BYTES],
        );
        let mut io = Trickle::new(big.clone(), 64 * 1024);
        let mut r = FrameReader::new(&[], Utf8Check::Trust, 1 << 20);
        let first = r.next(&mut io).await.unwrap().unwrap();
        assert_eq!(first.bytes, big);
        assert!(
            first.bytes.is_unique(),
            "a large frame's allocation is let go"
        );
    }

    /// One frame per read, then `Pending` (a quiet socket) once they are
    /// all read.
    struct Quiet(std::collections::VecDeque<Vec<u8>>);
    impl AsyncRead for Quiet {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let Some(front) = self.0.front_mut() else {
                return Poll::Pending;
            };
            let n = front.len().min(buf.remaining());
            buf.put_slice(&front[..n]);
            front.drain(..n);
            if front.is_empty() {
                self.0.pop_front();
            }
            Poll::Ready(Ok(()))
        }
    }

    /// A reader that read a delta and then went quiet keeps the delta's
    /// allocation for the next one; released, it holds nothing, whether
    /// the spare was still beside the buffer or already made the buffer
    /// by a read that found nothing, and the next delta still reads whole.
    #[tokio::test]
    async fn a_reader_that_went_idle_holds_no_spare_allocation() {
        let delta = |fill: u8| frame(true, OpCode::Data(Data::Text), None, vec![fill; 20_000]);
        let poll_once = |r: &mut FrameReader, io: &mut Quiet| {
            let waker = std::task::Waker::noop();
            match r.poll_next(&mut Context::from_waker(waker), io) {
                Poll::Ready(got) => Some(got.unwrap().unwrap()),
                Poll::Pending => None,
            }
        };
        let mut io = Quiet([delta(b'a')].into_iter().collect());
        let mut r = FrameReader::new(&[], Utf8Check::Trust, 1 << 20);
        let first = poll_once(&mut r, &mut io).expect("the delta");
        drop(first);
        assert!(r.spare.is_some(), "the written delta's allocation is kept");
        r.release_spare();
        assert!(r.spare.is_none(), "released beside the buffer");
        assert_eq!(r.buf.capacity(), 0);

        // The spare made the buffer by a poll whose read found nothing.
        let mut io = Quiet([delta(b'b')].into_iter().collect());
        let mut r = FrameReader::new(&[], Utf8Check::Trust, 1 << 20);
        drop(poll_once(&mut r, &mut io).expect("the delta"));
        assert!(poll_once(&mut r, &mut io).is_none(), "the socket is quiet");
        assert!(r.spare.is_none() && r.buf.capacity() >= 20_000);
        r.release_spare();
        assert_eq!(r.buf.capacity(), 0, "released as the buffer");
        assert!(r.spare.is_none());

        io.0.push_back(delta(b'c'));
        let next = poll_once(&mut r, &mut io).expect("the next delta");
        assert_eq!(next.bytes, delta(b'c'));
    }

    /// Bytes of a frame not yet whole are never released.
    #[tokio::test]
    async fn releasing_keeps_a_frame_half_read() {
        let whole = frame(true, OpCode::Data(Data::Text), None, vec![b'x'; 10_000]);
        let mut io = Quiet([whole[..6_000].to_vec()].into_iter().collect());
        let mut r = FrameReader::new(&[], Utf8Check::Trust, 1 << 20);
        let waker = std::task::Waker::noop();
        assert!(r
            .poll_next(&mut Context::from_waker(waker), &mut io)
            .is_pending());
        r.release_spare();
        io.0.push_back(whole[6_000..].to_vec());
        let got = r.next(&mut io).await.unwrap().unwrap();
        assert_eq!(got.bytes, whole);
    }

    #[tokio::test]
    async fn an_oversize_header_is_refused_before_its_payload_is_read() {
        let big = frame(
            true,
            OpCode::Data(Data::Binary),
            Some([1, 2, 3, 4]),
            vec![7; 2000],
        );
        let header_len = 2 + 2 + 4;
        let mut io = Trickle::new(big, 1);
        io.limit = header_len;
        let mut r = FrameReader::new(&[], Utf8Check::Validate, 1000);
        let e = r.next(&mut io).await.unwrap_err();
        assert!(
            matches!(
                e,
                ReadError::Frame(FrameError::MessageTooBig {
                    size: 2000,
                    max: 1000
                })
            ),
            "{e}"
        );
        assert_eq!(io.at, header_len, "not one payload byte was read");
    }

    #[tokio::test]
    async fn fragments_summing_past_the_limit_are_refused_at_the_last_header() {
        let mut bytes = frame(false, OpCode::Data(Data::Text), None, vec![b'a'; 600]);
        bytes.extend(frame(
            true,
            OpCode::Data(Data::Continue),
            None,
            vec![b'a'; 600],
        ));
        let (frames, end) = read_all(bytes, 64, Utf8Check::Trust, 1000).await;
        assert_eq!(frames.len(), 1);
        assert_eq!(
            end,
            Err("message of 1200 bytes over the limit of 1000".into())
        );
    }

    #[tokio::test]
    async fn invalid_utf8_split_across_client_fragments_is_refused() {
        // "€" is E2 82 AC: a frame ends after E2 82, the next starts with
        // 0x28 instead of AC.
        let m = Some([0x11, 0x22, 0x33, 0x44]);
        let mut bytes = frame(false, OpCode::Data(Data::Text), m, vec![b'a', 0xE2, 0x82]);
        bytes.extend(frame(true, OpCode::Data(Data::Continue), m, vec![0x28]));
        let (frames, end) = read_all(bytes.clone(), 3, Utf8Check::Validate, 1000).await;
        assert_eq!(frames.len(), 1);
        assert_eq!(end, Err("text is not valid UTF-8".into()));
        // The same split with the right byte passes, and upstream text is
        // trusted.
        let mut ok = frame(false, OpCode::Data(Data::Text), m, vec![b'a', 0xE2, 0x82]);
        ok.extend(frame(true, OpCode::Data(Data::Continue), m, vec![0xAC]));
        assert_eq!(read_all(ok, 3, Utf8Check::Validate, 1000).await.1, Ok(()));
        assert_eq!(read_all(bytes, 3, Utf8Check::Trust, 1000).await.1, Ok(()));
    }

    #[tokio::test]
    async fn client_text_past_its_ascii_prefix_and_across_fragments_is_validated_in_full() {
        let m = Some([0x80, 0x7f, 0x01, 0xfe]);
        let check = |text: Vec<u8>| async move {
            let bytes = frame(true, OpCode::Data(Data::Text), m, text);
            read_all(bytes, 1000, Utf8Check::Validate, 1000).await.1
        };
        let invalid = Err("text is not valid UTF-8".into());
        for at in [0, 31, 32, 33, 64, 150, 199] {
            let mut text = vec![b'A'; 200];
            text[at] = 0xFF;
            assert_eq!(check(text.clone()).await, invalid, "0xFF at {at}");
            text[at] = 0xC3;
            assert_eq!(check(text.clone()).await, invalid, "a lone lead at {at}");
            text.splice(at..at + 1, "é€".bytes());
            assert_eq!(check(text).await, Ok(()), "valid at {at}");
        }
        // A character left open by one fragment: the next one's ASCII is
        // not skipped, it is the wrong continuation.
        let mut bytes = frame(false, OpCode::Data(Data::Text), m, vec![b'a', 0xE2, 0x82]);
        bytes.extend(frame(true, OpCode::Data(Data::Continue), m, vec![b'A'; 64]));
        let end = read_all(bytes, 1000, Utf8Check::Validate, 1000).await.1;
        assert_eq!(end, invalid);
    }

    #[tokio::test]
    async fn a_message_ending_mid_character_is_invalid() {
        let bytes = frame(
            true,
            OpCode::Data(Data::Text),
            Some([9, 9, 9, 9]),
            vec![0xF0, 0x9F],
        );
        assert_eq!(
            read_all(bytes, 100, Utf8Check::Validate, 1000).await.1,
            Err("text is not valid UTF-8".into())
        );
    }

    #[tokio::test]
    async fn a_frame_masked_the_wrong_way_is_refused_at_its_header_and_counts_for_nothing() {
        let mask = Some([9, 8, 7, 6]);
        // A client's message: its first fragment masked, the rest not.
        let mut bytes = frame(false, OpCode::Data(Data::Text), mask, b"{\"a\":".to_vec());
        let header_len = bytes.len();
        bytes.extend(frame(
            true,
            OpCode::Data(Data::Continue),
            None,
            b"1}".to_vec(),
        ));
        let mut io = Trickle::new(bytes.clone(), usize::MAX);
        io.limit = header_len + 2;
        let mut r = FrameReader::new(&[], Utf8Check::Validate, 1000).expect_masked(true);
        r.next(&mut io).await.unwrap().unwrap();
        let e = r.next(&mut io).await.unwrap_err();
        assert!(matches!(e, ReadError::Frame(FrameError::Unmasked)), "{e}");
        assert!(
            !r.at_boundary(),
            "the message the forwarded fragment opened is still open"
        );
        assert_eq!(r.completion(), Some(Vec::new()));
        // An upstream's frame must not be masked.
        let masked = frame(true, OpCode::Data(Data::Text), mask, b"{}".to_vec());
        let mut io = Trickle::new(masked, usize::MAX);
        let mut r = FrameReader::new(&[], Utf8Check::Trust, 1000).expect_masked(false);
        let e = r.next(&mut io).await.unwrap_err();
        assert!(matches!(e, ReadError::Frame(FrameError::Masked)), "{e}");
        assert!(r.at_boundary());
    }

    #[tokio::test]
    async fn boundary_is_known_while_a_fragmented_message_is_in_flight() {
        let mut bytes = frame(false, OpCode::Data(Data::Binary), None, vec![1; 10]);
        bytes.extend(frame(true, OpCode::Control(Control::Ping), None, vec![]));
        bytes.extend(frame(true, OpCode::Data(Data::Continue), None, vec![2; 10]));
        let mut io = Trickle::new(bytes, usize::MAX);
        let mut r = FrameReader::new(&[], Utf8Check::Trust, 1000);
        assert!(r.at_boundary());
        r.next(&mut io).await.unwrap().unwrap();
        assert!(!r.at_boundary());
        assert!(r.has_frame(), "the ping is already buffered");
        let ping = r.next(&mut io).await.unwrap().unwrap();
        assert_eq!(ping.role, FrameRole::Control);
        assert!(!r.at_boundary(), "a control frame does not end the message");
        r.next(&mut io).await.unwrap().unwrap();
        assert!(r.at_boundary());
        assert!(r.next(&mut io).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn bytes_read_with_the_handshake_come_first_and_eof_mid_frame_is_an_error() {
        let whole = frame(
            true,
            OpCode::Data(Data::Text),
            None,
            b"session.created".to_vec(),
        );
        let (head, tail) = whole.split_at(5);
        let mut io = Trickle::new(tail.to_vec(), 2);
        let mut r = FrameReader::new(head, Utf8Check::Trust, 1000);
        assert_eq!(r.next(&mut io).await.unwrap().unwrap().bytes, whole);
        let mut io = Trickle::new(whole[..whole.len() - 1].to_vec(), 4);
        let mut r = FrameReader::new(&[], Utf8Check::Trust, 1000);
        assert!(matches!(r.next(&mut io).await, Err(ReadError::Truncated)));
    }
}
