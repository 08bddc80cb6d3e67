//! Which key created or accepted a call: only that key, or a key of the same
//! team, may act on it (hangup, refer, reject); any other key gets 404, as if
//! the call did not exist, so call ids cannot be probed.
//!
//! An accept claims its call *before* the upstream is asked
//! ([`Owners::try_claim`], a compare-and-set: the record is written only
//! if there is none), so of concurrent accepts (a webhook retried at once)
//! exactly one goes upstream. While that accept waits for the upstream the
//! record is [`Owner::accepting`]: another accept is answered as a
//! duplicate, a hangup, refer or reject with 409 (retry once the accept is
//! answered); if the upstream refuses, the claim is released
//! ([`Owners::release_claim`]) and a retry can win it. With Redis the same
//! claim is made in the fleet's record too ([`super::fleet`]).
//!
//! Records live in this process's memory and are removed when the call's
//! sideband ends; a GPT-Live session's record is *retired* instead
//! ([`Owners::retire`]): kept for [`RETIRED_FOR`] (at most
//! [`MAX_RETIRED`] of them), since a stored Live session's recording and
//! forks are asked for after it ended. [`may_act`] and [`decide`] are the
//! pure decisions.
//!
//! A hangup or reject the upstream answered is told to the call's sideband
//! ([`Owners::client_ended`], watched through [`Owners::client_end`]): the
//! call then ends as the client's hangup at once, even while its sideband
//! is still being attached (which would otherwise fail against the ended
//! call and be taken for a call the gateway cannot see).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::auth::KeyEntry;

use super::Transport;

/// The owner of one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    pub key_id: String,
    pub team: Option<String>,
    /// The route's client-facing model (the route its requests go to).
    pub model: String,
    pub transport: Transport,
    /// Claimed by an accept the upstream has not answered yet.
    pub accepting: bool,
}

/// Whether `key` may act on a call owned by `owner`: the same key, or a key
/// of the owner's team.
pub fn may_act(owner: &Owner, key: &KeyEntry) -> bool {
    owner.key_id == key.id || (owner.team.is_some() && owner.team == key.team)
}

/// What to do with an action on a call, given who holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// An accept of a call nobody holds: claim it, then ask the upstream.
    Accept,
    /// Forward the action on the holder's route.
    Forward(Owner),
    /// A reject of a call nobody holds (a webhook declining it): forward it
    /// on any route with a calls API.
    ForwardUnheld,
    /// 404 (`call_not_found`; a Live session's `session_not_found`):
    /// unknown to this key.
    NotFound,
    /// `400 call_already_accepted`: an accept of a held call.
    AlreadyAccepted,
    /// `409 call_accept_in_progress`: a hangup, refer or reject while the
    /// call's accept waits for the upstream.
    AcceptInProgress,
}

/// The decision for `action` (`accept`, `hangup`, `refer` or `reject`) by
/// `key` on a call held by `owner` (`None`: by nobody).
pub fn decide(action: &str, owner: Option<&Owner>, key: &KeyEntry) -> Decision {
    match (action, owner) {
        (_, Some(o)) if !may_act(o, key) => Decision::NotFound,
        ("accept", Some(_)) => Decision::AlreadyAccepted,
        ("accept", None) => Decision::Accept,
        (_, Some(o)) if o.accepting => Decision::AcceptInProgress,
        (_, Some(o)) => Decision::Forward(o.clone()),
        ("reject", None) => Decision::ForwardUnheld,
        (_, None) => Decision::NotFound,
    }
}

/// How long an ended Live session's owner is kept (its recording and
/// forks stay the owner's alone).
pub const RETIRED_FOR: Duration = Duration::from_secs(24 * 3600);
/// The most ended Live sessions' owners kept in memory (the oldest go
/// first); with Redis the fleet's records keep them too.
pub const MAX_RETIRED: usize = 100_000;

/// Call owners, by call id.
#[derive(Debug, Default)]
pub struct Owners {
    /// Ended Live sessions: owner and when it ended.
    retired: Mutex<HashMap<String, (Owner, Instant)>>,
    calls: Mutex<HashMap<String, Owner>>,
    /// Per call held here, fired when the client's hangup or reject was
    /// answered by the upstream.
    client_ends: Mutex<HashMap<String, CancellationToken>>,
}

