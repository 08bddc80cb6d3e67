//! The environment's part of the configuration: the `PATCHBAY_<SECTION>_<KEY>`
//! overrides (and the pool's well-known short names) applied to a parsed
//! config document, and the check of every `PATCHBAY_*` name the process
//! was given, so that a typo never silently falls back to a default.
//!
//! A name under a section's prefix that is not one of its keys
//! (`PATCHBAY_RELAY_IDLE_TIMEOUT_SEC`) is an error: it can only be a
//! misspelt override. Any other unknown `PATCHBAY_*` name is reported as a
//! warning, not an error: the same environment is shared with other tools
//! of the project (the operator's `PATCHBAY_WATCH_NAMESPACE`, the tests'
//! `PATCHBAY_TEST_REDIS_URL`), and refusing those would stop a gateway
//! over a variable it was never meant to read.

/// Every override's prefix.
pub const ENV_PREFIX: &str = "PATCHBAY_";

/// The sections whose keys the environment can set.
pub const TABLE_SECTIONS: [&str; 10] = [
    "server",
    "pool",
    "relay",
    "limits",
    "metering",
    "store",
    "keys",
    "drain",
    "client_secrets",
    "telemetry",
];

/// `PATCHBAY_*` names the gateway reads that are not section overrides.
const OTHER_NAMES: [&str; 4] = [
    "PATCHBAY_MASTER_KEY",
    "PATCHBAY_KUBE_SERVICEACCOUNT_DIR",
    "PATCHBAY_LOG_FORMAT",
    "PATCHBAY_LOG_QUEUE_LINES",
];

/// An override that cannot be applied or a name that cannot be one.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvError {
    /// The variable.
    pub var: String,
    pub message: String,
}

/// The keys of a section, as the environment can set them.
pub fn section_keys(section: &str) -> &'static [&'static str] {
    match section {
        "server" => &[
            "listen",
            "admin_listen",
            "upgrade_timeout_secs",
            "worker_threads",
            "max_failovers",
            "breaker_failures",
            "breaker_open_secs",
            "breaker_max_open_secs",
            "cors_origins",
            "access_log",
            "tls_cert_file",
            "tls_key_file",
        ],
        "pool" => &[
            "size",
            "max_idle_secs",
            "max_size",
            "size_file",
            "size_configmap",
            "warmup_timeout_secs",
        ],
        "relay" => &["idle_timeout_secs", "max_session_secs", "max_message_bytes"],
        "limits" => &["max_sessions"],
        "metering" => &["flush_secs", "unpriced", "stream_maxlen", "max_turn_usd"],
        "store" => &["redis_url_env", "redis_url_file", "ca_file", "replica_acks"],
        "keys" => &["file"],
        "drain" => &["wait_secs", "mode", "linger_secs"],
        "client_secrets" => &["signing_key_files", "max_ttl_secs"],
        "telemetry" => &[
            "endpoint",
            "protocol",
            "service_name",
            "resource_attributes",
            "sampler",
            "sampler_arg",
            "queue_size",
            "batch_size",
            "batch_delay_ms",
            "export_timeout_ms",
            "metrics_interval_ms",
        ],
        _ => &[],
    }
}

fn var_name(section: &str, key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}_{}",
        section.to_uppercase(),
        key.to_uppercase()
    )
}

/// Applies the `PATCHBAY_<SECTION>_<KEY>` overrides (and the pool's short
/// names) from `env` to a parsed config file.
pub fn apply(doc: &mut toml::Table, env: &dyn Fn(&str) -> Option<String>) -> Result<(), EnvError> {
    // The closure interface cannot enumerate, so probe the known keys of each
    // section; [`check_names`] is what finds the unknown ones.
    for section in TABLE_SECTIONS {
        for key in section_keys(section) {
            if let Some(raw) = env(&var_name(section, key)) {
                set_value(doc, section, key, parse_value(&raw));
            }
        }
    }
    for (var, key) in [
        ("REALTIME_POOL_SIZE", "size"),
        ("REALTIME_POOL_MAX_IDLE_SECS", "max_idle_secs"),
    ] {
        if let Some(raw) = env(var) {
            let n: i64 = raw.trim().parse().map_err(|_| EnvError {
                var: var.into(),
                message: format!("not a whole number: {raw:?}"),
            })?;
            if n < 0 {
                return Err(EnvError {
                    var: var.into(),
                    message: "must be >= 0".into(),
                });
            }
            set_value(doc, "pool", key, toml::Value::Integer(n));
        }
    }
    Ok(())
}

