//! The calls routes composed in one place: the Realtime and translation
//! calls collections ([`super::api`]) and GPT-Live's WebRTC sessions
//! ([`super::live`], and the WebSockets under a session's id:
//! [`super::live_ws`]), sharing one [`CallsState`] (owners and, with Redis,
//! the fleet's records and hand-over), so that one adopt loop takes over
//! the sidebands of both.

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;

use crate::gateway::Gateway;

use super::api::{
    act, act_translation, adopt_loop, create, create_translation, method_not_allowed, CallsState,
    CALLS_PATHS, TRANSLATION_CALLS_PATHS,
};
use super::fleet::CallFleet;
use super::live_owners::LiveWsOwners;
use super::{live, live_ws};

/// The calls and Live sessions routes. With Redis, also starts the task
/// that adopts calls other replicas let go (it stops when draining starts).
pub fn router(gw: Arc<Gateway>) -> Router {
    // The process's shared Redis connection: a rotated URL moves call
    // records and hand-over with the store.
    let fleet = gw
        .redis
        .clone()
        .map(|conn| CallFleet::new(conn, crate::store::DEFAULT_PREFIX, gw.metrics.clone()));
    let state = CallsState {
        gw,
        owners: Arc::default(),
        fleet,
    };
    // Live WebSocket sessions record their owners here too.
    let max_session = std::time::Duration::from_secs(state.gw.config.relay.max_session_secs);
    let records = LiveWsOwners::new(state.owners.clone(), state.fleet.clone(), max_session);
    if state.gw.live_records.set(Arc::new(records)).is_err() {
        tracing::warn!("the calls routes were built twice: Live WebSocket owners go to the first");
    }
    if state.fleet.is_some() {
        tokio::spawn(adopt_loop(state.clone()));
    }
    let mut r = Router::new();
    for base in CALLS_PATHS {
        r = r
            .route(base, post(create).fallback(method_not_allowed))
            .route(
                &format!("{base}/{{call_id}}/{{action}}"),
                post(act).fallback(method_not_allowed),
            );
    }
    for base in TRANSLATION_CALLS_PATHS {
        r = r
            .route(base, post(create_translation).fallback(method_not_allowed))
            .route(
                &format!("{base}/{{call_id}}/{{action}}"),
                post(act_translation).fallback(method_not_allowed),
            );
    }
    for base in live::LIVE_SESSIONS_PATHS {
        // `GET` of the collection is the primary WebSocket, answered on the
        // upgrade path before this router.
        r = r
            .route(base, post(live::create).fallback(method_not_allowed))
            .route(
                &format!("{base}/{{session_id}}/content"),
                get(live::content).fallback(method_not_allowed),
            )
            .route(
                &format!("{base}/{{session_id}}/attach"),
                get(live_ws::attach).fallback(method_not_allowed),
            )
            .route(
                &format!("{base}/{{session_id}}/fork"),
                post(live::fork)
                    .get(live_ws::fork)
                    .fallback(method_not_allowed),
            )
            .route(
                &format!("{base}/{{session_id}}/{{action}}"),
                post(live::act).fallback(method_not_allowed),
            );
    }
    r.with_state(state)
}
