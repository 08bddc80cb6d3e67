//! WebRTC and SIP calls through the gateway: admitted like a WebSocket
//! session, metered over a sideband, ended on budget.
//!
//! A call's audio flows between the device (or the phone network) and the
//! upstream directly; the gateway sees the HTTP requests that create, accept
//! and end calls ([`api`]) and, for each live call, a server-side WebSocket
//! to the same session, the *sideband* (`?call_id=`), on which every server
//! event arrives, `response.done` with its usage included ([`sideband`]).
//!
//! - [`offer`]: reading the offer bodies (multipart, JSON, raw SDP);
//! - [`upstream`]: the upstream calls API and sideband URLs and requests;
//! - [`ownership`]: which key (or team) may act on a call;
//! - [`refusals`]: the calls API's error answers;
//! - [`claim`]: an accept's claim on its call, taken before the upstream is
//!   asked, so that concurrent accepts make one call;
//! - [`fleet`]: with Redis, call records any replica can read, and the
//!   hand-over of sidebands between replicas;
//! - [`sideband`]: the metered sideband of one call, and how it ends;
//! - [`live`]: GPT-Live's WebRTC sessions (create, fork, recording, call
//!   control), calls in all but their wire shapes;
//! - [`live_mark`]: a WebRTC Live session's charged figure in the fleet,
//!   raised before each window is charged;
//! - [`live_owners`]: the owners of Live WebSocket sessions, recorded
//!   beside the others (never adopted);
//! - [`live_ws`]: the WebSockets under a Live session's id: a client's own
//!   sideband, relayed (the gateway's sideband meters it), and forks;
//! - [`routes`]: the routes of both, composed over one state.
//!
//! Caveat: turns that happen while no sideband is attached (between the
//! answer and the sideband's upgrade, or during a hand-over) are not seen
//! and therefore not metered.

pub mod api;
pub mod claim;
pub mod fleet;
pub mod live;
pub mod live_mark;
pub mod live_owners;
pub mod live_ws;
pub mod offer;
pub mod ownership;
pub mod refusals;
pub mod routes;
pub mod sideband;
pub mod upstream;

/// How the client reached the model, as written in rows (`transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    WebSocket,
    WebRtc,
    Sip,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::WebSocket => "websocket",
            Transport::WebRtc => "webrtc",
            Transport::Sip => "sip",
        }
    }
}
