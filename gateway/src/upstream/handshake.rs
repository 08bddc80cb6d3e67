//! The client side of the WebSocket opening handshake (RFC 6455 §4.1) on a
//! connected socket.
//!
//! The relay reads the upstream's frames from the socket itself, so the
//! bytes that arrive with the `101` (often `session.created`, in the same
//! packet) are returned to the caller instead of staying in a decoder's
//! buffer. The response is checked as a client must: status 101,
//! `Upgrade: websocket`, `Connection: upgrade`, the `Sec-WebSocket-Accept`
//! that answers the key sent, no extension (none is offered, so
//! permessage-deflate is never negotiated) and no subprotocol (none is
//! offered either). Interim `1xx` responses before it (`100`, `103`) are
//! skipped, as RFC 9110 §15.2 asks of a client.
//!
//! Caveat: the request carries the upstream key; nothing here logs the
//! request or its headers.

use base64::Engine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// The longest response head read (status line and headers).
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// What one read of the response asks for at least.
const READ_BYTES: usize = 4096;
/// Most response headers parsed.
const MAX_HEADERS: usize = 64;
/// How much of a refusal's body is read.
pub const REFUSAL_BODY_MAX: usize = 512;
/// How long a refusal's body is waited for once its head has arrived.
const BODY_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("HTTP {status}")]
    Refused {
        status: u16,
        retry_after: Option<String>,
        /// At most [`REFUSAL_BODY_MAX`] bytes of the body.
        body: Vec<u8>,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A request head without its key: the request line and headers, each
/// line ending in CRLF, as [`head`] starts it and [`push_header`] extends
/// it. [`client`] adds the `Sec-WebSocket-Key` and the blank line
/// ([`KEY_PART_BYTES`] more: reserve them and the head is sent as built).
pub type Head = Vec<u8>;

const KEY_LINE: &[u8] = b"Sec-WebSocket-Key: ";
/// What [`client`] appends to a [`Head`]: the key's line (a 16-byte nonce
/// is 24 characters of base64) and the blank line.
pub const KEY_PART_BYTES: usize = KEY_LINE.len() + 24 + 4;

/// The start of an upgrade request for `target` (path and query) on
/// `authority`: request line, `Host` and the upgrade headers but the key.
pub fn head(target: &str, authority: &str) -> Head {
    format!(
        "GET {target} HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    )
    .into_bytes()
}

/// Appends `name: value` to a [`Head`].
pub fn push_header(head: &mut Head, name: &str, value: &[u8]) {
    head.reserve(name.len() + value.len() + 4);
    head.extend_from_slice(name.as_bytes());
    head.extend_from_slice(b": ");
    head.extend_from_slice(value);
    head.extend_from_slice(b"\r\n");
}

/// How a complete response head answered the upgrade.
enum Answer {
    Upgraded,
    Refused {
        status: u16,
        retry_after: Option<String>,
        /// How its body ends.
        framing: Framing,
    },
    Invalid(&'static str),
}

/// How a refusal's body ends.
enum Framing {
    Length(usize),
    /// At the last chunk (`0`, CRLF, the empty line).
    Chunked,
    UntilClose,
}

/// Sends `head` (with a fresh key appended) as a WebSocket upgrade and
/// reads the response; returns the bytes the server sent after it (the
/// start of its frames). A refusal's body is read for up to [`BODY_GRACE`].
pub async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    head: Head,
) -> Result<Vec<u8>, HandshakeError> {
    client_by(io, head, None).await
}

/// [`client`], with a refusal's body read until `deadline` at the latest
/// (the dial's own): a slow body then ends as a refusal with what arrived,
/// never as the dial's timeout, which would hide the refusal's status.
pub async fn client_by<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    mut head: Head,
    deadline: Option<tokio::time::Instant>,
) -> Result<Vec<u8>, HandshakeError> {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce)
        .map_err(|e| HandshakeError::Invalid(format!("no randomness for the key: {e}")))?;
    // 16 bytes are 24 characters of base64.
    let mut key = [0u8; 24];
    base64::engine::general_purpose::STANDARD
        .encode_slice(nonce, &mut key)
        .map_err(|e| HandshakeError::Invalid(format!("cannot encode the key: {e}")))?;
    head.reserve(KEY_PART_BYTES);
    head.extend_from_slice(KEY_LINE);
    head.extend_from_slice(&key);
    head.extend_from_slice(b"\r\n\r\n");
    io.write_all(&head).await?;
    io.flush().await?;
    drop(head);
    let accept = derive_accept_key(&key);

    // Read straight into the buffer's spare capacity: a stack array would
    // live in this future (and in every future that awaits it).
    let mut buf = Vec::with_capacity(READ_BYTES);
    let (head_len, answer) = loop {
        if !buf.is_empty() {
            let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut response = httparse::Response::new(&mut slots);
            match response.parse(&buf) {
                // An interim response (RFC 9110 §15.2: 100, 103 Early
                // Hints) comes before the final one: skipped.
                Ok(httparse::Status::Complete(len)) if is_interim(response.code) => {
                    buf.drain(..len);
                    continue;
                }
                Ok(httparse::Status::Complete(len)) => {
                    break (len, answer(response.code, response.headers, &accept));
                }
                Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD_BYTES => {}
                Ok(httparse::Status::Partial) => {
                    return Err(HandshakeError::Invalid("response head too long".into()))
                }
                Err(e) => return Err(HandshakeError::Invalid(format!("bad response: {e}"))),
            }
        }
        buf.reserve(READ_BYTES);
        let n = io.read_buf(&mut buf).await?;
        if n == 0 {
            return Err(HandshakeError::Invalid(
                "connection closed during the handshake".into(),
            ));
        }
    };
    match answer {
        Answer::Upgraded => Ok(buf.split_off(head_len)),
        Answer::Invalid(message) => Err(HandshakeError::Invalid(message.into())),
        Answer::Refused {
            status,
            retry_after,
            framing,
        } => {
            let grace = tokio::time::Instant::now() + BODY_GRACE;
            let until = deadline.map_or(grace, |d| d.min(grace));
            let body = refusal_body(io, buf.split_off(head_len), framing, until).await;
            Err(HandshakeError::Refused {
                status,
                retry_after,
                body,
            })
        }
    }
}

