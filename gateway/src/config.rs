//! Gateway configuration: one TOML file, every key overridable from the
//! environment, validated once at start.
//!
//! Sources, later wins:
//! 1. built-in defaults ([`Config::default`]);
//! 2. the TOML file (`--config`, else `patchbay.toml` when present);
//! 3. `PATCHBAY_<SECTION>_<KEY>` for the table sections (`server`, `pool`,
//!    `relay`, `limits`, `metering`, `store`, `keys`, `drain`,
//!    `client_secrets`), parsed as a TOML value when it is one (`10`,
//!    `true`, `"x"`, `["a", "b"]`), else taken as a string;
//! 4. the well-known `REALTIME_POOL_SIZE` and `REALTIME_POOL_MAX_IDLE_SECS`.
//!
//! Unknown keys are errors (`deny_unknown_fields`), so a typo never silently
//! falls back to a default. Secrets are never in the file: routes name the
//! environment variable that holds their upstream key (`api_key_env`), Redis
//! is named by `redis_url_env`, and client keys live in the keys file (hashed)
//! or `PATCHBAY_MASTER_KEY`. Every validation error names the offending key;
//! `main` turns it into exit code 2.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use url::Url;

use crate::secret::Secret;

/// The file read when `--config` is not given, if it exists.
pub const DEFAULT_CONFIG_FILE: &str = "patchbay.toml";
/// Env var that holds a single client key (one-key setups).
pub const MASTER_KEY_ENV: &str = "PATCHBAY_MASTER_KEY";
const ENV_PREFIX: &str = "PATCHBAY_";
const TABLE_SECTIONS: [&str; 9] = [
    "server",
    "pool",
    "relay",
    "limits",
    "metering",
    "store",
    "keys",
    "drain",
    "client_secrets",
];

#[derive(Debug, thiserror::Error)]
#[error("config key `{key}`: {message}")]
pub struct ConfigError {
    /// Dotted path of the offending key, e.g. `routes[0].upstream_url`.
    pub key: String,
    pub message: String,
}

impl ConfigError {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub routes: Vec<RouteConfig>,
    pub pool: PoolConfig,
    pub relay: RelayConfig,
    pub limits: LimitsConfig,
    pub metering: MeteringConfig,
    pub prices: Vec<PriceRow>,
    pub store: StoreConfig,
    pub keys: KeysConfig,
    pub drain: DrainConfig,
    pub client_secrets: ClientSecretsConfig,
    /// `PATCHBAY_MASTER_KEY`, when set.
    #[serde(skip)]
    pub master_key: Option<Secret>,
    /// The file this config came from, watched for price edits.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            routes: vec![RouteConfig::default()],
            pool: PoolConfig::default(),
            relay: RelayConfig::default(),
            limits: LimitsConfig::default(),
            metering: MeteringConfig::default(),
            prices: Vec::new(),
            store: StoreConfig::default(),
            keys: KeysConfig::default(),
            drain: DrainConfig::default(),
            client_secrets: ClientSecretsConfig::default(),
            master_key: None,
            source: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// Bound on a client's HTTP upgrade request (headers) and on the whole
    /// upstream dial (connect, TLS, upgrade, `session.created`).
    pub upgrade_timeout_secs: u64,
    /// Runtime worker threads; 0 = one per core.
    pub worker_threads: usize,
    /// Origins allowed to call the HTTP API from a browser (CORS); empty
    /// allows any origin (credentials are explicit headers, never cookies).
    pub cors_origins: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            upgrade_timeout_secs: 10,
            worker_threads: 0,
            cors_origins: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Openai,
    Azure,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Ga,
    Beta,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    Daily,
    Monthly,
    #[default]
    Total,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// What clients put in `?model=`.
    pub model: String,
    #[serde(default = "default_provider")]
    pub provider: Provider,
    pub upstream_url: String,
    /// Model (OpenAI) or deployment (Azure) sent upstream; defaults to `model`.
    pub upstream_model: Option<String>,
    #[serde(default = "default_protocol")]
    pub protocol: Protocol,
    /// Environment variable holding the upstream key.
    pub api_key_env: String,
    /// Extra trust root (PEM) for a wss upstream.
    pub ca_file: Option<PathBuf>,
    pub budget_usd: Option<f64>,
    #[serde(default)]
    pub budget_period: BudgetPeriod,
    /// Resolved from `api_key_env` during validation.
    #[serde(skip)]
    pub api_key: Secret,
}

