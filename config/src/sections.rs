//! The sections of `gateway.toml` a renderer writes: `[[routes]]` (with `[[routes.upstreams]]`),
//! `[pool]`, `[relay]`, `[limits]`, `[metering]`, `[[prices]]`, `[store]`, `[keys]`, `[drain]` and
//! `[client_secrets]`. `[server]` and the document itself stay in the gateway: their defaults and
//! helpers belong to its runtime (the circuit breaker, the master key, the file's path).
//!
//! Reading is the gateway's: unknown keys are errors (`deny_unknown_fields`), so a typo never
//! silently falls back to a default, and every key left out takes the default written here. The
//! gateway validates what it read afterwards, in its loader.
//!
//! Writing is the operator's, and writes what a renderer chose: an unset optional key is left out,
//! and so are the gateway-only tunings (`pool.warmup_timeout_secs`, `metering.stream_maxlen`,
//! `metering.max_turn_usd`, a route's `budget_period`) while at their defaults, and `client_secrets.max_ttl_secs` while it is
//! the API's own maximum. The loader reads each left-out key as that same default, so a written
//! config reads back as the value that was written. A route that lists upstreams is written
//! without the single-upstream keys, which the loader would refuse (`upstream_url`,
//! `api_key_env`, `api_key_file`) or ignore next to a list.
//!
//! Two things are resolved by the gateway while loading and have no place in the file: a route's
//! upstream key and the store's Redis URL. They are the type parameters `K` and `U`, skipped by
//! serde: `()` for a renderer, the gateway's secret types once loaded (its `config` module names
//! `RouteConfig<UpstreamKey>` and `StoreConfig<Secret>` as its `RouteConfig` and `StoreConfig`).

use std::borrow::Cow;
use std::path::PathBuf;

use serde::{Deserialize, Serialize, Serializer};

use crate::bounds::MAX_CLIENT_SECRET_TTL_SECS;
use crate::enums::{BudgetPeriod, DrainMode, Endpoint, Intent, Protocol, Provider, Unpriced};
use crate::upstream_url::OPENAI_REALTIME_URL;

/// A listed upstream's `weight` when it names none.
pub const DEFAULT_UPSTREAM_WEIGHT: u32 = 1;
const DEFAULT_POOL_WARMUP_TIMEOUT_SECS: u64 = 10;
const DEFAULT_STREAM_MAXLEN: usize = 1_000_000;
/// Default `[metering] max_turn_usd`, USD: the most one turn is charged when its usage is
/// implausible, and the most a turn may cost before it is. The dearest real turn is a full
/// context window of audio in and the longest answer of audio out: 128k + 32k tokens on
/// `gpt-realtime-2`, about 6 USD at its audio rates (32 and 64 USD per 1M tokens); this is over
/// fifteen times that.
pub const DEFAULT_MAX_TURN_USD: f64 = 100.0;

/// A `[[routes]]` entry: one model, served by one upstream (the shorthand keys) or several
/// (`[[routes.upstreams]]`). `K` is the upstream key the gateway resolves while loading.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "K: Default"))]
pub struct RouteConfig<K = ()> {
    /// What clients put in `?model=`.
    pub model: String,
    /// The single-upstream shorthand: `provider`, `upstream_url`,
    /// `upstream_model`, `api_key_env` and `ca_file` describe one upstream
    /// named after the route's model. Leave them out and list
    /// `[[routes.upstreams]]` instead for several.
    #[serde(default)]
    pub provider: Provider,
    #[serde(default)]
    pub upstream_url: String,
    /// Model (OpenAI) or deployment (Azure) sent upstream; defaults to `model`.
    pub upstream_model: Option<String>,
    #[serde(default)]
    pub protocol: Protocol,
    /// `transcription`: the route serves `?intent=transcription` sessions
    /// that name no model (at most one route has it), and its upstreams are
    /// dialled with `intent=transcription` and a model only when
    /// `upstream_model` names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<Intent>,
    /// `translations`: clients connect at `/v1/realtime/translations` and
    /// the upstream URL is OpenAI's translation endpoint; sessions are
    /// metered by the audio they carry.
    #[serde(default)]
    pub endpoint: Endpoint,
    /// Environment variable holding the upstream key (or use `api_key_file`).
    #[serde(default)]
    pub api_key_env: String,
    /// File holding the upstream key (a mounted Secret), re-read when it changes.
    pub api_key_file: Option<PathBuf>,
    /// Extra trust root (PEM) for a wss upstream.
    pub ca_file: Option<PathBuf>,
    pub budget_usd: Option<f64>,
    #[serde(default)]
    pub budget_period: BudgetPeriod,
    /// Resolved from `api_key_env` or `api_key_file` during validation; swapped when the file
    /// changes.
    #[serde(skip)]
    pub api_key: K,
    /// The route's upstreams; after validation never empty (the shorthand
    /// becomes a list of one).
    #[serde(default)]
    pub upstreams: Vec<UpstreamConfig<K>>,
}

