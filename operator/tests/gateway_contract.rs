//! The operator ⇄ gateway contract: the `gateway.toml` the operator renders for a route loads
//! with the gateway's own config loader, for every example and for the extremes of the spec.
//!
//! The loader checks that `[keys] file` exists and reads `api_key_file` and `[store]
//! redis_url_file`. Inside a pod those are the mounted Secrets; here the test asserts the rendered
//! paths are the mount paths, then writes stand-in files to a temporary directory and points the
//! gateway at them (the keys file with the gateway's own env override `PATCHBAY_KEYS_FILE`, the
//! Secret directories by rewriting their prefix in the rendered text). No env var is set: the
//! rendered config must need none.

use std::path::{Path, PathBuf};

use patchbay_gateway::auth::KeySet;
use patchbay_gateway::config::Config;
use patchbay_operator::crd::{DrainMode, Protocol, RealtimeRoute, SecretKeyRef, MAX_SECONDS};
use patchbay_operator::gateway_config;
use serde::Deserialize;

fn example_docs(file: &str) -> Vec<serde_yaml::Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("example file");
    let docs = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("YAML document"))
        .collect();
    docs
}

fn example_route(file: &str) -> RealtimeRoute {
    example_docs(file)
        .into_iter()
        .find(|doc| doc["kind"] == "RealtimeRoute")
        .map(|doc| serde_yaml::from_value(doc).expect("a valid RealtimeRoute"))
        .expect("a RealtimeRoute in the example")
}

/// The client key file of `examples/secrets.yaml`, written to a temporary file.
fn example_keys_file() -> PathBuf {
    let docs = example_docs("secrets.yaml");
    let keys = docs
        .iter()
        .find(|doc| doc["kind"] == "Secret" && doc["metadata"]["name"] == "voice-keys")
        .and_then(|doc| doc["stringData"]["keys.toml"].as_str())
        .expect("the voice-keys Secret");
    let dir =
        std::env::temp_dir().join(format!("patchbay-operator-contract-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("keys.toml");
    std::fs::write(&path, keys).expect("write keys file");
    path
}

fn assert_loads(what: &str, route: &RealtimeRoute, keys_file: &Path) {
    let text = gateway_config::render(&route.spec);
    let doc: toml::Table = toml::from_str(&text).expect("TOML");
    assert_eq!(
        doc["keys"]["file"].as_str(),
        Some(
            format!(
                "/etc/patchbay/keys/{}",
                route.spec.client_keys_secret_ref.key
            )
            .as_str()
        ),
        "{what}: keys.file is the Secret's mount path"
    );
    let upstream = &route.spec.upstream.api_key_secret_ref.key;
    assert_eq!(
        doc["routes"][0]["api_key_file"].as_str(),
        Some(format!("/etc/patchbay/upstream/{upstream}").as_str()),
        "{what}: api_key_file is the upstream key Secret's mount path"
    );
    let dir = keys_file
        .parent()
        .expect("temp dir")
        .join(what.replace('/', "-"));
    std::fs::create_dir_all(dir.join("upstream")).expect("temp dir");
    std::fs::create_dir_all(dir.join("redis")).expect("temp dir");
    std::fs::write(dir.join("upstream").join(upstream), "sk-test-upstream\n").expect("key file");
    if let Some(redis) = &route.spec.metering.redis_url_secret_ref {
        assert_eq!(
            doc["store"]["redis_url_file"].as_str(),
            Some(format!("/etc/patchbay/redis/{}", redis.key).as_str()),
            "{what}: redis_url_file is the Redis Secret's mount path"
        );
        std::fs::write(
            dir.join("redis").join(&redis.key),
            "redis://127.0.0.1:6379\n",
        )
        .expect("url file");
    }
    let text = text
        .replace(
            "/etc/patchbay/upstream/",
            &format!("{}/upstream/", dir.display()),
        )
        .replace("/etc/patchbay/redis/", &format!("{}/redis/", dir.display()));
    let keys_file = keys_file.display().to_string();
    let env = |name: &str| match name {
        "PATCHBAY_KEYS_FILE" => Some(keys_file.clone()),
        _ => None,
    };
    if let Err(e) = Config::from_toml_with_env(&text, &env) {
        panic!("{what}: the gateway rejects the rendered config: {e}\n---\n{text}");
    }
}

#[test]
fn the_gateway_loads_the_config_rendered_for_every_example() {
    let keys = example_keys_file();
    for file in [
        "realtimeroute.yaml",
        "realtimeroute-minimal.yaml",
        "realtimeroute-full.yaml",
    ] {
        assert_loads(file, &example_route(file), &keys);
    }
}

#[test]
fn the_gateway_loads_the_config_of_a_beta_close_mode_route_with_a_pool_override() {
    let keys = example_keys_file();
    let mut route = example_route("realtimeroute-full.yaml");
    route.spec.upstream.protocol = Protocol::Beta;
    route.spec.upstream.model = None;
    route.spec.drain.mode = DrainMode::Close;
    route.spec.drain.linger_seconds = 0;
    route.spec.drain.wait_seconds = 1;
    route.spec.pool.size = Some(0);
    route.spec.pool.max_idle_seconds = 1;
    route.spec.metering.flush_seconds = 0;
    route.spec.metering.prices.clear();
    route.spec.metering.redis_url_secret_ref = None;
    route.spec.client_keys_secret_ref = SecretKeyRef {
        name: "keys".into(),
        key: "virtual-keys.toml".into(),
    };
    assert_loads("beta/close/override", &route, &keys);
}

#[test]
fn the_gateway_loads_the_config_at_the_schema_maxima() {
    assert_eq!(
        u64::try_from(MAX_SECONDS).unwrap(),
        patchbay_gateway::config::MAX_SECS,
        "the CRD's bound on seconds is the gateway's"
    );
    let keys = example_keys_file();
    let mut route = example_route("realtimeroute-full.yaml");
    route.spec.drain.mode = DrainMode::Linger;
    route.spec.drain.wait_seconds = MAX_SECONDS;
    route.spec.drain.linger_seconds = MAX_SECONDS;
    route.spec.drain.pre_stop_sleep_seconds = MAX_SECONDS;
    route.spec.pool.max_idle_seconds = MAX_SECONDS;
    route.spec.metering.flush_seconds = MAX_SECONDS;
    assert_loads("maxima", &route, &keys);
}

#[test]
fn the_example_client_keys_file_parses_with_the_gateway() {
    let text = std::fs::read_to_string(example_keys_file()).expect("keys file");
    KeySet::parse(&text).expect("the gateway accepts the example key file");
}
