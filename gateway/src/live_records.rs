//! Where a GPT-Live WebSocket session's owner is recorded once the
//! upstream's `session.started` names it, so that its `…/{id}/attach` and
//! `…/{id}/fork` (served by the calls routes, on any replica) know whose it
//! is.
//!
//! The session ([`crate::session`]) knows the id; the owners and their
//! store records belong to the calls routes, a layer above it. So the calls
//! routes hand the gateway an implementation of [`LiveRecords`] at start-up
//! ([`crate::gateway::Gateway::live_records`]) and the session calls it:
//! [`LiveRecords::started`] when the session has its id, and
//! [`LiveRecords::ended`] when it ends however it ends. A gateway without
//! the calls routes (a library user's, some tests') records nothing, and a
//! WebSocket Live id is then `session_not_found` to its attach and fork.
//!
//! Both calls are bounded by the store's own call timeout and never fail
//! the session: a record that could not be written leaves the session
//! running, its id unknown to other replicas.

use std::future::Future;
use std::pin::Pin;

/// A Live WebSocket session whose owner is recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveWsSession {
    /// The upstream's session id (`session.started`'s `session.id`).
    pub id: String,
    pub key_id: String,
    pub team: Option<String>,
    /// The route's client-facing model.
    pub model: String,
    /// When the session was admitted (Unix ms).
    pub started_unix_ms: u64,
}

/// A boxed future borrowing the recorder.
pub type Recording<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Records and retires the owners of Live WebSocket sessions.
pub trait LiveRecords: Send + Sync + std::fmt::Debug {
    /// The session started upstream: record its owner.
    fn started<'a>(&'a self, session: &'a LiveWsSession) -> Recording<'a>;
    /// The session ended: its owner is kept as an ended WebRTC Live
    /// session's is (its forks are asked for after it ended).
    fn ended<'a>(&'a self, session: &'a LiveWsSession) -> Recording<'a>;
}
