//! The `RealtimeRoute` custom resource (`patchbay.dev/v1alpha1`).
//!
//! One route is one model served by one gateway Deployment. The spec is what a user writes; every
//! optional field has a default here, in one place, so the builders never guess. The OpenAPI schema
//! the API server enforces is derived from these types: minimums and enums come from `schemars`
//! attributes, `replicas.min <= replicas.max` is a CEL rule (`x-kubernetes-validations`).
//!
//! Pod-level knobs that Kubernetes already validates (`resources`, `tolerations`, `affinity`) are
//! typed with the `k8s-openapi` structs in Rust but published in the CRD as open objects
//! (`x-kubernetes-preserve-unknown-fields`), so the CRD does not embed a copy of the core schema;
//! the API server validates them when it admits the Deployment.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// API group of the resource.
pub const GROUP: &str = "patchbay.dev";
/// Upstream URL used when an OpenAI route does not name one.
pub const OPENAI_REALTIME_URL: &str = "wss://api.openai.com/v1/realtime";

pub const DEFAULT_REPLICAS_MIN: i32 = 1;
pub const DEFAULT_POOL_MAX_IDLE_SECONDS: i32 = 30;
pub const DEFAULT_POOL_MAX_SIZE: i32 = 512;
pub const DEFAULT_METERING_FLUSH_SECONDS: i32 = 15;
pub const DEFAULT_DRAIN_WAIT_SECONDS: i32 = 10;
pub const DEFAULT_PRE_STOP_SLEEP_SECONDS: i32 = 5;
/// CPU target used when an autoscaled route names no metric at all.
pub const DEFAULT_TARGET_CPU_UTILIZATION_PERCENT: i32 = 70;

/// A model exposed through a pool of Patchbay gateway pods.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
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
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Pool","type":"integer","jsonPath":".status.poolSizePerPod","description":"warm upstream sockets per pod"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RealtimeRouteSpec {
    /// Model name clients ask for (`GET /v1/realtime?model=...`).
    #[schemars(length(min = 1))]
    pub model: String,
    /// Where sessions for this model go.
    pub upstream: Upstream,
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
    pub model: Option<String>,
    #[serde(default)]
    pub protocol: Protocol,
    /// Secret key holding the upstream API key.
    pub api_key_secret_ref: SecretKeyRef,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    #[default]
    Openai,
    Azure,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Ga,
    Beta,
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
    #[schemars(range(min = 1, max = 31_622_400))]
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
    #[schemars(range(min = 0, max = 31_622_400))]
    pub flush_seconds: i32,
    /// Secret key holding a Redis URL; without it counters live in each pod's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_url_secret_ref: Option<SecretKeyRef>,
    /// What to do with a model that has no price: `allow` (meter tokens, cost 0) or `block`.
    #[serde(default)]
    pub unpriced: Unpriced,
    /// USD per 1M tokens, per model.
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

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Unpriced {
    #[default]
    Allow,
    Block,
}

/// Prices of one model, USD per 1M tokens.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Price {
    #[schemars(length(min = 1))]
    pub model: String,
    #[schemars(range(min = 0.0))]
    pub text_input: f64,
    #[schemars(range(min = 0.0))]
    pub cached_text_input: f64,
    #[schemars(range(min = 0.0))]
    pub audio_input: f64,
    #[schemars(range(min = 0.0))]
    pub cached_audio_input: f64,
    #[schemars(range(min = 0.0))]
    pub text_output: f64,
    #[schemars(range(min = 0.0))]
    pub audio_output: f64,
}

/// Pod shutdown: the pod leaves the Service endpoints during `preStopSleepSeconds`, then the
/// gateway drains live sessions for `waitSeconds` (`close`), or lets them run on for
/// `lingerSeconds` more (`linger`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Drain {
    /// Seconds the gateway drains live sessions after SIGTERM (at least 1).
    #[serde(default = "default_drain_wait_seconds")]
    #[schemars(range(min = 1, max = 31_622_400))]
    pub wait_seconds: i32,
    #[serde(default = "default_pre_stop_sleep_seconds")]
    #[schemars(range(min = 0, max = 31_622_400))]
    pub pre_stop_sleep_seconds: i32,
    #[serde(default)]
    pub mode: DrainMode,
    #[serde(default)]
    #[schemars(range(min = 0, max = 31_622_400))]
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

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DrainMode {
    #[default]
    Close,
    Linger,
}

/// Pod-level overrides of the gateway Deployment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayPod {
    /// Gateway image; defaults to the operator's `--gateway-image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub resources: Option<Open<ResourceRequirements>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object_list")]
    pub tolerations: Option<Open<Vec<Toleration>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub affinity: Option<Open<Affinity>>,
}

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

/// Upper bound of every `*Seconds` field (one year), as the gateway's own
/// bound on its `*_secs` settings; the schema's `maximum` repeats it as a
/// literal (a test keeps the two equal).
pub const MAX_SECONDS: i32 = 31_622_400;

/// The CRD as YAML, exactly what `patchbay-operator crd` prints and `crds/realtimeroute.yaml` holds.
pub fn crd_yaml() -> String {
    serde_yaml::to_string(&RealtimeRoute::crd()).expect("a CRD always serialises")
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
        assert_eq!(columns, ["Model", "Replicas", "Ready", "Pool", "Age"]);
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
        assert!(required.contains(&"upstream"));
        assert!(required.contains(&"clientKeysSecretRef"));
    }

    #[test]
    fn a_minimal_spec_gets_every_default() {
        let spec: RealtimeRouteSpec = serde_json::from_value(serde_json::json!({
            "model": "gpt-realtime",
            "upstream": {"apiKeySecretRef": {"name": "openai", "key": "api-key"}},
            "clientKeysSecretRef": {"name": "keys", "key": "keys.toml"}
        }))
        .unwrap();
        assert_eq!(spec.upstream.provider, Provider::Openai);
        assert_eq!(spec.upstream.protocol, Protocol::Ga);
        assert_eq!(spec.replicas, Replicas::default());
        assert!(!spec.replicas.autoscaled());
        assert_eq!(spec.pool, Pool::default());
        assert_eq!(spec.drain, Drain::default());
        assert_eq!(spec.metering.flush_seconds, 15);
    }
}
