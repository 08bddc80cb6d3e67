//! The operator ⇄ gateway contract: the `gateway.toml` the operator renders for a route loads
//! with the gateway's own config loader, for every example and for the extremes of the spec.
//!
//! The loader checks that `[keys] file` exists and reads every `api_key_file`, `ca_file`,
//! `[store] redis_url_file` and `[client_secrets] signing_key_files`. Inside a pod those are the mounted Secrets; here the test asserts the rendered
//! paths are the mount paths, then writes stand-in files to a temporary directory and points the
//! gateway at them (the keys file with the gateway's own env override `PATCHBAY_KEYS_FILE`, the
//! Secret directories by rewriting their prefix in the rendered text). No env var is set: the
//! rendered config must need none.

use std::path::{Path, PathBuf};

use patchbay_gateway::auth::KeySet;
use patchbay_gateway::config::{Config, ConfigError};
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

/// Every file path the rendered config names, with what the file holds.
fn rendered_files(doc: &toml::Table) -> Vec<(String, &'static str)> {
    let mut files = Vec::new();
    let mut push = |v: Option<&toml::Value>, what: &'static str| {
        if let Some(path) = v.and_then(|v| v.as_str()) {
            files.push((path.to_string(), what));
        }
    };
    for route in doc["routes"].as_array().expect("routes") {
        push(route.get("api_key_file"), "upstream key");
        let ups = route.get("upstreams").and_then(|u| u.as_array());
        for up in ups.into_iter().flatten() {
            push(up.get("api_key_file"), "upstream key");
            push(up.get("ca_file"), "CA");
        }
    }
    push(
        doc.get("store").and_then(|s| s.get("redis_url_file")),
        "Redis URL",
    );
    let signing = doc
        .get("client_secrets")
        .and_then(|c| c.get("signing_key_files"))
        .and_then(|f| f.as_array());
    for file in signing.into_iter().flatten() {
        push(Some(file), "signing key");
    }
    push(doc["server"].get("tls_cert_file"), "TLS certificate");
    push(doc["server"].get("tls_key_file"), "TLS key");
    files
}

/// A self-signed certificate and its key, made once: the gateway's loader checks that the
/// client listener's pair matches.
fn tls_pair() -> &'static (String, String) {
    static PAIR: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    PAIR.get_or_init(|| {
        let made = rcgen::generate_simple_self_signed(vec!["gateway.example".into()])
            .expect("a self-signed certificate");
        (made.cert.pem(), made.signing_key.serialize_pem())
    })
}

/// A stand-in for a mounted Secret file. The gateway's loader checks a CA file's PEM framing,
/// that a signing key has at least 32 bytes and that a TLS certificate and key match.
fn stand_in(what: &str) -> &'static str {
    match what {
        "TLS certificate" => &tls_pair().0,
        "TLS key" => &tls_pair().1,
        "upstream key" => "sk-test-upstream\n",
        "CA" => "-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n",
        "Redis URL" => "redis://127.0.0.1:6379\n",
        "signing key" => "0123456789abcdef0123456789abcdef-signing\n",
        other => panic!("no stand-in for {other}"),
    }
}

/// Renders `route`, checks each Secret file is under a mount path of the pod, writes a stand-in
/// for each under a temporary directory, and loads the result with the gateway's loader.
fn assert_loads(what: &str, route: &RealtimeRoute, keys_file: &Path) -> Config {
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
    if let Some(up) = &route.spec.upstream {
        assert_eq!(
            doc["routes"][0]["api_key_file"].as_str(),
            Some(format!("/etc/patchbay/upstream/{}", up.api_key_secret_ref.key).as_str()),
            "{what}: api_key_file is the upstream key Secret's mount path"
        );
    }
    if let Some(redis) = &route.spec.metering.redis_url_secret_ref {
        assert_eq!(
            doc["store"]["redis_url_file"].as_str(),
            Some(format!("/etc/patchbay/redis/{}", redis.key).as_str()),
            "{what}: redis_url_file is the Redis Secret's mount path"
        );
    }
    match load_rendered(what, &text, keys_file) {
        Ok(config) => config,
        Err(e) => panic!("{what}: the gateway rejects the rendered config: {e}\n---\n{text}"),
    }
}

