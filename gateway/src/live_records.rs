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
//! Both run in tasks of their own (the end once the start is written), so
//! the session's future holds a pointer for them and no store call delays
//! its frames; both are bounded by the store's own call timeout and never
//! fail the session: a record that could not be written leaves the session
//! running, its id unknown to other replicas. The client has
//! `session.started` before the record is written: an attach or fork sent
//! within milliseconds of it can find no record yet (404, as any unknown
//! id).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use crate::auth::KeyEntry;

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

impl LiveWsSession {
    /// The session `id` of `key` on the route of `model`, admitted at
    /// `admitted`.
    pub fn new(id: String, key: &KeyEntry, model: &str, admitted: tokio::time::Instant) -> Self {
        let now = SystemTime::now();
        let started = now.checked_sub(admitted.elapsed()).unwrap_or(now);
        Self {
            id,
            key_id: key.id.clone(),
            team: key.team.clone(),
            model: model.to_string(),
            started_unix_ms: started
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }
}

/// A recorded owner: where, whose, and the task writing it.
pub struct LiveOwner {
    records: Arc<dyn LiveRecords>,
    session: Arc<LiveWsSession>,
    recording: JoinHandle<()>,
}

impl LiveOwner {
    /// Records `session`'s owner in a task of its own on `tasks`.
    pub fn record(
        records: Arc<dyn LiveRecords>,
        tasks: &TaskTracker,
        session: LiveWsSession,
    ) -> Self {
        let session = Arc::new(session);
        let (r, s) = (records.clone(), session.clone());
        let recording = tasks.spawn(async move { r.started(&s).await });
        Self {
            records,
            session,
            recording,
        }
    }

    /// Retires it in a task of its own, once it is written (a session that
    /// ends at once is never left recorded as running).
    pub fn retire(self, tasks: &TaskTracker) {
        let Self {
            records,
            session,
            recording,
        } = self;
        tasks.spawn(async move {
            let _ = recording.await;
            records.ended(&session).await;
        });
    }
}
