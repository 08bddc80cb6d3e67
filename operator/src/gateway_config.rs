//! Rendering a route's `gateway.toml`, the file the gateway pod is started with.
//!
//! This is the one contract the operator shares with the gateway: the keys are exactly the ones the
//! gateway's loader accepts (it rejects unknown keys), and no secret is ever written here. Secrets
//! reach the pod as files of mounted Secret volumes, which the gateway re-reads when they change:
//! `api_key_file` (the upstream key, or one per `[[routes.upstreams]]` entry, with its `ca_file`),
//! `[store] redis_url_file`, `[keys] file` and `[client_secrets] signing_key_files`.
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

use serde::Serialize;

use crate::crd::{
    DrainMode, Protocol, Provider, RealtimeRouteSpec, SecretKeyRef, Unpriced, OPENAI_REALTIME_URL,
};

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

const UPGRADE_TIMEOUT_SECS: u32 = 10;
const RELAY_IDLE_TIMEOUT_SECS: u32 = 300;
const RELAY_MAX_SESSION_SECS: u32 = 3600;
const RELAY_MAX_MESSAGE_BYTES: u64 = 16 * 1024 * 1024;
const MAX_SESSIONS_PER_POD: u32 = 1000;

/// Full path of the config file inside the pod.
pub fn config_path() -> String {
    format!("{CONFIG_DIR}/{CONFIG_FILE_NAME}")
}

/// `[pool] size` in the rendered file; see the module doc.
pub const POOL_SIZE_FALLBACK: i32 = 1;

/// Full path of the pool size file inside the pod.
pub fn pool_size_path() -> String {
    format!("{POOL_DIR}/{POOL_SIZE_KEY}")
}

#[derive(Serialize)]
struct GatewayToml<'a> {
    server: Server,
    routes: Vec<Route<'a>>,
    pool: PoolSection,
    relay: Relay,
    limits: Limits,
    metering: MeteringSection,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    prices: Vec<PriceRow<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<Store>,
    keys: Keys,
    drain: DrainSection,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_secrets: Option<ClientSecretsSection>,
}

#[derive(Serialize)]
struct ClientSecretsSection {
    signing_key_files: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_ttl_secs: Option<i32>,
}

#[derive(Serialize)]
struct Server {
    listen: String,
    admin_listen: String,
    upgrade_timeout_secs: u32,
}

/// A `[[routes]]` entry: the single-upstream shorthand, or `protocol` plus `upstreams`.
#[derive(Serialize)]
struct Route<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    provider: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_url: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_model: Option<&'a str>,
    protocol: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key_file: Option<String>,
    /// Last: TOML writes arrays of tables after the plain keys.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    upstreams: Vec<UpstreamRow<'a>>,
}

/// A `[[routes.upstreams]]` entry.
#[derive(Serialize)]
struct UpstreamRow<'a> {
    name: &'a str,
    provider: &'static str,
    upstream_url: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_model: Option<&'a str>,
    api_key_file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_file: Option<String>,
    priority: i32,
    weight: i32,
}

fn provider_name(p: Provider) -> &'static str {
    match p {
        Provider::Openai => "openai",
        Provider::Azure => "azure",
    }
}

fn protocol_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Ga => "ga",
        Protocol::Beta => "beta",
    }
}

/// The `[[routes]]` entry of a spec. Validation has made sure exactly one of `upstream` and
/// `upstreams` is set and that the listed upstreams share one protocol.
fn route_entry(spec: &RealtimeRouteSpec) -> Route<'_> {
    match &spec.upstream {
        Some(up) => Route {
            model: &spec.model,
            provider: Some(provider_name(up.provider)),
            upstream_url: Some(default_url(up.url.as_deref(), up.provider).unwrap_or_default()),
            upstream_model: up.model.as_deref(),
            protocol: protocol_name(up.protocol),
            api_key_file: Some(format!("{UPSTREAM_KEY_DIR}/{}", up.api_key_secret_ref.key)),
            upstreams: Vec::new(),
        },
        None => Route {
            model: &spec.model,
            provider: None,
            upstream_url: None,
            upstream_model: None,
            protocol: protocol_name(
                spec.upstreams
                    .first()
                    .map(|u| u.protocol)
                    .unwrap_or_default(),
            ),
            api_key_file: None,
            upstreams: spec
                .upstreams
                .iter()
                .map(|u| UpstreamRow {
                    name: &u.name,
                    provider: provider_name(u.provider),
                    upstream_url: default_url(u.url.as_deref(), u.provider).unwrap_or_default(),
                    upstream_model: u.model.as_deref(),
                    api_key_file: upstreams_file(&u.api_key_secret_ref),
                    ca_file: u.ca_secret_ref.as_ref().map(upstreams_file),
                    priority: u.priority,
                    weight: u.weight,
                })
                .collect(),
        },
    }
}

