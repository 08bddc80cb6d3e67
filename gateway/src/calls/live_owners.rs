//! The owners of GPT-Live WebSocket sessions, recorded where the owners of
//! WebRTC Live sessions are ([`super::ownership::Owners`], and with Redis
//! the fleet's records, [`super::fleet`]), so that the owner's (or its
//! team's) `…/{id}/attach` and `…/{id}/fork` of a WebSocket session's id
//! are served on any replica and anyone else's are 404 as for every Live id.
//!
//! The record is written when the upstream's `session.started` names the
//! session ([`crate::live_records`], called by the session) and retired
//! when it ends, as a WebRTC Live session's is: kept for
//! [`super::ownership::RETIRED_FOR`], since a stored session is forked
//! after it ended. It is a record of `transport` `websocket`, never in a
//! route's set of adoptable calls: a WebSocket session is not metered over
//! a sideband (its client's connection carries it and its usage, and only
//! the replica holding that connection meters it), so no replica ever
//! adopts it ([`super::api`]'s adoption skips such a record even if it
//! were found in a set).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::RouteConfig;
use crate::live_records::{LiveRecords, LiveWsSession, Recording};

use super::fleet::{CallFleet, CallRecord, RECORD_GRACE};
use super::ownership::{Owner, Owners};
use super::Transport;

/// The calls routes' owners, as the sessions' recorder.
#[derive(Debug)]
pub struct LiveWsOwners {
    pub owners: Arc<Owners>,
    pub fleet: Option<CallFleet>,
    /// How long a live record lasts: `max_session_secs` and
    /// [`RECORD_GRACE`] (a replica that dies leaves it to expire).
    pub ttl: Duration,
}

impl LiveWsOwners {
    pub fn new(owners: Arc<Owners>, fleet: Option<CallFleet>, max_session: Duration) -> Self {
        Self {
            owners,
            fleet,
            ttl: max_session + RECORD_GRACE,
        }
    }
}

/// The fleet's record of a Live WebSocket session.
pub fn record_of(s: &LiveWsSession) -> CallRecord {
    CallRecord {
        call_id: s.id.clone(),
        key_id: s.key_id.clone(),
        team: s.team.clone(),
        model: s.model.clone(),
        transport: Transport::WebSocket.as_str().into(),
        client_secret_id: None,
        lease_id: None,
        started_unix_ms: s.started_unix_ms,
        accepting: false,
    }
}

impl LiveRecords for LiveWsOwners {
    fn started<'a>(&'a self, s: &'a LiveWsSession) -> Recording<'a> {
        Box::pin(async move {
            let rec = record_of(s);
            self.owners.settle(&s.id, rec.owner());
            if let Some(f) = &self.fleet {
                f.register_live_ws(&rec, self.ttl).await;
            }
        })
    }

    fn ended<'a>(&'a self, s: &'a LiveWsSession) -> Recording<'a> {
        Box::pin(async move {
            self.owners.retire(&s.id, Instant::now());
            if let Some(f) = &self.fleet {
                f.retire_live_ws(&s.id).await;
            }
        })
    }
}

/// Whether a fleet record may be adopted by another replica: a call's or a
/// WebRTC Live session's, never a WebSocket session's.
pub fn adoptable(owner: &Owner) -> bool {
    owner.transport != Transport::WebSocket
}

/// True (and the record taken out of `route`'s set, this replica's claim
/// dropped) when a claimed record is a Live WebSocket session's: its
/// client's connection is its only leg, metered where it is held.
pub async fn never_adopted(fleet: &CallFleet, route: &RouteConfig, rec: &CallRecord) -> bool {
    if adoptable(&rec.owner()) {
        return false;
    }
    tracing::warn!(call_id = %rec.call_id, "a WebSocket Live session's record in a set of calls: not adopted");
    fleet.unindex(route, &rec.call_id).await;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> LiveWsSession {
        LiveWsSession {
            id: "live_1".into(),
            key_id: "k".into(),
            team: Some("t".into()),
            model: "gpt-live-1".into(),
            started_unix_ms: 7,
        }
    }

    #[tokio::test]
    async fn a_websocket_sessions_owner_is_known_while_it_runs_and_after_it_ended() {
        let owners = Arc::new(Owners::default());
        let rec = LiveWsOwners::new(owners.clone(), None, Duration::from_secs(60));
        rec.started(&session()).await;
        let owner = owners.known("live_1").expect("recorded");
        assert_eq!(
            (
                owner.key_id.as_str(),
                owner.team.as_deref(),
                owner.transport
            ),
            ("k", Some("t"), Transport::WebSocket)
        );
        assert!(!owner.accepting);
        assert!(!adoptable(&owner), "a WebSocket session is never adopted");
        rec.ended(&session()).await;
        assert_eq!(owners.get("live_1"), None, "no longer live here");
        assert_eq!(owners.known("live_1"), Some(owner), "retired, still owned");
    }

    #[test]
    fn its_fleet_record_names_the_websocket_transport_and_no_lease() {
        let rec = record_of(&session());
        assert_eq!(rec.transport(), Transport::WebSocket);
        assert_eq!(rec.lease_id, None);
        assert_eq!(rec.started_unix_ms, 7);
        let back: CallRecord = serde_json::from_str(&serde_json::to_string(&rec).unwrap()).unwrap();
        assert_eq!(back, rec);
    }
}
