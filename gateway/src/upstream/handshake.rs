//! The client side of the WebSocket opening handshake (RFC 6455 §4.1) on a
//! connected socket.
//!
//! The relay reads the upstream's frames from the socket itself, so the
//! bytes that arrive with the `101` (often `session.created`, in the same
//! packet) are returned to the caller instead of staying in a decoder's
//! buffer. The response is checked as a client must: status 101,
//! `Upgrade: websocket`, `Connection: upgrade`, the `Sec-WebSocket-Accept`
//! that answers the key sent, and no extension (none is offered, so
//! permessage-deflate is never negotiated).
//!
//! Caveat: the request carries the upstream key; nothing here logs the
//! request or its headers.

use base64::Engine;
use http::Request;
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

/// Sends `request` as a WebSocket upgrade and reads the response; returns
/// the bytes the server sent after it (the start of its frames).
pub async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    request: &Request<()>,
) -> Result<Vec<u8>, HandshakeError> {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce)
        .map_err(|e| HandshakeError::Invalid(format!("no randomness for the key: {e}")))?;
    let key = base64::engine::general_purpose::STANDARD.encode(nonce);
    io.write_all(&request_head(request, &key)?).await?;
    io.flush().await?;

    // Read straight into the buffer's spare capacity: a stack array would
    // live in this future (and in every future that awaits it).
    let mut buf = Vec::with_capacity(READ_BYTES);
    let (head_len, status, headers) = loop {
        buf.reserve(READ_BYTES);
        let n = io.read_buf(&mut buf).await?;
        if n == 0 {
            return Err(HandshakeError::Invalid(
                "connection closed during the handshake".into(),
            ));
        }
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut slots);
        match response.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let headers: Vec<(String, Vec<u8>)> = response
                    .headers
                    .iter()
                    .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
                    .collect();
                break (len, response.code.unwrap_or(0), headers);
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD_BYTES => continue,
            Ok(httparse::Status::Partial) => {
                return Err(HandshakeError::Invalid("response head too long".into()))
            }
            Err(e) => return Err(HandshakeError::Invalid(format!("bad response: {e}"))),
        }
    };
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    if status != 101 {
        let body = refusal_body(io, buf.split_off(head_len), header("content-length")).await;
        return Err(HandshakeError::Refused {
            status,
            retry_after: header("retry-after"),
            body,
        });
    }
    let has_token = |name: &str, token: &str| {
        header(name).is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    };
    if !has_token("upgrade", "websocket") || !has_token("connection", "upgrade") {
        return Err(HandshakeError::Invalid(
            "101 without Upgrade: websocket and Connection: upgrade".into(),
        ));
    }
    if header("sec-websocket-accept").as_deref() != Some(derive_accept_key(key.as_bytes()).as_str())
    {
        return Err(HandshakeError::Invalid(
            "Sec-WebSocket-Accept does not answer the key".into(),
        ));
    }
    if header("sec-websocket-extensions").is_some() {
        return Err(HandshakeError::Invalid(
            "the server chose an extension that was not offered".into(),
        ));
    }
    Ok(buf.split_off(head_len))
}

/// The request's head as bytes: its method, path and headers, with the
/// upgrade headers added.
fn request_head(request: &Request<()>, key: &str) -> Result<Vec<u8>, HandshakeError> {
    let uri = request.uri();
    let authority = uri
        .authority()
        .ok_or_else(|| HandshakeError::Invalid("upstream URL has no host".into()))?;
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head = format!(
        "GET {target} HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n"
    )
    .into_bytes();
    for (name, value) in request.headers() {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    Ok(head)
}

/// Up to [`REFUSAL_BODY_MAX`] bytes of a refusal's body: what came with its
/// head, then what arrives within [`BODY_GRACE`] (up to its
/// `Content-Length`, or until the server closes).
async fn refusal_body<S: AsyncRead + Unpin>(
    io: &mut S,
    mut body: Vec<u8>,
    content_length: Option<String>,
) -> Vec<u8> {
    let want = content_length
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(usize::MAX)
        .min(REFUSAL_BODY_MAX);
    let _ = tokio::time::timeout(BODY_GRACE, async {
        while body.len() < want {
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

    #[test]
    fn the_head_carries_the_target_host_upgrade_and_the_given_headers() {
        let request = Request::get("ws://127.0.0.1:9/v1/realtime?model=m")
            .header("authorization", "Bearer x")
            .body(())
            .unwrap();
        let head = String::from_utf8(request_head(&request, "k==").unwrap()).unwrap();
        assert!(head.starts_with("GET /v1/realtime?model=m HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"));
        for line in [
            "Upgrade: websocket\r\n",
            "Connection: Upgrade\r\n",
            "Sec-WebSocket-Version: 13\r\n",
            "Sec-WebSocket-Key: k==\r\n",
            "authorization: Bearer x\r\n",
        ] {
            assert!(head.contains(line), "{line}");
        }
        assert!(head.ends_with("\r\n\r\n"));
        assert!(!head.to_ascii_lowercase().contains("extensions"));
    }

    /// Runs the handshake against a server that answers with `response`
    /// (where `{accept}` is replaced by the right accept key).
    async fn against(response: &'static str) -> Result<Vec<u8>, HandshakeError> {
        against_then(response, b"").await
    }

    async fn against_then(
        response: &'static str,
        frames: &'static [u8],
    ) -> Result<Vec<u8>, HandshakeError> {
        let (mut ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                theirs.read_exact(&mut b).await.unwrap();
                head.push(b[0]);
            }
            let head = String::from_utf8(head).unwrap();
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
        });
        let request = Request::get("ws://upstream/v1/realtime").body(()).unwrap();
        let r = client(&mut ours, &request).await;
        server.await.unwrap();
        r
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
}
