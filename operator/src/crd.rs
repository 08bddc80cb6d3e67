//! The `RealtimeRoute` custom resource (`patchbay.dev/v1alpha1`).
//!
//! One route is one model served by one gateway Deployment. The spec is what a user writes; every
//! optional field has a default here, in one place, so the builders never guess. The OpenAPI schema
//! the API server enforces is derived from these types: minimums and enums come from `schemars`
//! attributes; `replicas.min <= replicas.max`, "exactly one of `upstream` and `upstreams`", "all
//! listed upstreams speak one protocol", "listed names are unique" and "exactly one of the signing
//! keys' `key` and `keys`" are CEL rules (`x-kubernetes-validations`). `validate.rs` checks the same
//! for API servers that do not evaluate CEL.
//!
//! Pod-level knobs that Kubernetes already validates (`resources`, `tolerations`, `affinity`) are
//! typed with the `k8s-openapi` structs in Rust but published in the CRD as open objects
//! (`x-kubernetes-preserve-unknown-fields`), so the CRD does not embed a copy of the core schema;
//! the API server validates them when it admits the Deployment.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// The enums are the gateway's own (`patchbay-config`), so the CRD accepts exactly the words
/// `gateway.toml` does; and the upstream URL used when an OpenAI route does not name one.
pub use patchbay_config::{
    DrainMode, Endpoint, Intent, Protocol, Provider, Unpriced, OPENAI_REALTIME_URL,
};
/// The most a price may be, USD per 1M tokens: the gateway's own ceiling, published as each price
/// field's `maximum`.
pub use patchbay_config::{MAX_PRICE_USD_PER_MILLION_TOKENS, MAX_PRICE_USD_PER_MINUTE};

/// API group of the resource.
pub const GROUP: &str = "patchbay.dev";

pub const DEFAULT_REPLICAS_MIN: i32 = 1;
pub const DEFAULT_POOL_MAX_IDLE_SECONDS: i32 = 30;
pub const DEFAULT_POOL_MAX_SIZE: i32 = 512;
pub const DEFAULT_METERING_FLUSH_SECONDS: i32 = 15;
pub const DEFAULT_DRAIN_WAIT_SECONDS: i32 = 10;
pub const DEFAULT_PRE_STOP_SLEEP_SECONDS: i32 = 5;
/// CPU target used when an autoscaled route names no metric at all.
pub const DEFAULT_TARGET_CPU_UTILIZATION_PERCENT: i32 = 70;

