//! Calls across a fleet sharing Redis: the ownership record any replica can
//! read, and the hand-over of a call's sideband from a draining (or dead)
//! replica to another.
//!
//! # In Redis
//! - `{prefix}call:{call_id}`: the call's [`CallRecord`] (JSON), written
//!   when the upstream answered, removed when the call ends; it expires
//!   [`RECORD_GRACE`] after `max_session_secs` whatever happens. An accept
//!   claims it first with `SET NX` ([`CallFleet::claim_accept`], marked
//!   `accepting`, expiring [`CLAIM_GRACE`] after the accept's own timeout):
//!   of concurrent accepts on any replicas, one goes upstream; a refused
//!   accept deletes its claim (only its own: compare-and-delete).
//!   A GPT-Live WebSocket session's owner has a record too (`transport`
//!   `websocket`, [`CallFleet::register_live_ws`]), in no route's set:
//!   it is never adopted ([`super::live_owners`]).
//! - `{prefix}call_holder:{call_id}`: the id of the replica whose sideband
//!   meters the call, with a TTL of [`HOLD_TTL`], renewed every
//!   [`HOLD_RENEW`] while it does.
//! - `{prefix}live_charged:{id}`: for a GPT-Live WebRTC session, the
//!   milliseconds its metering replica has charged so far, raised before
//!   each window is charged ([`CallFleet::mark_live_charged`]), so it is
//!   never behind what was charged (an adopting replica charges only what
//!   the upstream's cumulative figure adds to it; [`crate::metering::live`]).
//! - `{prefix}live_delegated:{id}`: the response ids of the delegated
//!   responses charged of that session, added before they are charged
//!   ([`CallFleet::mark_live_delegated`]): an adopting replica charges
//!   none of them again ([`crate::metering::delegated`]). An ended Live session's record is
//!   kept for [`super::ownership::RETIRED_FOR`] ([`CallFleet::retire`]):
//!   its recording and forks stay its owner's.
//! - `{prefix}calls:{model}:{upstream}`: the set of live call ids of one
//!   route (`upstream` is a hash of the route's upstream URL, so that only
//!   replicas that can reach the same upstream adopt its calls).
//!
//! # Hand-over
//! A draining replica closes its sidebands at once and deletes its holder
//! keys (only its own: compare-and-delete); a replica that dies stops
//! renewing them and they expire within [`HOLD_TTL`]. Every replica polls
//! its routes' sets every [`ADOPT_POLL`] and claims each call without a
//! holder with `SET NX`, so exactly one replica adopts it; it then attaches
//! a new sideband and meters from there (new `session_id`, same `call_id`).
//! Turns during the gap are not seen; a turn in flight at the hand-over may
//! be logged `usage_unknown` by the replica that let go.
//!
//! Every Redis call is bounded by [`CALL_TIMEOUT`]; a failure is logged and
//! counted in `patchbay_store_errors_total` and never ends a call.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::config::RouteConfig;
use crate::metrics::Metrics;
use crate::store::{StoreError, CALL_TIMEOUT};

use super::ownership::Owner;
use super::Transport;

/// How long a holder key lives without a renewal.
pub const HOLD_TTL: Duration = Duration::from_secs(10);
/// How often the holder of a call renews its key.
pub const HOLD_RENEW: Duration = Duration::from_secs(3);
/// How often a replica looks for calls without a holder.
pub const ADOPT_POLL: Duration = Duration::from_secs(2);
/// How long a call record outlives `max_session_secs`.
pub const RECORD_GRACE: Duration = Duration::from_secs(300);
/// How long an accept's claim outlives the accept's upstream timeout (the
/// admission before it, and the answer after it): a replica that dies
/// mid-accept leaves a claim that lapses by then.
pub const CLAIM_GRACE: Duration = Duration::from_secs(30);

/// What another replica needs to take a call over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub call_id: String,
    pub key_id: String,
    pub team: Option<String>,
    pub model: String,
    pub transport: String,
    pub client_secret_id: Option<String>,
    /// The key's fleet session lease, when it holds one.
    pub lease_id: Option<String>,
    /// When the call was admitted (Unix ms): `max_session_secs` counts from it.
    pub started_unix_ms: u64,
    /// Claimed by an accept the upstream has not answered yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accepting: bool,
}

