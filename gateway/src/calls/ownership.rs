//! Which key created or accepted a call: only that key, or a key of the same
//! team, may act on it (hangup, refer, reject); any other key gets 404, as if
//! the call did not exist, so call ids cannot be probed.
//!
//! Records live in this process's memory and are removed when the call's
//! sideband ends. [`may_act`] is the pure decision.

use std::collections::HashMap;
use std::sync::Mutex;

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
}

/// Whether `key` may act on a call owned by `owner`: the same key, or a key
/// of the owner's team.
pub fn may_act(owner: &Owner, key: &KeyEntry) -> bool {
    owner.key_id == key.id || (owner.team.is_some() && owner.team == key.team)
}

/// Call owners, by call id.
#[derive(Debug, Default)]
pub struct Owners {
    calls: Mutex<HashMap<String, Owner>>,
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

    pub fn remove(&self, call_id: &str) {
        self.lock().remove(call_id);
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
        };
        assert_eq!(owners.claim("c", o("a")).key_id, "a");
        assert_eq!(owners.claim("c", o("b")).key_id, "a");
        owners.remove("c");
        assert!(owners.is_empty());
    }
}
