//! Rendering a route's `gateway.toml`, the file the gateway pod is started with.
//!
//! This is the one contract the operator shares with the gateway, and it is built from the
//! gateway's own types: every section but `[server]` is a `patchbay-config` type the gateway's
//! loader deserialises (rejecting unknown keys), with the same enums, so no key or word is spelled
//! twice; `tests/gateway_contract.rs` loads what this renders with the gateway's loader.
//!
//! No secret is ever written here. Secrets reach the pod as files of mounted Secret volumes, which
//! the gateway re-reads when they change: `api_key_file` (the upstream key, or one per
//! `[[routes.upstreams]]` entry, with its `ca_file`), `[store] redis_url_file`, `[keys] file` and
//! `[client_secrets] signing_key_files`, and the client listener's certificate
//! (`[server] tls_cert_file`, `tls_key_file`).
//!
//! What is live and what needs a restart follows the gateway: `[metering]`, `[[prices]]` and the
//! `priority` and `weight` of each listed upstream are re-read from the file, so they are left out
//! of the restart hash ([`restart_part`]); the upstream list itself, and `[client_secrets]` (its file
//! list and `max_ttl_secs` are read at start; the key files' contents are re-read live), are in it.
//!
//! `[pool] size` is a fixed fallback ([`POOL_SIZE_FALLBACK`]), used only if the size file were
//! missing: the live value comes from `size_file`, which the pool ConfigMap feeds (it is applied
//! before the Deployment). Nothing that sizes the pool (`peakConcurrency`, `replicas`,
//! `pool.size`, the observed replica count) reaches this file, so none of them changes its hash and
//! the pod template: editing them, or an HPA scale event, never restarts the gateway pods and the
//! sessions they carry.

use patchbay_config::{
    BudgetPeriod, ClientSecretsConfig, DrainConfig, KeysConfig, LimitsConfig, MeteringConfig,
    PoolConfig, PriceRow, RelayConfig, RouteConfig, StoreConfig, UpstreamConfig,
};
use serde::Serialize;

use crate::crd::{Endpoint, NamedUpstream, Provider, RealtimeRouteSpec, SecretKeyRef};

/// Port clients connect to (Service port `http`).
pub const HTTP_PORT: u16 = 8080;
/// Port of `/healthz`, `/readyz` and `/metrics` (Service port `metrics`).
pub const ADMIN_PORT: u16 = 9090;
/// Directory the `<name>-gateway` ConfigMap is mounted at.
pub const CONFIG_DIR: &str = "/etc/patchbay/config";
/// Data key of the gateway ConfigMap, and so the file name under [`CONFIG_DIR`].
pub const CONFIG_FILE_NAME: &str = "gateway.toml";
/// Directory the `<name>-pool` ConfigMap is mounted at.
pub const POOL_DIR: &str = "/etc/patchbay/pool";
/// Data key of the pool ConfigMap, and so the file name under [`POOL_DIR`].
pub const POOL_SIZE_KEY: &str = "REALTIME_POOL_SIZE";
/// Directory the client keys Secret is mounted at.
pub const KEYS_DIR: &str = "/etc/patchbay/keys";
/// Directory the upstream key's Secret is mounted at.
pub const UPSTREAM_KEY_DIR: &str = "/etc/patchbay/upstream";
/// Directory the Redis URL's Secret is mounted at.
pub const REDIS_URL_DIR: &str = "/etc/patchbay/redis";
/// Directory under which each Secret referenced by `spec.upstreams` is mounted, one
/// subdirectory per Secret name.
pub const UPSTREAMS_DIR: &str = "/etc/patchbay/upstreams";
/// Directory the client-secret signing keys' Secret is mounted at.
pub const SIGNING_KEYS_DIR: &str = "/etc/patchbay/signing-keys";
/// Volume name of the signing keys' Secret.
pub const SIGNING_KEYS_VOLUME: &str = "signing-keys";
/// Directory the client listener's certificate Secret (`spec.tls`) is mounted at.
pub const TLS_DIR: &str = "/etc/patchbay/tls";
/// Volume name of the certificate Secret.
pub const TLS_VOLUME: &str = "tls";
/// The keys of a `kubernetes.io/tls` Secret: the certificate chain and its private key.
pub const TLS_CERT_KEY: &str = "tls.crt";
pub const TLS_KEY_KEY: &str = "tls.key";

