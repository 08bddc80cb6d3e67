//! A client connection's first request head, read by the gateway itself, and
//! the socket types a client session runs on.
//!
//! A Realtime WebSocket upgrade is the one request a gateway connection
//! exists for, and it is almost always the first and only one on its
//! connection. Its head is read and parsed here ([`read_head`], `httparse`)
//! and the session gets the bare TCP socket (a [`ClientIo`]), its
//! `101 Switching Protocols` written by the session itself, together with
//! its first frames. Taking such a request through hyper's connection state
//! machine, its upgrade channel and its boxed, rewinding `Upgraded` socket
//! cost more instructions than the rest of a short session's setup
//! (`benchmarks/README.md`).
//!
//! Every other first request, and every later request on a kept-alive
//! connection, goes to hyper unchanged: the bytes already read are replayed
//! to it first ([`Rewind`]). A head that is not complete within
//! [`MAX_HEAD_BYTES`], or that `httparse` rejects, goes to hyper as well, so
//! the answer to a malformed request is hyper's; so does a `GET` that
//! declares a body (`Transfer-Encoding`, or a `Content-Length` other than
//! 0), so that its body is read as a body, never as the next request.
//!
//! An HTTP/2 prior-knowledge preface (`PRI * HTTP/2.0`, [`H2_PREFACE`]) is
//! told apart ([`First::Http2`]): hyper's HTTP/1 connection would close it
//! without a word; the gateway answers it with a 505.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{header, HeaderMap, Method};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::either::Either;

/// The most bytes read while looking for the end of the first head; a
/// longer head goes to hyper (whose own limit is larger).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The most headers parsed here; a request with more goes to hyper.
const MAX_HEADERS: usize = 32;
/// How an HTTP/2 client with prior knowledge opens a connection (RFC 9113
/// §3.4); its first line is enough to tell.
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const H2_PREFACE_LINE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// A request head read by the gateway.
#[derive(Debug)]
pub struct Head {
    /// The request target's path (before any `?`).
    pub path: String,
    /// The query, without the `?`; empty when there is none.
    pub query: String,
    pub headers: HeaderMap,
}

/// What the first bytes of a connection turned out to be.
#[derive(Debug)]
pub enum First {
    /// An HTTP/1.1 `GET` whose head was parsed: every byte read, of which
    /// the first `head_len` are the head.
    Get {
        head: Head,
        read: Bytes,
        head_len: usize,
    },
    /// Anything else: every byte read so far, for hyper to read again.
    Other(Bytes),
    /// An HTTP/2 prior-knowledge preface: the gateway speaks HTTP/1.1 only.
    Http2,
    /// The peer closed (or failed) before sending a whole head.
    Gone,
}

/// Reads the connection's first request head.
///
/// The caller bounds the time (a half-open connection must not be held).
pub async fn read_head(tcp: &mut TcpStream) -> First {
    let mut buf = BytesMut::with_capacity(2048);
    loop {
        match tcp.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return First::Gone,
            Ok(_) => {}
        }
        match parse(&buf) {
            Ok(layout) => {
                let read = buf.freeze();
                return match layout.head(&read) {
                    Some(head) => First::Get {
                        head,
                        read,
                        head_len: layout.len,
                    },
                    None => First::Other(read),
                };
            }
            Err(NotGet::Other) => return First::Other(buf.freeze()),
            Err(NotGet::Http2) => return First::Http2,
            Err(NotGet::Partial) if buf.len() >= MAX_HEAD_BYTES => {
                return First::Other(buf.freeze())
            }
            Err(NotGet::Partial) => {
                if buf.capacity() == buf.len() {
                    buf.reserve(buf.len());
                }
            }
        }
    }
}

/// Why the bytes read are not (yet) a `GET` head.
#[derive(Debug)]
enum NotGet {
    /// Some other request, or not HTTP/1.1.
    Other,
    /// A head that is not complete yet.
    Partial,
    /// HTTP/2's connection preface.
    Http2,
}

/// A byte range of the bytes read.
type Span = (usize, usize);

/// Where a complete `GET` head's parts are in the bytes read: the head is
/// built from them once those bytes are frozen, its header values sharing
/// the bytes instead of each copied into an allocation of its own.
struct Layout {
    /// The head's length.
    len: usize,
    path: Span,
    query: Span,
    headers: [(Span, Span); MAX_HEADERS],
    count: usize,
}