/// One upstream of a route (`[[routes.upstreams]]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, bound(deserialize = "K: Default", serialize = ""))]
pub struct UpstreamConfig<K = ()> {
    /// Appears in rows, logs and metric labels; unique within the route.
    pub name: String,
    #[serde(default)]
    pub provider: Provider,
    pub upstream_url: String,
    /// Model (OpenAI) or deployment (Azure); defaults to the route's model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_model: Option<String>,
    /// Must equal the route's `protocol` (clients must not see event names
    /// change between sessions); may be left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// Environment variable holding this upstream's key (or use
    /// `api_key_file`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_key_env: String,
    /// File holding this upstream's key (a mounted Secret), re-read when it
    /// changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Lower is preferred; upstreams of equal priority share by weight.
    #[serde(default)]
    pub priority: u32,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Resolved during validation; shared with the dialler, swapped when the
    /// key file changes.
    #[serde(skip)]
    pub api_key: K,
}

fn default_weight() -> u32 {
    DEFAULT_UPSTREAM_WEIGHT
}

impl<K> UpstreamConfig<K> {
    /// The model or deployment sent upstream.
    pub fn upstream_model<'a>(&'a self, route: &'a RouteConfig<K>) -> &'a str {
        self.upstream_model.as_deref().unwrap_or(&route.model)
    }
}

impl<K: Default> Default for RouteConfig<K> {
    fn default() -> Self {
        Self {
            model: "gpt-realtime".into(),
            provider: Provider::Openai,
            upstream_url: OPENAI_REALTIME_URL.into(),
            upstream_model: None,
            protocol: Protocol::Ga,
            intent: None,
            endpoint: Endpoint::Realtime,
            api_key_env: "OPENAI_API_KEY".into(),
            api_key_file: None,
            ca_file: None,
            budget_usd: None,
            budget_period: BudgetPeriod::Total,
            api_key: K::default(),
            upstreams: Vec::new(),
        }
    }
}

impl<K> RouteConfig<K> {
    pub fn upstream_model(&self) -> &str {
        self.upstream_model.as_deref().unwrap_or(&self.model)
    }
}

impl<K: Clone> RouteConfig<K> {
    /// The route's upstreams: the validated list, or (for a route built in
    /// code without validation) the shorthand as a list of one.
    pub fn upstream_list(&self) -> Cow<'_, [UpstreamConfig<K>]> {
        if self.upstreams.is_empty() {
            Cow::Owned(vec![self.shorthand_upstream()])
        } else {
            Cow::Borrowed(&self.upstreams)
        }
    }

    /// The single-upstream keys as one upstream named after the model.
    fn shorthand_upstream(&self) -> UpstreamConfig<K> {
        UpstreamConfig {
            name: self.model.clone(),
            provider: self.provider,
            upstream_url: self.upstream_url.clone(),
            upstream_model: self.upstream_model.clone(),
            protocol: Some(self.protocol),
            api_key_env: self.api_key_env.clone(),
            api_key_file: self.api_key_file.clone(),
            ca_file: self.ca_file.clone(),
            priority: 0,
            weight: DEFAULT_UPSTREAM_WEIGHT,
            api_key: self.api_key.clone(),
        }
    }
}