fn default_provider() -> Provider {
    Provider::Openai
}

fn default_protocol() -> Protocol {
    Protocol::Ga
}

impl Default for RouteConfig {
    fn default() -> Self {
        Self {
            model: "gpt-realtime".into(),
            provider: Provider::Openai,
            upstream_url: "wss://api.openai.com/v1/realtime".into(),
            upstream_model: None,
            protocol: Protocol::Ga,
            api_key_env: "OPENAI_API_KEY".into(),
            ca_file: None,
            budget_usd: None,
            budget_period: BudgetPeriod::Total,
            api_key: Secret::default(),
        }
    }
}

impl RouteConfig {
    pub fn upstream_model(&self) -> &str {
        self.upstream_model.as_deref().unwrap_or(&self.model)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Warm sockets per route; 0 disables the pool.
    pub size: usize,
    pub max_idle_secs: u64,
    /// Hard cap on `size`, whatever the size file says.
    pub max_size: usize,
    /// File holding the live size (a bare number or `REALTIME_POOL_SIZE=N`).
    pub size_file: Option<PathBuf>,
    /// `/readyz` waits this long at most for the pool to first fill.
    pub warmup_timeout_secs: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            size: 4,
            max_idle_secs: 30,
            max_size: 512,
            size_file: None,
            warmup_timeout_secs: 10,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    pub idle_timeout_secs: u64,
    pub max_session_secs: u64,
    pub max_message_bytes: usize,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            idle_timeout_secs: 300,
            max_session_secs: 3600,
            max_message_bytes: 16 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Concurrent sessions per process.
    pub max_sessions: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self { max_sessions: 1000 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Unpriced {
    Block,
    #[default]
    Allow,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeteringConfig {
    /// 0 = flush after every turn, budgets re-read every second.
    pub flush_secs: u64,
    pub unpriced: Unpriced,
    /// Cap of the Redis request-log stream (`XADD MAXLEN ~`).
    pub stream_maxlen: usize,
}

impl Default for MeteringConfig {
    fn default() -> Self {
        Self {
            flush_secs: 15,
            unpriced: Unpriced::Allow,
            stream_maxlen: 1_000_000,
        }
    }
}

/// USD per 1M tokens for one model.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PriceRow {
    pub model: String,
    #[serde(default)]
    pub text_input: f64,
    #[serde(default)]
    pub cached_text_input: f64,
    #[serde(default)]
    pub audio_input: f64,
    #[serde(default)]
    pub cached_audio_input: f64,
    #[serde(default)]
    pub text_output: f64,
    #[serde(default)]
    pub audio_output: f64,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Env var holding the Redis URL; unset = in-memory store.
    pub redis_url_env: Option<String>,
    /// PEM file of the CA(s) a `rediss://` server's certificate must chain
    /// to (private CAs); unset = the public webpki roots. Verification is
    /// always on.
    pub ca_file: Option<PathBuf>,
    /// Resolved from `redis_url_env` during validation.
    #[serde(skip)]
    pub redis_url: Option<Secret>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct KeysConfig {
    /// TOML file of `[[keys]]` (and `[[teams]]`); re-read when it changes.
    pub file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DrainMode {
    #[default]
    Close,
    Linger,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DrainConfig {
    pub wait_secs: u64,
    pub mode: DrainMode,
    pub linger_secs: u64,
}

impl Default for DrainConfig {
    fn default() -> Self {
        Self {
            wait_secs: 10,
            mode: DrainMode::Close,
            linger_secs: 0,
        }
    }
}

/// `[client_secrets]`: the keys that sign and verify client secrets, and
/// the longest life a secret may be given.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientSecretsConfig {
    /// Files each holding one signing key (at least 32 bytes, whitespace
    /// trimmed): the first signs, all verify; re-read live. Empty: a random
    /// key made at start, so secrets work on this process only.
    pub signing_key_files: Vec<PathBuf>,
    /// Cap on `expires_after.seconds` (10..=7200).
    pub max_ttl_secs: u64,
}

impl Default for ClientSecretsConfig {
    fn default() -> Self {
        Self {
            signing_key_files: Vec::new(),
            max_ttl_secs: crate::client_secret::request::MAX_TTL_SECS,
        }
    }
}

impl Config {
    /// Loads from a file (or `patchbay.toml` if present, or defaults) and the
    /// process environment, then validates.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let default = Path::new(DEFAULT_CONFIG_FILE);
        let path = path.or(default.exists().then_some(default));
        let env: BTreeMap<String, String> = std::env::vars().collect();
        let env = |k: &str| env.get(k).cloned();
        match path {
            Some(p) => Self::from_file_with_env(p, &env),
            None => Self::from_toml_with_env("", &env),
        }
    }

    /// Reads and validates `path`; the result remembers it as its source.
    pub fn from_file_with_env(
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("--config", format!("cannot read {}: {e}", path.display()))
        })?;
        let mut config = Self::from_toml_with_env(&text, env)?;
        config.source = Some(path.to_path_buf());
        Ok(config)
    }

    /// Parses `text` (empty = defaults), applies env overrides from `env`,
    /// resolves secrets from `env` and validates. Pure apart from reading the
    /// files the config names (`ca_file`, `keys.file` existence).
    pub fn from_toml_with_env(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut doc: toml::Table = toml::from_str(text).map_err(|e| toml_error(&e))?;
        apply_env_overrides(&mut doc, env)?;
        let mut config: Config = serde_path_to_error::deserialize(toml::Value::Table(doc))
            .map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                let key = match unknown_field(inner.message()) {
                    Some(field) if path == "." || path.is_empty() => field.to_string(),
                    Some(field) if !path.ends_with(field) => format!("{path}.{field}"),
                    _ => path,
                };
                ConfigError::new(key, inner.message().to_string())
            })?;
        config.master_key = env(MASTER_KEY_ENV)
            .filter(|v| !v.is_empty())
            .map(Secret::new);
        config.validate(env)?;
        Ok(config)
    }