impl CallRecord {
    pub fn transport(&self) -> Transport {
        match self.transport.as_str() {
            "sip" => Transport::Sip,
            "websocket" => Transport::WebSocket,
            _ => Transport::WebRtc,
        }
    }

    pub fn owner(&self) -> Owner {
        Owner {
            key_id: self.key_id.clone(),
            team: self.team.clone(),
            model: self.model.clone(),
            transport: self.transport(),
            accepting: self.accepting,
        }
    }
}

/// Deletes `KEYS[1]` only when it holds `ARGV[1]`.
const RELEASE_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Sets `KEYS[1]` to `ARGV[1]` (for `ARGV[2]` ms) unless it exists;
/// returns nothing when it was set, else the value that holds it.
const CLAIM_SCRIPT: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
return redis.call('GET', KEYS[1])
";

/// Renews the hold only while it is this replica's (or nobody's): a replica
/// whose hold expired during a Redis outage and was claimed by another must
/// not take it back, or two sidebands would meter one call.
const RENEW_SCRIPT: &str = r"
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
";

/// The calls' Redis records for one replica.
#[derive(Clone)]
pub struct CallFleet {
    /// The process's shared Redis connection (the store's URL, TLS
    /// settings and reconnects).
    conn: crate::store::conn::RedisConn,
    prefix: String,
    /// This replica's id in holder keys.
    pub replica: String,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for CallFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallFleet")
            .field("prefix", &self.prefix)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

/// The set of a route's live calls (its own hash tag in a cluster).
pub fn index_key(prefix: &str, route: &RouteConfig, tagged: bool) -> String {
    let digest = sha2::Sha256::digest(route.upstream_url.as_bytes());
    let id = format!("{}:{}", route.model, hex::encode(&digest[..8]));
    if tagged {
        format!("{prefix}calls:{{{id}}}")
    } else {
        format!("{prefix}calls:{id}")
    }
}

impl CallFleet {
    pub fn new(conn: crate::store::conn::RedisConn, prefix: &str, metrics: Arc<Metrics>) -> Self {
        Self {
            conn,
            prefix: prefix.to_string(),
            replica: crate::ids::short_id(),
            metrics,
        }
    }

    /// `call_id`, in braces in a cluster: a call's keys share its slot.
    fn id(&self, call_id: &str) -> String {
        if self.conn.tagged() {
            format!("{{{call_id}}}")
        } else {
            call_id.to_string()
        }
    }

    fn record_key(&self, call_id: &str) -> String {
        format!("{}call:{}", self.prefix, self.id(call_id))
    }

    fn holder_key(&self, call_id: &str) -> String {
        format!("{}call_holder:{}", self.prefix, self.id(call_id))
    }

    fn charged_key(&self, call_id: &str) -> String {
        format!("{}live_charged:{}", self.prefix, self.id(call_id))
    }

    fn index_key(&self, route: &RouteConfig) -> String {
        index_key(&self.prefix, route, self.conn.tagged())
    }

    /// Runs `call` (a transaction on one call's keys) with `index` (the
    /// route's set): in the same transaction on one server; in a cluster,
    /// where the set lives in another slot, right after it.
    async fn with_index(&self, op: &'static str, mut call: redis::Pipeline, index: redis::Cmd) {
        let mut conn = self.conn.get();
        if self.conn.tagged() {
            if self
                .bounded(op, call.query_async::<()>(&mut conn))
                .await
                .is_some()
            {
                self.bounded(op, index.query_async::<()>(&mut conn)).await;
            }
        } else {
            call.add_command(index).ignore();
            self.bounded(op, call.query_async::<()>(&mut conn)).await;
        }
    }

    /// Records what this replica has charged of a Live session so far.
    pub async fn set_live_charged(&self, call_id: &str, charged_ms: u64, ttl: Duration) {
        let mut conn = self.conn.get();
        let cmd = redis::cmd("SET")
            .arg(self.charged_key(call_id))
            .arg(charged_ms)
            .arg("EX")
            .arg(ttl.as_secs().max(1))
            .to_owned();
        self.bounded("live_charged_set", cmd.query_async::<()>(&mut conn))
            .await;
    }

    /// What has been charged of a Live session (0 if nothing is recorded);
    /// `None` when Redis did not say.
    pub async fn live_charged(&self, call_id: &str) -> Option<u64> {
        let mut conn = self.conn.get();
        let cmd = redis::cmd("GET").arg(self.charged_key(call_id)).to_owned();
        self.bounded(
            "live_charged_get",
            cmd.query_async::<Option<u64>>(&mut conn),
        )
        .await
        .map(Option::unwrap_or_default)
    }