/// A 1xx other than `101`: not the answer yet.
fn is_interim(code: Option<u16>) -> bool {
    matches!(code, Some(c) if (100..200).contains(&c) && c != 101)
}

/// Checks a response head as a client must, reading its headers where they
/// are (a `101` costs no allocation).
fn answer(code: Option<u16>, headers: &[httparse::Header<'_>], accept: &str) -> Answer {
    let values = |name: &'static str| {
        headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let first = |name: &'static str| {
        values(name)
            .next()
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    // A token may come in any of the header's lines (RFC 9110 §5.3).
    let has_token = |name: &'static str, token: &str| {
        values(name).any(|v| {
            v.split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
        })
    };
    let status = code.unwrap_or(0);
    if status != 101 {
        let length = values("content-length")
            .next()
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
        return Answer::Refused {
            status,
            retry_after: first("retry-after"),
            framing: match length {
                Some(n) => Framing::Length(n),
                None if has_token("transfer-encoding", "chunked") => Framing::Chunked,
                None => Framing::UntilClose,
            },
        };
    }
    if !has_token("upgrade", "websocket") || !has_token("connection", "upgrade") {
        return Answer::Invalid("101 without Upgrade: websocket and Connection: upgrade");
    }
    if values("sec-websocket-accept").next() != Some(accept.as_bytes()) {
        return Answer::Invalid("Sec-WebSocket-Accept does not answer the key");
    }
    if values("sec-websocket-extensions").next().is_some() {
        return Answer::Invalid("the server chose an extension that was not offered");
    }
    // The dial offers no subprotocol (RFC 6455 §4.1: the client fails the
    // connection when the server names one it did not offer).
    if values("sec-websocket-protocol").next().is_some() {
        return Answer::Invalid("the server chose a subprotocol that was not offered");
    }
    Answer::Upgraded
}