/// A model exposed through a pool of Patchbay gateway pods.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "patchbay.dev",
    version = "v1alpha1",
    kind = "RealtimeRoute",
    plural = "realtimeroutes",
    shortname = "rtr",
    namespaced,
    status = "RealtimeRouteStatus",
    derive = "PartialEq",
    doc = "A model served through Patchbay gateway pods: upstream, scaling, warm pool, metering and draining.",
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".spec.model"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas","description":"ready gateway pods"}"#,
    printcolumn = r#"{"name":"Sessions","type":"integer","jsonPath":".status.sessions","description":"live sessions across the pods, at the last scrape"}"#,
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".status.pool","description":"warm upstream sockets / target, summed over the pods"}"#,
    printcolumn = r#"{"name":"Spend/1h","type":"string","jsonPath":".status.spendUSD","description":"USD metered in the last hour"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.replicas","priority":1}"#,
    printcolumn = r#"{"name":"Pool/Pod","type":"integer","jsonPath":".status.poolSizePerPod","description":"warm-pool target per pod","priority":1}"#,
    printcolumn = r#"{"name":"Scraped","type":"date","jsonPath":".status.lastScrapeTime","priority":1}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint","priority":1}"#
)]
#[x_kube(validation = Rule::new(UPSTREAM_XOR_RULE).message("set exactly one of spec.upstream and spec.upstreams"))]
#[serde(rename_all = "camelCase")]
pub struct RealtimeRouteSpec {
    /// Model name clients ask for (`GET /v1/realtime?model=...`).
    #[schemars(length(min = 1))]
    pub model: String,
    /// `transcription`: this route also serves `GET /v1/realtime?intent=transcription`, the
    /// sessions that name no model (the client picks its transcription model in
    /// `session.update`). Only with `endpoint: realtime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<Intent>,
    /// The OpenAI endpoint the route serves: `realtime` (`/v1/realtime`, the default),
    /// `translations` (`/v1/realtime/translations`, `gpt-realtime-translate`; metered by the
    /// audio it carries, so price its model with `usdPerMinute`) or `live`
    /// (`/v1/live/sessions`, GPT-Live; `protocol: ga` only). An OpenAI upstream without a `url`
    /// dials the endpoint's own URL; a named `url` must be the endpoint's.
    #[serde(default)]
    pub endpoint: Endpoint,
    /// Where sessions for this model go: one upstream. Exclusive with `upstreams`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Upstream>,
    /// Several upstreams of one protocol, with failover by `priority` and sharing by `weight`.
    /// Exclusive with `upstream`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(
        validation = Rule::new(UPSTREAMS_ONE_PROTOCOL_RULE).message("all upstreams of a route must speak one protocol"),
        validation = Rule::new(UPSTREAMS_UNIQUE_NAMES_RULE).message("upstream names must be unique within the route")
    )]
    pub upstreams: Vec<NamedUpstream>,
    /// Peak concurrent session connects across all replicas; sizes the per-pod warm pool.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub peak_concurrency: i32,
    /// Replica bounds. `min == max` runs a fixed count without an autoscaler.
    #[serde(default)]
    pub replicas: Replicas,
    /// Autoscaler targets, used when `replicas.max > replicas.min`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    /// Warm pool of upstream sockets in each pod.
    #[serde(default)]
    pub pool: Pool,
    /// Usage metering and prices.
    #[serde(default)]
    pub metering: Metering,
    /// Secret holding the gateway's client key file (TOML).
    pub client_keys_secret_ref: SecretKeyRef,
    /// Shutdown behaviour of a gateway pod.
    #[serde(default)]
    pub drain: Drain,
    /// Pod-level overrides.
    #[serde(default)]
    pub gateway: GatewayPod,
    /// Signing keys and TTL cap of the ephemeral client secrets minted at
    /// `POST /v1/realtime/client_secrets`. Without it each pod signs with a random key of its
    /// own, so a secret minted on one pod is refused by the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secrets: Option<ClientSecrets>,
    /// TLS on the gateway's own client listener, so clients reach the pods with `wss://` (the
    /// official Node SDK dials nothing else). Without it the listener is plain TCP: TLS usually
    /// ends at the cluster's Gateway or Ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTls>,
    /// Reach from outside the cluster through the Gateway API: the operator owns an `HTTPRoute`
    /// (`gateway.networking.k8s.io/v1`) named after the route, attached to these parents, that
    /// sends the OpenAI paths (`/v1/realtime…`, `/v1/live…`, `/openai/v1/…`) to the Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expose: Option<Expose>,
    /// OpenTelemetry export from the gateway pods over OTLP (traces, session events, metrics),
    /// rendered as `gateway.toml`'s `[telemetry]`. Without it nothing is exported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<Telemetry>,
}

/// `spec.telemetry`: where the gateway pods send OTLP, and how much.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Telemetry {
    /// The collector's base URL (`http://otel-collector.observability:4318` for
    /// `http/protobuf`, port 4317 for `grpc`); `https://` for TLS, trusted by the system roots.
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub endpoint: String,
    #[serde(default)]
    pub protocol: OtlpProtocol,
    /// `service.name` of everything exported (default `patchbay-gateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_name: Option<String>,
    /// More resource attributes (`deployment.environment.name: prod`); keys and values without
    /// `,` or `=`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_attributes: BTreeMap<String, String>,
    /// An `OTEL_TRACES_SAMPLER` (default `parentbased_always_on`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces_sampler: Option<TracesSampler>,
    /// The ratio of the `*traceidratio` samplers, 0 to 1 (`OTEL_TRACES_SAMPLER_ARG`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub traces_sampler_ratio: Option<f64>,
}

/// OTLP's transport, as `OTEL_EXPORTER_OTLP_PROTOCOL` spells it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum OtlpProtocol {
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HttpProtobuf => "http/protobuf",
            Self::Grpc => "grpc",
        }
    }
}

/// The trace samplers of the OpenTelemetry specification, by their `OTEL_TRACES_SAMPLER` names.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TracesSampler {
    AlwaysOn,
    AlwaysOff,
    Traceidratio,
    ParentbasedAlwaysOn,
    ParentbasedAlwaysOff,
    ParentbasedTraceidratio,
}

impl TracesSampler {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AlwaysOn => "always_on",
            Self::AlwaysOff => "always_off",
            Self::Traceidratio => "traceidratio",
            Self::ParentbasedAlwaysOn => "parentbased_always_on",
            Self::ParentbasedAlwaysOff => "parentbased_always_off",
            Self::ParentbasedTraceidratio => "parentbased_traceidratio",
        }
    }
}

/// Default of `expose.timeoutSeconds`: an hour, OpenAI's longest session.
pub const DEFAULT_EXPOSE_TIMEOUT_SECONDS: i32 = 3600;