    /// Forgets an ended Live session's hold and charge, keeping its record
    /// (its owner) for [`super::ownership::RETIRED_FOR`].
    pub async fn retire(&self, route: &RouteConfig, call_id: &str) {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .expire(
                self.record_key(call_id),
                super::ownership::RETIRED_FOR.as_secs() as i64,
            )
            .ignore()
            .del(self.holder_key(call_id))
            .ignore()
            .del(self.charged_key(call_id))
            .ignore();
        let srem = redis::cmd("SREM")
            .arg(self.index_key(route))
            .arg(call_id)
            .to_owned();
        self.with_index("call_retire", pipe, srem).await;
    }

    async fn bounded<T>(
        &self,
        op: &'static str,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Option<T> {
        let r = match tokio::time::timeout(CALL_TIMEOUT, f).await {
            Ok(Ok(v)) => return Some(v),
            Ok(Err(source)) => StoreError::Redis { op, source },
            Err(_) => StoreError::Timeout {
                op,
                after: CALL_TIMEOUT,
            },
        };
        self.metrics.store_errors.inc();
        tracing::warn!(op, error = %r, "calls store call failed");
        None
    }

    /// Records a call held by this replica.
    pub async fn register(&self, route: &RouteConfig, rec: &CallRecord, max_session: Duration) {
        let json = serde_json::to_string(rec).unwrap_or_default();
        let ttl = (max_session + RECORD_GRACE).as_secs();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .set_ex(self.record_key(&rec.call_id), json, ttl)
            .ignore()
            .set_options(
                self.holder_key(&rec.call_id),
                &self.replica,
                redis::SetOptions::default()
                    .with_expiration(redis::SetExpiry::PX(HOLD_TTL.as_millis() as u64)),
            )
            .ignore();
        let sadd = redis::cmd("SADD")
            .arg(self.index_key(route))
            .arg(&rec.call_id)
            .to_owned();
        self.with_index("call_register", pipe, sadd).await;
    }

    /// Renews this replica's hold on a call: `Some(false)` when another
    /// replica holds it now (this one must stop metering it), `None` when
    /// Redis did not answer (keep metering; the next tick tries again).
    pub async fn renew(&self, call_id: &str) -> Option<bool> {
        let mut conn = self.conn.get();
        let script = redis::Script::new(RENEW_SCRIPT);
        let mut inv = script.key(self.holder_key(call_id));
        inv.arg(&self.replica).arg(HOLD_TTL.as_millis() as u64);
        self.bounded("call_renew", inv.invoke_async::<i64>(&mut conn))
            .await
            .map(|held| held == 1)
    }

    /// Lets another replica take the call (drops this replica's hold only).
    pub async fn release(&self, call_id: &str) {
        let mut conn = self.conn.get();
        let script = redis::Script::new(RELEASE_SCRIPT);
        let mut inv = script.key(self.holder_key(call_id));
        inv.arg(&self.replica);
        self.bounded("call_release", inv.invoke_async::<i64>(&mut conn))
            .await;
    }

    /// Claims a call for an accept (`rec`, marked `accepting`) unless a
    /// record exists, for `ttl`: `Ok(Claimed::Won)` with what releases it,
    /// `Ok(Claimed::Held)` with the holder's record (`None` if unreadable),
    /// `Err` when Redis could not say.
    pub async fn claim_accept(
        &self,
        rec: &CallRecord,
        ttl: Duration,
    ) -> Result<Claimed, Unavailable> {
        let json = serde_json::to_string(rec).unwrap_or_default();
        let mut conn = self.conn.get();
        let script = redis::Script::new(CLAIM_SCRIPT);
        let mut inv = script.key(self.record_key(&rec.call_id));
        inv.arg(&json).arg(ttl.as_millis() as u64);
        let held: Option<String> = self
            .bounded("call_claim_accept", inv.invoke_async(&mut conn))
            .await
            .ok_or(Unavailable)?;
        Ok(match held {
            None => Claimed::Won(json),
            Some(h) => Claimed::Held(serde_json::from_str(&h).ok()),
        })
    }

