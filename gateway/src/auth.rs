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
//!
//! A client that speaks the retired beta dialect (`OpenAI-Beta:
//! realtime=v1`, or the `openai-beta.realtime-v1` subprotocol) is marked
//! ([`Presented::speaks_beta`]): only a route configured `protocol =
//! "beta"` serves it.
//!
//! A key may be limited to some models (`models = [...]` on the key and on
//! its team): [`model_allowed`] is the one place that decides it, for every
//! entry point that names a model.
//!
//! The keys file is refused whole when it lists one digest under two ids
//! (the key would be metered as whichever came last, and revoking one id
//! would leave it working). A reload is decided by [`KeySet::replaces`]: a
//! file with no keys may not replace one with keys (an emptied file, a
//! Secret mounted empty, a botched render would revoke every key at once)
//! unless it says `allow_empty = true` at its top.

use std::path::Path;
use std::sync::Arc;

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
    /// Models (route `model` names) this key may use; absent = every route,
    /// empty = none. Intersected with its team's list.
    #[serde(default)]
    pub models: Option<Vec<String>>,
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
    /// Models the team's keys may use; absent = every route, empty = none.
    #[serde(default)]
    pub models: Option<Vec<String>>,
}

/// Whether `key` (of `team`, when it has one) may open sessions on `model`:
/// the model must be on the key's list and on the team's list, where an
/// absent list allows every model and an empty one allows none. Names are
/// compared exactly (no patterns), against the route's client-facing model.
pub fn model_allowed(key: &KeyEntry, team: Option<&TeamEntry>, model: &str) -> bool {
    let allows = |list: &Option<Vec<String>>| {
        list.as_ref()
            .is_none_or(|models| models.iter().any(|m| m == model))
    };
    allows(&key.models) && team.is_none_or(|t| allows(&t.models))
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysFile {
    /// Says that a file without keys means it: a reload of it may revoke
    /// every key ([`KeySet::replaces`]). A top-level key, so it goes before
    /// the first `[[keys]]`.
    #[serde(default)]
    pub allow_empty: bool,
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
    /// Entries from the keys file (the master key is not one).
    file_keys: usize,
    /// The file said `allow_empty = true`.
    allow_empty: bool,
}

/// What an applied keys file holds, for the reload's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReloadSummary {
    /// Keys in the file (the master key is not counted).
    pub keys: usize,
    pub teams: usize,
    /// Keys in the file marked `disabled`.
    pub disabled: usize,
}