    fn validate(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if self.server.upgrade_timeout_secs == 0 {
            return Err(ConfigError::new(
                "server.upgrade_timeout_secs",
                "must be at least 1",
            ));
        }
        if self.routes.is_empty() {
            return Err(ConfigError::new("routes", "at least one route is required"));
        }
        for (i, route) in self.routes.iter_mut().enumerate() {
            let key = |k: &str| format!("routes[{i}].{k}");
            if route.model.trim().is_empty() {
                return Err(ConfigError::new(key("model"), "must not be empty"));
            }
            validate_upstream_url(route).map_err(|m| ConfigError::new(key("upstream_url"), m))?;
            match env(&route.api_key_env) {
                Some(v) if !v.trim().is_empty() => route.api_key = Secret::new(v.trim()),
                _ => {
                    return Err(ConfigError::new(
                        key("api_key_env"),
                        format!(
                            "environment variable {} (the upstream key) is not set",
                            route.api_key_env
                        ),
                    ))
                }
            }
            if let Some(ca) = &route.ca_file {
                if let Err(e) = crate::upstream::tls::read_ca_file(ca) {
                    return Err(ConfigError::new(key("ca_file"), e.to_string()));
                }
            }
            if let Some(b) = route.budget_usd {
                if !(b.is_finite() && b >= 0.0) {
                    return Err(ConfigError::new(key("budget_usd"), "must be a number >= 0"));
                }
            }
        }
        for i in 0..self.routes.len() {
            if self.routes[..i]
                .iter()
                .any(|r| r.model == self.routes[i].model)
            {
                return Err(ConfigError::new(
                    format!("routes[{i}].model"),
                    format!("duplicate route for model {:?}", self.routes[i].model),
                ));
            }
        }
        if self.pool.size > self.pool.max_size {
            self.pool.size = self.pool.max_size;
        }
        if self.pool.max_idle_secs == 0 {
            return Err(ConfigError::new("pool.max_idle_secs", "must be at least 1"));
        }
        if self.relay.max_message_bytes < 1024 {
            return Err(ConfigError::new(
                "relay.max_message_bytes",
                "must be at least 1024",
            ));
        }
        for (k, v) in [
            ("relay.idle_timeout_secs", self.relay.idle_timeout_secs),
            ("relay.max_session_secs", self.relay.max_session_secs),
        ] {
            if v == 0 {
                return Err(ConfigError::new(k, "must be at least 1"));
            }
        }
        if self.limits.max_sessions == 0 {
            return Err(ConfigError::new(
                "limits.max_sessions",
                "must be at least 1",
            ));
        }
        validate_prices(&self.prices)?;
        if let Some(var) = &self.store.redis_url_env {
            match env(var) {
                Some(v) if !v.trim().is_empty() => {
                    let url = v.trim();
                    if !(url.starts_with("redis://")
                        || url.starts_with("rediss://")
                        || url.starts_with("unix://"))
                    {
                        return Err(ConfigError::new(
                            "store.redis_url_env",
                            format!("{var} must hold a redis:// or rediss:// URL"),
                        ));
                    }
                    validate_redis_url(url, self.store.ca_file.is_some()).map_err(|m| {
                        ConfigError::new("store.redis_url_env", format!("{var}: {m}"))
                    })?;
                    self.store.redis_url = Some(Secret::new(url));
                }
                _ => {
                    return Err(ConfigError::new(
                        "store.redis_url_env",
                        format!("environment variable {var} (the Redis URL) is not set"),
                    ))
                }
            }
        }
        if let Some(ca) = &self.store.ca_file {
            if self.store.redis_url.is_none() {
                return Err(ConfigError::new(
                    "store.ca_file",
                    "needs a rediss:// store (set store.redis_url_env)",
                ));
            }
            if let Err(e) = crate::upstream::tls::read_ca_file(ca) {
                return Err(ConfigError::new("store.ca_file", e.to_string()));
            }
        }
        match &self.keys.file {
            Some(f) if !f.exists() => {
                return Err(ConfigError::new(
                    "keys.file",
                    format!("{} does not exist", f.display()),
                ))
            }
            None if self.master_key.is_none() => {
                return Err(ConfigError::new(
                    "keys.file",
                    format!("no client keys: set [keys] file or {MASTER_KEY_ENV}"),
                ))
            }
            _ => {}
        }
        if self.drain.wait_secs == 0 {
            return Err(ConfigError::new("drain.wait_secs", "must be at least 1"));
        }
        if let Some(bad) = self.server.cors_origins.iter().find(|o| !valid_origin(o)) {
            return Err(ConfigError::new(
                "server.cors_origins",
                format!("'{bad}' is not an origin (scheme://host[:port], no path)"),
            ));
        }
        {
            use crate::client_secret::request::{MAX_TTL_SECS, MIN_TTL_SECS};
            let ttl = self.client_secrets.max_ttl_secs;
            if !(MIN_TTL_SECS..=MAX_TTL_SECS).contains(&ttl) {
                return Err(ConfigError::new(
                    "client_secrets.max_ttl_secs",
                    format!("must be from {MIN_TTL_SECS} to {MAX_TTL_SECS}"),
                ));
            }
            for (i, f) in self.client_secrets.signing_key_files.iter().enumerate() {
                if let Err(e) = crate::client_secret::read_signing_key(f) {
                    return Err(ConfigError::new(
                        format!("client_secrets.signing_key_files[{i}]"),
                        e,
                    ));
                }
            }
        }
        // Every duration is added to a clock reading somewhere; past a year
        // it is a typo, and near u64::MAX seconds the addition would
        // overflow at run time instead of failing here.
        for (k, v) in [
            (
                "server.upgrade_timeout_secs",
                self.server.upgrade_timeout_secs,
            ),
            ("pool.max_idle_secs", self.pool.max_idle_secs),
            ("pool.warmup_timeout_secs", self.pool.warmup_timeout_secs),
            ("relay.idle_timeout_secs", self.relay.idle_timeout_secs),
            ("relay.max_session_secs", self.relay.max_session_secs),
            ("metering.flush_secs", self.metering.flush_secs),
            ("drain.wait_secs", self.drain.wait_secs),
            ("drain.linger_secs", self.drain.linger_secs),
        ] {
            if v > MAX_SECS {
                return Err(ConfigError::new(
                    k,
                    format!("must be at most {MAX_SECS} (one year)"),
                ));
            }
        }
        Ok(())
    }