impl Owners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Owner>> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, call_id: &str) -> Option<Owner> {
        self.lock().get(call_id).cloned()
    }

    /// Records `owner` unless the call already has one; returns the owner
    /// that holds the call afterwards.
    pub fn claim(&self, call_id: &str, owner: Owner) -> Owner {
        self.lock()
            .entry(call_id.to_string())
            .or_insert(owner)
            .clone()
    }

    /// Records `owner` only if the call has none (compare-and-set):
    /// `Err` with the holder when it already has one.
    pub fn try_claim(&self, call_id: &str, owner: Owner) -> Result<(), Owner> {
        match self.lock().entry(call_id.to_string()) {
            std::collections::hash_map::Entry::Occupied(held) => Err(held.get().clone()),
            std::collections::hash_map::Entry::Vacant(free) => {
                free.insert(owner);
                Ok(())
            }
        }
    }

    /// The call's accept was answered: its claim becomes the live owner.
    pub fn settle(&self, call_id: &str, owner: Owner) {
        self.lock().insert(call_id.to_string(), owner);
    }

    /// Drops an accept's claim (the upstream refused, or the accept never
    /// got there); a live owner stays.
    pub fn release_claim(&self, call_id: &str) {
        let mut calls = self.lock();
        if calls.get(call_id).is_some_and(|o| o.accepting) {
            calls.remove(call_id);
        }
    }

    /// The owner of a call held here, or of a Live session that ended here
    /// within [`RETIRED_FOR`].
    pub fn known(&self, call_id: &str) -> Option<Owner> {
        self.get(call_id).or_else(|| {
            let retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
            retired
                .get(call_id)
                .filter(|(_, at)| at.elapsed() < RETIRED_FOR)
                .map(|(o, _)| o.clone())
        })
    }

    /// A Live session ended: its owner is kept (see [`Owners::known`]).
    pub fn retire(&self, call_id: &str, now: Instant) {
        let owner = self.lock().remove(call_id);
        self.ends().remove(call_id);
        let Some(owner) = owner else { return };
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        retired.retain(|_, (_, at)| now.saturating_duration_since(*at) < RETIRED_FOR);
        if retired.len() >= MAX_RETIRED {
            let oldest = retired
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                retired.remove(&k);
            }
        }
        retired.insert(call_id.to_string(), (owner, now));
    }

    pub fn remove(&self, call_id: &str) {
        self.lock().remove(call_id);
        self.ends().remove(call_id);
    }

    fn ends(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.client_ends.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fired once the client has hung up or rejected the call (whether
    /// that happened before or after this is asked).
    pub fn client_end(&self, call_id: &str) -> CancellationToken {
        self.ends().entry(call_id.to_string()).or_default().clone()
    }

    /// The upstream answered the client's hangup or reject of a call held
    /// here; a call not held here is left alone (nothing would watch it).
    pub fn client_ended(&self, call_id: &str) {
        if self.lock().contains_key(call_id) {
            self.ends().entry(call_id.to_string()).or_default().cancel();
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, team: Option<&str>) -> KeyEntry {
        serde_json::from_value(serde_json::json!({"id": id, "sha256": "", "team": team})).unwrap()
    }

    #[test]
    fn the_owner_and_its_team_may_act_and_no_one_else() {
        let owner = |team: Option<&str>| Owner {
            key_id: "a".into(),
            team: team.map(str::to_string),
            model: "m".into(),
            transport: Transport::WebRtc,
            accepting: false,
        };
        let cases = [
            (owner(None), key("a", None), true),
            (owner(None), key("b", None), false),
            (owner(Some("t")), key("b", Some("t")), true),
            (owner(Some("t")), key("b", Some("u")), false),
            (owner(Some("t")), key("b", None), false),
            (owner(None), key("b", Some("t")), false),
            (owner(Some("t")), key("a", None), true),
        ];
        for (o, k, want) in cases {
            assert_eq!(may_act(&o, &k), want, "{o:?} {k:?}");
        }
    }

    #[test]
    fn the_first_claim_wins() {
        let owners = Owners::default();
        let o = |k: &str| Owner {
            key_id: k.into(),
            team: None,
            model: "m".into(),
            transport: Transport::Sip,
            accepting: false,
        };
        assert_eq!(owners.claim("c", o("a")).key_id, "a");
        assert_eq!(owners.claim("c", o("b")).key_id, "a");
        owners.remove("c");
        assert!(owners.is_empty());
    }

    #[test]
    fn a_client_hangup_reaches_the_call_whether_its_watch_began_before_or_after() {
        let owners = Owners::default();
        let live = Owner {
            accepting: false,
            ..accepting("a")
        };
        owners.settle("early", live.clone());
        let watching = owners.client_end("early");
        owners.client_ended("early");
        assert!(watching.is_cancelled());
        owners.settle("late", live);
        owners.client_ended("late");
        assert!(owners.client_end("late").is_cancelled());
        // A call not held here gets no token, and a removed one loses it.
        owners.client_ended("elsewhere");
        assert!(!owners.client_end("elsewhere").is_cancelled());
        owners.remove("late");
        owners.remove("elsewhere");
        assert!(!owners.client_end("late").is_cancelled());
    }

    fn accepting(key_id: &str) -> Owner {
        Owner {
            key_id: key_id.into(),
            team: None,
            model: "m".into(),
            transport: Transport::Sip,
            accepting: true,
        }
    }

    #[test]
    fn an_ended_live_sessions_owner_stays_known_and_a_removed_calls_does_not() {
        let owners = Owners::default();
        let live = Owner {
            accepting: false,
            ..accepting("a")
        };
        owners.settle("live_1", live.clone());
        owners.settle("rtc_1", live.clone());
        owners.retire("live_1", Instant::now());
        owners.remove("rtc_1");
        assert_eq!(owners.get("live_1"), None, "no longer held here");
        assert_eq!(owners.known("live_1"), Some(live));
        assert_eq!(owners.known("rtc_1"), None);
    }

    #[test]
    fn one_claim_of_a_call_wins_and_a_released_claim_can_be_won_again() {
        let owners = Owners::default();
        assert_eq!(owners.try_claim("c", accepting("a")), Ok(()));
        assert_eq!(owners.try_claim("c", accepting("b")), Err(accepting("a")));
        owners.release_claim("c");
        assert_eq!(owners.try_claim("c", accepting("b")), Ok(()));
        let live = Owner {
            accepting: false,
            ..accepting("b")
        };
        owners.settle("c", live.clone());
        owners.release_claim("c");
        assert_eq!(owners.get("c"), Some(live), "a live owner is not a claim");
    }

    #[test]
    fn each_action_is_decided_by_who_holds_the_call() {
        let live = Owner {
            accepting: false,
            ..accepting("a")
        };
        let a = key("a", None);
        let b = key("b", None);
        use Decision::*;
        let cases = [
            ("accept", None, &a, Accept),
            ("accept", Some(&live), &a, AlreadyAccepted),
            ("accept", Some(&accepting("a")), &a, AlreadyAccepted),
            ("accept", Some(&live), &b, NotFound),
            ("accept", Some(&accepting("a")), &b, NotFound),
            ("hangup", Some(&accepting("a")), &a, AcceptInProgress),
            ("refer", Some(&accepting("a")), &a, AcceptInProgress),
            ("reject", Some(&accepting("a")), &a, AcceptInProgress),
            ("hangup", Some(&accepting("a")), &b, NotFound),
            ("hangup", Some(&live), &a, Forward(live.clone())),
            ("reject", Some(&live), &a, Forward(live.clone())),
            ("hangup", Some(&live), &b, NotFound),
            ("reject", None, &a, ForwardUnheld),
            ("hangup", None, &a, NotFound),
            ("refer", None, &a, NotFound),
        ];
        for (action, owner, k, want) in cases {
            assert_eq!(
                decide(action, owner, k),
                want,
                "{action} {owner:?} {}",
                k.id
            );
        }
    }
}