#[derive(Serialize)]
struct PoolSection {
    size: i32,
    max_idle_secs: i32,
    max_size: i32,
    size_file: String,
}

#[derive(Serialize)]
struct Relay {
    idle_timeout_secs: u32,
    max_session_secs: u32,
    max_message_bytes: u64,
}

#[derive(Serialize)]
struct Limits {
    max_sessions: u32,
}

#[derive(Serialize)]
struct MeteringSection {
    flush_secs: i32,
    unpriced: &'static str,
}

#[derive(Serialize)]
struct PriceRow<'a> {
    model: &'a str,
    text_input: f64,
    cached_text_input: f64,
    audio_input: f64,
    cached_audio_input: f64,
    text_output: f64,
    audio_output: f64,
}

#[derive(Serialize)]
struct Store {
    redis_url_file: String,
}

#[derive(Serialize)]
struct Keys {
    file: String,
}

#[derive(Serialize)]
struct DrainSection {
    wait_secs: i32,
    mode: &'static str,
    linger_secs: i32,
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

/// An upstream's URL: the one given, or OpenAI's for an OpenAI upstream that names none.
pub fn default_url(url: Option<&str>, provider: Provider) -> Option<&str> {
    match (url, provider) {
        (Some(url), _) => Some(url),
        (None, Provider::Openai) => Some(OPENAI_REALTIME_URL),
        (None, Provider::Azure) => None,
    }
}

/// Render `gateway.toml` for a route. The spec must have passed validation (an Azure route
/// carries its URL); a missing URL renders as an empty string, which the gateway rejects.
pub fn render(spec: &RealtimeRouteSpec) -> String {
    let doc = GatewayToml {
        server: Server {
            listen: format!("0.0.0.0:{HTTP_PORT}"),
            admin_listen: format!("0.0.0.0:{ADMIN_PORT}"),
            upgrade_timeout_secs: UPGRADE_TIMEOUT_SECS,
        },
        routes: vec![route_entry(spec)],
        pool: PoolSection {
            size: POOL_SIZE_FALLBACK,
            max_idle_secs: spec.pool.max_idle_seconds,
            max_size: spec.pool.max_size,
            size_file: pool_size_path(),
        },
        relay: Relay {
            idle_timeout_secs: RELAY_IDLE_TIMEOUT_SECS,
            max_session_secs: RELAY_MAX_SESSION_SECS,
            max_message_bytes: RELAY_MAX_MESSAGE_BYTES,
        },
        limits: Limits {
            max_sessions: MAX_SESSIONS_PER_POD,
        },
        metering: MeteringSection {
            flush_secs: spec.metering.flush_seconds,
            unpriced: match spec.metering.unpriced {
                Unpriced::Allow => "allow",
                Unpriced::Block => "block",
            },
        },
        prices: spec
            .metering
            .prices
            .iter()
            .map(|p| PriceRow {
                model: &p.model,
                text_input: p.text_input,
                cached_text_input: p.cached_text_input,
                audio_input: p.audio_input,
                cached_audio_input: p.cached_audio_input,
                text_output: p.text_output,
                audio_output: p.audio_output,
            })
            .collect(),
        store: spec.metering.redis_url_secret_ref.as_ref().map(|r| Store {
            redis_url_file: format!("{REDIS_URL_DIR}/{}", r.key),
        }),
        keys: Keys {
            file: format!("{KEYS_DIR}/{}", spec.client_keys_secret_ref.key),
        },
        drain: DrainSection {
            wait_secs: spec.drain.wait_seconds,
            mode: match spec.drain.mode {
                DrainMode::Close => "close",
                DrainMode::Linger => "linger",
            },
            linger_secs: spec.drain.linger_seconds,
        },
        client_secrets: spec.client_secrets.as_ref().map(|c| ClientSecretsSection {
            signing_key_files: c
                .signing_keys_secret_ref
                .key_list()
                .into_iter()
                .map(|k| format!("{SIGNING_KEYS_DIR}/{k}"))
                .collect(),
            max_ttl_secs: c.max_ttl_seconds,
        }),
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
        assert_eq!(route["upstream_url"].as_str(), Some(OPENAI_REALTIME_URL));
        assert!(route.get("upstream_model").is_none());
        assert!(doc.get("store").is_none());
        assert!(doc.get("prices").is_none());
    }

    #[test]
    fn listed_upstreams_render_as_routes_upstreams_with_a_key_file_each() {
        let doc: toml::Table = toml::from_str(&render(&fixtures::two_upstream_spec())).unwrap();
        let route = doc["routes"].as_array().unwrap()[0].as_table().unwrap();
        let keys: Vec<&str> = route.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["model", "protocol", "upstreams"],
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
