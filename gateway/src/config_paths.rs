//! Relative file paths in a config file resolve against the file's own
//! directory, not the working directory: `[keys] file = "keys.toml"` next
//! to `/etc/patchbay/gateway.toml` is `/etc/patchbay/keys.toml` however
//! the gateway was started (as nginx and Envoy resolve their includes).
//! Paths given through the environment (`PATCHBAY_KEYS_FILE=…`) are the
//! shell's, and resolve against the working directory as usual: they are
//! applied after this.

use std::path::Path;

/// The keys of the top-level sections that hold one path.
const SECTION_PATHS: [(&str, &str); 6] = [
    ("server", "tls_cert_file"),
    ("server", "tls_key_file"),
    ("keys", "file"),
    ("pool", "size_file"),
    ("store", "redis_url_file"),
    ("store", "ca_file"),
];

/// The keys of a route (and of each of its upstreams) that hold a path.
const ROUTE_PATHS: [&str; 2] = ["api_key_file", "ca_file"];

/// Makes every relative path of the parsed file `doc` relative to `base`
/// (the directory of the file). Values of the wrong type are left for
/// the deserializer to refuse with the key's name.
pub fn resolve(doc: &mut toml::Table, base: &Path) {
    for (section, key) in SECTION_PATHS {
        if let Some(v) = table(doc, section).and_then(|t| t.get_mut(key)) {
            resolve_value(v, base);
        }
    }
    if let Some(toml::Value::Array(files)) =
        table(doc, "client_secrets").and_then(|t| t.get_mut("signing_key_files"))
    {
        files.iter_mut().for_each(|v| resolve_value(v, base));
    }
    let Some(toml::Value::Array(routes)) = doc.get_mut("routes") else {
        return;
    };
    for route in routes.iter_mut().filter_map(toml::Value::as_table_mut) {
        resolve_route(route, base);
        if let Some(toml::Value::Array(ups)) = route.get_mut("upstreams") {
            for up in ups.iter_mut().filter_map(toml::Value::as_table_mut) {
                resolve_route(up, base);
            }
        }
    }
}

fn table<'a>(doc: &'a mut toml::Table, name: &str) -> Option<&'a mut toml::Table> {
    doc.get_mut(name).and_then(toml::Value::as_table_mut)
}

fn resolve_route(t: &mut toml::Table, base: &Path) {
    for key in ROUTE_PATHS {
        if let Some(v) = t.get_mut(key) {
            resolve_value(v, base);
        }
    }
}

fn resolve_value(v: &mut toml::Value, base: &Path) {
    if let toml::Value::String(s) = v {
        let p = Path::new(s.as_str());
        if !s.is_empty() && p.is_relative() {
            *s = base.join(p).to_string_lossy().into_owned();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_relative_path_resolves_against_the_base_and_absolute_ones_stay() {
        let mut doc: toml::Table = toml::from_str(
            r#"
            [keys]
            file = "keys.toml"
            [pool]
            size_file = "../run/size"
            [store]
            redis_url_file = "/var/run/secrets/redis"
            ca_file = "ca.pem"
            [client_secrets]
            signing_key_files = ["a.key", "/abs/b.key"]
            [[routes]]
            model = "m"
            api_key_file = "up.key"
            [[routes.upstreams]]
            api_key_file = "sub/up2.key"
            ca_file = 3
            "#,
        )
        .unwrap();
        resolve(&mut doc, Path::new("/etc/patchbay"));
        let get = |path: &[&str]| {
            let mut v = &toml::Value::Table(doc.clone());
            for p in path {
                v = match p.parse::<usize>() {
                    Ok(i) => &v.as_array().unwrap()[i],
                    Err(_) => &v[p],
                };
            }
            v.clone()
        };
        assert_eq!(
            get(&["keys", "file"]).as_str(),
            Some("/etc/patchbay/keys.toml")
        );
        assert_eq!(
            get(&["pool", "size_file"]).as_str(),
            Some("/etc/patchbay/../run/size")
        );
        assert_eq!(
            get(&["store", "redis_url_file"]).as_str(),
            Some("/var/run/secrets/redis")
        );
        assert_eq!(
            get(&["store", "ca_file"]).as_str(),
            Some("/etc/patchbay/ca.pem")
        );
        assert_eq!(
            get(&["client_secrets", "signing_key_files", "0"]).as_str(),
            Some("/etc/patchbay/a.key")
        );
        assert_eq!(
            get(&["client_secrets", "signing_key_files", "1"]).as_str(),
            Some("/abs/b.key")
        );
        assert_eq!(
            get(&["routes", "0", "api_key_file"]).as_str(),
            Some("/etc/patchbay/up.key")
        );
        assert_eq!(
            get(&["routes", "0", "upstreams", "0", "api_key_file"]).as_str(),
            Some("/etc/patchbay/sub/up2.key")
        );
        assert_eq!(
            get(&["routes", "0", "upstreams", "0", "ca_file"]).as_integer(),
            Some(3)
        );
    }
}