/// Gateway API exposure of a route (`spec.expose`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Expose {
    /// The `Gateway`s (and listeners) the `HTTPRoute` attaches to: Gateway API
    /// `ParentReference`s.
    #[schemars(length(min = 1, max = 32))]
    pub parent_refs: Vec<ParentRef>,
    /// Host names the `HTTPRoute` matches (`HTTPRoute.spec.hostnames`); none: every host the
    /// listener accepts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub hostnames: Vec<String>,
    /// Serve the OpenAI paths under this prefix (`/voice` → `/voice/v1/realtime`), rewritten
    /// to the bare paths before they reach the gateway. Starts with `/`, does not end with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)+$"),
        length(max = 200)
    )]
    pub path_prefix: Option<String>,
    /// The `HTTPRoute` rules' `timeouts.request` and `timeouts.backendRequest`, in seconds: a
    /// WebSocket session is one request, so this bounds a session's length at the Gateway.
    /// `0` asks the implementation to disable them (Gateway API: "0s" SHOULD disable).
    #[serde(default = "default_expose_timeout")]
    #[schemars(range(min = 0, max = 86400))]
    pub timeout_seconds: i32,
}

fn default_expose_timeout() -> i32 {
    DEFAULT_EXPOSE_TIMEOUT_SECONDS
}

/// A Gateway API `ParentReference` (`gateway.networking.k8s.io/v1`): unset fields take the
/// Gateway API's defaults (group `gateway.networking.k8s.io`, kind `Gateway`, the route's
/// namespace).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// A listener name of the Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

/// The certificate of the client listener: a Secret of type `kubernetes.io/tls` (`tls.crt`, the
/// chain, and `tls.key`), as cert-manager's `Certificate` writes it. It is mounted as a
/// directory and the gateway re-reads both files, so a renewal reaches new connections without
/// a restart.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientTls {
    #[schemars(length(min = 1))]
    pub secret_name: String,
}

/// The CEL rule that makes `upstream` and `upstreams` exclusive (and one of them required).
pub const UPSTREAM_XOR_RULE: &str =
    "has(self.upstream) != (has(self.upstreams) && size(self.upstreams) > 0)";

/// CEL: every listed upstream speaks the first one's protocol (the schema defaults `protocol`).
pub const UPSTREAMS_ONE_PROTOCOL_RULE: &str = "self.all(u, u.protocol == self[0].protocol)";
/// CEL: no two listed upstreams share a name.
pub const UPSTREAMS_UNIQUE_NAMES_RULE: &str = "self.all(u, self.exists_one(v, v.name == u.name))";

/// The most upstreams one route may list (`spec.upstreams` `maxItems`).
pub const MAX_UPSTREAMS: usize = 16;
/// Bounds of `clientSecrets.maxTTLSeconds`: the gateway's `[client_secrets] max_ttl_secs`.
pub const MIN_CLIENT_SECRET_TTL_SECONDS: i32 = int32(patchbay_config::MIN_CLIENT_SECRET_TTL_SECS);
pub const MAX_CLIENT_SECRET_TTL_SECONDS: i32 = int32(patchbay_config::MAX_CLIENT_SECRET_TTL_SECS);
/// Least `pool.maxIdleSeconds`: the gateway's `[pool] max_idle_secs`.
pub const MIN_POOL_MAX_IDLE_SECONDS: i32 = int32(patchbay_config::MIN_POOL_MAX_IDLE_SECS);
/// Least `drain.waitSeconds`: the gateway's `[drain] wait_secs`.
pub const MIN_DRAIN_WAIT_SECONDS: i32 = int32(patchbay_config::MIN_DRAIN_WAIT_SECS);
/// Default `weight` of a listed upstream: the gateway's.
pub const DEFAULT_UPSTREAM_WEIGHT: i32 = int32(patchbay_config::DEFAULT_UPSTREAM_WEIGHT as u64);

/// One of several upstreams of a route (`spec.upstreams[]`), rendered as a
/// `[[routes.upstreams]]` entry of the gateway config.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamedUpstream {
    /// Appears in usage rows, logs and metric labels; unique within the route, a DNS label.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    #[serde(default)]
    pub provider: Provider,
    /// WebSocket URL. Defaults to OpenAI's for `provider: openai`; required for Azure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Model (OpenAI) or deployment (Azure) sent upstream, when it differs from `spec.model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub model: Option<String>,
    /// Every entry of a route must speak the same protocol.
    #[serde(default)]
    pub protocol: Protocol,
    /// Secret key holding this upstream's API key.
    pub api_key_secret_ref: SecretKeyRef,
    /// Secret key holding an extra trust root (PEM) for a `wss://` upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeyRef>,
    /// Lower is preferred; applied live (no pod restart).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub priority: i32,
    /// Share among upstreams of equal priority; applied live (no pod restart).
    #[serde(default = "default_upstream_weight")]
    #[schemars(range(min = 0))]
    pub weight: i32,
}