    pub fn route(&self, model: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.model == model)
    }
}

/// A store URL the gateway can use safely: TLS certificates are always
/// verified (redis-rs's `#insecure` fragment is refused), and a `ca_file`
/// only makes sense for `rediss://`. Never echoes the URL (it may hold a
/// password).
fn validate_redis_url(url: &str, has_ca_file: bool) -> Result<(), String> {
    let parsed = Url::parse(url).map_err(|e| format!("not a valid URL: {e}"))?;
    if parsed.fragment().is_some() {
        return Err(
            "a URL fragment (such as #insecure) is not accepted: TLS certificates are always verified"
                .into(),
        );
    }
    if has_ca_file && parsed.scheme() != "rediss" {
        return Err("store.ca_file is set, so the URL must be rediss:// (TLS)".into());
    }
    Ok(())
}

/// Every price must be a finite number >= 0.
fn validate_prices(prices: &[PriceRow]) -> Result<(), ConfigError> {
    for (i, p) in prices.iter().enumerate() {
        let fields = [
            ("text_input", p.text_input),
            ("cached_text_input", p.cached_text_input),
            ("audio_input", p.audio_input),
            ("cached_audio_input", p.cached_audio_input),
            ("text_output", p.text_output),
            ("audio_output", p.audio_output),
        ];
        for (name, v) in fields {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ConfigError::new(
                    format!("prices[{i}].{name}"),
                    "must be a number >= 0",
                ));
            }
        }
    }
    Ok(())
}

