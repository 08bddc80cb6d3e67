//! Which keys of an edited config file need a restart: everything but the
//! live part (`[metering]`, `[[prices]]`, and each upstream's `priority`
//! and `weight`). The config watcher applies the live part and names these
//! in a WARN ("restart to apply"), so an edit of `[pool] size` or
//! `[server] listen` in a running gateway is never silently ignored.

/// The dotted keys whose values differ between the file the gateway
/// started with (`old`) and its edit (`new`), apart from the live part,
/// in a stable order: `server.listen`, `routes[0].model`, `pool` (a
/// section added or removed as a whole).
pub fn restart_only_changes(old: &toml::Table, new: &toml::Table) -> Vec<String> {
    let mut out = Vec::new();
    diff_tables("", old, new, &mut out);
    out.retain(|k| !is_live(k));
    out
}

/// The keys the gateway applies while running.
fn is_live(key: &str) -> bool {
    key == "metering"
        || key.starts_with("metering.")
        || key == "prices"
        || key.starts_with("prices[")
        || (key.starts_with("routes[")
            && key.contains(".upstreams[")
            && (key.ends_with(".priority") || key.ends_with(".weight")))
}

fn diff_tables(prefix: &str, old: &toml::Table, new: &toml::Table, out: &mut Vec<String>) {
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort_unstable();
    keys.dedup();
    for k in keys {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        diff_values(path, old.get(k), new.get(k), out);
    }
}

fn diff_values(
    path: String,
    old: Option<&toml::Value>,
    new: Option<&toml::Value>,
    out: &mut Vec<String>,
) {
    match (old, new) {
        (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) => diff_tables(&path, a, b, out),
        (Some(toml::Value::Array(a)), Some(toml::Value::Array(b)))
            if a.len() == b.len() && a.iter().chain(b).all(toml::Value::is_table) =>
        {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff_values(format!("{path}[{i}]"), Some(x), Some(y), out);
            }
        }
        (a, b) if a != b => out.push(path),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(s: &str) -> toml::Table {
        toml::from_str(s).unwrap()
    }

    #[test]
    fn restart_only_keys_are_named_and_live_ones_are_not() {
        let old = doc(r#"
            [server]
            listen = "127.0.0.1:8080"
            [pool]
            size = 4
            [metering]
            flush_secs = 5
            [[prices]]
            model = "m"
            text_input = 1.0
            [[routes]]
            model = "m"
            [[routes.upstreams]]
            name = "a"
            priority = 1
            weight = 1
        "#);
        let new = doc(r#"
            [server]
            listen = "127.0.0.1:9000"
            [pool]
            size = 8
            [metering]
            flush_secs = 1
            [[prices]]
            model = "m"
            text_input = 2.0
            [[routes]]
            model = "m"
            [[routes.upstreams]]
            name = "a"
            priority = 2
            weight = 3
            [relay]
            idle_timeout_secs = 60
        "#);
        assert_eq!(
            restart_only_changes(&old, &new),
            vec!["pool.size", "relay", "server.listen"]
        );
        assert_eq!(restart_only_changes(&old, &old), Vec::<String>::new());
    }

    #[test]
    fn a_route_added_or_renamed_is_named() {
        let old = doc("[[routes]]\nmodel = \"a\"\n");
        let renamed = doc("[[routes]]\nmodel = \"b\"\n");
        assert_eq!(
            restart_only_changes(&old, &renamed),
            vec!["routes[0].model"]
        );
        let added = doc("[[routes]]\nmodel = \"a\"\n[[routes]]\nmodel = \"b\"\n");
        assert_eq!(restart_only_changes(&old, &added), vec!["routes"]);
    }
}
