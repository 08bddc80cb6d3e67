//! Small wire helpers of the simulator: binding a listener, reading an
//! event's `type`, and fresh ids. The simulator stands for OpenAI, so it
//! shares none of this with the gateway it is tested against.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use serde::Deserialize;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// A simulator connection: plain TCP, or TLS when configured.
pub type SimIo = tokio_util::either::Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>;

/// A deep backlog: benchmarks connect hundreds of sockets at once.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds with `SO_REUSEADDR` (a restarted simulator takes its port back at
/// once) and a deep backlog.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The `type` of a client event (any key order), if it is a JSON object
/// that has one.
pub fn event_type(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, rename = "type")]
        kind: std::borrow::Cow<'a, str>,
    }
    serde_json::from_str::<Typed<'_>>(text)
        .ok()
        .map(|t| t.kind.into_owned())
}

/// A fresh 16-hex-digit id (as OpenAI's ids end: `sess_…`, `rtc_…`).
/// An event's text as OpenAI writes it: `type` first, then `event_id`, then
/// the members of `rest`, an object already serialised (serde_json's map is
/// sorted, so the two are put in front by hand).
pub fn event_text(kind: &str, event_id: &str, rest: &str) -> String {
    let rest = rest.strip_prefix('{').unwrap_or("}");
    let sep = if rest == "}" { "" } else { "," };
    format!(r#"{{"type":"{kind}","event_id":"{event_id}"{sep}{rest}"#)
}

pub fn short_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SEED: OnceLock<RandomState> = OnceLock::new();
    let mut h = SEED.get_or_init(RandomState::new).build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", h.finish())
}

/// A key as OpenAI quotes it back: a short prefix, stars, the last four.
pub fn mask_key(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    if chars.len() <= 8 {
        return "*".repeat(chars.len());
    }
    let head: String = chars[..4].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}{}{tail}", "*".repeat(chars.len() - 8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_type_is_read_in_any_key_order() {
        assert_eq!(
            event_type(r#"{"event_id":"e","type":"response.create"}"#).as_deref(),
            Some("response.create")
        );
        assert_eq!(
            event_type(r#"{"a":{"type":"x"},"type":"y"}"#).as_deref(),
            Some("y")
        );
        assert_eq!(event_type("not json"), None);
    }

    #[test]
    fn ids_are_distinct() {
        assert_ne!(short_id(), short_id());
    }
}