/// Prefix of the volume names of `spec.upstreams` Secrets (`upstreams-0`, `upstreams-1`, ...).
pub const UPSTREAMS_VOLUME_PREFIX: &str = "upstreams-";

/// A Secret mounted as a directory: the volume name, the Secret, the keys projected as files of
/// the same name (sorted, distinct) and where the directory is mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretMount {
    pub volume: String,
    pub secret: String,
    pub keys: Vec<String>,
    pub dir: String,
}

/// The file a key of a `spec.upstreams` Secret is mounted as.
pub fn upstreams_file(secret: &SecretKeyRef) -> String {
    format!("{UPSTREAMS_DIR}/{}/{}", secret.name, secret.key)
}

/// One volume per distinct Secret referenced by `spec.upstreams` (API keys and CAs), in order
/// of first reference, each projecting exactly the keys the route uses. Empty for a
/// single-upstream route, whose key has its own volume at [`UPSTREAM_KEY_DIR`].
pub fn upstream_secret_mounts(spec: &RealtimeRouteSpec) -> Vec<SecretMount> {
    let mut mounts: Vec<SecretMount> = Vec::new();
    let refs = spec
        .upstreams
        .iter()
        .flat_map(|u| std::iter::once(&u.api_key_secret_ref).chain(u.ca_secret_ref.as_ref()));
    for r in refs {
        match mounts.iter_mut().find(|m| m.secret == r.name) {
            Some(m) => {
                if !m.keys.contains(&r.key) {
                    m.keys.push(r.key.clone());
                    m.keys.sort();
                }
            }
            None => mounts.push(SecretMount {
                volume: format!("{UPSTREAMS_VOLUME_PREFIX}{}", mounts.len()),
                secret: r.name.clone(),
                keys: vec![r.key.clone()],
                dir: format!("{UPSTREAMS_DIR}/{}", r.name),
            }),
        }
    }
    mounts
}

/// The signing keys' Secret as a volume, when the route configures client secrets.
pub fn signing_keys_mount(spec: &RealtimeRouteSpec) -> Option<SecretMount> {
    let r = &spec.client_secrets.as_ref()?.signing_keys_secret_ref;
    let mut keys: Vec<String> = r.key_list().into_iter().map(String::from).collect();
    keys.sort();
    keys.dedup();
    Some(SecretMount {
        volume: SIGNING_KEYS_VOLUME.into(),
        secret: r.name.clone(),
        keys,
        dir: SIGNING_KEYS_DIR.into(),
    })
}

/// The certificate Secret as a volume, when the route's client listener serves TLS.
pub fn tls_mount(spec: &RealtimeRouteSpec) -> Option<SecretMount> {
    let tls = spec.tls.as_ref()?;
    Some(SecretMount {
        volume: TLS_VOLUME.into(),
        secret: tls.secret_name.clone(),
        keys: vec![TLS_CERT_KEY.into(), TLS_KEY_KEY.into()],
        dir: TLS_DIR.into(),
    })
}

/// `[server] upgrade_timeout_secs`: the gateway's default, written out.
const UPGRADE_TIMEOUT_SECS: u32 = 10;

/// Full path of the config file inside the pod.
pub fn config_path() -> String {
    format!("{CONFIG_DIR}/{CONFIG_FILE_NAME}")
}

/// `[pool] size` in the rendered file; see the module doc.
pub const POOL_SIZE_FALLBACK: u32 = 1;

/// Full path of the pool size file inside the pod.
pub fn pool_size_path() -> String {
    format!("{POOL_DIR}/{POOL_SIZE_KEY}")
}