/// Parses a `GET` head, complete in `buf`.
fn parse(buf: &[u8]) -> Result<Layout, NotGet> {
    if buf.starts_with(H2_PREFACE_LINE) {
        return Err(NotGet::Http2);
    }
    if H2_PREFACE_LINE.starts_with(buf) {
        // httparse refuses `HTTP/2` before the line is whole.
        return Err(NotGet::Partial);
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Err(NotGet::Partial),
        Err(_) => return Err(NotGet::Other),
    };
    if req.method != Some("GET") || req.version != Some(1) {
        return Err(NotGet::Other);
    }
    let Some(target) = req.path.filter(|p| p.starts_with('/')) else {
        return Err(NotGet::Other);
    };
    if req.headers.iter().any(declares_body) {
        return Err(NotGet::Other);
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    // Every non-empty part httparse returns is a slice of `buf` (an empty
    // one, such as a missing query, may point anywhere).
    let span = |part: &[u8]| {
        if part.is_empty() {
            return (0, 0);
        }
        let start = part.as_ptr() as usize - buf.as_ptr() as usize;
        (start, start + part.len())
    };
    let mut layout = Layout {
        len,
        path: span(path.as_bytes()),
        query: span(query.as_bytes()),
        headers: [((0, 0), (0, 0)); MAX_HEADERS],
        count: req.headers.len(),
    };
    for (slot, h) in layout.headers.iter_mut().zip(req.headers.iter()) {
        *slot = (span(h.name.as_bytes()), span(h.value));
    }
    Ok(layout)
}

/// A `Transfer-Encoding`, or a `Content-Length` other than 0: the request
/// has a body, which hyper must read as its body (a refused upgrade keeps
/// the connection open, and a body taken for the next request would let a
/// client smuggle one past whatever sits in front of the gateway).
fn declares_body(h: &httparse::Header<'_>) -> bool {
    h.name.eq_ignore_ascii_case("transfer-encoding")
        || (h.name.eq_ignore_ascii_case("content-length") && h.value.trim_ascii() != b"0")
}

impl Layout {
    /// The head, from the frozen bytes the layout was parsed from; `None`
    /// when a header name or value is not valid for `http` (hyper answers).
    fn head(&self, read: &Bytes) -> Option<Head> {
        let text = |(start, end): Span| std::str::from_utf8(&read[start..end]).ok();
        let mut headers = HeaderMap::with_capacity(self.count);
        for &(name, (start, end)) in &self.headers[..self.count] {
            let name = HeaderName::from_bytes(&read[name.0..name.1]).ok()?;
            let value = HeaderValue::from_maybe_shared(read.slice(start..end)).ok()?;
            headers.append(name, value);
        }
        Some(Head {
            path: text(self.path)?.to_string(),
            query: text(self.query)?.to_string(),
            headers,
        })
    }
}

/// A socket whose first bytes were already read: they are read again first.
#[derive(Debug)]
pub struct Rewind {
    prefix: Bytes,
    inner: TcpStream,
}

impl Rewind {
    pub fn new(prefix: Bytes, inner: TcpStream) -> Self {
        Self { prefix, inner }
    }
}

impl AsyncRead for Rewind {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.prefix.has_remaining() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The socket a client session runs on once upgraded: the bare TCP socket
/// when the gateway read the upgrade request itself, hyper's upgraded
/// connection when hyper served it (a later request on a kept-alive
/// connection).
pub type ClientIo = Either<TcpStream, TokioIo<hyper::upgrade::Upgraded>>;

/// The head of a `101 Switching Protocols` accepting a WebSocket upgrade.
pub fn switching_protocols(accept: &str, subprotocol: Option<&str>) -> Vec<u8> {
    let mut head = Vec::with_capacity(160);
    head.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: ",
    );
    head.extend_from_slice(accept.as_bytes());
    if let Some(p) = subprotocol {
        head.extend_from_slice(b"\r\nsec-websocket-protocol: ");
        head.extend_from_slice(p.as_bytes());
    }
    head.extend_from_slice(b"\r\n\r\n");
    head
}

/// A complete HTTP/1.1 response: status line, `headers`, `content-length`
/// and `body`.
pub fn response(status: http::StatusCode, headers: &HeaderMap, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body);
    out
}