/// Just the `[[prices]]` of a config file's text, validated: what a live
/// price edit changes (the rest of the config needs a restart).
pub fn prices_from_toml(text: &str) -> Result<Vec<PriceRow>, ConfigError> {
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| toml_error(&e))?;
    let prices = doc
        .remove("prices")
        .unwrap_or_else(|| toml::Value::Array(Vec::new()));
    let prices: Vec<PriceRow> = serde_path_to_error::deserialize(prices).map_err(|e| {
        let path = format!("prices{}", e.path());
        ConfigError::new(path, e.into_inner().message().to_string())
    })?;
    validate_prices(&prices)?;
    Ok(prices)
}

fn validate_upstream_url(route: &RouteConfig) -> Result<(), String> {
    let url = Url::parse(&route.upstream_url).map_err(|e| format!("invalid URL: {e}"))?;
    if !matches!(url.scheme(), "ws" | "wss") {
        return Err(format!("scheme must be ws or wss, not {}", url.scheme()));
    }
    if url.host_str().is_none() {
        return Err("URL has no host".into());
    }
    if route.provider == Provider::Azure
        && !url.path().ends_with("/openai/v1/realtime")
        && !url.query_pairs().any(|(k, _)| k == "api-version")
    {
        return Err("an Azure /openai/realtime URL needs ?api-version=…".into());
    }
    Ok(())
}

/// Applies `PATCHBAY_<SECTION>_<KEY>` and the well-known pool variables.
fn apply_env_overrides(
    doc: &mut toml::Table,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    // The closure interface cannot enumerate, so probe the known keys of each
    // section: unknown env names are simply not looked at.
    for section in TABLE_SECTIONS {
        for key in section_keys(section) {
            let var = format!(
                "{ENV_PREFIX}{}_{}",
                section.to_uppercase(),
                key.to_uppercase()
            );
            if let Some(raw) = env(&var) {
                set_key(doc, section, key, &raw)?;
            }
        }
    }
    for (var, key) in [
        ("REALTIME_POOL_SIZE", "size"),
        ("REALTIME_POOL_MAX_IDLE_SECS", "max_idle_secs"),
    ] {
        if let Some(raw) = env(var) {
            let n: i64 = raw
                .trim()
                .parse()
                .map_err(|_| ConfigError::new(var, format!("not a whole number: {raw:?}")))?;
            if n < 0 {
                return Err(ConfigError::new(var, "must be >= 0"));
            }
            set_value(doc, "pool", key, toml::Value::Integer(n));
        }
    }
    Ok(())
}

