//! Client authentication: extracting the key from an upgrade request and
//! looking it up among the configured keys.
//!
//! Keys are stored as SHA-256 digests (the keys file holds hex digests, the
//! master key is hashed at load) and compared in constant time with `subtle`,
//! scanning every entry so the time taken does not depend on which entry
//! matched. The plaintext client key only lives in a [`Secret`] for the few
//! microseconds of the lookup; it is never forwarded upstream or logged.
//!
//! Accepted credentials, first match wins:
//! 1. `Authorization: Bearer <key>`;
//! 2. `api-key: <key>` (Azure-style clients);
//! 3. `Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.<key>[, openai-beta.realtime-v1]`
//!    (browsers); the 101 must then select `realtime`.

use std::path::Path;
use std::sync::{Arc, RwLock};

use http::HeaderMap;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::config::BudgetPeriod;
use crate::secret::Secret;

pub const SUBPROTOCOL_REALTIME: &str = "realtime";
const INSECURE_KEY_PREFIX: &str = "openai-insecure-api-key.";

/// One client key's entry (from `[[keys]]`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub id: String,
    /// Hex SHA-256 of the key.
    pub sha256: String,
    #[serde(default)]
    pub team: Option<String>,
    #[serde(default)]
    pub rpm: Option<u64>,
    #[serde(default)]
    pub tpm: Option<u64>,
    #[serde(default)]
    pub budget_usd: Option<f64>,
    #[serde(default)]
    pub budget_period: BudgetPeriod,
    #[serde(default)]
    pub max_sessions: Option<usize>,
    #[serde(default)]
    pub disabled: bool,
}

/// A team's budget (from `[[teams]]`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TeamEntry {
    pub id: String,
    #[serde(default)]
    pub budget_usd: Option<f64>,
    #[serde(default)]
    pub budget_period: BudgetPeriod,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysFile {
    #[serde(default)]
    pub keys: Vec<KeyEntry>,
    #[serde(default)]
    pub teams: Vec<TeamEntry>,
}

#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("cannot read keys file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("keys file {path}: {message}")]
    Invalid { path: String, message: String },
}

/// The parsed, validated key set.
#[derive(Debug, Default)]
pub struct KeySet {
    entries: Vec<([u8; 32], KeyEntry)>,
    pub teams: Vec<TeamEntry>,
}

impl KeySet {
    pub fn from_file(path: &Path) -> Result<Self, KeysError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| KeysError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|message| KeysError::Invalid {
            path: shown,
            message,
        })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let file: KeysFile = toml::from_str(text).map_err(|e| e.message().to_string())?;
        let mut entries = Vec::with_capacity(file.keys.len());
        for (i, k) in file.keys.into_iter().enumerate() {
            let digest = parse_digest(&k.sha256)
                .ok_or_else(|| format!("keys[{i}].sha256: not 64 hex digits"))?;
            if k.id.is_empty() {
                return Err(format!("keys[{i}].id: must not be empty"));
            }
            if entries
                .iter()
                .any(|(_, e): &([u8; 32], KeyEntry)| e.id == k.id)
            {
                return Err(format!("keys[{i}].id: duplicate id {:?}", k.id));
            }
            check_budget(k.budget_usd, || format!("keys[{i}].budget_usd"))?;
            entries.push((digest, k));
        }
        for (i, t) in file.teams.iter().enumerate() {
            if t.id.is_empty() {
                return Err(format!("teams[{i}].id: must not be empty"));
            }
            if file.teams[..i].iter().any(|o| o.id == t.id) {
                return Err(format!("teams[{i}].id: duplicate id {:?}", t.id));
            }
            check_budget(t.budget_usd, || format!("teams[{i}].budget_usd"))?;
        }
        Ok(Self {
            entries,
            teams: file.teams,
        })
    }

    /// Adds the master key (`PATCHBAY_MASTER_KEY`) as key id `master`.
    pub fn with_master(mut self, master: &Secret) -> Self {
        self.entries.push((
            master.sha256(),
            KeyEntry {
                id: "master".into(),
                sha256: String::new(),
                team: None,
                rpm: None,
                tpm: None,
                budget_usd: None,
                budget_period: BudgetPeriod::Total,
                max_sessions: None,
                disabled: false,
            },
        ));
        self
    }

    /// Finds the entry whose digest equals the presented key's, scanning all
    /// entries in constant time per entry.
    pub fn lookup(&self, presented: &Secret) -> Option<&KeyEntry> {
        let digest = presented.sha256();
        let mut found = None;
        for (d, entry) in &self.entries {
            if bool::from(d.ct_eq(&digest)) {
                found = Some(entry);
            }
        }
        found
    }

    /// The entry with this id (the meter checks a live session's key is
    /// still present and enabled after a reload).
    pub fn by_id(&self, id: &str) -> Option<&KeyEntry> {
        self.entries.iter().map(|(_, e)| e).find(|e| e.id == id)
    }

    pub fn team(&self, id: &str) -> Option<&TeamEntry> {
        self.teams.iter().find(|t| t.id == id)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A budget must be a finite number >= 0: `nan` would never be reached and
/// a negative one would refuse everything.
fn check_budget(budget: Option<f64>, key: impl FnOnce() -> String) -> Result<(), String> {
    match budget {
        Some(b) if !(b.is_finite() && b >= 0.0) => {
            Err(format!("{}: must be a number >= 0, got {b}", key()))
        }
        _ => Ok(()),
    }
}

fn parse_digest(hex_digest: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_digest.trim(), &mut out).ok()?;
    Some(out)
}