/// Writes a stand-in for each Secret file `text` names under a temporary directory and loads
/// `text` with the gateway's loader, pointed at them.
fn load_rendered(what: &str, text: &str, keys_file: &Path) -> Result<Config, ConfigError> {
    let doc: toml::Table = toml::from_str(text).expect("TOML");
    let dir = keys_file
        .parent()
        .expect("temp dir")
        .join(what.replace(|c: char| !c.is_ascii_alphanumeric() && c != '.', "-"));
    for (path, kind) in rendered_files(&doc) {
        let rest = path
            .strip_prefix("/etc/patchbay/")
            .unwrap_or_else(|| panic!("{what}: {path} is not under a mount path"));
        let local = dir.join(rest);
        std::fs::create_dir_all(local.parent().expect("parent")).expect("temp dir");
        std::fs::write(&local, stand_in(kind)).expect("stand-in file");
    }
    let text = text.replace("/etc/patchbay/", &format!("{}/", dir.display()));
    let keys_file = keys_file.display().to_string();
    let env = |name: &str| match name {
        "PATCHBAY_KEYS_FILE" => Some(keys_file.clone()),
        _ => None,
    };
    Config::from_toml_with_env(&text, &env)
}

/// `route` with the field at JSON pointer `pointer` set to `value`, decoded as the operator
/// decodes what the API server stored.
fn with_field(route: &RealtimeRoute, pointer: &str, value: serde_json::Value) -> RealtimeRoute {
    let mut json = serde_json::to_value(route).expect("a route serialises");
    let (parent, key) = pointer.rsplit_once('/').expect("a JSON pointer");
    json.pointer_mut(parent)
        .and_then(|p| p.as_object_mut())
        .unwrap_or_else(|| panic!("{parent} is an object of the route"))
        .insert(key.into(), value);
    serde_json::from_value(json).unwrap_or_else(|e| panic!("{pointer}: {e}"))
}

/// The schema of the route's spec in the generated CRD: what the API server admits.
fn spec_schema() -> serde_json::Value {
    let crd: serde_json::Value =
        serde_yaml::from_str(&patchbay_operator::crd::crd_yaml()).expect("the CRD parses");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        .clone()
}

#[test]
fn the_gateway_loads_the_config_rendered_for_every_example() {
    let keys = example_keys_file();
    for file in [
        "realtimeroute.yaml",
        "realtimeroute-minimal.yaml",
        "realtimeroute-full.yaml",
        "realtimeroute-upstreams.yaml",
        "realtimeroute-translations.yaml",
        "realtimeroute-gateway-api.yaml",
    ] {
        assert_loads(file, &example_route(file), &keys);
    }
}

#[test]
fn a_routes_endpoint_and_intent_load_in_the_gateway_as_the_crd_spells_them() {
    let keys = example_keys_file();
    let schema = spec_schema();
    let route = example_route("realtimeroute-minimal.yaml");
    let endpoints = schema["endpoint"]["enum"].as_array().expect("an enum");
    assert_eq!(schema["endpoint"]["default"], "realtime");
    assert!(endpoints.len() >= 2, "{endpoints:?}");
    for w in endpoints {
        let r = with_field(&route, "/spec/endpoint", w.clone());
        patchbay_operator::validate::check_spec(&r.spec).unwrap_or_else(|e| panic!("{w}: {e}"));
        let config = assert_loads(&format!("endpoint-{}", w.as_str().unwrap()), &r, &keys);
        assert_eq!(&serde_json::to_value(config.routes[0].endpoint).unwrap(), w);
    }
    let intents = schema["intent"]["enum"].as_array().expect("an enum");
    // `null` is the field left out (the schema lists it for the optional field).
    for w in intents.iter().filter(|w| !w.is_null()) {
        let r = with_field(&route, "/spec/intent", w.clone());
        patchbay_operator::validate::check_spec(&r.spec).unwrap_or_else(|e| panic!("{w}: {e}"));
        let config = assert_loads(&format!("intent-{}", w.as_str().unwrap()), &r, &keys);
        assert_eq!(&serde_json::to_value(config.routes[0].intent).unwrap(), w);
        // Judged alike: a translations route with an intent.
        let r = with_field(&r, "/spec/endpoint", "translations".into());
        assert!(patchbay_operator::validate::check_spec(&r.spec).is_err());
        let text = gateway_config::render(&r.spec);
        let e = load_rendered("intent-translations", &text, &keys).unwrap_err();
        assert_eq!(e.key, "routes[0].intent", "{e}");
    }
}