/// The document: the sections are the gateway's own types; only `[server]`, whose type belongs
/// to the gateway's runtime, is the operator's.
#[derive(Serialize)]
struct GatewayToml {
    server: Server,
    routes: Vec<RouteConfig>,
    pool: PoolConfig,
    relay: RelayConfig,
    limits: LimitsConfig,
    metering: MeteringConfig,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    prices: Vec<PriceRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<StoreConfig>,
    keys: KeysConfig,
    drain: DrainConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_secrets: Option<ClientSecretsConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    telemetry: Option<TelemetryToml>,
}

/// `[telemetry]`, whose type (like `[server]`'s) belongs to the gateway's runtime. Not a live
/// section: an edit restarts the pods.
#[derive(Serialize)]
struct TelemetryToml {
    endpoint: String,
    protocol: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_name: Option<String>,
    /// `key=value,key=value`, as `OTEL_RESOURCE_ATTRIBUTES`.
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_attributes: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sampler: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sampler_arg: Option<String>,
}

fn telemetry_entry(spec: &RealtimeRouteSpec) -> Option<TelemetryToml> {
    let t = spec.telemetry.as_ref()?;
    let attributes: Vec<String> = t
        .resource_attributes
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    Some(TelemetryToml {
        endpoint: t.endpoint.clone(),
        protocol: t.protocol.as_str(),
        service_name: t.service_name.clone(),
        resource_attributes: (!attributes.is_empty()).then(|| attributes.join(",")),
        sampler: t.traces_sampler.map(|s| s.as_str()),
        sampler_arg: t.traces_sampler_ratio.map(|r| r.to_string()),
    })
}

#[derive(Serialize)]
struct Server {
    listen: String,
    admin_listen: String,
    upgrade_timeout_secs: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cert_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_key_file: Option<String>,
}

/// A count or a number of seconds of the spec (an `int32`) as the gateway's unsigned type. The
/// schema admits no negative one, and validation holds each to the gateway's bounds; were one
/// negative all the same, it would render as 0.
fn unsigned<T: TryFrom<i32> + Default>(v: i32) -> T {
    T::try_from(v).unwrap_or_default()
}

/// The `[[routes]]` entry of a spec. Validation has made sure exactly one of `upstream` and
/// `upstreams` is set and that the listed upstreams share one protocol. Every key is chosen here
/// (no `..`), so a key the gateway adds to a route fails to compile until it is rendered or left
/// out on purpose; the single-upstream keys of a listed route are not written.
fn route_entry(spec: &RealtimeRouteSpec) -> RouteConfig {
    let (provider, upstream_url, upstream_model, protocol, api_key_file) = match &spec.upstream {
        Some(up) => (
            up.provider,
            default_url(up.url.as_deref(), up.provider, spec.endpoint).unwrap_or_default(),
            up.model.clone(),
            up.protocol,
            Some(format!("{UPSTREAM_KEY_DIR}/{}", up.api_key_secret_ref.key).into()),
        ),
        None => (
            Provider::default(),
            String::new(),
            None,
            spec.upstreams
                .first()
                .map(|u| u.protocol)
                .unwrap_or_default(),
            None,
        ),
    };
    RouteConfig {
        model: spec.model.clone(),
        provider,
        upstream_url,
        upstream_model,
        protocol,
        intent: spec.intent,
        endpoint: spec.endpoint,
        api_key_env: String::new(),
        api_key_file,
        ca_file: None,
        budget_usd: None,
        budget_period: BudgetPeriod::default(),
        api_key: (),
        upstreams: spec
            .upstreams
            .iter()
            .map(|u| upstream_entry(u, spec.endpoint))
            .collect(),
    }
}