/// A route as written: the shorthand keys only without a list (see the module doc).
impl<K> Serialize for RouteConfig<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(bound = "")]
        struct Written<'a, K> {
            model: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            provider: Option<Provider>,
            #[serde(skip_serializing_if = "Option::is_none")]
            upstream_url: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            upstream_model: Option<&'a str>,
            protocol: Protocol,
            #[serde(skip_serializing_if = "Option::is_none")]
            intent: Option<Intent>,
            #[serde(skip_serializing_if = "is_default")]
            endpoint: Endpoint,
            #[serde(skip_serializing_if = "Option::is_none")]
            api_key_env: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            api_key_file: Option<&'a PathBuf>,
            #[serde(skip_serializing_if = "Option::is_none")]
            ca_file: Option<&'a PathBuf>,
            #[serde(skip_serializing_if = "Option::is_none")]
            budget_usd: Option<f64>,
            #[serde(skip_serializing_if = "is_default")]
            budget_period: BudgetPeriod,
            /// Last: TOML writes arrays of tables after the plain keys.
            #[serde(skip_serializing_if = "<[_]>::is_empty")]
            upstreams: &'a [UpstreamConfig<K>],
        }
        // No `..`: a new key fails to compile until it is written.
        let Self {
            model,
            provider,
            upstream_url,
            upstream_model,
            protocol,
            intent,
            endpoint,
            api_key_env,
            api_key_file,
            ca_file,
            budget_usd,
            budget_period,
            api_key: _,
            upstreams,
        } = self;
        let shorthand = upstreams.is_empty();
        Written {
            model,
            provider: shorthand.then_some(*provider),
            upstream_url: shorthand.then_some(upstream_url.as_str()),
            upstream_model: upstream_model.as_deref().filter(|_| shorthand),
            protocol: *protocol,
            intent: *intent,
            endpoint: *endpoint,
            api_key_env: Some(api_key_env.as_str()).filter(|e| shorthand && !e.is_empty()),
            api_key_file: api_key_file.as_ref().filter(|_| shorthand),
            ca_file: ca_file.as_ref().filter(|_| shorthand),
            budget_usd: *budget_usd,
            budget_period: *budget_period,
            upstreams,
        }
        .serialize(serializer)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Warm sockets per route; 0 disables the pool.
    pub size: usize,
    pub max_idle_secs: u64,
    /// Hard cap on `size`, whatever the size file says.
    pub max_size: usize,
    /// File holding the live size (a bare number or `REALTIME_POOL_SIZE=N`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_file: Option<PathBuf>,
    /// A ConfigMap in the pod's own namespace holding the live size under `REALTIME_POOL_SIZE`,
    /// watched through the Kubernetes API (the pod's ServiceAccount), so a new size arrives in
    /// a moment rather than at the kubelet's next sync of the mounted `size_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_configmap: Option<String>,
    /// `/readyz` waits this long at most for the pool to first fill.
    #[serde(skip_serializing_if = "is_default_warmup")]
    pub warmup_timeout_secs: u64,
}

fn is_default_warmup(secs: &u64) -> bool {
    *secs == DEFAULT_POOL_WARMUP_TIMEOUT_SECS
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            size: 4,
            max_idle_secs: 30,
            max_size: 512,
            size_file: None,
            size_configmap: None,
            warmup_timeout_secs: DEFAULT_POOL_WARMUP_TIMEOUT_SECS,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
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

#[derive(Debug, Clone, Deserialize, Serialize)]
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

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeteringConfig {
    /// 0 = flush after every turn, budgets re-read every second.
    pub flush_secs: u64,
    pub unpriced: Unpriced,
    /// Cap of the Redis request-log stream (`XADD MAXLEN ~`).
    #[serde(skip_serializing_if = "is_default_stream_maxlen")]
    pub stream_maxlen: usize,
    /// USD: the most one turn whose usage is implausible is charged (a finite number > 0).
    #[serde(skip_serializing_if = "is_default_max_turn_usd")]
    pub max_turn_usd: f64,
}

fn is_default_stream_maxlen(maxlen: &usize) -> bool {
    *maxlen == DEFAULT_STREAM_MAXLEN
}

fn is_default_max_turn_usd(usd: &f64) -> bool {
    *usd == DEFAULT_MAX_TURN_USD
}

impl Default for MeteringConfig {
    fn default() -> Self {
        Self {
            flush_secs: 15,
            unpriced: Unpriced::Allow,
            stream_maxlen: DEFAULT_STREAM_MAXLEN,
            max_turn_usd: DEFAULT_MAX_TURN_USD,
        }
    }
}

/// The prices of one model: USD per 1M tokens for token usage, and USD per minute of audio for
/// duration usage (`usd_per_minute`). Which rate a usage takes is decided by the usage's shape,
/// never by the row: duration usage (`{"type": "duration", "seconds": S}`) is charged
/// `S / 60 × usd_per_minute`, token usage by the token rates. A row without `usd_per_minute` does
/// not price duration usage; a row with `usd_per_minute` and no token rate (all of them 0) does
/// not price token usage ([`PriceRow::prices_tokens`]); either is then unpriced (the `unpriced`
/// policy applies).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PriceRow {
    pub model: String,
    /// Prices only sessions on the route upstream of this name (several
    /// upstreams per route); a row without it prices every upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
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
    /// USD per minute of audio, for duration usage (input transcription reported as
    /// `{"type": "duration", "seconds": S}`); unset, the row prices no duration usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_minute: Option<f64>,
}

