//! An accept's claim on its call, taken before the upstream is asked: in
//! this process's [`Owners`] (a compare-and-set), and with Redis in the
//! fleet's call record too (`SET NX`), so that of concurrent accepts of one
//! call (a webhook retried at once, on one replica or several) exactly one
//! goes upstream, gets a session slot and a sideband.
//!
//! The claim is released when the accept fails (admission refused, the
//! upstream refused or did not answer: [`AcceptClaim::release`], awaited so
//! that a retry right after the refusal can win it) and, as a fallback,
//! when the accept is dropped midway (its client left): the in-memory
//! claim at once, the Redis one by a spawned compare-and-delete (it would
//! lapse with its TTL anyway). A won accept keeps it
//! ([`AcceptClaim::keep`]) once the call's owner is settled.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::auth::KeyEntry;
use crate::gateway::Route;

use super::fleet::{unix_ms, CallFleet, CallRecord, Claimed, Unavailable};
use super::ownership::{decide, Decision, Owner, Owners};
use super::Transport;

/// Why an accept did not get its call.
#[derive(Debug, Clone, PartialEq)]
pub enum Lost {
    /// Another request holds it: what to answer.
    Held(Decision),
    /// Redis could not say who holds it.
    StoreUnavailable,
}

/// A won claim; released on drop unless kept.
#[derive(Debug)]
pub struct AcceptClaim {
    owners: Arc<Owners>,
    fleet: Option<CallFleet>,
    call_id: String,
    /// The fleet record as written (what releases it).
    record: Option<String>,
    armed: bool,
}

/// The answer to an accept that found the call held by `holder`.
fn held_by(holder: Option<&Owner>, key: &KeyEntry) -> Lost {
    match holder {
        Some(o) => Lost::Held(decide("accept", Some(o), key)),
        // A record that cannot be read names no owner: unknown to this key.
        None => Lost::Held(Decision::NotFound),
    }
}

/// Claims `call_id` for an accept by `key` on `route`; the fleet's claim
/// lapses after `ttl` if nothing settles or releases it.
pub async fn claim(
    owners: &Arc<Owners>,
    fleet: Option<&CallFleet>,
    key: &KeyEntry,
    route: &Route,
    call_id: &str,
    ttl: Duration,
) -> Result<AcceptClaim, Lost> {
    let owner = Owner {
        key_id: key.id.clone(),
        team: key.team.clone(),
        model: route.config.model.clone(),
        transport: Transport::Sip,
        accepting: true,
    };
    if let Err(holder) = owners.try_claim(call_id, owner) {
        return Err(held_by(Some(&holder), key));
    }
    let mut claim = AcceptClaim {
        owners: owners.clone(),
        fleet: fleet.cloned(),
        call_id: call_id.to_string(),
        record: None,
        armed: true,
    };
    let Some(fleet) = fleet else {
        return Ok(claim);
    };
    let rec = CallRecord {
        call_id: call_id.to_string(),
        key_id: key.id.clone(),
        team: key.team.clone(),
        model: route.config.model.clone(),
        transport: Transport::Sip.as_str().into(),
        client_secret_id: None,
        lease_id: None,
        started_unix_ms: unix_ms(SystemTime::now()),
        accepting: true,
    };
    match fleet.claim_accept(&rec, ttl).await {
        Ok(Claimed::Won(record)) => {
            claim.record = Some(record);
            Ok(claim)
        }
        // Dropping the claim releases the in-memory half.
        Ok(Claimed::Held(holder)) => Err(held_by(holder.map(|r| r.owner()).as_ref(), key)),
        Err(Unavailable) => Err(Lost::StoreUnavailable),
    }
}

impl AcceptClaim {
    /// The accept failed: the call is free again, here and in the fleet.
    pub async fn release(mut self) {
        self.armed = false;
        self.owners.release_claim(&self.call_id);
        if let (Some(fleet), Some(record)) = (&self.fleet, &self.record) {
            fleet.release_claim(&self.call_id, record).await;
        }
    }

    /// The accept won: the call's owner is settled (and its fleet record
    /// written over the claim).
    pub fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for AcceptClaim {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.owners.release_claim(&self.call_id);
        let (Some(fleet), Some(record)) = (self.fleet.take(), self.record.take()) else {
            return;
        };
        let call_id = std::mem::take(&mut self.call_id);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { fleet.release_claim(&call_id, &record).await });
        }
    }
}