/// The live key set, swapped whole when the keys file changes.
#[derive(Debug, Default)]
pub struct KeyStore {
    current: RwLock<Arc<KeySet>>,
}

impl KeyStore {
    pub fn new(set: KeySet) -> Self {
        Self {
            current: RwLock::new(Arc::new(set)),
        }
    }

    pub fn get(&self) -> Arc<KeySet> {
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn replace(&self, set: KeySet) {
        match self.current.write() {
            Ok(mut g) => *g = Arc::new(set),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(set),
        }
    }
}

/// The key a client presented, and whether it asked for the `realtime`
/// subprotocol (which the 101 must then select).
#[derive(Debug, PartialEq, Eq)]
pub struct Presented {
    pub key: Option<Secret>,
    pub wants_realtime_subprotocol: bool,
}

/// Extracts the client's credential from the upgrade request headers.
pub fn presented_key(headers: &HeaderMap) -> Presented {
    let protocols: Vec<&str> = headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let wants_realtime_subprotocol = protocols.contains(&SUBPROTOCOL_REALTIME);
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    let api_key = headers
        .get("api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let subprotocol = protocols
        .iter()
        .find_map(|p| p.strip_prefix(INSECURE_KEY_PREFIX));
    let key = bearer
        .or(api_key)
        .or(subprotocol)
        .filter(|k| !k.is_empty())
        .map(Secret::new);
    Presented {
        key,
        wants_realtime_subprotocol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn hex_of(key: &str) -> String {
        hex::encode(Secret::new(key).sha256())
    }

    fn keys() -> KeySet {
        KeySet::parse(&format!(
            "[[keys]]\nid = \"a\"\nsha256 = \"{}\"\nteam = \"support\"\n[[keys]]\nid = \"b\"\nsha256 = \"{}\"\n",
            hex_of("pb-a"),
            hex_of("pb-b")
        ))
        .unwrap()
    }

    #[test]
    fn lookup_finds_the_matching_entry_and_only_it() {
        let k = keys();
        assert_eq!(k.lookup(&Secret::new("pb-a")).unwrap().id, "a");
        assert_eq!(k.lookup(&Secret::new("pb-b")).unwrap().id, "b");
        assert!(k.lookup(&Secret::new("pb-c")).is_none());
        assert!(k.lookup(&Secret::new("")).is_none());
    }

    #[test]
    fn master_key_is_hashed_and_found() {
        let k = KeySet::default().with_master(&Secret::new("m"));
        assert_eq!(k.lookup(&Secret::new("m")).unwrap().id, "master");
    }

    #[test]
    fn bad_digest_and_duplicate_ids_are_named() {
        let e = KeySet::parse("[[keys]]\nid = \"a\"\nsha256 = \"zz\"\n").unwrap_err();
        assert!(e.contains("keys[0].sha256"), "{e}");
        let d = hex_of("x");
        let e = KeySet::parse(&format!(
            "[[keys]]\nid = \"a\"\nsha256 = \"{d}\"\n[[keys]]\nid = \"a\"\nsha256 = \"{d}\"\n"
        ))
        .unwrap_err();
        assert!(e.contains("duplicate"), "{e}");
    }

    #[test]
    fn budgets_that_could_never_apply_are_named() {
        let d = hex_of("x");
        for (budget, needle) in [
            ("nan", "keys[0].budget_usd"),
            ("-1.0", "keys[0].budget_usd"),
            ("inf", "keys[0].budget_usd"),
        ] {
            let e = KeySet::parse(&format!(
                "[[keys]]\nid = \"a\"\nsha256 = \"{d}\"\nbudget_usd = {budget}\n"
            ))
            .unwrap_err();
            assert!(e.contains(needle), "{budget}: {e}");
        }
        let e = KeySet::parse("[[teams]]\nid = \"t\"\nbudget_usd = nan\n").unwrap_err();
        assert!(e.contains("teams[0].budget_usd"), "{e}");
        let e = KeySet::parse("[[teams]]\nid = \"t\"\n[[teams]]\nid = \"t\"\n").unwrap_err();
        assert!(e.contains("teams[1].id: duplicate"), "{e}");
        KeySet::parse(&format!(
            "[[keys]]\nid = \"a\"\nsha256 = \"{d}\"\nbudget_usd = 0.0\nteam = \"t\"\n[[teams]]\nid = \"t\"\nbudget_usd = 5\n"
        ))
        .expect("zero and whole-number budgets are fine");
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn bearer_api_key_and_subprotocol_are_all_accepted() {
        let p = presented_key(&headers(&[("authorization", "Bearer pb-a")]));
        assert_eq!(p.key.unwrap().expose(), "pb-a");
        let p = presented_key(&headers(&[("api-key", "pb-b")]));
        assert_eq!(p.key.unwrap().expose(), "pb-b");
        let p = presented_key(&headers(&[(
            "sec-websocket-protocol",
            "realtime, openai-insecure-api-key.pb-c, openai-beta.realtime-v1",
        )]));
        assert_eq!(p.key.unwrap().expose(), "pb-c");
        assert!(p.wants_realtime_subprotocol);
    }

    #[test]
    fn no_credential_is_none() {
        let p = presented_key(&headers(&[("authorization", "Basic abc")]));
        assert!(p.key.is_none());
        let p = presented_key(&headers(&[("authorization", "Bearer ")]));
        assert!(p.key.is_none());
        assert!(!p.wants_realtime_subprotocol);
    }
}