fn section_keys(section: &str) -> &'static [&'static str] {
    match section {
        "server" => &[
            "listen",
            "admin_listen",
            "upgrade_timeout_secs",
            "worker_threads",
        ],
        "pool" => &[
            "size",
            "max_idle_secs",
            "max_size",
            "size_file",
            "warmup_timeout_secs",
        ],
        "relay" => &["idle_timeout_secs", "max_session_secs", "max_message_bytes"],
        "limits" => &["max_sessions"],
        "metering" => &["flush_secs", "unpriced", "stream_maxlen"],
        "store" => &["redis_url_env", "ca_file"],
        "keys" => &["file"],
        "drain" => &["wait_secs", "mode", "linger_secs"],
        "client_secrets" => &["signing_key_files", "max_ttl_secs"],
        _ => &[],
    }
}

fn set_key(doc: &mut toml::Table, section: &str, key: &str, raw: &str) -> Result<(), ConfigError> {
    let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.into()),
    };
    set_value(doc, section, key, value);
    Ok(())
}

fn set_value(doc: &mut toml::Table, section: &str, key: &str, value: toml::Value) {
    let table = doc
        .entry(section)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let toml::Value::Table(t) = table {
        t.insert(key.to_string(), value);
    }
}

fn toml_error(e: &toml::de::Error) -> ConfigError {
    ConfigError::new(
        unknown_field(e.message()).unwrap_or("config"),
        e.to_string().trim().to_string(),
    )
}

/// The field name of serde's "unknown field `x`, expected …" message.
fn unknown_field(msg: &str) -> Option<&str> {
    let rest = msg.strip_prefix("unknown field `")?;
    rest.find('`').map(|end| &rest[..end])
}

/// Upper bound of every `*_secs` setting: one year.
pub const MAX_SECS: u64 = 366 * 24 * 3600;

