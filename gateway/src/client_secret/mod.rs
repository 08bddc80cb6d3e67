//! Ephemeral client secrets: what `POST /v1/realtime/client_secrets` mints
//! and what a browser then connects with, so a browser never holds a
//! long-lived Patchbay key. Plain Rust: the HTTP surface is `crate::api`,
//! the WebSocket path is `crate::server` and `crate::session`.
//!
//! - Minting ([`ClientSecrets::mint`]) is authenticated by a Patchbay client
//!   key (never by a client secret), counts as one request against that
//!   key's rpm and is refused when its budgets are spent (the caller runs
//!   admission). It signs a token ([`token`]) and stores the minted session
//!   config under the secret id until expiry ([`configs`]).
//! - Connecting ([`ClientSecrets::open`]) verifies the token, requires the
//!   parent key to still exist and be enabled (so disabling a key
//!   invalidates its secrets at the next connect), binds the session to the
//!   secret's model (403 `model_not_allowed` otherwise) and fetches the
//!   config; a missing config is a 401, never an unconfigured session. The
//!   session is then admitted, limited and metered as the parent key.
//! - Signing keys: `[client_secrets] signing_key_files` (first signs, all
//!   verify), re-read live by [`ClientSecrets::reload`]; with none, a random
//!   key made at start, so secrets work on this process only.
//!
//! Secrets are [`Secret`]s (redacted in `Debug`/`Display`) and never logged;
//! logs and rows carry only the secret id.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::StatusCode;
use serde_json::{Map, Value};

use crate::admission::Refusal;
use crate::auth::{KeyEntry, KeySet, TeamEntry};
use crate::config::{Config, Protocol};
use crate::metrics::{Metrics, SecretRefusalLabels};
use crate::secret::Secret;
use crate::store::DEFAULT_PREFIX;

pub mod apply;
pub mod configs;
pub mod request;
pub mod token;

pub use configs::SessionConfigs;
pub use token::{is_client_secret, Claims, SigningKey, SigningKeys, VerifyError};

/// Largest signing key file read, in bytes.
pub const MAX_SIGNING_KEY_FILE_BYTES: u64 = 64 * 1024;