/// Signing keys of client secrets: one Secret, mounted as files the gateway re-reads when they
/// change. The first key signs, all verify, so a key rotates with no downtime: add the new key
/// first, wait out `maxTTLSeconds`, then drop the old one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientSecrets {
    pub signing_keys_secret_ref: SigningKeysRef,
    /// Cap on a minted secret's lifetime; defaults to the gateway's (7200).
    #[serde(
        default,
        rename = "maxTTLSeconds",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = MIN_CLIENT_SECRET_TTL_SECONDS, max = MAX_CLIENT_SECRET_TTL_SECONDS))]
    pub max_ttl_seconds: Option<i32>,
}

/// A Secret and the keys of it that hold signing keys (each at least 32 bytes): `key` for one,
/// or `keys` for several (the first signs).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.key) != (has(self.keys) && size(self.keys) > 0)").message("set exactly one of key and keys"))]
pub struct SigningKeysRef {
    #[schemars(length(min = 1))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub keys: Vec<String>,
}

impl SigningKeysRef {
    /// The keys in signing order (the first signs).
    pub fn key_list(&self) -> Vec<&str> {
        self.key
            .iter()
            .map(String::as_str)
            .chain(self.keys.iter().map(String::as_str))
            .collect()
    }
}

/// The upstream Realtime API.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Upstream {
    #[serde(default)]
    pub provider: Provider,
    /// WebSocket URL. Defaults to OpenAI's for `provider: openai`; required for Azure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Model name sent upstream, when it differs from `spec.model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub model: Option<String>,
    #[serde(default)]
    pub protocol: Protocol,
    /// Secret key holding the upstream API key.
    pub api_key_secret_ref: SecretKeyRef,
}

/// A key in a Secret in the route's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    #[schemars(length(min = 1))]
    pub name: String,
    #[schemars(length(min = 1))]
    pub key: String,
}

/// Replica bounds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.max) || self.min <= self.max").message("replicas.min must be <= replicas.max"))]
pub struct Replicas {
    #[serde(default = "default_replicas_min")]
    #[schemars(range(min = 1))]
    pub min: i32,
    /// Defaults to `min`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max: Option<i32>,
}

impl Default for Replicas {
    fn default() -> Self {
        Self {
            min: DEFAULT_REPLICAS_MIN,
            max: None,
        }
    }
}

impl Replicas {
    pub fn max(&self) -> i32 {
        self.max.unwrap_or(self.min).max(self.min)
    }

    /// An autoscaler owns the replica count only when there is a range to scale in.
    pub fn autoscaled(&self) -> bool {
        self.max() > self.min
    }
}

/// Autoscaler targets; either or both.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Autoscaling {
    /// Average `patchbay_realtime_sessions_active` per pod (needs a custom-metrics adapter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub target_active_sessions_per_pod: Option<i32>,
    /// Average CPU utilisation, percent of the CPU request.
    #[serde(
        default,
        rename = "targetCPUUtilizationPercentage",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 100))]
    pub target_cpu_utilization_percentage: Option<i32>,
}

/// Warm pool settings, per pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// Explicit per-pod size; overrides the size computed from `peakConcurrency`. 0 disables the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub size: Option<i32>,
    /// A warm socket older than this is closed (upstream sessions expire).
    #[serde(default = "default_pool_max_idle_seconds")]
    #[schemars(range(min = MIN_POOL_MAX_IDLE_SECONDS, max = MAX_SECONDS))]
    pub max_idle_seconds: i32,
    /// Upper bound of the per-pod size.
    #[serde(default = "default_pool_max_size")]
    #[schemars(range(min = 1))]
    pub max_size: i32,
}

impl Default for Pool {
    fn default() -> Self {
        Self {
            size: None,
            max_idle_seconds: DEFAULT_POOL_MAX_IDLE_SECONDS,
            max_size: DEFAULT_POOL_MAX_SIZE,
        }
    }
}

/// Usage metering.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metering {
    /// Seconds between flushes of usage records; 0 flushes every turn.
    #[serde(default = "default_metering_flush_seconds")]
    #[schemars(range(min = 0, max = MAX_SECONDS))]
    pub flush_seconds: i32,
    /// Secret key holding a Redis URL; without it counters live in each pod's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_url_secret_ref: Option<SecretKeyRef>,
    /// What to do with a model that has no price: `allow` (meter tokens, cost 0) or `block`.
    #[serde(default)]
    pub unpriced: Unpriced,
    /// Per model: USD per 1M tokens, and USD per minute of audio (`usdPerMinute`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prices: Vec<Price>,
}

impl Default for Metering {
    fn default() -> Self {
        Self {
            flush_seconds: DEFAULT_METERING_FLUSH_SECONDS,
            redis_url_secret_ref: None,
            unpriced: Unpriced::default(),
            prices: Vec::new(),
        }
    }
}