/// A `[[routes.upstreams]]` entry; its protocol and endpoint are the route's.
fn upstream_entry(u: &NamedUpstream, endpoint: Endpoint) -> UpstreamConfig {
    UpstreamConfig {
        name: u.name.clone(),
        provider: u.provider,
        upstream_url: default_url(u.url.as_deref(), u.provider, endpoint).unwrap_or_default(),
        upstream_model: u.model.clone(),
        protocol: None,
        api_key_env: String::new(),
        api_key_file: Some(upstreams_file(&u.api_key_secret_ref).into()),
        ca_file: u.ca_secret_ref.as_ref().map(|r| upstreams_file(r).into()),
        priority: unsigned(u.priority),
        weight: unsigned(u.weight),
        api_key: (),
    }
}

/// Sections of `gateway.toml` the gateway applies while running (it re-reads the file): editing
/// them never restarts a pod. Everything else needs a restart and is hashed into the pod
/// template ([`restart_part`]).
pub const LIVE_SECTIONS: [&str; 2] = ["metering", "prices"];
/// Keys of each `[[routes.upstreams]]` entry the gateway applies while running.
pub const LIVE_UPSTREAM_KEYS: [&str; 2] = ["priority", "weight"];

/// The rendered config without its [`LIVE_SECTIONS`] and [`LIVE_UPSTREAM_KEYS`]: what a pod
/// must restart to apply. Text that does not parse (never the operator's own rendering) is
/// returned whole, so any edit of it restarts the pods rather than failing the reconcile.
pub fn restart_part(rendered: &str) -> String {
    let Ok(mut doc) = toml::from_str::<toml::Table>(rendered) else {
        return rendered.to_string();
    };
    for section in LIVE_SECTIONS {
        doc.remove(section);
    }
    let routes = doc.get_mut("routes").and_then(|r| r.as_array_mut());
    for route in routes.into_iter().flatten() {
        let ups = route.get_mut("upstreams").and_then(|u| u.as_array_mut());
        for up in ups.into_iter().flatten().filter_map(|u| u.as_table_mut()) {
            for key in LIVE_UPSTREAM_KEYS {
                up.remove(key);
            }
        }
    }
    toml::to_string(&doc).unwrap_or_else(|_| rendered.to_string())
}

/// An upstream's URL: the one given, or OpenAI's for the route's `endpoint` for an OpenAI
/// upstream that names none.
pub fn default_url(url: Option<&str>, provider: Provider, endpoint: Endpoint) -> Option<String> {
    match (url, provider) {
        (Some(url), _) => Some(url.to_string()),
        (None, Provider::Openai) => Some(patchbay_config::openai_url(endpoint)),
        (None, Provider::Azure) => None,
    }
}

/// Render `gateway.toml` for a route. The spec must have passed validation (an Azure route
/// carries its URL); a missing URL renders as an empty string, which the gateway rejects.
pub fn render(spec: &RealtimeRouteSpec) -> String {
    render_watching(spec, None)
}