    /// Deletes an accept's claim: only `claim` (as [`Claimed::Won`] gave
    /// it), never a record written since.
    pub async fn release_claim(&self, call_id: &str, claim: &str) {
        let mut conn = self.conn.get();
        let script = redis::Script::new(RELEASE_SCRIPT);
        let mut inv = script.key(self.record_key(call_id));
        inv.arg(claim);
        self.bounded("call_release_claim", inv.invoke_async::<i64>(&mut conn))
            .await;
    }

    /// Forgets an ended call.
    pub async fn forget(&self, route: &RouteConfig, call_id: &str) {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .del(self.record_key(call_id))
            .ignore()
            .del(self.holder_key(call_id))
            .ignore();
        let srem = redis::cmd("SREM")
            .arg(self.index_key(route))
            .arg(call_id)
            .to_owned();
        self.with_index("call_forget", pipe, srem).await;
    }

    /// The record of a call, from any replica: `Ok(None)` when there is
    /// none, `Err` when Redis could not say (logged and counted).
    pub async fn record(&self, call_id: &str) -> Result<Option<CallRecord>, Unavailable> {
        let mut conn = self.conn.get();
        let cmd = redis::cmd("GET").arg(self.record_key(call_id)).to_owned();
        let json: Option<String> = self
            .bounded("call_get", cmd.query_async(&mut conn))
            .await
            .ok_or(Unavailable)?;
        Ok(json.and_then(|j| serde_json::from_str(&j).ok()))
    }

    /// Claims every call of `route` that no replica holds; the records of
    /// the calls this replica now holds.
    pub async fn claim_orphans(&self, route: &RouteConfig) -> Vec<CallRecord> {
        let mut conn = self.conn.get();
        let index = self.index_key(route);
        let cmd = redis::cmd("SMEMBERS").arg(&index).to_owned();
        let Some(ids) = self
            .bounded("call_index", cmd.query_async::<Vec<String>>(&mut conn))
            .await
        else {
            return Vec::new();
        };
        let mut claimed = Vec::new();
        for id in ids {
            let cmd = redis::cmd("SET")
                .arg(self.holder_key(&id))
                .arg(&self.replica)
                .arg("NX")
                .arg("PX")
                .arg(HOLD_TTL.as_millis() as u64)
                .to_owned();
            let won: Option<Option<String>> =
                self.bounded("call_claim", cmd.query_async(&mut conn)).await;
            if !matches!(won, Some(Some(_))) {
                continue;
            }
            match self.record(&id).await {
                Ok(Some(rec)) => claimed.push(rec),
                Ok(None) => {
                    // The record expired or the call ended meanwhile.
                    self.forget(route, &id).await;
                }
                // Not known: the record stays; the claim lapses with its
                // TTL and the call is claimed again on a later poll.
                Err(Unavailable) => {}
            }
        }
        claimed
    }
}

/// Raises `KEYS[1]` to `ARGV[1]` (never lowers it), for `ARGV[2]` s.
const RAISE_SCRIPT: &str = r"
local held = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local new = tonumber(ARGV[1])
if new > held then held = new end
redis.call('SET', KEYS[1], tostring(held), 'EX', ARGV[2])
return 1
";

impl CallFleet {
    /// Raises what is recorded as charged of a Live session to
    /// `charged_ms` (before it is charged: [`crate::metering::live::ChargedMark`]);
    /// true once Redis confirmed it.
    pub async fn mark_live_charged(&self, call_id: &str, charged_ms: u64, ttl: Duration) -> bool {
        let mut conn = self.conn.get();
        let script = redis::Script::new(RAISE_SCRIPT);
        let mut inv = script.key(self.charged_key(call_id));
        inv.arg(charged_ms).arg(ttl.as_secs().max(1));
        self.bounded("live_charged_mark", inv.invoke_async::<i64>(&mut conn))
            .await
            .is_some()
    }

    fn delegated_key(&self, call_id: &str) -> String {
        format!("{}live_delegated:{}", self.prefix, self.id(call_id))
    }

    /// Adds delegated response ids to those charged of a Live session
    /// (before they are charged); true once Redis confirmed it.
    pub async fn mark_live_delegated(&self, call_id: &str, ids: &[String], ttl: Duration) -> bool {
        let key = self.delegated_key(call_id);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .sadd(&key, ids)
            .ignore()
            .expire(&key, ttl.as_secs().max(1) as i64)
            .ignore();
        let mut conn = self.conn.get();
        self.bounded("live_delegated_mark", pipe.query_async::<()>(&mut conn))
            .await
            .is_some()
    }