impl ReloadSummary {
    /// The INFO line of an applied reload.
    pub fn log(&self) {
        tracing::info!(
            keys = self.keys,
            teams = self.teams,
            disabled = self.disabled,
            "keys file applied"
        );
    }
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
        let file = parse_keys_file(text)?;
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
            if let Some(j) = entries.iter().position(|(d, _)| *d == digest) {
                return Err(format!(
                    "keys[{i}].sha256: the same key as keys[{j}]: ids {:?} and {:?} share one digest \
                     (a key has one id)",
                    entries[j].1.id, k.id
                ));
            }
            check_budget(k.budget_usd, || format!("keys[{i}].budget_usd"))?;
            check_models(k.models.as_deref(), || format!("keys[{i}].models"))?;
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
            check_models(t.models.as_deref(), || format!("teams[{i}].models"))?;
        }
        Ok(Self {
            file_keys: entries.len(),
            entries,
            teams: file.teams,
            allow_empty: file.allow_empty,
        })
    }

    /// Whether this set (a reloaded keys file, the master key added) may
    /// replace `current`, and what it holds. Refused: a file with no keys
    /// replacing one with keys, unless it says `allow_empty = true`.
    pub fn replaces(&self, current: &KeySet) -> Result<ReloadSummary, String> {
        if self.file_keys == 0 && current.file_keys > 0 && !self.allow_empty {
            return Err(format!(
                "the file lists no keys and would revoke all {} keys in use; write \
                 `allow_empty = true` at its top to empty it on purpose",
                current.file_keys
            ));
        }
        Ok(ReloadSummary {
            keys: self.file_keys,
            teams: self.teams.len(),
            disabled: self.entries[..self.file_keys]
                .iter()
                .filter(|(_, e)| e.disabled)
                .count(),
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
                models: None,
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

/// A model name in an allow-list must not be empty: `""` would never match
/// a route and most likely is a typo for a missing name.
fn check_models(models: Option<&[String]>, key: impl FnOnce() -> String) -> Result<(), String> {
    match models {
        Some(list) if list.iter().any(|m| m.trim().is_empty()) => {
            Err(format!("{}: model names must not be empty", key()))
        }
        _ => Ok(()),
    }
}

fn parse_digest(hex_digest: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_digest.trim(), &mut out).ok()?;
    Some(out)
}

/// The live key set, swapped whole when the keys file changes; live
/// sessions' meters [`subscribe`](Self::subscribe) to learn of a swap at once.
#[derive(Debug, Default)]
pub struct KeyStore {
    current: tokio::sync::watch::Sender<Arc<KeySet>>,
}

impl KeyStore {
    pub fn new(set: KeySet) -> Self {
        Self {
            current: tokio::sync::watch::Sender::new(Arc::new(set)),
        }
    }

    pub fn get(&self) -> Arc<KeySet> {
        self.current.borrow().clone()
    }

    pub fn replace(&self, set: KeySet) {
        self.current.send_replace(Arc::new(set));
    }

    /// Wakes on every later [`replace`](Self::replace).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Arc<KeySet>> {
        self.current.subscribe()
    }
}

/// The key a client presented, whether it asked for the `realtime`
/// subprotocol (which the 101 must then select), and whether it speaks the
/// retired beta protocol.
#[derive(Debug, PartialEq, Eq)]
pub struct Presented {
    pub key: Option<Secret>,
    pub wants_realtime_subprotocol: bool,
    /// `OpenAI-Beta: realtime=v1` (one of the header's comma-separated
    /// values) or the `openai-beta.realtime-v1` subprotocol: the beta
    /// dialect, which a GA route refuses before any dial.
    pub speaks_beta: bool,
}

/// The subprotocol a beta browser client adds.
pub const SUBPROTOCOL_BETA: &str = "openai-beta.realtime-v1";
/// The `OpenAI-Beta` value of a beta Realtime client.
pub const BETA_HEADER_VALUE: &str = "realtime=v1";

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
    let speaks_beta = protocols.contains(&SUBPROTOCOL_BETA)
        || headers
            .get_all("openai-beta")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|v| v.trim().eq_ignore_ascii_case(BETA_HEADER_VALUE));
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
        speaks_beta,
    }
}