/// [`render`], with `[pool] size_configmap` naming the pool ConfigMap the pods watch through
/// the API server (their ServiceAccount may read that one ConfigMap and nothing else).
pub fn render_watching(spec: &RealtimeRouteSpec, pool_configmap: Option<&str>) -> String {
    let doc = GatewayToml {
        server: Server {
            listen: format!("0.0.0.0:{HTTP_PORT}"),
            admin_listen: format!("0.0.0.0:{ADMIN_PORT}"),
            upgrade_timeout_secs: UPGRADE_TIMEOUT_SECS,
            tls_cert_file: spec
                .tls
                .as_ref()
                .map(|_| format!("{TLS_DIR}/{TLS_CERT_KEY}")),
            tls_key_file: spec
                .tls
                .as_ref()
                .map(|_| format!("{TLS_DIR}/{TLS_KEY_KEY}")),
        },
        routes: vec![route_entry(spec)],
        pool: PoolConfig {
            size: POOL_SIZE_FALLBACK as usize,
            max_idle_secs: unsigned(spec.pool.max_idle_seconds),
            max_size: unsigned(spec.pool.max_size),
            size_file: Some(pool_size_path().into()),
            size_configmap: pool_configmap.map(String::from),
            ..PoolConfig::default()
        },
        // Not in the spec: the gateway's defaults, written out.
        relay: RelayConfig::default(),
        limits: LimitsConfig::default(),
        metering: MeteringConfig {
            flush_secs: unsigned(spec.metering.flush_seconds),
            unpriced: spec.metering.unpriced,
            ..MeteringConfig::default()
        },
        prices: spec
            .metering
            .prices
            .iter()
            .map(|p| PriceRow {
                model: p.model.clone(),
                upstream: None,
                text_input: p.text_input,
                cached_text_input: p.cached_text_input,
                audio_input: p.audio_input,
                cached_audio_input: p.cached_audio_input,
                text_output: p.text_output,
                audio_output: p.audio_output,
                usd_per_minute: p.usd_per_minute,
            })
            .collect(),
        store: spec
            .metering
            .redis_url_secret_ref
            .as_ref()
            .map(|r| StoreConfig {
                redis_url_file: Some(format!("{REDIS_URL_DIR}/{}", r.key).into()),
                ..StoreConfig::default()
            }),
        keys: KeysConfig {
            file: Some(format!("{KEYS_DIR}/{}", spec.client_keys_secret_ref.key).into()),
        },
        drain: DrainConfig {
            wait_secs: unsigned(spec.drain.wait_seconds),
            mode: spec.drain.mode,
            linger_secs: unsigned(spec.drain.linger_seconds),
        },
        client_secrets: spec.client_secrets.as_ref().map(|c| ClientSecretsConfig {
            signing_key_files: c
                .signing_keys_secret_ref
                .key_list()
                .into_iter()
                .map(|k| format!("{SIGNING_KEYS_DIR}/{k}").into())
                .collect(),
            max_ttl_secs: c
                .max_ttl_seconds
                .map_or(ClientSecretsConfig::default().max_ttl_secs, unsigned),
        }),
        telemetry: telemetry_entry(spec),
    };
    toml::to_string(&doc).expect("the gateway config always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn the_restart_part_leaves_out_exactly_the_live_sections() {
        let rendered = render(&fixtures::full_spec());
        let restart: toml::Table = toml::from_str(&restart_part(&rendered)).unwrap();
        let full: toml::Table = toml::from_str(&rendered).unwrap();
        for (section, value) in &full {
            if LIVE_SECTIONS.contains(&section.as_str()) {
                assert!(!restart.contains_key(section), "{section}");
            } else {
                assert_eq!(restart.get(section), Some(value), "{section}");
            }
        }
    }

    #[test]
    fn renders_every_section_of_the_contract_and_no_secret() {
        let spec = fixtures::full_spec();
        let text = render(&spec);
        let doc: toml::Table = toml::from_str(&text).unwrap();
        let sections: Vec<&str> = doc.keys().map(String::as_str).collect();
        assert_eq!(
            sections,
            [
                "client_secrets",
                "drain",
                "keys",
                "limits",
                "metering",
                "pool",
                "prices",
                "relay",
                "routes",
                "server",
                "store"
            ]
        );
        assert_eq!(
            doc["client_secrets"]["signing_key_files"],
            toml::Value::Array(vec![
                "/etc/patchbay/signing-keys/current".into(),
                "/etc/patchbay/signing-keys/previous".into()
            ]),
            "in the listed order: the first signs"
        );
        assert_eq!(
            doc["client_secrets"]["max_ttl_secs"].as_integer(),
            Some(600)
        );
        let route = &doc["routes"].as_array().unwrap()[0];
        assert_eq!(route["model"].as_str(), Some("gpt-realtime"));
        assert_eq!(
            route["api_key_file"].as_str(),
            Some("/etc/patchbay/upstream/api-key")
        );
        assert!(
            route.get("api_key_env").is_none(),
            "no secret in the environment"
        );
        assert_eq!(
            doc["pool"]["size_file"].as_str(),
            Some("/etc/patchbay/pool/REALTIME_POOL_SIZE")
        );
        assert_eq!(
            doc["store"]["redis_url_file"].as_str(),
            Some("/etc/patchbay/redis/url")
        );
        assert_eq!(
            doc["keys"]["file"].as_str(),
            Some("/etc/patchbay/keys/keys.toml")
        );
        assert!(!text.contains("sk-"), "no secret value in the config");
    }

    #[test]
    fn an_openai_route_without_url_uses_the_openai_endpoint_and_omits_optional_sections() {
        let spec = fixtures::minimal_spec();
        let doc: toml::Table = toml::from_str(&render(&spec)).unwrap();
        let route = &doc["routes"].as_array().unwrap()[0];
        assert_eq!(
            route["upstream_url"].as_str(),
            Some(patchbay_config::OPENAI_REALTIME_URL)
        );
        assert!(route.get("endpoint").is_none() && route.get("intent").is_none());
        assert!(route.get("upstream_model").is_none());
        assert!(doc.get("store").is_none());
        assert!(doc.get("prices").is_none());
    }

    #[test]
    fn a_routes_endpoint_and_intent_render_and_pick_openais_url_for_the_endpoint() {
        let doc: toml::Table = toml::from_str(&render(&fixtures::full_spec())).unwrap();
        let route = &doc["routes"].as_array().unwrap()[0];
        assert_eq!(route["intent"].as_str(), Some("transcription"));
        let mut spec = fixtures::minimal_spec();
        spec.endpoint = Endpoint::Translations;
        let doc: toml::Table = toml::from_str(&render(&spec)).unwrap();
        let route = &doc["routes"].as_array().unwrap()[0];
        assert_eq!(route["endpoint"].as_str(), Some("translations"));
        assert_eq!(
            route["upstream_url"].as_str(),
            Some("wss://api.openai.com/v1/realtime/translations")
        );
        let mut spec = fixtures::two_upstream_spec();
        spec.endpoint = Endpoint::Translations;
        let doc: toml::Table = toml::from_str(&render(&spec)).unwrap();
        let route = &doc["routes"].as_array().unwrap()[0];
        let first = &route["upstreams"].as_array().unwrap()[0];
        assert_eq!(
            first["upstream_url"].as_str(),
            Some("wss://api.openai.com/v1/realtime/translations"),
            "a listed OpenAI upstream without a url dials the route's endpoint"
        );
    }

    #[test]
    fn listed_upstreams_render_as_routes_upstreams_with_a_key_file_each() {
        let doc: toml::Table = toml::from_str(&render(&fixtures::two_upstream_spec())).unwrap();
        let route = doc["routes"].as_array().unwrap()[0].as_table().unwrap();
        let keys: Vec<&str> = route.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["intent", "model", "protocol", "upstreams"],
            "no shorthand keys"
        );
        assert_eq!(route["protocol"].as_str(), Some("ga"));
        let ups = route["upstreams"].as_array().unwrap();
        let expected = toml::toml! {
            name = "openai"
            provider = "openai"
            upstream_url = "wss://api.openai.com/v1/realtime"
            api_key_file = "/etc/patchbay/upstreams/openai/api-key"
            priority = 0
            weight = 3
        };
        assert_eq!(ups[0].as_table(), Some(&expected));
        let expected = toml::toml! {
            name = "azure-eastus"
            provider = "azure"
            upstream_url = "wss://eastus.openai.azure.com/openai/v1/realtime"
            upstream_model = "my-deployment"
            api_key_file = "/etc/patchbay/upstreams/azure/key"
            ca_file = "/etc/patchbay/upstreams/openai/ca.pem"
            priority = 1
            weight = 1
        };
        assert_eq!(ups[1].as_table(), Some(&expected));
    }

    #[test]
    fn priority_and_weight_are_live_but_the_upstream_list_is_not() {
        let spec = fixtures::two_upstream_spec();
        let restart = |s: &RealtimeRouteSpec| restart_part(&render(s));
        let mut balanced = spec.clone();
        balanced.upstreams[0].weight = 9;
        balanced.upstreams[1].priority = 0;
        assert_ne!(render(&spec), render(&balanced), "the file changes");
        assert_eq!(
            restart(&spec),
            restart(&balanced),
            "the restart part does not"
        );
        let edits: [fn(&mut RealtimeRouteSpec); 4] = [
            |s| s.upstreams.truncate(1),
            |s| s.upstreams[1].name = "azure-westus".into(),
            |s| s.upstreams[1].model = Some("other".into()),
            |s| s.upstreams[1].ca_secret_ref = None,
        ];
        for edit in edits {
            let mut edited = spec.clone();
            edit(&mut edited);
            assert_ne!(restart(&spec), restart(&edited));
        }
    }

    #[test]
    fn client_secrets_settings_need_a_restart_and_a_single_key_renders_one_file() {
        let mut spec = fixtures::minimal_spec();
        let doc: toml::Table = toml::from_str(&render(&spec)).unwrap();
        assert!(doc.get("client_secrets").is_none());
        spec.client_secrets = Some(crate::crd::ClientSecrets {
            signing_keys_secret_ref: crate::crd::SigningKeysRef {
                name: "signing".into(),
                key: Some("k1".into()),
                keys: Vec::new(),
            },
            max_ttl_seconds: None,
        });
        let doc: toml::Table = toml::from_str(&render(&spec)).unwrap();
        let expected = toml::toml! { signing_key_files = ["/etc/patchbay/signing-keys/k1"] };
        assert_eq!(doc["client_secrets"].as_table(), Some(&expected));
        // The gateway reads the file list and the TTL cap at start (the key files' contents
        // live), so the section is part of what restarts a pod.
        let mut capped = spec.clone();
        capped.client_secrets.as_mut().unwrap().max_ttl_seconds = Some(60);
        assert_ne!(restart_part(&render(&spec)), restart_part(&render(&capped)));
    }

    #[test]
    fn a_certificate_secret_turns_on_tls_from_its_mounted_files_and_needs_a_restart() {
        let mut spec = fixtures::minimal_spec();
        let plain: toml::Table = toml::from_str(&render(&spec)).unwrap();
        assert!(plain["server"].get("tls_cert_file").is_none());
        assert!(plain["server"].get("tls_key_file").is_none());
        assert_eq!(tls_mount(&spec), None);
        spec.tls = Some(crate::crd::ClientTls {
            secret_name: "voice-tls".into(),
        });
        let rendered = render(&spec);
        let doc: toml::Table = toml::from_str(&rendered).unwrap();
        assert_eq!(
            doc["server"]["tls_cert_file"].as_str(),
            Some("/etc/patchbay/tls/tls.crt")
        );
        assert_eq!(
            doc["server"]["tls_key_file"].as_str(),
            Some("/etc/patchbay/tls/tls.key")
        );
        let mount = tls_mount(&spec).expect("mounted");
        assert_eq!(
            (mount.secret.as_str(), mount.dir.as_str(), mount.keys),
            (
                "voice-tls",
                TLS_DIR,
                vec!["tls.crt".into(), "tls.key".into()]
            )
        );
        assert_ne!(
            restart_part(&rendered),
            restart_part(&render(&fixtures::minimal_spec())),
            "turning TLS on restarts the pods (the listener is bound at start)"
        );
    }

    #[test]
    fn nothing_that_sizes_the_pool_reaches_the_config() {
        // render() takes only the spec, so a scale event cannot reach the file or its hash; and
        // editing what sizes the pool changes only the pool ConfigMap, never the pod template.
        let spec = fixtures::autoscaled_spec();
        let mut edited = spec.clone();
        edited.peak_concurrency *= 3;
        edited.replicas.min += 1;
        edited.pool.size = Some(7);
        assert_eq!(render(&spec), render(&edited));
        let doc: toml::Table = toml::from_str(&render(&spec)).unwrap();
        assert_eq!(
            doc["pool"]["size"].as_integer(),
            Some(i64::from(POOL_SIZE_FALLBACK))
        );
    }
}