/// Prices of one model: token rates in USD per 1M tokens, each from 0 to 1000000, and
/// `usdPerMinute`, USD per minute of audio for duration usage (transcription reported in seconds),
/// from 0 to 1000; the gateway refuses a larger one at start. Token usage takes the token rates,
/// duration usage the per-minute rate; a row may carry either or both (a token rate left out is 0).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Price {
    #[schemars(length(min = 1))]
    pub model: String,
    #[serde(default)]
    #[schemars(range(min = 0.0, max = MAX_PRICE_USD_PER_MILLION_TOKENS))]
    pub text_input: f64,
    #[serde(default)]
    #[schemars(range(min = 0.0, max = MAX_PRICE_USD_PER_MILLION_TOKENS))]
    pub cached_text_input: f64,
    #[serde(default)]
    #[schemars(range(min = 0.0, max = MAX_PRICE_USD_PER_MILLION_TOKENS))]
    pub audio_input: f64,
    #[serde(default)]
    #[schemars(range(min = 0.0, max = MAX_PRICE_USD_PER_MILLION_TOKENS))]
    pub cached_audio_input: f64,
    #[serde(default)]
    #[schemars(range(min = 0.0, max = MAX_PRICE_USD_PER_MILLION_TOKENS))]
    pub text_output: f64,
    #[serde(default)]
    #[schemars(range(min = 0.0, max = MAX_PRICE_USD_PER_MILLION_TOKENS))]
    pub audio_output: f64,
    /// USD per minute of audio, for duration usage (`{"type": "duration", "seconds": S}` is
    /// charged S / 60 times this); unset, the model's duration usage is unpriced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = MAX_PRICE_USD_PER_MINUTE))]
    pub usd_per_minute: Option<f64>,
}

/// Pod shutdown: the pod leaves the Service endpoints during `preStopSleepSeconds`, then the
/// gateway drains live sessions for `waitSeconds` (`close`), or lets them run on for
/// `lingerSeconds` more (`linger`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Drain {
    /// Seconds the gateway drains live sessions after SIGTERM (at least 1).
    #[serde(default = "default_drain_wait_seconds")]
    #[schemars(range(min = MIN_DRAIN_WAIT_SECONDS, max = MAX_SECONDS))]
    pub wait_seconds: i32,
    #[serde(default = "default_pre_stop_sleep_seconds")]
    #[schemars(range(min = 0, max = MAX_SECONDS))]
    pub pre_stop_sleep_seconds: i32,
    #[serde(default)]
    pub mode: DrainMode,
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_SECONDS))]
    pub linger_seconds: i32,
}

impl Default for Drain {
    fn default() -> Self {
        Self {
            wait_seconds: DEFAULT_DRAIN_WAIT_SECONDS,
            pre_stop_sleep_seconds: DEFAULT_PRE_STOP_SLEEP_SECONDS,
            mode: DrainMode::default(),
            linger_seconds: 0,
        }
    }
}

/// Pod-level overrides of the gateway Deployment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayPod {
    /// Gateway image; defaults to the operator's `--gateway-image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `Always`, `IfNotPresent` or `Never`; unset, Kubernetes decides from the image's tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,
    /// Secrets (`kubernetes.io/dockerconfigjson`) in the route's namespace that the kubelet uses
    /// to pull the gateway image; the operator never reads them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<PullSecretRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub resources: Option<Open<ResourceRequirements>>,
    /// PriorityClass of the gateway pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
    /// Extra labels on the gateway pods. The operator's own labels (`app.kubernetes.io/name`,
    /// `instance`, `component`, `part-of`, `managed-by`) select the route's pods and cannot be
    /// set here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_POD_METADATA_ENTRIES))]
    #[x_kube(validation = Rule::new(POD_LABELS_RULE).message("gateway.podLabels cannot set the operator's app.kubernetes.io/name, instance, component, part-of or managed-by labels"))]
    pub pod_labels: BTreeMap<String, String>,
    /// Extra annotations on the gateway pods. Keys under `patchbay.dev/` and
    /// `controller.kubernetes.io/pod-deletion-cost` are the operator's and cannot be set here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_POD_METADATA_ENTRIES))]
    #[x_kube(validation = Rule::new(POD_ANNOTATIONS_RULE).message("gateway.podAnnotations cannot set patchbay.dev/ annotations or controller.kubernetes.io/pod-deletion-cost"))]
    pub pod_annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object_list")]
    pub tolerations: Option<Open<Vec<Toleration>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub affinity: Option<Open<Affinity>>,
    /// How the gateway pods spread across zones or nodes. A constraint without a
    /// `labelSelector` gets the route's pod selector (this route's gateway pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object_list")]
    pub topology_spread_constraints: Option<Open<Vec<TopologySpreadConstraint>>>,
}