/// The keys file's TOML, its errors naming the entry (`keys[2].rpm:
/// invalid type: string "60", expected u32`) or the line of a syntax error.
fn parse_keys_file(text: &str) -> Result<KeysFile, String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("line {line}: {}", e.message())
        }
        None => e.message().to_string(),
    })?;
    serde_path_to_error::deserialize(toml::Value::Table(doc)).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().message().trim().to_string();
        if path.is_empty() || path == "." {
            message
        } else {
            format!("{path}: {message}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn hex_of(key: &str) -> String {
        hex::encode(Secret::new(key).sha256())
    }

    #[test]
    fn a_keys_file_error_names_the_entry_or_the_line() {
        let text = format!(
            "[[keys]]\nid = \"a\"\nsha256 = \"{}\"\n[[keys]]\nid = \"b\"\nsha256 = \"{}\"\nrpm = \"60\"\n",
            hex_of("pb-a"),
            hex_of("pb-b")
        );
        let e = KeySet::parse(&text).unwrap_err();
        assert!(e.starts_with("keys[1].rpm: invalid type: string"), "{e}");
        let e = KeySet::parse("[[keys]]\nid = \"a\"\nsha256 = = 1\n").unwrap_err();
        assert!(e.starts_with("line 3: "), "{e}");
        let e = KeySet::parse("[[keys]]\nid = \"a\"\nsha256 = \"x\"\nrmp = 5\n").unwrap_err();
        assert!(e.starts_with("keys[0]"), "{e}");
        assert!(e.contains("rmp"), "{e}");
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

    /// Two ids with one digest: a session would be metered on whichever
    /// came last, and revoking one id would leave the key working.
    #[test]
    fn a_digest_listed_under_two_ids_is_refused_naming_both() {
        let d = hex_of("shared");
        let e = KeySet::parse(&format!(
            "[[keys]]\nid = \"alpha\"\nsha256 = \"{d}\"\n[[keys]]\nid = \"other\"\nsha256 = \"{}\"\n\
             [[keys]]\nid = \"beta\"\nsha256 = \"{}\"\n",
            hex_of("x"),
            d.to_uppercase()
        ))
        .unwrap_err();
        assert!(e.contains("keys[2].sha256"), "{e}");
        assert!(e.contains("\"alpha\"") && e.contains("\"beta\""), "{e}");
        assert!(!e.contains("\"other\""), "{e}");
    }

    fn set(text: &str) -> KeySet {
        KeySet::parse(text).unwrap()
    }

    fn two_keys() -> String {
        format!(
            "[[keys]]\nid = \"a\"\nsha256 = \"{}\"\nteam = \"t\"\n\
             [[keys]]\nid = \"b\"\nsha256 = \"{}\"\ndisabled = true\n[[teams]]\nid = \"t\"\n",
            hex_of("pb-a"),
            hex_of("pb-b")
        )
    }

    #[test]
    fn a_file_without_keys_may_not_replace_one_with_keys_unless_it_says_so() {
        let master = Secret::new("m");
        let current = set(&two_keys()).with_master(&master);
        for empty in ["", "\n# nothing\n", "[[teams]]\nid = \"t\"\n"] {
            let e = set(empty)
                .with_master(&master)
                .replaces(&current)
                .unwrap_err();
            assert!(e.contains("revoke all 2 keys"), "{empty:?}: {e}");
            assert!(e.contains("allow_empty = true"), "{e}");
        }
        let summary = set("allow_empty = true\n").replaces(&current).unwrap();
        assert_eq!(
            summary,
            ReloadSummary {
                keys: 0,
                teams: 0,
                disabled: 0
            }
        );
        // The master key alone is no key of the file: emptying stays free.
        let only_master = set("").with_master(&master);
        assert!(set("").with_master(&master).replaces(&only_master).is_ok());
        assert!(set("").replaces(&KeySet::default()).is_ok());
    }

    #[test]
    fn an_applied_reload_counts_keys_teams_and_disabled_keys() {
        let master = Secret::new("m");
        let summary = set(&two_keys())
            .with_master(&master)
            .replaces(&set("").with_master(&master))
            .unwrap();
        assert_eq!(
            summary,
            ReloadSummary {
                keys: 2,
                teams: 1,
                disabled: 1
            }
        );
        // One key replacing two is a reload like any other.
        let one = format!("[[keys]]\nid = \"c\"\nsha256 = \"{}\"\n", hex_of("pb-c"));
        assert_eq!(set(&one).replaces(&set(&two_keys())).unwrap().keys, 1);
    }

    #[test]
    fn allow_empty_is_a_top_level_key() {
        assert!(set("allow_empty = true\n").allow_empty);
        assert!(!set("").allow_empty);
        let e = KeySet::parse(&format!(
            "[[keys]]\nid = \"a\"\nsha256 = \"{}\"\nallow_empty = true\n",
            hex_of("x")
        ))
        .unwrap_err();
        assert!(e.contains("allow_empty"), "{e}");
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

    fn entry(models: Option<&[&str]>) -> KeyEntry {
        let mut k = KeySet::default()
            .with_master(&Secret::new("m"))
            .by_id("master")
            .unwrap()
            .clone();
        k.models = models.map(|l| l.iter().map(|m| m.to_string()).collect());
        k
    }

    fn team(models: Option<&[&str]>) -> TeamEntry {
        TeamEntry {
            id: "t".into(),
            budget_usd: None,
            budget_period: BudgetPeriod::Total,
            models: models.map(|l| l.iter().map(|m| m.to_string()).collect()),
        }
    }

    #[test]
    fn model_allowed_is_the_key_list_intersected_with_the_team_list() {
        const A: &str = "gpt-realtime";
        const B: &str = "gpt-realtime-mini";
        let lists: [Option<&[&str]>; 5] = [None, Some(&[]), Some(&[A]), Some(&[B]), Some(&[A, B])];
        let allows = |list: Option<&[&str]>, m: &str| list.is_none_or(|l| l.contains(&m));
        for key_list in lists {
            for team_list in lists {
                for m in [A, B, "other"] {
                    let expected = allows(key_list, m) && allows(team_list, m);
                    assert_eq!(
                        model_allowed(&entry(key_list), Some(&team(team_list)), m),
                        expected,
                        "key {key_list:?} team {team_list:?} model {m}"
                    );
                }
            }
            for m in [A, B, "other"] {
                assert_eq!(
                    model_allowed(&entry(key_list), None, m),
                    allows(key_list, m),
                    "key {key_list:?} without a team, model {m}"
                );
            }
        }
        // Spelled-out corners: absent = all, empty = none, exact names only.
        assert!(model_allowed(&entry(None), None, "anything"));
        assert!(!model_allowed(&entry(Some(&[])), None, A));
        assert!(!model_allowed(
            &entry(Some(&[A])),
            Some(&team(Some(&[]))),
            A
        ));
        assert!(!model_allowed(
            &entry(Some(&[A])),
            None,
            "gpt-realtime-2025"
        ));
    }

    #[test]
    fn models_lists_parse_and_empty_names_are_refused() {
        let d = hex_of("x");
        let k = KeySet::parse(&format!(
            "[[keys]]\nid = \"a\"\nsha256 = \"{d}\"\nteam = \"t\"\nmodels = [\"gpt-realtime\"]\n\
             [[keys]]\nid = \"b\"\nsha256 = \"{}\"\nmodels = []\n\
             [[teams]]\nid = \"t\"\nmodels = [\"gpt-realtime\", \"gpt-realtime-mini\"]\n",
            hex_of("y")
        ))
        .unwrap();
        assert_eq!(
            k.by_id("a").unwrap().models.as_deref(),
            Some(&["gpt-realtime".to_string()][..])
        );
        assert_eq!(k.by_id("b").unwrap().models.as_deref(), Some(&[][..]));
        assert_eq!(k.team("t").unwrap().models.as_ref().unwrap().len(), 2);
        let e = KeySet::parse(&format!(
            "[[keys]]\nid = \"a\"\nsha256 = \"{d}\"\nmodels = [\"\"]\n"
        ))
        .unwrap_err();
        assert!(e.contains("keys[0].models"), "{e}");
        let e = KeySet::parse("[[teams]]\nid = \"t\"\nmodels = [\" \"]\n").unwrap_err();
        assert!(e.contains("teams[0].models"), "{e}");
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
        assert!(p.speaks_beta);
    }

    #[test]
    fn the_beta_dialect_is_recognised_by_its_header_or_its_subprotocol() {
        let beta =
            |pairs: &[(&'static str, &'static str)]| presented_key(&headers(pairs)).speaks_beta;
        assert!(beta(&[("openai-beta", "realtime=v1")]));
        assert!(beta(&[("openai-beta", "assistants=v2, realtime=v1")]));
        assert!(beta(&[("OpenAI-Beta", "Realtime=V1")]));
        assert!(beta(&[(
            "sec-websocket-protocol",
            "realtime, openai-beta.realtime-v1"
        )]));
        assert!(!beta(&[("openai-beta", "assistants=v2")]));
        assert!(!beta(&[(
            "sec-websocket-protocol",
            "realtime, openai-insecure-api-key.k"
        )]));
        assert!(!beta(&[("authorization", "Bearer pb-a")]));
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