/// `scheme://host[:port]` with an http(s) scheme and nothing after: what a
/// browser sends in `Origin`.
pub fn valid_origin(o: &str) -> bool {
    let Some(rest) = o
        .strip_prefix("https://")
        .or_else(|| o.strip_prefix("http://"))
    else {
        return false;
    };
    !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    const BASE_ENV: &[(&str, &str)] = &[("OPENAI_API_KEY", "sk-up"), (MASTER_KEY_ENV, "pb-master")];

    #[test]
    fn empty_file_gives_the_documented_defaults() {
        let c = Config::from_toml_with_env("", &env_of(BASE_ENV)).unwrap();
        assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.server.admin_listen.to_string(), "127.0.0.1:9090");
        assert_eq!(c.relay.idle_timeout_secs, 300);
        assert_eq!(c.pool.size, 4);
        assert_eq!(c.metering.flush_secs, 15);
        assert_eq!(c.drain.wait_secs, 10);
        assert_eq!(c.routes[0].model, "gpt-realtime");
        assert_eq!(c.routes[0].api_key.expose(), "sk-up");
        assert_eq!(c.master_key.as_ref().unwrap().expose(), "pb-master");
    }

    #[test]
    fn unknown_key_is_named() {
        let e = Config::from_toml_with_env("[server]\nlisten_addr = \"x\"\n", &env_of(BASE_ENV))
            .unwrap_err();
        assert_eq!(e.key, "server.listen_addr", "{e}");
        let e = Config::from_toml_with_env("[serverx]\n", &env_of(BASE_ENV)).unwrap_err();
        assert_eq!(e.key, "serverx", "{e}");
        let e =
            Config::from_toml_with_env("[limits]\nmax_sessions = \"many\"\n", &env_of(BASE_ENV))
                .unwrap_err();
        assert_eq!(e.key, "limits.max_sessions", "{e}");
    }

    #[test]
    fn bad_upstream_url_is_named() {
        let toml = r#"
            [[routes]]
            model = "m"
            upstream_url = "https://example.invalid/v1/realtime"
            api_key_env = "OPENAI_API_KEY"
        "#;
        let e = Config::from_toml_with_env(toml, &env_of(BASE_ENV)).unwrap_err();
        assert_eq!(e.key, "routes[0].upstream_url");
        let toml = toml.replace("https://example.invalid/v1/realtime", "not a url");
        let e = Config::from_toml_with_env(&toml, &env_of(BASE_ENV)).unwrap_err();
        assert_eq!(e.key, "routes[0].upstream_url");
    }

    #[test]
    fn missing_upstream_key_variable_is_named() {
        let e = Config::from_toml_with_env("", &env_of(&[(MASTER_KEY_ENV, "k")])).unwrap_err();
        assert_eq!(e.key, "routes[0].api_key_env");
        assert!(e.to_string().contains("OPENAI_API_KEY"), "{e}");
    }

    #[test]
    fn no_client_keys_at_all_is_an_error() {
        let e = Config::from_toml_with_env("", &env_of(&[("OPENAI_API_KEY", "sk")])).unwrap_err();
        assert_eq!(e.key, "keys.file");
    }

    #[test]
    fn env_overrides_beat_the_file_and_wellknown_pool_names_apply() {
        let toml = "[server]\nlisten = \"127.0.0.1:1\"\n[pool]\nsize = 2\n";
        let mut env: Vec<(&str, &str)> = BASE_ENV.to_vec();
        env.extend([
            ("PATCHBAY_SERVER_LISTEN", "0.0.0.0:7000"),
            ("PATCHBAY_RELAY_IDLE_TIMEOUT_SECS", "42"),
            ("PATCHBAY_DRAIN_MODE", "linger"),
            ("REALTIME_POOL_SIZE", "9"),
            ("REALTIME_POOL_MAX_IDLE_SECS", "11"),
        ]);
        let c = Config::from_toml_with_env(toml, &env_of(&env)).unwrap();
        assert_eq!(c.server.listen.to_string(), "0.0.0.0:7000");
        assert_eq!(c.relay.idle_timeout_secs, 42);
        assert_eq!(c.drain.mode, DrainMode::Linger);
        assert_eq!(c.pool.size, 9);
        assert_eq!(c.pool.max_idle_secs, 11);
    }

    #[test]
    fn durations_past_a_year_are_refused_by_name() {
        for (section, key) in [
            ("server", "upgrade_timeout_secs"),
            ("pool", "max_idle_secs"),
            ("pool", "warmup_timeout_secs"),
            ("relay", "idle_timeout_secs"),
            ("relay", "max_session_secs"),
            ("metering", "flush_secs"),
            ("drain", "wait_secs"),
            ("drain", "linger_secs"),
        ] {
            let toml = format!("[{section}]\n{key} = 9223372036854775807\n");
            let e = Config::from_toml_with_env(&toml, &env_of(BASE_ENV)).unwrap_err();
            assert_eq!(e.key, format!("{section}.{key}"), "{e}");
            assert!(e.to_string().contains("one year"), "{e}");
            let toml = format!("[{section}]\n{key} = {MAX_SECS}\n");
            Config::from_toml_with_env(&toml, &env_of(BASE_ENV))
                .unwrap_or_else(|e| panic!("a year of {section}.{key} is allowed: {e}"));
        }
    }

    #[test]
    fn env_override_of_wrong_type_is_named() {
        let mut env: Vec<(&str, &str)> = BASE_ENV.to_vec();
        env.push(("PATCHBAY_LIMITS_MAX_SESSIONS", "lots"));
        let e = Config::from_toml_with_env("", &env_of(&env)).unwrap_err();
        assert!(e.to_string().contains("max_sessions"), "{e}");
    }

    #[test]
    fn azure_route_without_api_version_is_refused() {
        let toml = r#"
            [[routes]]
            model = "m"
            provider = "azure"
            upstream_url = "wss://res.openai.azure.com/openai/realtime"
            api_key_env = "OPENAI_API_KEY"
        "#;
        let e = Config::from_toml_with_env(toml, &env_of(BASE_ENV)).unwrap_err();
        assert_eq!(e.key, "routes[0].upstream_url");
    }

    #[test]
    fn full_documented_config_loads() {
        let toml = r#"
            [server]
            listen = "0.0.0.0:8080"
            admin_listen = "0.0.0.0:9090"
            upgrade_timeout_secs = 10
            [[routes]]
            model = "gpt-realtime"
            provider = "openai"
            upstream_url = "wss://api.openai.com/v1/realtime"
            upstream_model = "gpt-realtime-2025-08-28"
            protocol = "beta"
            api_key_env = "UP"
            budget_usd = 100.0
            budget_period = "daily"
            [pool]
            size = 4
            max_idle_secs = 30
            max_size = 512
            size_file = "/etc/patchbay/pool/REALTIME_POOL_SIZE"
            [relay]
            idle_timeout_secs = 300
            max_session_secs = 3600
            max_message_bytes = 16777216
            [limits]
            max_sessions = 1000
            [metering]
            flush_secs = 15
            unpriced = "block"
            [[prices]]
            model = "gpt-realtime"
            text_input = 4.0
            cached_text_input = 0.4
            audio_input = 32.0
            cached_audio_input = 0.4
            text_output = 16.0
            audio_output = 64.0
            [store]
            redis_url_env = "REDIS"
            [drain]
            wait_secs = 10
            mode = "close"
            linger_secs = 0
            [client_secrets]
            signing_key_files = []
            max_ttl_secs = 3600
        "#;
        let c = Config::from_toml_with_env(
            toml,
            &env_of(&[
                ("UP", "sk"),
                ("REDIS", "redis://127.0.0.1:6379"),
                (MASTER_KEY_ENV, "k"),
            ]),
        )
        .unwrap();
        assert_eq!(c.routes[0].upstream_model(), "gpt-realtime-2025-08-28");
        assert_eq!(c.routes[0].protocol, Protocol::Beta);
        assert_eq!(c.routes[0].budget_period, BudgetPeriod::Daily);
        assert_eq!(c.prices[0].audio_output, 64.0);
        assert_eq!(c.metering.unpriced, Unpriced::Block);
        assert!(c.store.redis_url.is_some());
        assert_eq!(c.client_secrets.max_ttl_secs, 3600);
    }

    #[test]
    fn store_tls_verification_cannot_be_turned_off_and_ca_file_needs_rediss() {
        let with = |url: &str, extra: &str| {
            let toml = format!("[store]\nredis_url_env = \"REDIS\"\n{extra}");
            let mut env: Vec<(&str, &str)> = BASE_ENV.to_vec();
            env.push(("REDIS", url));
            Config::from_toml_with_env(&toml, &env_of(&env))
        };
        let e = with("rediss://redis.example:6380/#insecure", "").unwrap_err();
        assert_eq!(e.key, "store.redis_url_env");
        assert!(e.message.contains("always verified"), "{e}");
        assert!(
            !e.message.contains("redis.example"),
            "never echo the URL: {e}"
        );
        let e = with("redis://127.0.0.1:6379", "ca_file = \"/nonexistent.pem\"").unwrap_err();
        assert_eq!(e.key, "store.redis_url_env");
        assert!(e.message.contains("rediss://"), "{e}");
        let e = with(
            "rediss://u:p@127.0.0.1:6380",
            "ca_file = \"/nonexistent.pem\"",
        )
        .unwrap_err();
        assert_eq!(e.key, "store.ca_file");
        let c = with("rediss://alice:s3cret@127.0.0.1:6380/0", "").unwrap();
        assert!(c.store.redis_url.is_some());
        let no_store = Config::from_toml_with_env(
            "[store]\nca_file = \"/nonexistent.pem\"\n",
            &env_of(BASE_ENV),
        )
        .unwrap_err();
        assert_eq!(no_store.key, "store.ca_file");
        let mut env: Vec<(&str, &str)> = BASE_ENV.to_vec();
        env.extend([
            ("REDIS", "rediss://127.0.0.1:6380"),
            ("PATCHBAY_STORE_CA_FILE", "/nonexistent.pem"),
        ]);
        let e = Config::from_toml_with_env("[store]\nredis_url_env = \"REDIS\"\n", &env_of(&env))
            .unwrap_err();
        assert_eq!(e.key, "store.ca_file", "the env override reaches ca_file");
    }

    #[test]
    fn cors_origins_must_be_origins() {
        for (o, ok) in [
            ("https://app.example", true),
            ("http://localhost:3000", true),
            ("https://app.example/", false),
            ("app.example", false),
            ("https://", false),
            ("https://a b", false),
        ] {
            assert_eq!(valid_origin(o), ok, "{o}");
        }
        let toml = "[server]\ncors_origins = [\"app.example\"]\n";
        let e = Config::from_toml_with_env(toml, &env_of(BASE_ENV)).unwrap_err();
        assert_eq!(e.key, "server.cors_origins", "{e}");
    }
}