/// The gateway container's `imagePullPolicy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ImagePullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl ImagePullPolicy {
    /// The word Kubernetes spells it with.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// A Secret in the route's namespace, by name (a pod's `imagePullSecrets[]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct PullSecretRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The labels the operator puts on every gateway pod: the Deployment's selector
/// (`name`, `instance`), the Service's, the PDB's and the deletion-cost keeper's (`managed-by`).
/// `gateway.podLabels` cannot set them (CEL and `validate`).
pub const OPERATOR_POD_LABELS: [&str; 5] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
];
/// CEL: no key of `gateway.podLabels` is one of [`OPERATOR_POD_LABELS`].
pub const POD_LABELS_RULE: &str = "self.all(k, !(k in ['app.kubernetes.io/name', \
     'app.kubernetes.io/instance', 'app.kubernetes.io/component', 'app.kubernetes.io/part-of', \
     'app.kubernetes.io/managed-by']))";
/// Annotation keys under this prefix are the operator's (the config hash).
pub const OPERATOR_ANNOTATION_PREFIX: &str = "patchbay.dev/";
/// The annotation the deletion-cost keeper sets on each gateway pod.
pub const POD_DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";
/// CEL: no key of `gateway.podAnnotations` is the operator's.
pub const POD_ANNOTATIONS_RULE: &str = "self.all(k, !k.startsWith('patchbay.dev/') && \
     k != 'controller.kubernetes.io/pod-deletion-cost')";
/// The most entries of `gateway.podLabels` or `gateway.podAnnotations` (`maxProperties`): it also
/// bounds the CEL rules' cost.
pub const MAX_POD_METADATA_ENTRIES: u32 = 64;

/// A Kubernetes type the CRD publishes as an open object
/// (`x-kubernetes-preserve-unknown-fields`): kept as the JSON the API server
/// stored and converted to `T` where it is used. The API server accepts any
/// object there, so decoding must not depend on it: the watcher decodes a
/// whole page of routes at once, and one route with, say,
/// `resources: {limits: "1"}` would otherwise stop reconciling for every
/// route. `validate::check_spec` reports the conversion error on that route
/// alone, as `InvalidSpec`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Open<T> {
    raw: serde_json::Value,
    #[serde(skip)]
    kind: std::marker::PhantomData<T>,
}

impl<T: Serialize + serde::de::DeserializeOwned> Open<T> {
    pub fn new(value: &T) -> Self {
        Self {
            // Serialising a k8s-openapi type into a JSON value cannot fail.
            raw: serde_json::to_value(value).unwrap_or_default(),
            kind: std::marker::PhantomData,
        }
    }

    /// The typed value, or why the stored JSON is not one.
    pub fn get(&self) -> Result<T, serde_json::Error> {
        serde_json::from_value(self.raw.clone())
    }
}

/// Observed state, written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RealtimeRouteStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_size_per_pod: Option<i32>,
    /// In-cluster address clients connect to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<RouteCondition>,
    /// The `HTTPRoute` of `spec.expose`: its parents' verdicts and the URLs it is reached at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposure: Option<ExposureStatus>,
    /// Live sessions summed over the pods scraped at `lastScrapeTime` (written by the operator's
    /// scrape, under field manager `patchbay-operator-scrape`, like every field below).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<i64>,
    /// Warm upstream sockets waiting, summed over the scraped pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_sockets: Option<i64>,
    /// The scraped pods' warm-pool targets, summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_target: Option<i64>,
    /// `warmSockets/poolTarget`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// USD metered over the last `spendWindowSeconds` (the increase of the pods'
    /// `patchbay_cost_usd_total`), as a decimal string.
    #[serde(default, rename = "spendUSD", skip_serializing_if = "Option::is_none")]
    pub spend_usd: Option<String>,
    /// The window `spendUSD` covers: an hour, or less while the operator has watched for less.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spend_window_seconds: Option<i64>,
    /// When the pods were last scraped (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scrape_time: Option<String>,
    /// Ready pods whose admin listener answered the last scrape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scraped_pods: Option<i32>,
    /// Ready pods that did not answer the last scrape: counted in none of the sums above.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unscraped_pods: Vec<String>,
}

/// `status.exposure`: what the Gateway API made of `spec.expose`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExposureStatus {
    /// The owned `HTTPRoute`'s name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub http_route: String,
    /// One entry per parent that reported on the `HTTPRoute` (`status.parents`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<ParentStatus>,
    /// Where clients reach the route from outside: the Gateways' addresses and listeners.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
}

