//! The least a WebSocket gateway that holds the upstream key can do: the
//! floor for a gateway's per-session CPU, as [`crate::tcp_relay`] is for a
//! proxy's.
//!
//! Per connection it reads the client's upgrade request, checks its
//! `Authorization: Bearer` against one key, opens a fresh connection to the
//! upstream and upgrades it with the upstream key (the gateway's own client
//! handshake, [`patchbay_gateway::upstream::handshake`]: the `101` checked,
//! its `Sec-WebSocket-Accept` verified), answers the client's `101`, and
//! then copies bytes both ways like `tcp-relay` (the upstream's bytes that
//! came with its `101` first). No frame is parsed, nothing is metered or
//! logged, nothing is pooled. A gateway cannot do less and still swap the
//! client's key for its own: whatever it costs over `ws-relay` is its
//! features (admission, metering, request-log rows, log lines, the warm
//! pool, close handshakes), whatever `ws-relay` costs over `tcp-relay` is
//! the two handshakes. With `meter` set it is the metering floor instead
//! ([`crate::metered`]): the same handshakes, then every turn's
//! `response.done` read from whole upstream frames into a request-log row.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use patchbay_gateway::upstream::handshake;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// The longest request head read.
const MAX_HEAD_BYTES: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

/// What [`serve`] needs besides its listener.
#[derive(Clone)]
pub struct WsRelay {
    pub upstream: SocketAddr,
    /// The key clients must present.
    pub client_key: String,
    /// The key sent upstream.
    pub upstream_key: String,
    /// Meter turns ([`crate::metered`]) into these rows instead of copying
    /// bytes.
    pub meter: Option<crate::metered::Rows>,
}

/// Serves `listener` forever.
pub async fn serve(listener: TcpListener, relay: WsRelay) {
    let relay = Arc::new(relay);
    loop {
        let client = match listener.accept().await {
            Ok((c, _)) => c,
            Err(e) => {
                eprintln!("ws-relay: accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let relay = relay.clone();
        tokio::spawn(async move {
            if let Err(e) = session(client, &relay).await {
                eprintln!("ws-relay: {e}");
            }
        });
    }
}

/// A parsed upgrade request: the target and the client's key.
#[derive(Debug, PartialEq)]
pub struct Upgrade {
    pub target: String,
    pub ws_key: String,
    pub bearer: Option<String>,
}

/// Parses a complete request head; `Ok(None)` while it is incomplete.
pub fn parse_upgrade(buf: &[u8]) -> Result<Option<Upgrade>, String> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad request: {e}")),
    }
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
    };
    let ws_key = header("sec-websocket-key").ok_or("no Sec-WebSocket-Key")?;
    Ok(Some(Upgrade {
        target: req.path.unwrap_or("/").to_string(),
        ws_key: ws_key.to_string(),
        bearer: header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_string),
    }))
}

async fn session(mut client: TcpStream, relay: &WsRelay) -> Result<(), String> {
    client.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let upgrade = loop {
        let n = client.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        match parse_upgrade(&buf)? {
            Some(u) => break u,
            None if buf.len() < MAX_HEAD_BYTES => continue,
            None => return Err("request head too long".into()),
        }
    };
    if upgrade.bearer.as_deref() != Some(relay.client_key.as_str()) {
        let _ = client
            .write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")
            .await;
        return Ok(());
    }
    let mut up = TcpStream::connect(relay.upstream)
        .await
        .map_err(|e| e.to_string())?;
    up.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut request = handshake::head(&upgrade.target, &relay.upstream.to_string());
    handshake::push_header(
        &mut request,
        "authorization",
        format!("Bearer {}", relay.upstream_key).as_bytes(),
    );
    let early = handshake::client(&mut up, request)
        .await
        .map_err(|e| format!("upstream handshake: {e}"))?;
    let mut answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        derive_accept_key(upgrade.ws_key.as_bytes())
    )
    .into_bytes();
    if let Some(rows) = &relay.meter {
        // The upstream's early bytes are frames: they go through the meter.
        client.write_all(&answer).await.map_err(|e| e.to_string())?;
        let session_id = patchbay_gateway::ids::short_id();
        crate::metered::relay(client, up, early.to_vec(), session_id, rows).await;
        return Ok(());
    }
    answer.extend_from_slice(&early);
    client.write_all(&answer).await.map_err(|e| e.to_string())?;
    let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upgrade_request_gives_its_target_key_and_bearer() {
        let head = b"GET /v1/realtime?model=m HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
            Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
            Authorization: Bearer k1\r\n\r\n";
        assert_eq!(parse_upgrade(&head[..20]).unwrap(), None);
        assert_eq!(
            parse_upgrade(head).unwrap(),
            Some(Upgrade {
                target: "/v1/realtime?model=m".into(),
                ws_key: "dGhlIHNhbXBsZSBub25jZQ==".into(),
                bearer: Some("k1".into()),
            })
        );
        let no_key = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(parse_upgrade(no_key).is_err());
        assert!(parse_upgrade(b"\x00\x01 nonsense\r\n\r\n").is_err());
    }
}