/// Checks the `PATCHBAY_*` names among `names`: an error for the first
/// name under a section's prefix that is none of its keys (with the key it
/// most likely meant), else the other names the gateway does not read, to
/// be logged as warnings. `referenced` are the variables the config itself
/// names (a route's `api_key_env`, `store.redis_url_env`): those are read.
pub fn check_names<'a>(
    names: impl IntoIterator<Item = &'a str>,
    referenced: &[&str],
) -> Result<Vec<String>, EnvError> {
    let mut unread = Vec::new();
    for name in names {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if OTHER_NAMES.contains(&name) || referenced.contains(&name) {
            continue;
        }
        if is_service_link(rest) {
            unread.push(name.to_string());
            continue;
        }
        // The longest section prefix: `CLIENT_SECRETS_` before a shorter one.
        let section = TABLE_SECTIONS
            .iter()
            .filter(|s| {
                rest.len() > s.len()
                    && rest[..s.len()].eq_ignore_ascii_case(s)
                    && rest.as_bytes()[s.len()] == b'_'
            })
            .max_by_key(|s| s.len());
        let Some(section) = section else {
            unread.push(name.to_string());
            continue;
        };
        let key = rest[section.len() + 1..].to_ascii_lowercase();
        let keys = section_keys(section);
        if keys.contains(&key.as_str()) && name == var_name(section, &key) {
            continue;
        }
        let hint = closest(&key, keys)
            .map(|k| format!(" (did you mean {}?)", var_name(section, k)))
            .unwrap_or_default();
        return Err(EnvError {
            var: name.to_string(),
            message: format!(
                "`{key}` is not a key of [{section}]{hint}; its keys are {}",
                keys.join(", ")
            ),
        });
    }
    Ok(unread)
}

