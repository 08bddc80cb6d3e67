//! Rendering a route's `gateway.toml`, the file the gateway pod is started with.
//!
//! This is the one contract the operator shares with the gateway: the keys are exactly the ones the
//! gateway's loader accepts (it rejects unknown keys), and no secret is ever written here. Secrets
//! reach the pod as files of mounted Secret volumes, which the gateway re-reads when they change:
//! `api_key_file` (the upstream key), `[store] redis_url_file` and `[keys] file`.
//!
//! `[pool] size` is a fixed fallback ([`POOL_SIZE_FALLBACK`]), used only if the size file were
//! missing: the live value comes from `size_file`, which the pool ConfigMap feeds (it is applied
//! before the Deployment). Nothing that sizes the pool (`peakConcurrency`, `replicas`,
//! `pool.size`, the observed replica count) reaches this file, so none of them changes its hash and
//! the pod template: editing them, or an HPA scale event, never restarts the gateway pods and the
//! sessions they carry.

use serde::Serialize;

use crate::crd::{DrainMode, Protocol, Provider, RealtimeRouteSpec, Unpriced, OPENAI_REALTIME_URL};

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
}

#[derive(Serialize)]
struct Server {
    listen: String,
    admin_listen: String,
    upgrade_timeout_secs: u32,
}

#[derive(Serialize)]
struct Route<'a> {
    model: &'a str,
    provider: &'static str,
    upstream_url: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_model: Option<&'a str>,
    protocol: &'static str,
    api_key_file: String,
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

/// The rendered config without its [`LIVE_SECTIONS`]: what a pod must restart to apply.
pub fn restart_part(rendered: &str) -> String {
    let mut doc: toml::Table = toml::from_str(rendered).expect("the rendered config parses");
    for section in LIVE_SECTIONS {
        doc.remove(section);
    }
    toml::to_string(&doc).expect("a TOML table always serialises")
}

/// The upstream URL of a route: the spec's, or OpenAI's for an OpenAI route that names none.
pub fn upstream_url(spec: &RealtimeRouteSpec) -> Option<&str> {
    match (&spec.upstream.url, spec.upstream.provider) {
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
        routes: vec![Route {
            model: &spec.model,
            provider: match spec.upstream.provider {
                Provider::Openai => "openai",
                Provider::Azure => "azure",
            },
            upstream_url: upstream_url(spec).unwrap_or_default(),
            upstream_model: spec.upstream.model.as_deref(),
            protocol: match spec.upstream.protocol {
                Protocol::Ga => "ga",
                Protocol::Beta => "beta",
            },
            api_key_file: format!(
                "{UPSTREAM_KEY_DIR}/{}",
                spec.upstream.api_key_secret_ref.key
            ),
        }],
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
                "drain", "keys", "limits", "metering", "pool", "prices", "relay", "routes",
                "server", "store"
            ]
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