/// One parent's `Accepted` and `ResolvedRefs` conditions on the `HTTPRoute`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParentStatus {
    /// `namespace/name`, with `/sectionName` when the reference names a listener.
    pub parent: String,
    /// `True`, `False` or `Unknown` (not reported yet).
    pub accepted: String,
    pub resolved_refs: String,
    /// The reason and message of the first of the two that is not `True`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A status condition (`Ready`, `Progressing`, `Degraded`), shaped like `metav1.Condition`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteCondition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339 time of the last change of `status`.
    pub last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl RealtimeRoute {
    /// The condition of this type in the current status, if any.
    pub fn condition(&self, type_: &str) -> Option<&RouteCondition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }
}

/// Upper bound of every `*Seconds` field (one year): the gateway's own bound on its `*_secs`
/// settings, published as the schema's `maximum`.
pub const MAX_SECONDS: i32 = int32(patchbay_config::MAX_SECS);

/// A bound of the gateway's as the CRD's `int32`; one that does not fit fails to compile.
const fn int32(bound: u64) -> i32 {
    assert!(
        bound <= i32::MAX as u64,
        "the CRD publishes bounds as int32"
    );
    bound as i32
}

/// The CRD as YAML, exactly what `patchbay-operator crd` prints and `crds/realtimeroute.yaml` holds.
pub fn crd_yaml() -> String {
    serde_yaml::to_string(&RealtimeRoute::crd()).expect("a CRD always serialises")
}

fn default_upstream_weight() -> i32 {
    DEFAULT_UPSTREAM_WEIGHT
}
fn default_replicas_min() -> i32 {
    DEFAULT_REPLICAS_MIN
}
fn default_pool_max_idle_seconds() -> i32 {
    DEFAULT_POOL_MAX_IDLE_SECONDS
}
fn default_pool_max_size() -> i32 {
    DEFAULT_POOL_MAX_SIZE
}
fn default_metering_flush_seconds() -> i32 {
    DEFAULT_METERING_FLUSH_SECONDS
}
fn default_drain_wait_seconds() -> i32 {
    DEFAULT_DRAIN_WAIT_SECONDS
}
fn default_pre_stop_sleep_seconds() -> i32 {
    DEFAULT_PRE_STOP_SLEEP_SECONDS
}

fn open_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