/// Up to [`REFUSAL_BODY_MAX`] bytes of a refusal's body: what came with its
/// head, then what arrives until `until` (up to its `Content-Length`, its
/// last chunk, or until the server closes). A chunked body keeps its chunk
/// size lines.
async fn refusal_body<S: AsyncRead + Unpin>(
    io: &mut S,
    mut body: Vec<u8>,
    framing: Framing,
    until: tokio::time::Instant,
) -> Vec<u8> {
    let want = match framing {
        Framing::Length(n) => n.min(REFUSAL_BODY_MAX),
        Framing::Chunked | Framing::UntilClose => REFUSAL_BODY_MAX,
    };
    let ended = |body: &[u8]| {
        matches!(framing, Framing::Chunked)
            && (body.starts_with(b"0\r\n\r\n") || body.ends_with(b"\r\n0\r\n\r\n"))
    };
    let _ = tokio::time::timeout_at(until, async {
        while body.len() < want && !ended(&body) {
            body.reserve(want - body.len());
            match io.read_buf(&mut body).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    body.truncate(want);
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_request_carries_the_target_host_upgrade_a_fresh_key_and_the_given_headers() {
        let mut first = head("/v1/realtime?model=m", "127.0.0.1:9");
        push_header(&mut first, "authorization", b"Bearer x");
        let (result, sent) = exchange(&first, OK_101, b"").await;
        result.expect("upgraded");
        assert!(sent.starts_with("GET /v1/realtime?model=m HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"));
        for line in [
            "Upgrade: websocket\r\n",
            "Connection: Upgrade\r\n",
            "Sec-WebSocket-Version: 13\r\n",
            "authorization: Bearer x\r\n",
        ] {
            assert!(sent.contains(line), "{line}");
        }
        let key = sent
            .lines()
            .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
            .expect("a key");
        let nonce = base64::engine::general_purpose::STANDARD
            .decode(key)
            .expect("base64");
        assert_eq!(nonce.len(), 16, "RFC 6455: a 16-byte nonce");
        assert!(sent.ends_with("\r\n\r\n"));
        assert_eq!(sent.matches("\r\n\r\n").count(), 1);
        assert!(!sent.to_ascii_lowercase().contains("extensions"));
        let (_, again) = exchange(&first, OK_101, b"").await;
        assert_ne!(again, sent, "each handshake has its own key");
    }

    const OK_101: &str = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                          Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n";

    /// Runs the handshake against a server that answers with `response`
    /// (where `{accept}` is replaced by the right accept key).
    async fn against(response: &'static str) -> Result<Vec<u8>, HandshakeError> {
        against_then(response, b"").await
    }

    async fn against_then(
        response: &'static str,
        frames: &'static [u8],
    ) -> Result<Vec<u8>, HandshakeError> {
        exchange(&head("/v1/realtime", "upstream"), response, frames)
            .await
            .0
    }

    /// The handshake's result and the request the server read.
    async fn exchange(
        request: &[u8],
        response: &'static str,
        frames: &'static [u8],
    ) -> (Result<Vec<u8>, HandshakeError>, String) {
        let (mut ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let head = String::from_utf8(request_head(&mut theirs).await).unwrap();
            let key = head
                .lines()
                .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
                .unwrap();
            let accept = derive_accept_key(key.as_bytes());
            let reply = response.replace("{accept}", &accept);
            theirs
                .write_all(&[reply.as_bytes(), frames].concat())
                .await
                .unwrap();
            theirs.shutdown().await.unwrap();
            head
        });
        let r = client(&mut ours, request.to_vec()).await;
        (r, server.await.unwrap())
    }

    /// The request head a test server reads, byte by byte (nothing past it).
    async fn request_head(theirs: &mut tokio::io::DuplexStream) -> Vec<u8> {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            theirs.read_exact(&mut b).await.unwrap();
            head.push(b[0]);
        }
        head
    }

    /// A server that answers the upgrade with `parts`, each written
    /// `gap` after the one before, then holds the connection open.
    fn held_open(
        parts: &'static [&'static [u8]],
        gap: std::time::Duration,
    ) -> tokio::io::DuplexStream {
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            request_head(&mut theirs).await;
            for part in parts {
                theirs.write_all(part).await.unwrap();
                tokio::time::sleep(gap).await;
            }
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        });
        ours
    }

    #[tokio::test]
    async fn a_refusal_with_a_chunked_body_ends_at_its_last_chunk() {
        let mut io = held_open(
            &[
                b"HTTP/1.1 401 No\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nnope!\r\n0\r\n\r\n",
                b"late",
            ],
            std::time::Duration::from_millis(100),
        );
        let r = client(&mut io, head("/v1/realtime", "upstream")).await;
        let Err(HandshakeError::Refused { status, body, .. }) = r else {
            panic!("not a refusal: {r:?}");
        };
        assert_eq!(status, 401);
        assert_eq!(
            body, b"5\r\nnope!\r\n0\r\n\r\n",
            "nothing read past the last chunk"
        );
    }

    #[tokio::test]
    async fn a_refusal_whose_body_is_slower_than_the_deadline_is_still_a_refusal() {
        let mut io = held_open(
            &[b"HTTP/1.1 429 Slow\r\nRetry-After: 3\r\nContent-Length: 100\r\n\r\nslow"],
            std::time::Duration::ZERO,
        );
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(150);
        let upgrade = client_by(&mut io, head("/v1/realtime", "upstream"), Some(deadline));
        // As the dial bounds it: by the same deadline.
        let r = tokio::time::timeout_at(deadline, upgrade).await;
        let Ok(Err(HandshakeError::Refused {
            status,
            retry_after,
            body,
        })) = r
        else {
            panic!("not a refusal: {r:?}");
        };
        assert_eq!((status, retry_after.as_deref()), (429, Some("3")));
        assert_eq!(body, b"slow");
    }

    #[tokio::test]
    async fn bytes_after_the_101_are_returned() {
        let rest = against_then(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\n\r\n",
            b"\x81\x02hi",
        )
        .await
        .unwrap();
        assert_eq!(rest, b"\x81\x02hi");
    }

    #[tokio::test]
    async fn a_refusal_keeps_its_status_retry_after_and_body() {
        let Err(HandshakeError::Refused {
            status,
            retry_after,
            body,
        }) = against(
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nslow",
        )
        .await
        else {
            panic!("not a refusal");
        };
        assert_eq!((status, retry_after.as_deref()), (429, Some("7")));
        assert_eq!(body, b"slow");
    }

    #[tokio::test]
    async fn interim_responses_before_the_101_are_skipped() {
        let rest = against_then(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n\
             HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n",
            b"\x81\x02hi",
        )
        .await
        .expect("the 101 behind the interim responses");
        assert_eq!(rest, b"\x81\x02hi");
        // An interim response is not a refusal, but a final one after it is.
        let refused = against("HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 401 No\r\n\r\n").await;
        assert!(matches!(
            refused,
            Err(HandshakeError::Refused { status: 401, .. })
        ));
    }

    #[tokio::test]
    async fn a_subprotocol_that_was_not_offered_is_refused() {
        let chosen = against(
            "HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: realtime\r\n\r\n",
        )
        .await;
        assert!(matches!(chosen, Err(HandshakeError::Invalid(m)) if m.contains("subprotocol")));
    }

    #[tokio::test]
    async fn a_wrong_accept_or_an_extension_is_refused() {
        let wrong = against(
            "HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: nope\r\n\r\n",
        )
        .await;
        assert!(matches!(wrong, Err(HandshakeError::Invalid(m)) if m.contains("Accept")));
        let ext = against(
            "HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n",
        )
        .await;
        assert!(matches!(ext, Err(HandshakeError::Invalid(m)) if m.contains("extension")));
        let no_upgrade = against("HTTP/1.1 101 OK\r\nSec-WebSocket-Accept: {accept}\r\n\r\n").await;
        assert!(matches!(no_upgrade, Err(HandshakeError::Invalid(_))));
    }

    #[tokio::test]
    async fn header_names_and_tokens_match_in_any_case_and_on_any_line() {
        let rest = against_then(
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: WebSocket\r\n\
             connection: keep-alive\r\nCONNECTION: close , Upgrade\r\n\
             sec-websocket-accept: {accept}\r\n\r\n",
            b"\x81\x00",
        )
        .await
        .expect("a valid 101");
        assert_eq!(rest, b"\x81\x00");
        let no_token = against(
            "HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nConnection: keep-alive, upgraded\r\n\
             Sec-WebSocket-Accept: {accept}\r\n\r\n",
        )
        .await;
        assert!(matches!(no_token, Err(HandshakeError::Invalid(m)) if m.contains("Connection")));
    }
}