#[test]
fn a_routes_endpoint_and_its_upstream_url_are_judged_alike_by_the_operator_and_the_gateway() {
    let keys = example_keys_file();
    let route = example_route("realtimeroute-minimal.yaml");
    for (endpoint, url, ok) in [
        ("realtime", "wss://api.openai.com/v1/realtime", true),
        (
            "translations",
            "wss://api.openai.com/v1/realtime/translations",
            true,
        ),
        (
            "translations",
            "ws://127.0.0.1:9/v1/realtime/translations/",
            true,
        ),
        ("translations", "wss://api.openai.com/v1/realtime", false),
        (
            "realtime",
            "wss://api.openai.com/v1/realtime/translations",
            false,
        ),
    ] {
        let r = with_field(&route, "/spec/endpoint", endpoint.into());
        let r = with_field(&r, "/spec/upstream/url", url.into());
        let operator = patchbay_operator::validate::check_spec(&r.spec);
        assert_eq!(
            operator.is_ok(),
            ok,
            "the operator on {endpoint} {url}: {operator:?}"
        );
        let text = gateway_config::render(&r.spec);
        match load_rendered(&format!("endpoint-url-{endpoint}"), &text, &keys) {
            Ok(_) => assert!(ok, "the gateway accepts {endpoint} {url}"),
            Err(e) => {
                assert!(!ok, "the gateway refuses {endpoint} {url}: {e}");
                assert_eq!(e.key, "routes[0].upstream_url", "{e}");
            }
        }
    }
}