/// Reads one signing key file.
pub fn read_signing_key(path: &Path) -> Result<SigningKey, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.len() > MAX_SIGNING_KEY_FILE_BYTES {
        return Err(format!(
            "{} is larger than {MAX_SIGNING_KEY_FILE_BYTES} bytes",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    SigningKey::from_file_text(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every configured key, in order; `Ok(None)` when none is configured. An
/// error names the file's config key (`client_secrets.signing_key_files[i]`).
/// Read at start-up (a bad file stops it, exit 2) and at every change; the
/// configuration itself only parses the paths.
pub fn load_signing_keys(files: &[PathBuf]) -> Result<Option<SigningKeys>, String> {
    let keys = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            read_signing_key(f).map_err(|e| format!("client_secrets.signing_key_files[{i}]: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SigningKeys::new(keys))
}

/// A minted secret, as the mint endpoint answers it.
#[derive(Debug)]
pub struct Minted {
    pub value: Secret,
    pub id: String,
    pub expires_at: u64,
    pub session: Map<String, Value>,
}

/// What a session opened with a client secret carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// `client_secret_id` in rows and logs.
    pub id: String,
    /// The route the secret is bound to.
    pub model: String,
    /// The minted session config (JSON object text).
    pub config: String,
}

impl Grant {
    /// The `session.update` the gateway sends upstream after
    /// `session.created`: the minted config without `model` (the upstream
    /// socket is already dialled for the route's upstream model), and
    /// without `type` on beta-protocol routes (beta sessions have none).
    pub fn session_update(&self, protocol: Protocol) -> String {
        let mut session: Map<String, Value> =
            serde_json::from_str(&self.config).unwrap_or_default();
        session.remove("model");
        if protocol == Protocol::Beta {
            session.remove("type");
        }
        serde_json::json!({"type": "session.update", "session": session}).to_string()
    }
}

/// Signing keys (live), the config store and the mint bounds.
#[derive(Debug)]
pub struct ClientSecrets {
    keys: RwLock<Arc<SigningKeys>>,
    files: Vec<PathBuf>,
    max_ttl_secs: u64,
    configs: SessionConfigs,
    metrics: Arc<Metrics>,
}

impl ClientSecrets {
    /// From `[client_secrets]` and `[store]`. Must be called inside the
    /// runtime (the Redis connection is lazy but needs it).
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> Result<Self, String> {
        let redis = match &config.store.redis_url {
            Some(url) => Some(
                crate::store::conn::RedisConn::new(url.expose(), config.store.ca_file.as_deref())
                    .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        Self::with_redis(config, metrics, redis)
    }

    /// Like [`ClientSecrets::new`], on the process's shared Redis connection
    /// (`None`: configs in memory).
    pub fn with_redis(
        config: &Config,
        metrics: Arc<Metrics>,
        redis: Option<crate::store::conn::RedisConn>,
    ) -> Result<Self, String> {
        let files = config.client_secrets.signing_key_files.clone();
        let keys = match load_signing_keys(&files)? {
            Some(k) => k,
            None => {
                tracing::info!("no [client_secrets] signing_key_files: client secrets are signed with a random key and work on this process only");
                SigningKeys::new(vec![SigningKey::random()?])
                    .ok_or_else(|| "no signing key".to_string())?
            }
        };
        let configs = match redis {
            Some(conn) => SessionConfigs::on(conn, DEFAULT_PREFIX),
            None => SessionConfigs::memory(),
        };
        Ok(Self {
            keys: RwLock::new(Arc::new(keys)),
            files,
            max_ttl_secs: config.client_secrets.max_ttl_secs,
            configs,
            metrics,
        })
    }

    pub fn signing_key_files(&self) -> &[PathBuf] {
        &self.files
    }

    pub fn max_ttl_secs(&self) -> u64 {
        self.max_ttl_secs
    }

    fn keys(&self) -> Arc<SigningKeys> {
        match self.keys.read() {
            Ok(k) => k.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Re-reads every signing key file; a missing or invalid one keeps the
    /// current keys (logged). Idempotent.
    pub fn reload(&self) -> Result<(), String> {
        match load_signing_keys(&self.files) {
            Ok(Some(keys)) => {
                let changed = *self.keys() != keys;
                if changed {
                    tracing::info!(keys = keys.len(), "client-secret signing keys reloaded");
                    match self.keys.write() {
                        Ok(mut k) => *k = Arc::new(keys),
                        Err(p) => *p.into_inner() = Arc::new(keys),
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                return Err(format!(
                    "invalid client-secret signing key; keeping the current keys: {e}"
                ))
            }
        }
        Ok(())
    }

    /// Counts a refusal in `patchbay_client_secrets_refused_total`.
    pub fn count_refusal(&self, stage: &str, reason: &str) {
        self.metrics
            .client_secrets_refused
            .get_or_create(&SecretRefusalLabels {
                stage: stage.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Signs a secret for `parent` and stores its config. The caller has
    /// validated the request and run admission for `parent`.
    pub async fn mint(
        &self,
        parent: &KeyEntry,
        req: request::MintRequest,
        now: SystemTime,
    ) -> Result<Minted, Refusal> {
        let mut id = [0u8; token::SECRET_ID_BYTES];
        getrandom::fill(&mut id).map_err(|e| {
            tracing::error!(error = %e, "no OS randomness for a client secret id");
            unavailable("cannot mint a client secret right now")
        })?;
        let expires_at = unix_secs(now).saturating_add(req.ttl_secs);
        let value = self
            .keys()
            .mint(id, &parent.id, &parent.sha256, &req.model, expires_at)
            .map_err(|e| {
                Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "invalid_request",
                    format!("cannot mint a client secret: {e}"),
                )
            })?;
        let id = token::secret_id_text(&id);
        let config = Value::Object(req.session.clone()).to_string();
        match self
            .configs
            .put(&id, &config, Duration::from_secs(req.ttl_secs))
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                return Err(unavailable(
                    "too many live client secrets on this gateway; try again later",
                ))
            }
            Err(e) => {
                self.metrics.store_errors.inc();
                tracing::warn!(store = self.configs.kind(), error = %e, "cannot store a client secret's session config");
                return Err(unavailable(
                    "cannot store the client secret's session; try again",
                ));
            }
        }
        self.metrics
            .client_secrets_minted
            .get_or_create(&crate::metrics::model(&req.model))
            .inc();
        tracing::info!(client_secret_id = %id, key_id = %parent.id, model = %req.model, expires_at, "client secret minted");
        Ok(Minted {
            value,
            id,
            expires_at,
            session: req.session,
        })
    }

    /// The parent key and grant for a presented client secret, or the
    /// refusal (counted) to answer the upgrade with. `requested_model` is
    /// `?model=` if the client sent one.
    pub async fn open(
        &self,
        presented: &Secret,
        keys: &KeySet,
        requested_model: Option<&str>,
        now: SystemTime,
    ) -> Result<(KeyEntry, Grant), Refusal> {
        let (reason, refusal) = match self.open_inner(presented, keys, requested_model, now).await {
            Ok(ok) => return Ok(ok),
            Err(e) => e,
        };
        self.count_refusal("connect", reason);
        Err(refusal)
    }

    /// The parent key of a presented client secret and the secret's id
    /// (`cs_…`), or the refusal (counted under `stage`) to answer with: the
    /// signature, the expiry and the parent (enabled, and still the key
    /// that minted it) are checked; the secret's model and its minted
    /// config are not, so this is for requests that open nothing (the
    /// usage answer).
    pub fn parent_of(
        &self,
        presented: &Secret,
        keys: &KeySet,
        now: SystemTime,
        stage: &str,
    ) -> Result<(KeyEntry, String), Refusal> {
        match self.verify_parent(presented, keys, now) {
            Ok((parent, claims)) => Ok((parent, claims.id)),
            Err((reason, refusal)) => {
                self.count_refusal(stage, reason);
                Err(refusal)
            }
        }
    }

    /// The secret's claims, if it is signed by a current key and unexpired,
    /// and its parent key, if that is enabled and still the key that minted
    /// it (a rotation gives the id another secret).
    fn verify_parent(
        &self,
        presented: &Secret,
        keys: &KeySet,
        now: SystemTime,
    ) -> Result<(KeyEntry, Claims), (&'static str, Refusal)> {
        let signing = self.keys();
        let claims = signing
            .verify(presented.expose(), unix_secs(now))
            .map_err(|e| {
                let message = match e {
                    VerifyError::Expired => "this client secret has expired; mint a new one",
                    _ => "incorrect API key provided (invalid client secret)",
                };
                (e.reason(), Refusal::unauthorized(message))
            })?;
        match keys.by_id(&claims.parent_key_id) {
            Some(k) if !k.disabled && signing.binds(&claims, &k.sha256) => Ok((k.clone(), claims)),
            _ => Err((
                "parent_key_invalid",
                Refusal::unauthorized(
                    "the key that minted this client secret is disabled, replaced or no longer exists",
                ),
            )),
        }
    }

    async fn open_inner(
        &self,
        presented: &Secret,
        keys: &KeySet,
        requested_model: Option<&str>,
        now: SystemTime,
    ) -> Result<(KeyEntry, Grant), (&'static str, Refusal)> {
        let (parent, claims) = self.verify_parent(presented, keys, now)?;
        if let Some(m) = requested_model {
            if m != claims.model {
                return Err(("model_mismatch", model_not_allowed(&claims.model, m)));
            }
        }
        let config = match self.configs.get(&claims.id).await {
            Ok(Some(c)) => c,
            Ok(None) => {
                return Err((
                    "config_missing",
                    Refusal::unauthorized(
                        "this client secret's session is no longer available; mint a new one",
                    ),
                ))
            }
            Err(e) => {
                self.metrics.store_errors.inc();
                tracing::warn!(store = self.configs.kind(), error = %e, client_secret_id = %claims.id, "cannot read a client secret's session config");
                return Err((
                    "store_error",
                    unavailable("cannot read the client secret's session; try again"),
                ));
            }
        };
        Ok((
            parent,
            Grant {
                id: claims.id,
                model: claims.model,
                config,
            },
        ))
    }
}

/// Whether `key` may mint secrets for `model`: its model allow-list (and its
/// team's), checked before anything is minted or counted (403
/// `model_not_allowed`). A secret's sessions are checked again when used,
/// since the key's list may have changed since.
pub fn parent_key_may_use(
    key: &KeyEntry,
    team: Option<&TeamEntry>,
    model: &str,
) -> Result<(), Refusal> {
    if crate::auth::model_allowed(key, team, model) {
        Ok(())
    } else {
        Err(Refusal::model_not_allowed(model))
    }
}

/// 403 for a secret used with another model than its own.
pub fn model_not_allowed(bound: &str, requested: &str) -> Refusal {
    Refusal::new(
        StatusCode::FORBIDDEN,
        "invalid_request_error",
        "model_not_allowed",
        format!("this client secret is for model '{bound}', not '{requested}'"),
    )
    .with_param("model")
}

/// 401 for a client secret presented where only a client key may be.
pub fn secret_cannot_mint() -> Refusal {
    Refusal::unauthorized("a client secret cannot mint client secrets; use a Patchbay API key")
}

fn unavailable(message: &str) -> Refusal {
    Refusal::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "service_unavailable",
        message,
    )
    .retry_after(Duration::from_secs(1))
}

pub fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MASTER_KEY_ENV;

    fn config(extra: &str) -> Config {
        let env = |k: &str| match k {
            "OPENAI_API_KEY" => Some("sk".to_string()),
            MASTER_KEY_ENV => Some("pb-master".to_string()),
            _ => None,
        };
        Config::from_toml_with_env(extra, &env).unwrap()
    }

    fn keys(extra: &str) -> KeySet {
        KeySet::parse(&format!(
            "[[keys]]\nid = \"parent\"\nsha256 = \"{}\"\n{extra}\n",
            "00".repeat(32)
        ))
        .unwrap()
    }

    fn request(model: &str, ttl: u64) -> request::MintRequest {
        request::parse(
            format!(r#"{{"expires_after":{{"seconds":{ttl}}},"session":{{"model":"{model}","instructions":"Be brief."}}}}"#)
                .as_bytes(),
            "gpt-realtime",
            &["gpt-realtime", "other"],
            None,
            7200,
        )
        .unwrap()
    }

    async fn minted(cs: &ClientSecrets, model: &str, now: SystemTime) -> Minted {
        let parent = keys("").by_id("parent").unwrap().clone();
        cs.mint(&parent, request(model, 60), now).await.unwrap()
    }

    #[tokio::test]
    async fn a_minted_secret_opens_as_its_parent_with_its_config() {
        let cs = ClientSecrets::new(&config(""), Arc::default()).unwrap();
        let now = SystemTime::now();
        let m = minted(&cs, "gpt-realtime", now).await;
        assert!(m.value.expose().starts_with(token::TOKEN_PREFIX));
        assert_eq!(m.expires_at, unix_secs(now) + 60);
        let (key, grant) = cs
            .open(&m.value, &keys(""), Some("gpt-realtime"), now)
            .await
            .unwrap();
        assert_eq!(key.id, "parent");
        assert_eq!(grant.id, m.id);
        assert_eq!(grant.model, "gpt-realtime");
        let update: Value = serde_json::from_str(&grant.session_update(Protocol::Ga)).unwrap();
        assert_eq!(update["type"], "session.update");
        assert_eq!(update["session"]["instructions"], "Be brief.");
        assert_eq!(update["session"]["type"], "realtime");
        assert!(update["session"].get("model").is_none());
        let beta: Value = serde_json::from_str(&grant.session_update(Protocol::Beta)).unwrap();
        assert!(beta["session"].get("type").is_none());
        // No ?model= means the secret's own.
        assert!(cs.open(&m.value, &keys(""), None, now).await.is_ok());
    }

    #[tokio::test]
    async fn expiry_another_model_and_a_disabled_parent_are_refused() {
        let cs = ClientSecrets::new(&config(""), Arc::default()).unwrap();
        let now = SystemTime::now();
        let m = minted(&cs, "gpt-realtime", now).await;
        let later = now + Duration::from_secs(60);
        let r = cs.open(&m.value, &keys(""), None, later).await.unwrap_err();
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert!(r.message.contains("expired"), "{}", r.message);
        let r = cs
            .open(&m.value, &keys(""), Some("other"), now)
            .await
            .unwrap_err();
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        assert_eq!(r.code, "model_not_allowed");
        let r = cs
            .open(&m.value, &keys("disabled = true"), None, now)
            .await
            .unwrap_err();
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        let r = cs
            .open(&m.value, &KeySet::default(), None, now)
            .await
            .unwrap_err();
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn a_secret_from_another_process_or_without_its_config_is_refused() {
        let a = ClientSecrets::new(&config(""), Arc::default()).unwrap();
        let b = ClientSecrets::new(&config(""), Arc::default()).unwrap();
        let now = SystemTime::now();
        let m = minted(&a, "gpt-realtime", now).await;
        // Random keys differ per process.
        let r = b.open(&m.value, &keys(""), None, now).await.unwrap_err();
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        // Same key file, memory stores: the signature verifies, the config
        // is not there.
        let dir = std::env::temp_dir().join(format!("patchbay-cs-{}", crate::ids::short_id()));
        std::fs::write(&dir, "k".repeat(40)).unwrap();
        let toml = format!(
            "[client_secrets]\nsigning_key_files = [{:?}]\n",
            dir.display().to_string()
        );
        let a = ClientSecrets::new(&config(&toml), Arc::default()).unwrap();
        let b = ClientSecrets::new(&config(&toml), Arc::default()).unwrap();
        let m = minted(&a, "gpt-realtime", now).await;
        let r = b.open(&m.value, &keys(""), None, now).await.unwrap_err();
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert!(r.message.contains("no longer available"), "{}", r.message);
        std::fs::remove_file(&dir).unwrap();
    }

    #[tokio::test]
    async fn rotated_key_files_keep_old_secrets_valid_until_removed() {
        let dir = std::env::temp_dir();
        let old = dir.join(format!("patchbay-cs-old-{}", crate::ids::short_id()));
        let new = dir.join(format!("patchbay-cs-new-{}", crate::ids::short_id()));
        std::fs::write(&old, "o".repeat(40)).unwrap();
        std::fs::write(&new, "n".repeat(40)).unwrap();
        let toml = format!(
            "[client_secrets]\nsigning_key_files = [{:?}, {:?}]\n",
            new.display().to_string(),
            old.display().to_string()
        );
        let cs = ClientSecrets::new(&config(&toml), Arc::default()).unwrap();
        // A secret signed with the old key alone (before the rotation).
        let old_only = SigningKeys::new(vec![read_signing_key(&old).unwrap()]).unwrap();
        let now = SystemTime::now();
        let m = minted(&cs, "gpt-realtime", now).await;
        let claims = cs.keys().verify(m.value.expose(), unix_secs(now)).unwrap();
        let legacy = old_only
            .mint(
                [9; token::SECRET_ID_BYTES],
                "parent",
                "the parent's digest",
                "gpt-realtime",
                claims.expires_at,
            )
            .unwrap();
        assert!(cs.keys().verify(legacy.expose(), unix_secs(now)).is_ok());
        // The new key signs: the old key alone does not verify new secrets.
        assert!(old_only.verify(m.value.expose(), unix_secs(now)).is_err());
        // Retire the old key: its secrets stop verifying after the reload;
        // an unreadable file keeps what is loaded.
        std::fs::write(&old, "n".repeat(40)).unwrap();
        cs.reload().unwrap();
        assert!(cs.keys().verify(legacy.expose(), unix_secs(now)).is_err());
        std::fs::remove_file(&old).unwrap();
        assert!(cs.reload().is_err(), "an unreadable key file is refused");
        assert!(cs.keys().verify(m.value.expose(), unix_secs(now)).is_ok());
        std::fs::remove_file(&new).unwrap();
    }

    #[test]
    fn signing_key_files_can_come_from_the_environment() {
        let env = |k: &str| match k {
            "OPENAI_API_KEY" => Some("sk".to_string()),
            MASTER_KEY_ENV => Some("pb".to_string()),
            "PATCHBAY_CLIENT_SECRETS_SIGNING_KEY_FILES" => {
                Some(r#"["/nonexistent/a", "/nonexistent/b"]"#.to_string())
            }
            "PATCHBAY_CLIENT_SECRETS_MAX_TTL_SECS" => Some("60".to_string()),
            _ => None,
        };
        let c = Config::from_toml_with_env("", &env).unwrap();
        let e = load_signing_keys(&c.client_secrets.signing_key_files).unwrap_err();
        assert!(
            e.starts_with("client_secrets.signing_key_files[0]: "),
            "{e}"
        );
        let env_ttl = |k: &str| match k {
            "PATCHBAY_CLIENT_SECRETS_SIGNING_KEY_FILES" => None,
            k => env(k),
        };
        let c = Config::from_toml_with_env("", &env_ttl).unwrap();
        assert_eq!(c.client_secrets.max_ttl_secs, 60);
    }

    #[test]
    fn bad_signing_key_files_are_named_in_the_start_error() {
        let env = |k: &str| match k {
            "OPENAI_API_KEY" => Some("sk".to_string()),
            MASTER_KEY_ENV => Some("pb".to_string()),
            _ => None,
        };
        let c = Config::from_toml_with_env(
            "[client_secrets]\nsigning_key_files = [\"/nonexistent/patchbay-key\"]\n",
            &env,
        )
        .unwrap();
        let e = ClientSecrets::new(&c, Arc::new(Metrics::new())).unwrap_err();
        assert!(
            e.starts_with("client_secrets.signing_key_files[0]: "),
            "{e}"
        );
        let short =
            std::env::temp_dir().join(format!("patchbay-cs-short-{}", crate::ids::short_id()));
        std::fs::write(&short, "too short").unwrap();
        let c = Config::from_toml_with_env(
            &format!(
                "[client_secrets]\nsigning_key_files = [{:?}]\n",
                short.display().to_string()
            ),
            &env,
        )
        .unwrap();
        let e = load_signing_keys(&c.client_secrets.signing_key_files).unwrap_err();
        assert!(e.contains("at least 32 bytes"), "{e}");
        std::fs::remove_file(&short).unwrap();
        for ttl in [0, 9, 7201] {
            let e = Config::from_toml_with_env(
                &format!("[client_secrets]\nmax_ttl_secs = {ttl}\n"),
                &env,
            )
            .unwrap_err();
            assert_eq!(e.key, "client_secrets.max_ttl_secs");
        }
    }
}