fn open_object_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd_json() -> serde_json::Value {
        serde_json::to_value(RealtimeRoute::crd()).unwrap()
    }

    #[test]
    fn crd_names_group_kind_plural_and_short_name() {
        let crd = crd_json();
        assert_eq!(crd["metadata"]["name"], "realtimeroutes.patchbay.dev");
        assert_eq!(crd["spec"]["group"], GROUP);
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(crd["spec"]["names"]["kind"], "RealtimeRoute");
        assert_eq!(crd["spec"]["names"]["plural"], "realtimeroutes");
        assert_eq!(crd["spec"]["names"]["shortNames"][0], "rtr");
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha1");
        assert!(version["subresources"]["status"].is_object());
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            columns,
            [
                "Model", "Ready", "Sessions", "Pool", "Spend/1h", "Age", "Replicas", "Pool/Pod",
                "Scraped", "Endpoint"
            ]
        );
        // `-o wide` only: the default view stays narrow.
        let wide: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["priority"] == 1)
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(wide, ["Replicas", "Pool/Pod", "Scraped", "Endpoint"]);
    }

    #[test]
    fn crd_schema_carries_minimums_enums_and_the_replica_rule() {
        let crd = crd_json();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let props = &spec["properties"];
        assert_eq!(props["peakConcurrency"]["minimum"].as_f64(), Some(0.0));
        assert_eq!(
            props["replicas"]["properties"]["min"]["minimum"].as_f64(),
            Some(1.0)
        );
        assert_eq!(
            props["replicas"]["x-kubernetes-validations"][0]["rule"],
            "!has(self.max) || self.min <= self.max"
        );
        assert_eq!(
            props["upstream"]["properties"]["provider"]["enum"],
            serde_json::json!(["openai", "azure"])
        );
        assert_eq!(
            props["drain"]["properties"]["mode"]["enum"],
            serde_json::json!(["close", "linger"])
        );
        assert_eq!(
            props["autoscaling"]["properties"]["targetCPUUtilizationPercentage"]["maximum"]
                .as_f64(),
            Some(100.0)
        );
        assert_eq!(
            props["gateway"]["properties"]["affinity"]["x-kubernetes-preserve-unknown-fields"],
            true
        );
        for (section, field) in [
            ("pool", "maxIdleSeconds"),
            ("metering", "flushSeconds"),
            ("drain", "waitSeconds"),
            ("drain", "preStopSleepSeconds"),
            ("drain", "lingerSeconds"),
        ] {
            assert_eq!(
                props[section]["properties"][field]["maximum"].as_f64(),
                Some(f64::from(MAX_SECONDS)),
                "{section}.{field}"
            );
        }
        let required: Vec<&str> = spec["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(required.contains(&"model"));
        assert!(!required.contains(&"upstream"), "upstream or upstreams");
        assert!(required.contains(&"clientKeysSecretRef"));
    }

    #[test]
    fn crd_schema_bounds_every_price_by_the_gateways_ceiling() {
        let crd = crd_json();
        let price = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["metering"]["properties"]["prices"]["items"]["properties"];
        for field in [
            "textInput",
            "cachedTextInput",
            "audioInput",
            "cachedAudioInput",
            "textOutput",
            "audioOutput",
        ] {
            assert_eq!(price[field]["minimum"].as_f64(), Some(0.0), "{field}");
            assert_eq!(
                price[field]["maximum"].as_f64(),
                Some(patchbay_config::MAX_PRICE_USD_PER_MILLION_TOKENS),
                "{field}"
            );
        }
    }

    #[test]
    fn crd_schema_refuses_an_empty_model_anywhere() {
        let crd = crd_json();
        let props = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"];
        for (field, schema) in [
            ("model", &props["model"]),
            ("upstream.model", &props["upstream"]["properties"]["model"]),
            (
                "upstreams[].model",
                &props["upstreams"]["items"]["properties"]["model"],
            ),
        ] {
            assert_eq!(schema["minLength"].as_u64(), Some(1), "{field}");
        }
    }

    #[test]
    fn crd_schema_makes_upstream_and_upstreams_exclusive() {
        let crd = crd_json();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(
            spec["x-kubernetes-validations"][0]["rule"],
            UPSTREAM_XOR_RULE
        );
        let ups = &spec["properties"]["upstreams"];
        assert_eq!(ups["maxItems"].as_u64(), Some(MAX_UPSTREAMS as u64));
        let item = &ups["items"];
        assert_eq!(
            item["properties"]["name"]["pattern"],
            "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
        );
        assert_eq!(item["properties"]["weight"]["minimum"].as_f64(), Some(0.0));
        let required: Vec<&str> = item["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(required, ["apiKeySecretRef", "name"]);
        let cs = &spec["properties"]["clientSecrets"];
        assert_eq!(
            cs["properties"]["maxTTLSeconds"]["maximum"].as_f64(),
            Some(f64::from(MAX_CLIENT_SECRET_TTL_SECONDS))
        );
        assert_eq!(
            cs["properties"]["maxTTLSeconds"]["minimum"].as_f64(),
            Some(f64::from(MIN_CLIENT_SECRET_TTL_SECONDS))
        );
        assert!(
            cs["properties"]["signingKeysSecretRef"]["x-kubernetes-validations"][0]["rule"]
                .as_str()
                .unwrap()
                .contains("has(self.key)")
        );
    }

    #[test]
    fn a_listed_upstream_gets_weight_one_and_priority_zero() {
        let spec: RealtimeRouteSpec = serde_json::from_value(serde_json::json!({
            "model": "gpt-realtime",
            "upstreams": [{"name": "a", "apiKeySecretRef": {"name": "openai", "key": "api-key"}}],
            "clientKeysSecretRef": {"name": "keys", "key": "keys.toml"},
            "clientSecrets": {"signingKeysSecretRef": {"name": "signing", "key": "k"}}
        }))
        .unwrap();
        assert_eq!(spec.upstream, None);
        assert_eq!(spec.upstreams[0].weight, DEFAULT_UPSTREAM_WEIGHT);
        assert_eq!(spec.upstreams[0].priority, 0);
        let cs = spec.client_secrets.unwrap();
        assert_eq!(cs.signing_keys_secret_ref.key_list(), ["k"]);
        assert_eq!(cs.max_ttl_seconds, None);
    }

    #[test]
    fn a_minimal_spec_gets_every_default() {
        let spec: RealtimeRouteSpec = serde_json::from_value(serde_json::json!({
            "model": "gpt-realtime",
            "upstream": {"apiKeySecretRef": {"name": "openai", "key": "api-key"}},
            "clientKeysSecretRef": {"name": "keys", "key": "keys.toml"}
        }))
        .unwrap();
        let upstream = spec.upstream.as_ref().unwrap();
        assert_eq!(upstream.provider, Provider::Openai);
        assert_eq!(upstream.protocol, Protocol::Ga);
        assert!(spec.upstreams.is_empty());
        assert_eq!(spec.client_secrets, None);
        assert_eq!(spec.replicas, Replicas::default());
        assert!(!spec.replicas.autoscaled());
        assert_eq!(spec.pool, Pool::default());
        assert_eq!(spec.drain, Drain::default());
        assert_eq!(spec.metering.flush_seconds, 15);
    }
}
