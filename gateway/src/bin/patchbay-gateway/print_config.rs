//! `patchbay-gateway print-config`: the config file as the gateway reads
//! it, with the environment's `PATCHBAY_<SECTION>_<KEY>` overrides applied,
//! as TOML (keys left out take their defaults, docs/configuration.md). The
//! config is validated first, as `serve` would (exit 2 naming the key).
//!
//! Nothing secret is printed: the config names where secrets live
//! (`api_key_env`, `redis_url_file`, …), and those names are kept, but any
//! other value under a name that says key, secret, password or token is
//! replaced by `[REDACTED]`, and a URL's password by `REDACTED`, in case a
//! file or an override put one there. Files are never opened for printing.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use patchbay_gateway::config::{apply_env_overrides, Config, DEFAULT_CONFIG_FILE};

/// What a redacted value is printed as.
const REDACTED: &str = "[REDACTED]";

pub fn run(path: Option<&Path>) -> ExitCode {
    match effective(path) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("patchbay-gateway print-config: {e}");
            ExitCode::from(crate::EXIT_CONFIG)
        }
    }
}

/// The effective config's TOML, redacted.
fn effective(path: Option<&Path>) -> Result<String, String> {
    let config = Config::load(path).map_err(|e| e.to_string())?;
    let text = match &config.source {
        Some(p) => {
            std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?
        }
        None => String::new(),
    };
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let mut doc: toml::Table = toml::from_str(&text).map_err(|e| e.to_string())?;
    if let Some(dir) = config.source.as_deref().and_then(Path::parent) {
        patchbay_gateway::config_paths::resolve(&mut doc, dir);
    }
    apply_env_overrides(&mut doc, &|k: &str| env.get(k).cloned()).map_err(|e| e.to_string())?;
    redact_table(&mut doc);
    let source = config.source.as_ref().map_or(
        format!("built-in defaults (no {DEFAULT_CONFIG_FILE})"),
        |p| p.display().to_string(),
    );
    let master = if config.master_key.is_some() {
        "set"
    } else {
        "unset"
    };
    let store = if config.store.redis_url.is_some() {
        "redis"
    } else {
        "memory"
    };
    let body = toml::to_string(&doc).map_err(|e| e.to_string())?;
    Ok(format!(
        "# config: {source}, with PATCHBAY_* overrides; unset keys take their defaults\n\
         # PATCHBAY_MASTER_KEY: {master}; store: {store}\n{body}"
    ))
}

/// A key whose value is the name of where a secret lives, not the secret.
fn names_a_place(key: &str) -> bool {
    key.ends_with("_env") || key.ends_with("_file") || key.ends_with("_files")
}

/// A key whose value would be a secret.
fn names_a_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["key", "secret", "password", "token"]
        .iter()
        .any(|w| k.contains(w))
        && !names_a_place(&k)
}

fn redact_table(t: &mut toml::Table) {
    for (k, v) in t.iter_mut() {
        if names_a_secret(k) && !matches!(v, toml::Value::Table(_) | toml::Value::Array(_)) {
            *v = toml::Value::String(REDACTED.into());
        } else {
            redact_value(v);
        }
    }
}

fn redact_value(v: &mut toml::Value) {
    match v {
        toml::Value::Table(t) => redact_table(t),
        toml::Value::Array(a) => a.iter_mut().for_each(redact_value),
        toml::Value::String(s) => {
            if let Some(clean) = without_password(s) {
                *s = clean;
            }
        }
        _ => {}
    }
}

/// `s` with its URL password replaced, when it is a URL with one.
fn without_password(s: &str) -> Option<String> {
    let mut url = url::Url::parse(s).ok()?;
    url.password()?;
    url.set_password(Some("REDACTED")).ok()?;
    Some(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_and_the_names_of_their_places_kept() {
        let mut doc: toml::Table = toml::from_str(
            r#"
            [[routes]]
            model = "m"
            upstream_url = "wss://user:hunter2@api.example/v1/realtime"
            api_key_env = "OPENAI_API_KEY"
            api_key = "sk-live"
            [store]
            redis_url_file = "/run/redis"
            [client_secrets]
            signing_key_files = ["/a", "/b"]
            token = "t0k"
            "#,
        )
        .unwrap();
        redact_table(&mut doc);
        let text = toml::to_string(&doc).unwrap();
        for secret in ["hunter2", "sk-live", "t0k"] {
            assert!(!text.contains(secret), "{secret} in:\n{text}");
        }
        for kept in ["OPENAI_API_KEY", "/run/redis", "/a", "api.example"] {
            assert!(text.contains(kept), "{kept} missing:\n{text}");
        }
    }
}