/// Whether `rest` (a name after `PATCHBAY_`) has the shape of the
/// variables Kubernetes sets for each Service of a pod's namespace (its
/// "service links": `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT[_<PORT>]`,
/// `<NAME>_PORT[_<N>_<PROTO>[_PROTO|_PORT|_ADDR]]`): a Service called
/// `patchbay-store` gives `PATCHBAY_STORE_SERVICE_HOST`. Those are not
/// misspelt overrides (no key ends so), so they are only warned about.
fn is_service_link(rest: &str) -> bool {
    const PROTOS: [&str; 3] = ["_TCP", "_UDP", "_SCTP"];
    if rest.ends_with("_SERVICE_HOST") || rest.ends_with("_PORT") {
        return true;
    }
    if let Some((_, port)) = rest.rsplit_once("_SERVICE_PORT_") {
        return !port.is_empty();
    }
    let rest = ["_PROTO", "_PORT", "_ADDR"]
        .iter()
        .find_map(|s| rest.strip_suffix(s))
        .unwrap_or(rest);
    PROTOS.iter().any(|p| {
        rest.strip_suffix(p)
            .and_then(|r| r.rsplit_once("_PORT_"))
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// The environment variables a config file names as where a secret lives
/// (every string under a key ending in `_env`: a route's `api_key_env`,
/// `store.redis_url_env`), found in the raw document so that a misspelt
/// override is reported before anything else of the file is checked.
pub fn referenced_names(doc: &toml::Table) -> Vec<String> {
    fn walk(t: &toml::Table, out: &mut Vec<String>) {
        for (k, v) in t {
            match v {
                toml::Value::String(s) if k.ends_with("_env") => out.push(s.clone()),
                toml::Value::Table(t) => walk(t, out),
                toml::Value::Array(items) => {
                    for t in items.iter().filter_map(toml::Value::as_table) {
                        walk(t, out);
                    }
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(doc, &mut out);
    out
}

/// The key nearest to `key` by edit distance, if it is near (a typo) or
/// one of the two begins the other (`max_ttl` for `max_ttl_secs`).
fn closest<'k>(key: &str, keys: &[&'k str]) -> Option<&'k str> {
    keys.iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, k)| *d <= 3 || k.starts_with(key) || key.starts_with(k))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// `raw` as a TOML value when it is one (`10`, `true`, `"x"`, `["a"]`),
/// else as a string.
fn parse_value(raw: &str) -> toml::Value {
    match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.into()),
    }
}

fn set_value(doc: &mut toml::Table, section: &str, key: &str, value: toml::Value) {
    let table = doc
        .entry(section)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let toml::Value::Table(t) = table {
        t.insert(key.to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_override_is_an_error_naming_the_key_it_meant() {
        let e = check_names(["PATCHBAY_RELAY_IDLE_TIMEOUT_SEC"], &[]).unwrap_err();
        assert_eq!(e.var, "PATCHBAY_RELAY_IDLE_TIMEOUT_SEC");
        assert!(
            e.message
                .contains("did you mean PATCHBAY_RELAY_IDLE_TIMEOUT_SECS?"),
            "{e:?}"
        );
        let e = check_names(["PATCHBAY_CLIENT_SECRETS_MAX_TTL"], &[]).unwrap_err();
        assert!(e.message.contains("[client_secrets]"), "{e:?}");
        assert!(
            e.message
                .contains("did you mean PATCHBAY_CLIENT_SECRETS_MAX_TTL_SECS?"),
            "{e:?}"
        );
        // A lower-case override is not read: refused, not ignored.
        assert!(check_names(["PATCHBAY_SERVER_listen"], &[]).is_err());
    }

    #[test]
    fn known_overrides_and_names_the_config_reads_pass() {
        let names = [
            "PATCHBAY_SERVER_LISTEN",
            "PATCHBAY_CLIENT_SECRETS_SIGNING_KEY_FILES",
            "PATCHBAY_MASTER_KEY",
            "PATCHBAY_LOG_FORMAT",
            "PATCHBAY_STORE_URL",
            "HOME",
        ];
        assert_eq!(check_names(names, &["PATCHBAY_STORE_URL"]), Ok(Vec::new()));
    }

    #[test]
    fn the_names_a_file_refers_to_are_found_at_any_depth() {
        let doc: toml::Table = toml::from_str(
            "[store]\nredis_url_env = \"R\"\n[[routes]]\napi_key_env = \"A\"\n\
             [[routes.upstreams]]\napi_key_env = \"B\"\nname = \"x\"\n",
        )
        .unwrap();
        let mut names = referenced_names(&doc);
        names.sort();
        assert_eq!(names, ["A", "B", "R"]);
    }

    #[test]
    fn kubernetes_service_links_are_warnings_not_typos() {
        let links = [
            "PATCHBAY_STORE_SERVICE_HOST",
            "PATCHBAY_STORE_SERVICE_PORT",
            "PATCHBAY_SERVER_SERVICE_PORT_HTTP",
            "PATCHBAY_STORE_PORT",
            "PATCHBAY_STORE_PORT_6379_TCP",
            "PATCHBAY_STORE_PORT_6379_TCP_PROTO",
            "PATCHBAY_STORE_PORT_6379_TCP_PORT",
            "PATCHBAY_STORE_PORT_6379_TCP_ADDR",
        ];
        assert_eq!(
            check_names(links, &[]),
            Ok(links.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        );
        // Not a link's shape: still a typo.
        assert!(check_names(["PATCHBAY_STORE_PORT_X_TCP"], &[]).is_err());
        assert!(check_names(["PATCHBAY_STORE_SERVICE_HOSTS"], &[]).is_err());
    }

    #[test]
    fn other_unknown_names_are_warnings() {
        assert_eq!(
            check_names(["PATCHBAY_TEST_REDIS_URL", "PATCHBAY_WATCH_NAMESPACE"], &[]),
            Ok(vec![
                "PATCHBAY_TEST_REDIS_URL".to_string(),
                "PATCHBAY_WATCH_NAMESPACE".to_string()
            ])
        );
    }

    #[test]
    fn every_section_key_is_accepted_by_its_own_name() {
        for section in TABLE_SECTIONS {
            for key in section_keys(section) {
                let name = var_name(section, key);
                assert_eq!(check_names([name.as_str()], &[]), Ok(Vec::new()), "{name}");
            }
        }
    }
}