/// A WebSocket handshake request (RFC 6455 §4.2.1), by its method and
/// headers.
pub fn is_websocket_upgrade(method: &Method, headers: &HeaderMap) -> bool {
    let has_token = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
                .unwrap_or(false)
        })
    };
    method == Method::GET
        && has_token(header::CONNECTION, "upgrade")
        && has_token(header::UPGRADE, "websocket")
        && headers.get(header::SEC_WEBSOCKET_VERSION) == Some(&HeaderValue::from_static("13"))
        && headers.contains_key(header::SEC_WEBSOCKET_KEY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(bytes: &[u8]) -> Result<Layout, NotGet> {
        parse(bytes)
    }

    fn head_of(bytes: &'static [u8]) -> (Head, usize) {
        let layout = parsed(bytes).expect("parsed as a GET");
        let head = layout
            .head(&Bytes::from_static(bytes))
            .expect("a valid head");
        (head, layout.len)
    }

    #[test]
    fn a_get_head_is_parsed_with_its_query_and_headers() {
        let raw = b"GET /v1/realtime?model=gpt-realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nSec-WebSocket-Protocol: realtime, openai-insecure-api-key.k\r\n\r\nAB";
        let (head, len) = head_of(raw);
        assert_eq!(head.path, "/v1/realtime");
        assert_eq!(head.query, "model=gpt-realtime");
        assert_eq!(
            head.headers.get("upgrade").map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert_eq!(
            head.headers
                .get("sec-websocket-protocol")
                .map(|v| v.as_bytes()),
            Some(&b"realtime, openai-insecure-api-key.k"[..])
        );
        assert_eq!(&raw[len..], b"AB");
        let (bare, _) = head_of(b"GET /v1/realtime HTTP/1.1\r\nX-Empty:\r\n\r\n");
        assert_eq!(
            (bare.path.as_str(), bare.query.as_str()),
            ("/v1/realtime", "")
        );
        assert_eq!(
            bare.headers.get("x-empty").map(|v| v.as_bytes()),
            Some(&b""[..])
        );
        // The values are the bytes read, not copies of them.
        let read = raw.as_ptr_range();
        for value in head.headers.values() {
            assert!(read.contains(&value.as_bytes().as_ptr()), "{value:?}");
        }
    }

    #[test]
    fn other_requests_and_partial_heads_are_told_apart() {
        assert!(matches!(
            parsed(b"POST /v1/realtime HTTP/1.1\r\n\r\n"),
            Err(NotGet::Other)
        ));
        assert!(matches!(
            parsed(b"GET /v1/realtime HTTP/1.0\r\n\r\n"),
            Err(NotGet::Other)
        ));
        assert!(matches!(
            parsed(b"GET http://h/v1/realtime HTTP/1.1\r\n\r\n"),
            Err(NotGet::Other)
        ));
        assert!(matches!(
            parsed(b"GET / HTTP/1.1\r\nHost"),
            Err(NotGet::Partial)
        ));
        assert!(matches!(
            parsed(b"\x16\x03\x01\x02\x00"),
            Err(NotGet::Other)
        ));
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("x-{i}: v\r\n"))
            .collect();
        let raw = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert!(matches!(parsed(raw.as_bytes()), Err(NotGet::Other)));
    }

    #[test]
    fn a_get_that_declares_a_body_goes_to_hyper() {
        for framing in [
            "Content-Length: 5",
            "content-length:  12 ",
            "Transfer-Encoding: chunked",
            "TRANSFER-ENCODING: identity",
        ] {
            let raw = format!("GET /v1/realtime HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n");
            assert!(
                matches!(parsed(raw.as_bytes()), Err(NotGet::Other)),
                "{framing}"
            );
        }
        let empty = b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
        assert!(parsed(empty).is_ok());
    }

    #[test]
    fn an_http2_preface_is_told_apart_once_its_first_line_is_in() {
        assert!(matches!(parsed(H2_PREFACE), Err(NotGet::Http2)));
        assert!(matches!(parsed(b"PRI * HTTP/2.0\r\n"), Err(NotGet::Http2)));
        assert!(matches!(parsed(b"PRI * HTTP/2"), Err(NotGet::Partial)));
        assert!(matches!(parsed(b"PRI * HTTP/2.0\r"), Err(NotGet::Partial)));
        assert!(matches!(
            parsed(b"GET / HTTP/2.0\r\n\r\n"),
            Err(NotGet::Other)
        ));
    }

    #[test]
    fn a_response_is_serialized_with_its_length() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        let out = response(http::StatusCode::TOO_MANY_REQUESTS, &headers, b"{}");
        assert_eq!(
            out,
            b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        );
        let head = switching_protocols("abc=", Some("realtime"));
        assert_eq!(
            head,
            b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: abc=\r\nsec-websocket-protocol: realtime\r\n\r\n"
        );
    }
}
