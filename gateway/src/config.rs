//! Gateway configuration: one TOML file, every key overridable from the
//! environment, validated once at start.
//!
//! Sources, later wins:
//! 1. built-in defaults ([`Config::default`]);
//! 2. the TOML file (`--config`, else `patchbay.toml` when present);
//! 3. `PATCHBAY_<SECTION>_<KEY>` for the table sections (`server`, `pool`,
//!    `relay`, `limits`, `metering`, `store`, `keys`, `drain`,
//!    `client_secrets`, `telemetry`), parsed as a TOML value when it is one (`10`,
//!    `true`, `"x"`, `["a", "b"]`), else taken as a string;
//! 4. the well-known `REALTIME_POOL_SIZE` and `REALTIME_POOL_MAX_IDLE_SECS`,
//!    and the standard `OTEL_*` variables for `[telemetry]`
//!    ([`crate::telemetry::config`]).
//!
//! Unknown keys are errors (`deny_unknown_fields`), so a typo never silently
//! falls back to a default. Secrets are never in the file: routes name the
//! environment variable (`api_key_env`) or the file (`api_key_file`, a mounted
//! Secret, re-read while running) that holds their upstream key, Redis is named
//! by `redis_url_env` or `redis_url_file`, and client keys live in the keys
//! file (hashed) or `PATCHBAY_MASTER_KEY`. Every validation error names the offending key;
//! `main` turns it into exit code 2.
//!
//! The types of the sections the operator renders (`[[routes]]`, `[pool]`, `[relay]`, `[limits]`,
//! `[metering]`, `[[prices]]`, `[store]`, `[keys]`, `[drain]`, `[client_secrets]`), their enums,
//! the bounds on their seconds and the upstream-URL rules are the `patchbay-config` crate's, which
//! the operator builds the file from; this module re-exports them and keeps what needs the
//! gateway's runtime: `[server]`, the document, env overrides, secrets and validation.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use patchbay_config::{
    validate_upstream_url, MAX_PRICE_USD_PER_MILLION_TOKENS, MAX_PRICE_USD_PER_MINUTE,
    MIN_DRAIN_WAIT_SECS, MIN_POOL_MAX_IDLE_SECS,
};
use serde::Deserialize;

use crate::config_checks;
use crate::config_env;
use crate::secret::Secret;
use crate::telemetry::config::{Settings as TelemetrySettings, TelemetryConfig};
use crate::upstream_key::{key_from_file_text, UpstreamKey};

/// The sections a renderer writes, their enums and bounds, and the upstream-URL rules live in
/// `patchbay-config`, shared with the operator that renders this file.
pub use patchbay_config::{
    BudgetPeriod, ClientSecretsConfig, DrainConfig, DrainMode, Endpoint, Intent, KeysConfig,
    LimitsConfig, MeteringConfig, PoolConfig, PriceRow, Protocol, Provider, RelayConfig, Unpriced,
    MAX_SECS,
};

/// A `[[routes]]` entry, with its upstream key resolved while loading.
pub type RouteConfig = patchbay_config::RouteConfig<UpstreamKey>;
/// A `[[routes.upstreams]]` entry, with its key resolved while loading.
pub type UpstreamConfig = patchbay_config::UpstreamConfig<UpstreamKey>;
/// `[store]`, with its Redis URL resolved while loading.
pub type StoreConfig = patchbay_config::StoreConfig<Secret>;

/// The file read when `--config` is not given, if it exists.
pub const DEFAULT_CONFIG_FILE: &str = "patchbay.toml";
/// Env var that holds a single client key (one-key setups).
pub const MASTER_KEY_ENV: &str = "PATCHBAY_MASTER_KEY";

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
    pub telemetry: TelemetryConfig,
    /// `[telemetry]` and the `OTEL_*` variables resolved; `None`: export off.
    #[serde(skip)]
    pub telemetry_settings: Option<TelemetrySettings>,
    /// `PATCHBAY_MASTER_KEY`, when set.
    #[serde(skip)]
    pub master_key: Option<Secret>,
    /// The file this config came from, watched for price edits.
    #[serde(skip)]
    pub source: Option<PathBuf>,
    /// `PATCHBAY_*` variables of the environment the gateway does not read
    /// (logged as warnings at start).
    #[serde(skip)]
    pub unread_env: Vec<String>,
    /// The file as read at start (paths resolved, before env overrides), to
    /// name the restart-only keys an edit changes ([`crate::config_diff`]).
    #[serde(skip)]
    pub file_doc: Option<toml::Table>,
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
            telemetry: TelemetryConfig::default(),
            telemetry_settings: None,
            master_key: None,
            source: None,
            unread_env: Vec::new(),
            file_doc: None,
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
    /// Extra upstreams a session's set-up may try after a retryable dial
    /// failure (routes with several upstreams).
    pub max_failovers: usize,
    /// Consecutive failures that open an upstream's circuit breaker.
    pub breaker_failures: u32,
    /// How long a breaker first stays open before one probe dial.
    pub breaker_open_secs: u64,
    /// The longest a breaker stays open (doubling while probes fail); at
    /// least `breaker_open_secs`.
    pub breaker_max_open_secs: u64,
    /// Origins allowed to call the HTTP API from a browser (CORS); empty
    /// allows any origin (credentials are explicit headers, never cookies).
    pub cors_origins: Vec<String>,
    /// One access line per request and per WebSocket session
    /// ([`crate::access`]).
    pub access_log: bool,
    /// TLS on the client listener ([`crate::client_tls`]): the certificate
    /// chain and its key (PEM), both or neither.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
}