    /// The delegated response ids charged of a Live session so far;
    /// `None` when Redis did not say.
    pub async fn live_delegated(&self, call_id: &str) -> Option<Vec<String>> {
        let cmd = redis::cmd("SMEMBERS")
            .arg(self.delegated_key(call_id))
            .to_owned();
        let mut conn = self.conn.get();
        self.bounded("live_delegated_get", cmd.query_async(&mut conn))
            .await
    }

    /// Records a GPT-Live WebSocket session's owner (`transport`
    /// `websocket`, for its attach and forks on any replica): the record
    /// alone, in no route's set and with no holder, so no replica's
    /// [`CallFleet::claim_orphans`] ever sees it (its client holds the
    /// session's only connection: nothing could be adopted).
    pub async fn register_live_ws(&self, rec: &CallRecord, ttl: Duration) {
        let json = serde_json::to_string(rec).unwrap_or_default();
        let cmd = redis::cmd("SET")
            .arg(self.record_key(&rec.call_id))
            .arg(json)
            .arg("EX")
            .arg(ttl.as_secs().max(1))
            .to_owned();
        let mut conn = self.conn.get();
        self.bounded("live_ws_register", cmd.query_async::<()>(&mut conn))
            .await;
    }

    /// Keeps an ended Live WebSocket session's record (its owner) for
    /// [`super::ownership::RETIRED_FOR`].
    pub async fn retire_live_ws(&self, id: &str) {
        let cmd = redis::cmd("EXPIRE")
            .arg(self.record_key(id))
            .arg(super::ownership::RETIRED_FOR.as_secs())
            .to_owned();
        let mut conn = self.conn.get();
        self.bounded("live_ws_retire", cmd.query_async::<()>(&mut conn))
            .await;
    }

    /// Takes `call_id` out of `route`'s set of adoptable calls and drops
    /// this replica's hold on it (a record that must never be adopted).
    pub async fn unindex(&self, route: &RouteConfig, call_id: &str) {
        let cmd = redis::cmd("SREM")
            .arg(self.index_key(route))
            .arg(call_id)
            .to_owned();
        let mut conn = self.conn.get();
        self.bounded("call_unindex", cmd.query_async::<()>(&mut conn))
            .await;
        self.release(call_id).await;
    }
}

/// How a claim of a call for an accept went.
#[derive(Debug, Clone, PartialEq)]
pub enum Claimed {
    /// This accept holds the call; the claim as written (to release it).
    Won(String),
    /// A record exists: its holder (`None` if it could not be read).
    Held(Option<CallRecord>),
}

/// Redis did not answer a calls-store read in time, or failed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

/// Milliseconds since the Unix epoch.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_to_different_upstreams_have_different_call_sets() {
        let route = |url: &str| RouteConfig {
            model: "m".into(),
            upstream_url: url.into(),
            ..RouteConfig::default()
        };
        let a = index_key("p:", &route("wss://a/v1/realtime"), false);
        assert!(a.starts_with("p:calls:m:"), "{a}");
        assert_ne!(a, index_key("p:", &route("wss://b/v1/realtime"), false));
        assert_eq!(a, index_key("p:", &route("wss://a/v1/realtime"), false));
    }

    #[test]
    fn a_record_round_trips_and_names_its_owner() {
        let rec = CallRecord {
            call_id: "rtc_1".into(),
            key_id: "k".into(),
            team: Some("t".into()),
            model: "m".into(),
            transport: "sip".into(),
            client_secret_id: None,
            lease_id: Some("s1".into()),
            started_unix_ms: 5,
            accepting: false,
        };
        let back: CallRecord = serde_json::from_str(&serde_json::to_string(&rec).unwrap()).unwrap();
        assert_eq!(back, rec);
        assert_eq!(back.owner().transport, Transport::Sip);
        assert_eq!(back.owner().team.as_deref(), Some("t"));
        let json = serde_json::to_string(&rec).unwrap();
        assert!(!json.contains("accepting"), "{json}");
        let claim = CallRecord {
            accepting: true,
            ..rec
        };
        let back: CallRecord =
            serde_json::from_str(&serde_json::to_string(&claim).unwrap()).unwrap();
        assert!(back.owner().accepting);
    }
}