#[test]
fn the_gateway_loads_the_config_of_a_beta_close_mode_route_with_a_pool_override() {
    let keys = example_keys_file();
    let mut route = example_route("realtimeroute-full.yaml");
    let upstream = route.spec.upstream.as_mut().expect("one upstream");
    upstream.protocol = Protocol::Beta;
    upstream.model = None;
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
fn the_gateway_loads_two_listed_upstreams_with_their_key_files_balances_and_protocol() {
    let keys = example_keys_file();
    let route = example_route("realtimeroute-upstreams.yaml");
    assert_eq!(route.spec.upstreams.len(), 2);
    let config = assert_loads("two-upstreams", &route, &keys);
    let loaded = &config.routes[0];
    assert_eq!(loaded.model, route.spec.model);
    assert_eq!(loaded.upstreams.len(), 2);
    for (spec, got) in route.spec.upstreams.iter().zip(&loaded.upstreams) {
        assert_eq!(got.name, spec.name);
        assert_eq!(
            i64::from(got.priority),
            i64::from(spec.priority),
            "{}",
            spec.name
        );
        assert_eq!(
            i64::from(got.weight),
            i64::from(spec.weight),
            "{}",
            spec.name
        );
        assert!(
            got.api_key_file
                .as_ref()
                .is_some_and(|f| f.ends_with(format!(
                    "upstreams/{}/{}",
                    spec.api_key_secret_ref.name, spec.api_key_secret_ref.key
                ))),
            "{}: {:?}",
            spec.name,
            got.api_key_file
        );
        assert_eq!(
            got.ca_file.is_some(),
            spec.ca_secret_ref.is_some(),
            "{}",
            spec.name
        );
    }
    // The live part the gateway re-reads names the same upstreams with their balances.
    let text = gateway_config::render(&route.spec);
    let balances = patchbay_gateway::config::balances_from_toml(&text).expect("balances");
    assert_eq!(balances.len(), 2);
    assert_eq!(balances[0].upstream, route.spec.upstreams[0].name);
    assert_eq!(
        i64::from(balances[0].weight),
        i64::from(route.spec.upstreams[0].weight)
    );
}

#[test]
fn the_gateway_refuses_what_the_operator_refuses_for_listed_upstreams() {
    // A route mixing protocols never reaches a pod (validation refuses it); were it rendered,
    // the gateway's loader would refuse it too, naming the route's upstream.
    let keys = example_keys_file();
    let mut route = example_route("realtimeroute-upstreams.yaml");
    route.spec.upstreams[1].protocol = Protocol::Beta;
    assert!(patchbay_operator::validate::check_spec(&route.spec).is_err());
    let rendered = gateway_config::render(&route.spec);
    let mut doc: toml::Table = toml::from_str(&rendered).unwrap();
    let up = doc["routes"][0]["upstreams"][1].as_table_mut().unwrap();
    up.insert("protocol".into(), "beta".into());
    let text = toml::to_string(&doc).unwrap();
    let dir = keys.parent().unwrap().join("mixed");
    for (path, kind) in rendered_files(&doc) {
        let local = dir.join(path.strip_prefix("/etc/patchbay/").unwrap());
        std::fs::create_dir_all(local.parent().unwrap()).unwrap();
        std::fs::write(&local, stand_in(kind)).unwrap();
    }
    let text = text.replace("/etc/patchbay/", &format!("{}/", dir.display()));
    let keys_file = keys.display().to_string();
    let env = |name: &str| (name == "PATCHBAY_KEYS_FILE").then(|| keys_file.clone());
    let err = Config::from_toml_with_env(&text, &env).unwrap_err();
    assert_eq!(err.key, "routes[0].upstreams[1].protocol");
}

#[test]
fn the_gateway_loads_client_secrets_with_every_signing_key_file() {
    let keys = example_keys_file();
    let route = example_route("realtimeroute-full.yaml");
    let cs = route
        .spec
        .client_secrets
        .as_ref()
        .expect("the full example mints secrets");
    let config = assert_loads("client-secrets", &route, &keys);
    let files: Vec<String> = config
        .client_secrets
        .signing_key_files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let expected: Vec<String> = cs
        .signing_keys_secret_ref
        .key_list()
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(files, expected, "the first listed key signs");
    assert_eq!(
        config.client_secrets.max_ttl_secs,
        u64::try_from(cs.max_ttl_seconds.expect("a cap")).unwrap()
    );
    assert_eq!(
        i64::from(patchbay_operator::crd::MAX_CLIENT_SECRET_TTL_SECONDS),
        i64::try_from(patchbay_gateway::client_secret::request::MAX_TTL_SECS).unwrap(),
        "the CRD's cap is the gateway's"
    );
    assert_eq!(
        i64::from(patchbay_operator::crd::MIN_CLIENT_SECRET_TTL_SECONDS),
        i64::try_from(patchbay_gateway::client_secret::request::MIN_TTL_SECS).unwrap()
    );
}

#[test]
fn the_example_client_keys_file_parses_with_the_gateway() {
    let text = std::fs::read_to_string(example_keys_file()).expect("keys file");
    KeySet::parse(&text).expect("the gateway accepts the example key file");
}

/// Reads one setting of a loaded gateway config as the word or number it was written as.
type Loaded = fn(&Config) -> serde_json::Value;

fn word<T: serde::Serialize>(v: T) -> serde_json::Value {
    serde_json::to_value(v).expect("an enum serialises")
}

#[test]
fn every_word_the_crd_accepts_renders_to_a_config_the_gateway_loads_with_that_word() {
    let keys = example_keys_file();
    let single = example_route("realtimeroute-full.yaml");
    let listed = example_route("realtimeroute-upstreams.yaml");
    let schema = spec_schema();
    let azure_url = "wss://eastus.openai.azure.com/openai/v1/realtime";
    // (route, the enum's schema, where the word goes in the spec, what the gateway loaded)
    let fields: [(&RealtimeRoute, &serde_json::Value, &[&str], Loaded); 6] = [
        (
            &single,
            &schema["upstream"]["properties"]["provider"],
            &["/spec/upstream/provider"],
            |c| word(c.routes[0].upstreams[0].provider),
        ),
        (
            &single,
            &schema["upstream"]["properties"]["protocol"],
            &["/spec/upstream/protocol"],
            |c| word(c.routes[0].protocol),
        ),
        (
            &listed,
            &schema["upstreams"]["items"]["properties"]["provider"],
            &["/spec/upstreams/0/provider"],
            |c| word(c.routes[0].upstreams[0].provider),
        ),
        (
            &listed,
            &schema["upstreams"]["items"]["properties"]["protocol"],
            &["/spec/upstreams/0/protocol", "/spec/upstreams/1/protocol"],
            |c| word(c.routes[0].upstreams[1].protocol),
        ),
        (
            &single,
            &schema["metering"]["properties"]["unpriced"],
            &["/spec/metering/unpriced"],
            |c| word(c.metering.unpriced),
        ),
        (
            &single,
            &schema["drain"]["properties"]["mode"],
            &["/spec/drain/mode"],
            |c| word(c.drain.mode),
        ),
    ];
    for (route, enum_schema, pointers, loaded) in fields {
        let words = enum_schema["enum"].as_array().expect("an enum in the CRD");
        assert!(words.len() >= 2, "{enum_schema}");
        for w in words {
            let mut route = route.clone();
            for pointer in pointers {
                route = with_field(&route, pointer, w.clone());
                if *w == "azure" {
                    let url = pointer.replace("/provider", "/url");
                    route = with_field(&route, &url, azure_url.into());
                }
            }
            patchbay_operator::validate::check_spec(&route.spec)
                .unwrap_or_else(|e| panic!("{pointers:?} = {w}: {e}"));
            let what = format!("{}-{}", pointers[0], w.as_str().expect("a word"));
            let config = assert_loads(&what, &route, &keys);
            assert_eq!(&loaded(&config), w, "{pointers:?}");
        }
    }
}

#[test]
fn each_seconds_bound_is_the_crds_the_operators_and_the_gateways() {
    let keys = example_keys_file();
    let route = example_route("realtimeroute-full.yaml");
    let schema = spec_schema();
    // (CRD section and field, gateway section and key, what the gateway loaded)
    let bounds: [(&str, &str, &str, &str, Loaded); 5] = [
        ("pool", "maxIdleSeconds", "pool", "max_idle_secs", |c| {
            c.pool.max_idle_secs.into()
        }),
        ("metering", "flushSeconds", "metering", "flush_secs", |c| {
            c.metering.flush_secs.into()
        }),
        ("drain", "waitSeconds", "drain", "wait_secs", |c| {
            c.drain.wait_secs.into()
        }),
        ("drain", "lingerSeconds", "drain", "linger_secs", |c| {
            c.drain.linger_secs.into()
        }),
        (
            "clientSecrets",
            "maxTTLSeconds",
            "client_secrets",
            "max_ttl_secs",
            |c| c.client_secrets.max_ttl_secs.into(),
        ),
    ];
    for (section, field, gw_section, gw_key, loaded) in bounds {
        let published = &schema[section]["properties"][field];
        let bound = |k: &str| {
            let v = published[k]
                .as_f64()
                .unwrap_or_else(|| panic!("{section}.{field} has a {k}"));
            v as i64
        };
        let (min, max) = (bound("minimum"), bound("maximum"));
        let pointer = format!("/spec/{section}/{field}");
        for edge in [min, max] {
            let at_edge = with_field(&route, &pointer, edge.into());
            patchbay_operator::validate::check_spec(&at_edge.spec)
                .unwrap_or_else(|e| panic!("the operator refuses {section}.{field} = {edge}: {e}"));
            let config = assert_loads(&format!("{gw_key}-{edge}"), &at_edge, &keys);
            assert_eq!(loaded(&config), serde_json::Value::from(edge), "{gw_key}");
            let past = if edge == min { min - 1 } else { max + 1 };
            let beyond = with_field(&route, &pointer, past.into());
            let Err(err) = patchbay_operator::validate::check_spec(&beyond.spec) else {
                panic!("the operator accepts {section}.{field} = {past}");
            };
            assert!(
                err.to_string().contains(&format!("{section}.{field}")),
                "{err}"
            );
            // The gateway, given the value past the edge in the file, refuses it by name.
            let mut doc: toml::Table =
                toml::from_str(&gateway_config::render(&at_edge.spec)).unwrap();
            doc[gw_section]
                .as_table_mut()
                .unwrap()
                .insert(gw_key.into(), past.into());
            let text = toml::to_string(&doc).unwrap();
            let Err(err) = load_rendered(&format!("{gw_key}-{past}"), &text, &keys) else {
                panic!("the gateway accepts {gw_section}.{gw_key} = {past}");
            };
            assert_eq!(err.key, format!("{gw_section}.{gw_key}"), "{err}");
        }
    }
}

#[test]
fn the_price_ceiling_is_the_crds_the_operators_and_the_gateways() {
    let keys = example_keys_file();
    let route = example_route("realtimeroute-full.yaml");
    let schema = spec_schema();
    let published = &schema["metering"]["properties"]["prices"]["items"]["properties"];
    let per_million = patchbay_operator::crd::MAX_PRICE_USD_PER_MILLION_TOKENS;
    let per_minute = patchbay_operator::crd::MAX_PRICE_USD_PER_MINUTE;
    // (CRD field, gateway key, the example's price row, the ceiling): row 1 is per-minute.
    for (field, gw_key, row, ceiling) in [
        ("textInput", "text_input", 0, per_million),
        ("cachedTextInput", "cached_text_input", 0, per_million),
        ("audioInput", "audio_input", 0, per_million),
        ("cachedAudioInput", "cached_audio_input", 0, per_million),
        ("textOutput", "text_output", 0, per_million),
        ("audioOutput", "audio_output", 0, per_million),
        ("usdPerMinute", "usd_per_minute", 1, per_minute),
    ] {
        let max = published[field]["maximum"]
            .as_f64()
            .unwrap_or_else(|| panic!("prices[].{field} has a maximum"));
        assert_eq!(max, ceiling, "{field}");
        let pointer = format!("/spec/metering/prices/{row}/{field}");
        let at_max = with_field(&route, &pointer, max.into());
        patchbay_operator::validate::check_spec(&at_max.spec)
            .unwrap_or_else(|e| panic!("the operator refuses {field} = {max}: {e}"));
        assert_loads(&format!("price-{gw_key}-max"), &at_max, &keys);
        let past = max * 2.0;
        let beyond = with_field(&route, &pointer, past.into());
        let Err(err) = patchbay_operator::validate::check_spec(&beyond.spec) else {
            panic!("the operator accepts {field} = {past}");
        };
        assert!(
            err.to_string()
                .contains(&format!("metering.prices[{row}].{field}")),
            "{err}"
        );
        // The gateway, given that price in its file, refuses to start, naming the key.
        let text = gateway_config::render(&beyond.spec);
        let Err(err) = load_rendered(&format!("price-{gw_key}-past"), &text, &keys) else {
            panic!("the gateway accepts prices[{row}].{gw_key} = {past}");
        };
        assert_eq!(err.key, format!("prices[{row}].{gw_key}"), "{err}");
    }
}

#[test]
fn upstream_urls_are_judged_alike_by_the_operator_and_the_gateway() {
    let keys = example_keys_file();
    let route = example_route("realtimeroute-full.yaml");
    for (provider, url, ok) in [
        ("openai", "wss://api.openai.com/v1/realtime", true),
        ("openai", "ws://127.0.0.1:8081/v1/realtime", true),
        ("openai", "https://api.openai.com/v1/realtime", false),
        ("openai", "wss://", false),
        ("openai", "wss:// /x", false),
        ("openai", "wss://host:99999/v1/realtime", false),
        ("openai", "wss://host:abc/v1/realtime", false),
        ("openai", "not a url", false),
        ("azure", "wss://r.openai.azure.com/openai/v1/realtime", true),
        (
            "azure",
            "wss://r.openai.azure.com/openai/realtime?api-version=2025-04-01-preview&deployment=d",
            true,
        ),
        (
            "azure",
            "wss://r.openai.azure.com/openai/realtime?deployment=d",
            false,
        ),
    ] {
        let r = with_field(&route, "/spec/upstream/provider", provider.into());
        let r = with_field(&r, "/spec/upstream/url", url.into());
        let operator = patchbay_operator::validate::check_spec(&r.spec);
        let text = gateway_config::render(&r.spec);
        let gateway = load_rendered(&format!("url-{provider}"), &text, &keys);
        assert_eq!(
            operator.is_ok(),
            ok,
            "the operator on {provider} {url}: {operator:?}"
        );
        match gateway {
            Ok(_) => assert!(ok, "the gateway accepts {provider} {url}"),
            Err(e) => {
                assert!(!ok, "the gateway refuses {provider} {url}: {e}");
                assert_eq!(e.key, "routes[0].upstream_url", "{e}");
            }
        }
    }
}

#[test]
fn every_telemetry_word_the_crd_admits_loads_and_resolves_in_the_gateway() {
    let keys = example_keys_file();
    let schema = &spec_schema()["telemetry"]["properties"];
    let route = example_route("realtimeroute-minimal.yaml");
    let protocols = schema["protocol"]["enum"].as_array().expect("an enum");
    let samplers = schema["tracesSampler"]["enum"].as_array().expect("an enum");
    assert_eq!(protocols.len(), 2);
    assert_eq!(samplers.iter().filter(|w| !w.is_null()).count(), 6);
    for protocol in protocols {
        for sampler in samplers.iter().filter(|w| !w.is_null()) {
            let telemetry = serde_json::json!({
                "endpoint": "http://otel-collector.observability:4318",
                "protocol": protocol,
                "serviceName": "voice-gw",
                "resourceAttributes": {"deployment.environment.name": "prod", "team": "voice"},
                "tracesSampler": sampler,
                "tracesSamplerRatio": 0.25,
            });
            let r = with_field(&route, "/spec/telemetry", telemetry);
            patchbay_operator::validate::check_spec(&r.spec).expect("valid");
            let config = assert_loads(&format!("telemetry-{protocol}-{sampler}"), &r, &keys);
            let settings = config
                .telemetry
                .resolve(&|_| None)
                .unwrap_or_else(|e| panic!("{protocol} {sampler}: {} {}", e.key, e.message))
                .expect("export is on");
            assert_eq!(
                settings.endpoints.traces.protocol.as_str(),
                protocol.as_str().unwrap()
            );
            let resource: std::collections::BTreeMap<_, _> =
                settings.resource.iter().cloned().collect();
            assert_eq!(resource["service.name"], "voice-gw");
            assert_eq!(resource["deployment.environment.name"], "prod");
            assert_eq!(resource["team"], "voice");
        }
    }
    // The restart part covers it: pods restart to pick a new collector up.
    let a = with_field(
        &route,
        "/spec/telemetry",
        serde_json::json!({"endpoint": "http://a:4318"}),
    );
    let b = with_field(
        &route,
        "/spec/telemetry",
        serde_json::json!({"endpoint": "http://b:4318"}),
    );
    assert_ne!(
        gateway_config::restart_part(&gateway_config::render(&a.spec)),
        gateway_config::restart_part(&gateway_config::render(&b.spec))
    );
    // What the gateway would refuse, validation refuses first.
    for bad in [
        serde_json::json!({"endpoint": "otel:4318"}),
        serde_json::json!({"endpoint": "http://"}),
        serde_json::json!({"endpoint": "http://a:4318", "resourceAttributes": {"a,b": "c"}}),
        serde_json::json!({"endpoint": "http://a:4318", "resourceAttributes": {"a": "b,c"}}),
        serde_json::json!({"endpoint": "http://a:4318", "tracesSamplerRatio": 1.5}),
    ] {
        let r = with_field(&route, "/spec/telemetry", bad.clone());
        assert!(
            patchbay_operator::validate::check_spec(&r.spec).is_err(),
            "{bad}"
        );
    }
}