/// Consecutive failed dials that open an upstream's circuit breaker.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
/// How long a breaker first stays open.
pub const DEFAULT_BREAKER_OPEN_SECS: u64 = 5;
/// The longest a breaker stays open between probes.
pub const DEFAULT_BREAKER_MAX_OPEN_SECS: u64 = 60;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            upgrade_timeout_secs: 10,
            worker_threads: 0,
            cors_origins: Vec::new(),
            access_log: true,
            tls_cert_file: None,
            tls_key_file: None,
            max_failovers: 2,
            breaker_failures: DEFAULT_BREAKER_FAILURES,
            breaker_open_secs: DEFAULT_BREAKER_OPEN_SECS,
            breaker_max_open_secs: DEFAULT_BREAKER_MAX_OPEN_SECS,
        }
    }
}

impl Config {
    /// Loads from a file (or `patchbay.toml` if present, or defaults) and the
    /// process environment, then validates.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let default = Path::new(DEFAULT_CONFIG_FILE);
        let path = path.or(default.exists().then_some(default));
        let vars: BTreeMap<String, String> = std::env::vars().collect();
        let env = |k: &str| vars.get(k).cloned();
        let file = path
            .map(|p| Ok::<_, ConfigError>((p, read_doc(p)?)))
            .transpose()?;
        // The environment's names before the file's own checks: a misspelt
        // override is the error to report even when the file is incomplete
        // without it.
        let referenced = file
            .as_ref()
            .map(|(_, doc)| config_env::referenced_names(doc))
            .unwrap_or_default();
        let referenced: Vec<&str> = referenced.iter().map(String::as_str).collect();
        let unread = config_env::check_names(vars.keys().map(String::as_str), &referenced)?;
        let mut config = match file {
            Some((p, doc)) => Self::from_file_doc(p, doc, &env),
            None => Self::from_toml_with_env("", &env),
        }?;
        config.unread_env = unread;
        Ok(config)
    }

    /// Reads and validates `path`; the result remembers it as its source.
    pub fn from_file_with_env(
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        Self::from_file_doc(path, read_doc(path)?, env)
    }

    /// The config of the file at `path`, parsed as `doc`: its relative paths
    /// resolved against its directory, then env overrides and validation.
    fn from_file_doc(
        path: &Path,
        mut doc: toml::Table,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        crate::config_paths::resolve(&mut doc, path.parent().unwrap_or(Path::new("")));
        let mut config = Self::from_doc_with_env(doc.clone(), env)?;
        config.source = Some(path.to_path_buf());
        config.file_doc = Some(doc);
        Ok(config)
    }

    /// Parses `text` (empty = defaults), applies env overrides from `env`,
    /// resolves secrets from `env` and validates. Pure apart from reading the
    /// files the config names (`ca_file`, `keys.file` existence).
    pub fn from_toml_with_env(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let doc: toml::Table = toml::from_str(text).map_err(|e| toml_error(&e))?;
        Self::from_doc_with_env(doc, env)
    }

    fn from_doc_with_env(
        mut doc: toml::Table,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
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
        for (k, v) in [
            (
                "server.breaker_failures",
                u64::from(self.server.breaker_failures),
            ),
            ("server.breaker_open_secs", self.server.breaker_open_secs),
            (
                "server.breaker_max_open_secs",
                self.server.breaker_max_open_secs,
            ),
        ] {
            if v == 0 {
                return Err(ConfigError::new(k, "must be at least 1"));
            }
            if k.ends_with("_secs") && v > MAX_SECS {
                return Err(ConfigError::new(
                    k,
                    format!("must be at most {MAX_SECS} (one year)"),
                ));
            }
        }
        // The longest open time is at least the first.
        self.server.breaker_max_open_secs = self
            .server
            .breaker_max_open_secs
            .max(self.server.breaker_open_secs);
        if self.routes.is_empty() {
            return Err(ConfigError::new("routes", "at least one route is required"));
        }
        for (i, route) in self.routes.iter_mut().enumerate() {
            let key = |k: &str| format!("routes[{i}].{k}");
            if route.model.trim().is_empty() {
                return Err(ConfigError::new(key("model"), "must not be empty"));
            }
            let listed = !route.upstreams.is_empty();
            if listed
                && (!route.upstream_url.is_empty()
                    || !route.api_key_env.is_empty()
                    || route.api_key_file.is_some())
            {
                return Err(ConfigError::new(
                    key("upstreams"),
                    "use either upstream_url/api_key_env/api_key_file or [[routes.upstreams]], not both",
                ));
            }
            if !listed && route.upstream_url.is_empty() {
                return Err(ConfigError::new(
                    key("upstream_url"),
                    "required (or list [[routes.upstreams]])",
                ));
            }
            let prefix = |j: usize, k: &str| {
                if listed {
                    format!("routes[{i}].upstreams[{j}].{k}")
                } else {
                    format!("routes[{i}].{k}")
                }
            };
            let mut ups = route.upstream_list().into_owned();
            for (j, up) in ups.iter_mut().enumerate() {
                if up.name.trim().is_empty() {
                    return Err(ConfigError::new(prefix(j, "name"), "must not be empty"));
                }
                if let Some(p) = up.protocol {
                    if p != route.protocol {
                        return Err(ConfigError::new(
                            prefix(j, "protocol"),
                            format!(
                                "route {:?} speaks {:?}; all its upstreams must speak one protocol",
                                route.model, route.protocol
                            ),
                        ));
                    }
                }
                up.protocol = Some(route.protocol);
                validate_upstream_url(up.provider, &up.upstream_url)
                    .map_err(|e| ConfigError::new(prefix(j, "upstream_url"), e.to_string()))?;
                let secret = upstream_key(&up.api_key_env, up.api_key_file.as_deref(), env)
                    .map_err(|(k, m)| ConfigError::new(prefix(j, k), m))?;
                up.api_key = UpstreamKey::new(secret);
                if let Some(ca) = &up.ca_file {
                    if let Err(e) = crate::pem::read_ca_file(ca) {
                        return Err(ConfigError::new(prefix(j, "ca_file"), e.to_string()));
                    }
                }
            }
            for j in 0..ups.len() {
                if ups[..j].iter().any(|u| u.name == ups[j].name) {
                    return Err(ConfigError::new(
                        prefix(j, "name"),
                        format!("duplicate upstream name {:?}", ups[j].name),
                    ));
                }
            }
            if !listed {
                route.api_key = ups[0].api_key.clone();
            }
            route.upstreams = ups;
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
            config_checks::endpoint_fits(&self.routes[i], i)
                .map_err(|(k, m)| ConfigError::new(k, m))?;
            if self.routes[i].intent.is_some()
                && self.routes[..i]
                    .iter()
                    .any(|r| r.intent == self.routes[i].intent)
            {
                return Err(ConfigError::new(
                    format!("routes[{i}].intent"),
                    "another route already serves this intent (a session naming no model must find one route)",
                ));
            }
        }
        config_checks::pool_configmap(self.pool.size_configmap.as_deref())
            .map_err(|(k, m)| ConfigError::new(k, m))?;
        if self.pool.size > self.pool.max_size {
            self.pool.size = self.pool.max_size;
        }
        if self.pool.max_idle_secs < MIN_POOL_MAX_IDLE_SECS {
            return Err(ConfigError::new(
                "pool.max_idle_secs",
                format!("must be at least {MIN_POOL_MAX_IDLE_SECS}"),
            ));
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
        validate_max_turn_usd(&self.metering)?;
        if let Some((k, raw)) = redis_url_source(&self.store, env)? {
            let url = checked_redis_url(&raw, self.store.ca_file.is_some())
                .map_err(|m| ConfigError::new(k, m))?;
            self.store.redis_url = Some(url);
        }
        if self.store.replica_acks > MAX_REPLICA_ACKS {
            let m = format!("must be at most {MAX_REPLICA_ACKS} (0 = no confirmation)");
            return Err(ConfigError::new("store.replica_acks", m));
        }
        if let Some(ca) = &self.store.ca_file {
            if self.store.redis_url.is_none() {
                return Err(ConfigError::new(
                    "store.ca_file",
                    "needs a rediss:// store (set store.redis_url_env or store.redis_url_file)",
                ));
            }
            if let Err(e) = crate::pem::read_ca_file(ca) {
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
        if self.drain.wait_secs < MIN_DRAIN_WAIT_SECS {
            return Err(ConfigError::new(
                "drain.wait_secs",
                format!("must be at least {MIN_DRAIN_WAIT_SECS}"),
            ));
        }
        config_checks::tls_pair(
            self.server.tls_cert_file.as_deref(),
            self.server.tls_key_file.as_deref(),
        )
        .map_err(|(k, m)| ConfigError::new(k, m))?;
        if let Some(bad) = self.server.cors_origins.iter().find(|o| !valid_origin(o)) {
            return Err(ConfigError::new(
                "server.cors_origins",
                format!("'{bad}' is not an origin (scheme://host[:port], no path)"),
            ));
        }
        self.telemetry_settings = self
            .telemetry
            .resolve(env)
            .map_err(|e| ConfigError::new(e.key, e.message))?;
        {
            use patchbay_config::{MAX_CLIENT_SECRET_TTL_SECS, MIN_CLIENT_SECRET_TTL_SECS};
            let ttl = self.client_secrets.max_ttl_secs;
            if !(MIN_CLIENT_SECRET_TTL_SECS..=MAX_CLIENT_SECRET_TTL_SECS).contains(&ttl) {
                return Err(ConfigError::new(
                    "client_secrets.max_ttl_secs",
                    format!(
                        "must be from {MIN_CLIENT_SECRET_TTL_SECS} to {MAX_CLIENT_SECRET_TTL_SECS}"
                    ),
                ));
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

/// A route's upstream key from `api_key_file` or `api_key_env` (exactly one); the error names the
/// offending key of the route.
fn upstream_key(
    api_key_env: &str,
    api_key_file: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Secret, (&'static str, String)> {
    match (api_key_file, api_key_env.trim()) {
        (Some(_), var) if !var.is_empty() => Err((
            "api_key_file",
            "set api_key_env or api_key_file, not both".into(),
        )),
        (Some(file), _) => {
            let text = std::fs::read_to_string(file).map_err(|e| {
                (
                    "api_key_file",
                    format!("cannot read {}: {e}", file.display()),
                )
            })?;
            key_from_file_text(&text)
                .ok_or_else(|| ("api_key_file", format!("{} is empty", file.display())))
        }
        (None, "") => Err(("api_key_env", "set api_key_env or api_key_file".into())),
        (None, var) => match env(var) {
            Some(v) if !v.trim().is_empty() => Ok(Secret::new(v.trim())),
            _ => Err((
                "api_key_env",
                format!("environment variable {var} (the upstream key) is not set"),
            )),
        },
    }
}

/// Where `[store]` takes the Redis URL from, and its raw text; `None`: no Redis.
fn redis_url_source(
    store: &StoreConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(&'static str, String)>, ConfigError> {
    match (&store.redis_url_env, &store.redis_url_file) {
        (Some(_), Some(_)) => Err(ConfigError::new(
            "store.redis_url_file",
            "set redis_url_env or redis_url_file, not both",
        )),
        (None, None) => Ok(None),
        (Some(var), None) => match env(var) {
            Some(v) if !v.trim().is_empty() => Ok(Some(("store.redis_url_env", v))),
            _ => Err(ConfigError::new(
                "store.redis_url_env",
                format!("environment variable {var} (the Redis URL) is not set"),
            )),
        },
        (None, Some(file)) => match std::fs::read_to_string(file) {
            Ok(text) if !text.trim().is_empty() => Ok(Some(("store.redis_url_file", text))),
            Ok(_) => Err(ConfigError::new(
                "store.redis_url_file",
                format!("{} is empty", file.display()),
            )),
            Err(e) => Err(ConfigError::new(
                "store.redis_url_file",
                format!("cannot read {}: {e}", file.display()),
            )),
        },
    }
}

/// The part of the config file the gateway applies while running: `[metering]` and
/// `[[prices]]` (with the `PATCHBAY_METERING_*` overrides of `env`), validated as at start.
/// Everything else in the file needs a restart.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveConfig {
    pub metering: MeteringConfig,
    pub prices: Vec<PriceRow>,
}

/// Parse the live part of a config file's `text`; see [`LiveConfig`].
pub fn live_from_toml(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<LiveConfig, ConfigError> {
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| toml_error(&e))?;
    apply_env_overrides(&mut doc, env)?;
    let metering: MeteringConfig = match doc.remove("metering") {
        None => MeteringConfig::default(),
        Some(value) => serde_path_to_error::deserialize(value).map_err(|e| {
            let path = format!("metering.{}", e.path());
            ConfigError::new(path, e.into_inner().message().to_string())
        })?,
    };
    if metering.flush_secs > MAX_SECS {
        return Err(ConfigError::new(
            "metering.flush_secs",
            format!("must be at most {MAX_SECS} (one year)"),
        ));
    }
    validate_max_turn_usd(&metering)?;
    let prices = doc
        .remove("prices")
        .unwrap_or_else(|| toml::Value::Array(Vec::new()));
    let prices: Vec<PriceRow> = serde_path_to_error::deserialize(prices).map_err(|e| {
        let path = format!("prices{}", e.path());
        ConfigError::new(path, e.into_inner().message().to_string())
    })?;
    validate_prices(&prices)?;
    Ok(LiveConfig { metering, prices })
}

/// The most replicas `[store] replica_acks` may ask to confirm a write.
pub const MAX_REPLICA_ACKS: u32 = 16;

/// The Redis URL in `raw` (an env value or a URL file's text), trimmed and
/// checked ([`crate::redis_url::check`]); the error never quotes the URL
/// (it may carry a password).
pub fn checked_redis_url(raw: &str, has_ca_file: bool) -> Result<Secret, String> {
    let url = raw.trim();
    crate::redis_url::check(url, has_ca_file)?;
    Ok(Secret::new(url))
}

/// Every token rate must be a number within `[0, MAX_PRICE_USD_PER_MILLION_TOKENS]` and a
/// `usd_per_minute` within `[0, MAX_PRICE_USD_PER_MINUTE]`: finite, and small enough that no usage
/// can make a cost overflow (see `metering::pricing`). A model priced twice for the same upstream
/// is ambiguous (which row's rates apply?) and refused, naming the second row.
fn validate_prices(prices: &[PriceRow]) -> Result<(), ConfigError> {
    let bad = |i: usize, name: &str, v: f64, max: f64, unit: &str| {
        ConfigError::new(
            format!("prices[{i}].{name}"),
            format!("must be a number >= 0 and at most {max} ({unit}), got {v}"),
        )
    };
    let in_bounds = |v: f64, max: f64| v.is_finite() && (0.0..=max).contains(&v);
    for (i, p) in prices.iter().enumerate() {
        for (name, v) in p.token_rates() {
            if !in_bounds(v, MAX_PRICE_USD_PER_MILLION_TOKENS) {
                let unit = "USD per 1M tokens";
                return Err(bad(i, name, v, MAX_PRICE_USD_PER_MILLION_TOKENS, unit));
            }
        }
        if let Some(v) = p
            .usd_per_minute
            .filter(|v| !in_bounds(*v, MAX_PRICE_USD_PER_MINUTE))
        {
            let unit = "USD per minute of audio";
            return Err(bad(i, "usd_per_minute", v, MAX_PRICE_USD_PER_MINUTE, unit));
        }
        if let Some(first) = prices[..i]
            .iter()
            .position(|q| q.model == p.model && q.upstream == p.upstream)
        {
            return Err(ConfigError::new(
                format!("prices[{i}].model"),
                format!(
                    "{:?} is priced already by prices[{first}] (for the same upstream): give its \
                     token rates and usd_per_minute in one row",
                    p.model
                ),
            ));
        }
    }
    Ok(())
}

/// `[metering] max_turn_usd` caps the charge of a turn whose usage is implausible: a finite
/// number > 0 (0 would charge such turns nothing, `inf` would not cap them).
fn validate_max_turn_usd(metering: &MeteringConfig) -> Result<(), ConfigError> {
    let v = metering.max_turn_usd;
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ConfigError::new(
            "metering.max_turn_usd",
            format!("must be a finite number > 0 (USD), got {v}"),
        ))
    }
}

/// One upstream's live balancing settings, from a config file's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Balance {
    pub route: String,
    pub upstream: String,
    pub priority: u32,
    pub weight: u32,
}

/// The `priority` and `weight` of every `[[routes.upstreams]]` entry in a
/// config file's text: what a live balancing edit changes (the upstream
/// list itself needs a restart). Entries without a name or with a value
/// that is not a whole number >= 0 make the edit invalid, named by key.
pub fn balances_from_toml(text: &str) -> Result<Vec<Balance>, ConfigError> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| toml_error(&e))?;
    let mut out = Vec::new();
    let routes = doc.get("routes").and_then(|r| r.as_array());
    for (i, route) in routes.into_iter().flatten().enumerate() {
        let Some(model) = route.get("model").and_then(|m| m.as_str()) else {
            continue;
        };
        let ups = route.get("upstreams").and_then(|u| u.as_array());
        for (j, up) in ups.into_iter().flatten().enumerate() {
            let key = |k: &str| format!("routes[{i}].upstreams[{j}].{k}");
            let name = up
                .get("name")
                .and_then(|n| n.as_str())
                .ok_or_else(|| ConfigError::new(key("name"), "required"))?;
            let number = |k: &str, default: u32| -> Result<u32, ConfigError> {
                match up.get(k) {
                    None => Ok(default),
                    Some(v) => v
                        .as_integer()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| ConfigError::new(key(k), "must be a whole number >= 0")),
                }
            };
            out.push(Balance {
                route: model.to_string(),
                upstream: name.to_string(),
                priority: number("priority", 0)?,
                weight: number("weight", patchbay_config::DEFAULT_UPSTREAM_WEIGHT)?,
            });
        }
    }
    Ok(out)
}

/// The config file at `path`, read and parsed.
fn read_doc(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new("--config", format!("cannot read {}: {e}", path.display()))
    })?;
    toml::from_str(&text).map_err(|e| toml_error(&e))
}