impl PriceRow {
    /// The token rates, with their keys, in the file's order.
    pub fn token_rates(&self) -> [(&'static str, f64); 6] {
        [
            ("text_input", self.text_input),
            ("cached_text_input", self.cached_text_input),
            ("audio_input", self.audio_input),
            ("cached_audio_input", self.cached_audio_input),
            ("text_output", self.text_output),
            ("audio_output", self.audio_output),
        ]
    }

    /// Whether the row prices token usage: every row does, except one that sets
    /// `usd_per_minute` and no token rate (a per-minute model: its token usage, if any came, would
    /// otherwise be charged 0 without the `unpriced` policy seeing it).
    pub fn prices_tokens(&self) -> bool {
        self.usd_per_minute.is_none() || self.token_rates().iter().any(|(_, r)| *r != 0.0)
    }

    /// Whether the row prices duration usage (it sets `usd_per_minute`).
    pub fn prices_duration(&self) -> bool {
        self.usd_per_minute.is_some()
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// `[store]`. `U` is the Redis URL the gateway resolves while loading.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, bound(deserialize = "", serialize = ""))]
pub struct StoreConfig<U = ()> {
    /// Env var holding the Redis URL; unset (and no `redis_url_file`) = in-memory store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url_env: Option<String>,
    /// File holding the Redis URL (a mounted Secret).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url_file: Option<PathBuf>,
    /// PEM file of the CA(s) a `rediss://` server's certificate must chain
    /// to (private CAs); unset = the public webpki roots. Verification is
    /// always on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Replicas that must confirm each metering write (`WAIT`) before the
    /// outbox lets it go; 0 = none (Redis's asynchronous replication: a
    /// primary lost right after a write may take it along).
    #[serde(skip_serializing_if = "is_zero")]
    pub replica_acks: u32,
    /// Resolved from `redis_url_env` or `redis_url_file` during validation.
    #[serde(skip)]
    pub redis_url: Option<U>,
}

impl<U> Default for StoreConfig<U> {
    fn default() -> Self {
        Self {
            redis_url_env: None,
            redis_url_file: None,
            ca_file: None,
            replica_acks: 0,
            redis_url: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct KeysConfig {
    /// TOML file of `[[keys]]` (and `[[teams]]`); re-read when it changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
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
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientSecretsConfig {
    /// Files each holding one signing key (at least 32 bytes, whitespace
    /// trimmed): the first signs, all verify; re-read live. Empty: a random
    /// key made at start, so secrets work on this process only.
    pub signing_key_files: Vec<PathBuf>,
    /// Cap on `expires_after.seconds` (10..=7200).
    #[serde(skip_serializing_if = "is_max_ttl")]
    pub max_ttl_secs: u64,
}

fn is_max_ttl(secs: &u64) -> bool {
    *secs == MAX_CLIENT_SECRET_TTL_SECS
}

impl Default for ClientSecretsConfig {
    fn default() -> Self {
        Self {
            signing_key_files: Vec::new(),
            max_ttl_secs: MAX_CLIENT_SECRET_TTL_SECS,
        }
    }
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed() -> RouteConfig {
        RouteConfig {
            model: "m".into(),
            upstreams: vec![
                UpstreamConfig {
                    name: "a".into(),
                    provider: Provider::Openai,
                    upstream_url: OPENAI_REALTIME_URL.into(),
                    upstream_model: None,
                    protocol: None,
                    api_key_env: String::new(),
                    api_key_file: Some("/k/a".into()),
                    ca_file: None,
                    priority: 0,
                    weight: 3,
                    api_key: (),
                },
                UpstreamConfig {
                    name: "b".into(),
                    provider: Provider::Azure,
                    upstream_url: "wss://b.openai.azure.com/openai/v1/realtime".into(),
                    upstream_model: Some("dep".into()),
                    protocol: Some(Protocol::Beta),
                    api_key_env: "B_KEY".into(),
                    api_key_file: None,
                    ca_file: Some("/k/ca.pem".into()),
                    priority: 1,
                    weight: 1,
                    api_key: (),
                },
            ],
            protocol: Protocol::Beta,
            ..RouteConfig::default()
        }
    }

    fn keys(table: &toml::Table) -> Vec<&str> {
        table.keys().map(String::as_str).collect()
    }

    #[test]
    fn a_listed_route_is_written_without_the_single_upstream_keys_and_reads_back() {
        let route = listed();
        let text = toml::to_string(&route).unwrap();
        let doc: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(keys(&doc), ["model", "protocol", "upstreams"], "{text}");
        let ups = doc["upstreams"].as_array().unwrap();
        let first = ups[0].as_table().unwrap();
        assert_eq!(
            keys(first),
            [
                "api_key_file",
                "name",
                "priority",
                "provider",
                "upstream_url",
                "weight"
            ],
            "unset keys are left out, priority and weight never"
        );
        let back: RouteConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.protocol, Protocol::Beta);
        assert_eq!(back.upstreams.len(), 2);
        let b = &back.upstreams[1];
        assert_eq!(
            (
                b.provider,
                b.upstream_model(&back),
                b.protocol,
                b.api_key_env.as_str()
            ),
            (Provider::Azure, "dep", Some(Protocol::Beta), "B_KEY")
        );
        assert_eq!(
            b.ca_file.as_deref(),
            Some(std::path::Path::new("/k/ca.pem"))
        );
    }

    #[test]
    fn a_shorthand_route_is_written_with_its_keys_and_reads_back_as_a_list_of_one() {
        let route = RouteConfig {
            model: "m".into(),
            provider: Provider::Azure,
            upstream_url: "wss://r.openai.azure.com/openai/v1/realtime".into(),
            upstream_model: Some("dep".into()),
            api_key_env: String::new(),
            api_key_file: Some("/k/key".into()),
            budget_usd: Some(5.0),
            budget_period: BudgetPeriod::Daily,
            ..RouteConfig::default()
        };
        let text = toml::to_string(&route).unwrap();
        let doc: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(
            keys(&doc),
            [
                "api_key_file",
                "budget_period",
                "budget_usd",
                "model",
                "protocol",
                "provider",
                "upstream_model",
                "upstream_url"
            ],
            "{text}"
        );
        let back: RouteConfig = toml::from_str(&text).unwrap();
        let list = back.upstream_list();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].name, "m");
        assert_eq!(list[0].provider, Provider::Azure);
        assert_eq!(list[0].upstream_model(&back), "dep");
        assert_eq!(list[0].protocol, Some(Protocol::Ga));
        assert_eq!(back.budget_period, BudgetPeriod::Daily);
        let total = RouteConfig::<()> {
            budget_period: BudgetPeriod::Total,
            ..route
        };
        let doc: toml::Table = toml::from_str(&toml::to_string(&total).unwrap()).unwrap();
        assert!(
            !doc.contains_key("budget_period"),
            "the default is left out"
        );
    }

    #[test]
    fn gateway_only_tunings_are_left_out_at_their_defaults_and_read_back_as_them() {
        let pool: toml::Table =
            toml::from_str(&toml::to_string(&PoolConfig::default()).unwrap()).unwrap();
        assert_eq!(keys(&pool), ["max_idle_secs", "max_size", "size"]);
        let metering: toml::Table =
            toml::from_str(&toml::to_string(&MeteringConfig::default()).unwrap()).unwrap();
        assert_eq!(keys(&metering), ["flush_secs", "unpriced"]);
        let secrets: toml::Table =
            toml::from_str(&toml::to_string(&ClientSecretsConfig::default()).unwrap()).unwrap();
        assert_eq!(keys(&secrets), ["signing_key_files"]);
        let back: MeteringConfig =
            toml::from_str("flush_secs = 15\nunpriced = \"allow\"\n").unwrap();
        assert_eq!(back, MeteringConfig::default());
        let capped = MeteringConfig {
            max_turn_usd: 5.0,
            ..MeteringConfig::default()
        };
        let back: MeteringConfig = toml::from_str(&toml::to_string(&capped).unwrap()).unwrap();
        assert_eq!(back.max_turn_usd, 5.0, "a tuned value is written");
        let tuned = PoolConfig {
            warmup_timeout_secs: 3,
            ..PoolConfig::default()
        };
        let back: PoolConfig = toml::from_str(&toml::to_string(&tuned).unwrap()).unwrap();
        assert_eq!(back.warmup_timeout_secs, 3, "a tuned value is written");
        let capped = ClientSecretsConfig {
            max_ttl_secs: 600,
            ..ClientSecretsConfig::default()
        };
        let back: ClientSecretsConfig = toml::from_str(&toml::to_string(&capped).unwrap()).unwrap();
        assert_eq!(back.max_ttl_secs, 600);
        let store: toml::Table =
            toml::from_str(&toml::to_string(&StoreConfig::<()>::default()).unwrap()).unwrap();
        assert!(store.is_empty(), "an unset store writes no key");
    }

    #[test]
    fn a_price_row_prices_the_usage_shapes_it_has_a_rate_for() {
        let tokens: PriceRow = toml::from_str("model = \"m\"\ntext_input = 1.0\n").unwrap();
        assert!(tokens.prices_tokens() && !tokens.prices_duration());
        // A free model (every token rate 0, no per-minute rate) still prices tokens.
        let free: PriceRow = toml::from_str("model = \"m\"\n").unwrap();
        assert!(free.prices_tokens() && !free.prices_duration());
        let minute: PriceRow =
            toml::from_str("model = \"gpt-live-transcribe\"\nusd_per_minute = 0.017\n").unwrap();
        assert_eq!(minute.usd_per_minute, Some(0.017));
        assert!(minute.prices_duration() && !minute.prices_tokens());
        let both: PriceRow =
            toml::from_str("model = \"m\"\naudio_input = 6.0\nusd_per_minute = 0.006\n").unwrap();
        assert!(both.prices_duration() && both.prices_tokens());
        // Written back only when set.
        assert!(!toml::to_string(&tokens).unwrap().contains("usd_per_minute"));
        let back: PriceRow = toml::from_str(&toml::to_string(&minute).unwrap()).unwrap();
        assert_eq!(back, minute);
    }

    #[test]
    fn unknown_keys_are_refused_by_every_section() {
        let e = toml::from_str::<RouteConfig>("model = \"m\"\nupstream = \"x\"\n").unwrap_err();
        assert!(e.message().starts_with("unknown field `upstream`"), "{e}");
        let e =
            toml::from_str::<UpstreamConfig>("name = \"a\"\nupstream_url = \"x\"\nurl = \"x\"\n")
                .unwrap_err();
        assert!(e.message().starts_with("unknown field `url`"), "{e}");
        assert!(toml::from_str::<PoolConfig>("sise = 1\n").is_err());
        assert!(toml::from_str::<MeteringConfig>("flush = 1\n").is_err());
        assert!(toml::from_str::<PriceRow>("model = \"m\"\naudio = 1.0\n").is_err());
        assert!(toml::from_str::<PriceRow>("model = \"m\"\nusd_per_second = 1.0\n").is_err());
        assert!(toml::from_str::<StoreConfig>("redis_url = \"x\"\n").is_err());
        assert!(toml::from_str::<DrainConfig>("mode = \"close\"\nwait = 1\n").is_err());
        assert!(toml::from_str::<ClientSecretsConfig>("ttl = 1\n").is_err());
    }
}