/// Applies the `PATCHBAY_<SECTION>_<KEY>` overrides (and the pool's
/// short names) from `env` to a parsed config file ([`crate::config_env`]).
pub fn apply_env_overrides(
    doc: &mut toml::Table,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    config_env::apply(doc, env).map_err(ConfigError::from)
}

impl From<config_env::EnvError> for ConfigError {
    fn from(e: config_env::EnvError) -> Self {
        ConfigError::new(e.var, e.message)
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
    use crate::config_env::{section_keys, TABLE_SECTIONS};
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
    fn a_route_may_list_upstreams_each_with_its_key_and_one_protocol() {
        let dir = std::env::temp_dir().join(format!("pb-ups-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key_file = dir.join("azure-key");
        std::fs::write(&key_file, "az-key\n").unwrap();
        let toml = format!(
            "[[routes]]\nmodel = \"gpt-realtime\"\n\
             [[routes.upstreams]]\nname = \"openai\"\nupstream_url = \"wss://api.openai.com/v1/realtime\"\n\
             api_key_env = \"OPENAI_API_KEY\"\nweight = 3\n\
             [[routes.upstreams]]\nname = \"azure\"\nprovider = \"azure\"\n\
             upstream_url = \"wss://r.openai.azure.com/openai/v1/realtime\"\n\
             upstream_model = \"dep\"\napi_key_file = \"{}\"\npriority = 1\n",
            key_file.display()
        );
        let c = Config::from_toml_with_env(&toml, &env_of(BASE_ENV)).unwrap();
        let ups = &c.routes[0].upstreams;
        assert_eq!(ups.len(), 2);
        assert_eq!(
            (ups[0].name.as_str(), ups[0].weight, ups[0].priority),
            ("openai", 3, 0)
        );
        assert_eq!(ups[0].api_key.current().expose(), "sk-up");
        assert_eq!(
            (ups[1].name.as_str(), ups[1].weight, ups[1].priority),
            ("azure", 1, 1)
        );
        assert_eq!(ups[1].api_key.current().expose(), "az-key");
        assert_eq!(ups[1].upstream_model(&c.routes[0]), "dep");

        // The shorthand is a list of one named after the model.
        let c = Config::from_toml_with_env("", &env_of(BASE_ENV)).unwrap();
        assert_eq!(c.routes[0].upstreams.len(), 1);
        assert_eq!(c.routes[0].upstreams[0].name, "gpt-realtime");

        let both = toml.replace(
            "model = \"gpt-realtime\"\n",
            "model = \"gpt-realtime\"\nupstream_url = \"wss://x/v1/realtime\"\n",
        );
        let e = Config::from_toml_with_env(&both, &env_of(BASE_ENV)).unwrap_err();
        assert_eq!(e.key, "routes[0].upstreams", "{e}");
        let mixed = toml.replace("priority = 1\n", "priority = 1\nprotocol = \"beta\"\n");
        let e = Config::from_toml_with_env(&mixed, &env_of(BASE_ENV)).unwrap_err();
        assert_eq!(e.key, "routes[0].upstreams[1].protocol", "{e}");
        assert!(e.to_string().contains("one protocol"), "{e}");
        let dup = toml.replace("name = \"azure\"", "name = \"openai\"");
        let e = Config::from_toml_with_env(&dup, &env_of(BASE_ENV)).unwrap_err();
        assert_eq!(e.key, "routes[0].upstreams[1].name", "{e}");
        let bad = toml.replace("wss://r.openai", "https://r.openai");
        let e = Config::from_toml_with_env(&bad, &env_of(BASE_ENV)).unwrap_err();
        assert_eq!(e.key, "routes[0].upstreams[1].upstream_url", "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn balances_are_read_from_the_config_text_for_live_reloads() {
        let text = "[[routes]]\nmodel = \"m\"\n[[routes.upstreams]]\nname = \"a\"\nweight = 4\n\
                    [[routes.upstreams]]\nname = \"b\"\npriority = 2\n";
        assert_eq!(
            balances_from_toml(text).unwrap(),
            vec![
                Balance {
                    route: "m".into(),
                    upstream: "a".into(),
                    priority: 0,
                    weight: 4
                },
                Balance {
                    route: "m".into(),
                    upstream: "b".into(),
                    priority: 2,
                    weight: 1
                },
            ]
        );
        let e = balances_from_toml(&text.replace("weight = 4", "weight = -1")).unwrap_err();
        assert_eq!(e.key, "routes[0].upstreams[0].weight");
    }

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
        assert_eq!(c.routes[0].api_key.current().expose(), "sk-up");
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
            ("server", "breaker_open_secs"),
            ("server", "breaker_max_open_secs"),
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

    /// Every key of every section can be set from the environment: the
    /// keys probed are the section's own, as serde names them when it
    /// refuses an unknown one.
    #[test]
    fn every_key_of_every_section_has_its_env_override() {
        for section in TABLE_SECTIONS {
            let err =
                Config::from_toml_with_env(&format!("[{section}]\nnot_a_key = 1\n"), &|_| None)
                    .unwrap_err()
                    .to_string();
            let expected = err
                .split_once("expected one of ")
                .or_else(|| err.split_once("expected "))
                .unwrap_or_else(|| panic!("[{section}]: {err}"))
                .1;
            let mut known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
            known.sort_unstable();
            let mut probed = section_keys(section).to_vec();
            probed.sort_unstable();
            assert_eq!(probed, known, "[{section}]");
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

    /// A file under the temp dir holding `text`; removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(text: &str) -> Self {
            let path =
                std::env::temp_dir().join(format!("patchbay-config-{}", crate::ids::short_id()));
            std::fs::write(&path, text).unwrap();
            Self(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn file_route(file: &Path, env_line: &str) -> String {
        format!(
            "[[routes]]\nmodel = \"m\"\nupstream_url = \"wss://api.openai.com/v1/realtime\"\n\
             api_key_file = \"{}\"\n{env_line}\n",
            file.display()
        )
    }

    #[test]
    fn the_upstream_key_is_read_from_its_file_trimmed() {
        let key = TempFile::new("sk-from-file\n");
        let c = Config::from_toml_with_env(&file_route(&key.0, ""), &env_of(BASE_ENV)).unwrap();
        assert_eq!(c.routes[0].api_key.current().expose(), "sk-from-file");
    }

    #[test]
    fn an_upstream_key_file_that_is_missing_empty_or_doubled_by_an_env_var_is_named() {
        let env = env_of(BASE_ENV);
        let missing = std::env::temp_dir().join("patchbay-config-no-such-key-file");
        let e = Config::from_toml_with_env(&file_route(&missing, ""), &env).unwrap_err();
        assert_eq!(e.key, "routes[0].api_key_file", "{e}");
        let empty = TempFile::new(" \n");
        let e = Config::from_toml_with_env(&file_route(&empty.0, ""), &env).unwrap_err();
        assert_eq!(e.key, "routes[0].api_key_file", "{e}");
        assert!(e.to_string().contains("is empty"), "{e}");
        let key = TempFile::new("sk-1");
        let both = file_route(&key.0, "api_key_env = \"OPENAI_API_KEY\"");
        let e = Config::from_toml_with_env(&both, &env).unwrap_err();
        assert_eq!(e.key, "routes[0].api_key_file", "{e}");
        let neither = "[[routes]]\nmodel = \"m\"\nupstream_url = \"wss://a.example/v1/realtime\"\n";
        let e = Config::from_toml_with_env(neither, &env).unwrap_err();
        assert_eq!(e.key, "routes[0].api_key_env", "{e}");
    }

    #[test]
    fn the_redis_url_is_read_from_its_file_and_checked() {
        let env = env_of(BASE_ENV);
        let url = TempFile::new("redis://127.0.0.1:6379/3\n");
        let toml = format!("[store]\nredis_url_file = \"{}\"\n", url.0.display());
        let c = Config::from_toml_with_env(&toml, &env).unwrap();
        assert_eq!(
            c.store.redis_url.as_ref().map(Secret::expose),
            Some("redis://127.0.0.1:6379/3")
        );
        let bad = TempFile::new("http://127.0.0.1:6379");
        let toml = format!("[store]\nredis_url_file = \"{}\"\n", bad.0.display());
        let e = Config::from_toml_with_env(&toml, &env).unwrap_err();
        assert_eq!(e.key, "store.redis_url_file", "{e}");
        assert!(
            !e.to_string().contains("127.0.0.1"),
            "the URL is not echoed: {e}"
        );
        let toml = format!(
            "[store]\nredis_url_file = \"{}\"\nredis_url_env = \"R\"\n",
            url.0.display()
        );
        let e = Config::from_toml_with_env(&toml, &env).unwrap_err();
        assert_eq!(e.key, "store.redis_url_file", "{e}");
    }

    #[test]
    fn the_live_part_is_metering_and_prices_with_their_env_overrides() {
        let text = "[server]\nlisten = \"127.0.0.1:1\"\n[metering]\nflush_secs = 3\nunpriced = \"block\"\n\
                    [[prices]]\nmodel = \"m\"\ntext_input = 1.0\n";
        let live = live_from_toml(text, &env_of(&[])).unwrap();
        assert_eq!(live.metering.flush_secs, 3);
        assert_eq!(live.metering.unpriced, Unpriced::Block);
        assert_eq!(live.prices[0].text_input, 1.0);
        let env = env_of(&[("PATCHBAY_METERING_FLUSH_SECS", "7")]);
        assert_eq!(live_from_toml(text, &env).unwrap().metering.flush_secs, 7);
        assert_eq!(
            live_from_toml("", &env_of(&[])).unwrap().metering,
            MeteringConfig::default()
        );
    }

    #[test]
    fn an_invalid_live_part_is_refused_naming_the_key() {
        for (text, key) in [
            ("[metering]\nflush_secs = \"soon\"\n", "metering.flush_secs"),
            (
                "[metering]\nflush_secs = 99999999999\n",
                "metering.flush_secs",
            ),
            ("[metering]\nflush = 1\n", "metering."),
            (
                "[[prices]]\nmodel = \"m\"\ntext_input = -1.0\n",
                "prices[0].text_input",
            ),
        ] {
            let e = live_from_toml(text, &env_of(&[])).unwrap_err();
            assert!(e.key.starts_with(key), "{text}: {e}");
        }
    }

    #[test]
    fn a_price_above_the_ceiling_is_refused_at_load_and_on_reload_naming_the_key() {
        let row =
            |v: &str| format!("[[prices]]\nmodel = \"m\"\ntext_input = 1.0\naudio_output = {v}\n");
        for v in ["1e308", "1000000.5"] {
            let e = Config::from_toml_with_env(&row(v), &env_of(BASE_ENV)).unwrap_err();
            assert_eq!(e.key, "prices[0].audio_output", "{v}: {e}");
            assert!(e.to_string().contains("prices[0].audio_output"), "{e}");
            assert!(e.message.contains("1000000"), "the ceiling is named: {e}");
            let e = live_from_toml(&row(v), &env_of(&[])).unwrap_err();
            assert_eq!(e.key, "prices[0].audio_output", "{v}: {e}");
        }
        let c = Config::from_toml_with_env(&row("1000000.0"), &env_of(BASE_ENV)).unwrap();
        assert_eq!(
            c.prices[0].audio_output, 1_000_000.0,
            "the ceiling itself is allowed"
        );
    }

    #[test]
    fn a_per_minute_price_is_bounded_and_a_model_priced_twice_is_refused() {
        let row = |v: &str| {
            format!("[[prices]]\nmodel = \"gpt-live-transcribe\"\nusd_per_minute = {v}\n")
        };
        let c = Config::from_toml_with_env(&row("0.017"), &env_of(BASE_ENV)).unwrap();
        assert_eq!(c.prices[0].usd_per_minute, Some(0.017));
        let c = Config::from_toml_with_env(&row("1000.0"), &env_of(BASE_ENV)).unwrap();
        assert_eq!(
            c.prices[0].usd_per_minute,
            Some(1000.0),
            "the ceiling itself"
        );
        for v in ["1000.5", "-0.01", "1e308", "nan", "inf"] {
            let e = Config::from_toml_with_env(&row(v), &env_of(BASE_ENV)).unwrap_err();
            assert_eq!(e.key, "prices[0].usd_per_minute", "{v}: {e}");
            assert!(e.message.contains("USD per minute"), "{e}");
            let e = live_from_toml(&row(v), &env_of(&[])).unwrap_err();
            assert_eq!(e.key, "prices[0].usd_per_minute", "{v}: {e}");
        }
        // Two rows for one model (one per-minute, one per token) are ambiguous.
        let twice = "[[prices]]\nmodel = \"m\"\ntext_input = 1.0\n\
                     [[prices]]\nmodel = \"m\"\nusd_per_minute = 0.01\n";
        let e = Config::from_toml_with_env(twice, &env_of(BASE_ENV)).unwrap_err();
        assert_eq!(e.key, "prices[1].model", "{e}");
        assert!(e.message.contains("prices[0]"), "{e}");
        // One row per upstream is not.
        let per_upstream = "[[prices]]\nmodel = \"m\"\ntext_input = 1.0\n\
                            [[prices]]\nmodel = \"m\"\nupstream = \"b\"\ntext_input = 2.0\n";
        live_from_toml(per_upstream, &env_of(&[])).unwrap();
    }

    #[test]
    fn max_turn_usd_defaults_to_100_and_must_be_finite_and_positive() {
        let c = Config::from_toml_with_env("", &env_of(BASE_ENV)).unwrap();
        assert_eq!(c.metering.max_turn_usd, 100.0);
        let c = Config::from_toml_with_env("[metering]\nmax_turn_usd = 2.5\n", &env_of(BASE_ENV))
            .unwrap();
        assert_eq!(c.metering.max_turn_usd, 2.5);
        let mut env: Vec<(&str, &str)> = BASE_ENV.to_vec();
        env.push(("PATCHBAY_METERING_MAX_TURN_USD", "7"));
        let c = Config::from_toml_with_env("", &env_of(&env)).unwrap();
        assert_eq!(c.metering.max_turn_usd, 7.0);
        for v in ["0.0", "-1.0", "nan", "inf"] {
            let text = format!("[metering]\nmax_turn_usd = {v}\n");
            let e = Config::from_toml_with_env(&text, &env_of(BASE_ENV)).unwrap_err();
            assert_eq!(e.key, "metering.max_turn_usd", "{v}: {e}");
            let e = live_from_toml(&text, &env_of(&[])).unwrap_err();
            assert_eq!(e.key, "metering.max_turn_usd", "{v}: {e}");
        }
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
        let c = with(
            "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
            "replica_acks = 1",
        )
        .unwrap();
        assert_eq!(c.store.replica_acks, 1);
        let e = with("redis://127.0.0.1:6379", "replica_acks = 17").unwrap_err();
        assert_eq!(e.key, "store.replica_acks");
        assert!(e.message.contains("at most 16"), "{e}");
    }

    #[test]
    fn a_mint_requests_ttl_bounds_are_the_configs() {
        // `client_secret::request` keeps its own names for the bounds it holds a mint request
        // to; they must be the ones `client_secrets.max_ttl_secs` is checked against.
        use crate::client_secret::request::{MAX_TTL_SECS, MIN_TTL_SECS};
        assert_eq!(MIN_TTL_SECS, patchbay_config::MIN_CLIENT_SECRET_TTL_SECS);
        assert_eq!(MAX_TTL_SECS, patchbay_config::MAX_CLIENT_SECRET_TTL_SECS);
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
