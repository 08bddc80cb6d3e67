//! `patchbay-gateway check`: loads everything `serve` loads (the config
//! and its env overrides, the keys file, prices, CA files, signing keys,
//! upstream key files) by building the same [`Gateway`], without binding a
//! listener or dialling anything, and prints what would be served. A
//! problem is printed as `serve` would print it (naming the config key or
//! the file) and exits 2.

use std::path::Path;
use std::process::ExitCode;

use patchbay_gateway::config::Config;
use patchbay_gateway::gateway::Gateway;

/// Checks the config at `path` (or the default one).
pub fn run(path: Option<&Path>) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    // Building the gateway starts no task that dials, but some of its
    // parts expect a runtime to exist.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return failed(&e),
    };
    let built = rt.block_on(async { Gateway::new(config) });
    match built {
        Ok(gw) => {
            print!("{}", summary(&gw));
            ExitCode::SUCCESS
        }
        Err(e) => failed(&e),
    }
}

fn failed(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("patchbay-gateway check: {e}");
    ExitCode::from(crate::EXIT_CONFIG)
}

/// What the gateway would serve: listeners, routes and their upstreams'
/// hosts, keys, store.
fn summary(gw: &Gateway) -> String {
    let c = &gw.config;
    let mut out = String::new();
    let source = c
        .source
        .as_ref()
        .map_or("built-in defaults".to_string(), |p| p.display().to_string());
    out += &format!("config: {source}\n");
    for var in &c.unread_env {
        out += &format!("warning: the environment sets {var}, which the gateway does not read\n");
    }
    out += &format!(
        "listen: {} (admin {})\n",
        c.server.listen, c.server.admin_listen
    );
    for route in &gw.routes {
        out += &format!("route {}:\n", route.config.model);
        for u in &route.upstreams {
            let host = url::Url::parse(&u.config.upstream_url)
                .ok()
                .and_then(|url| url.host_str().map(str::to_string))
                .unwrap_or_else(|| "?".into());
            out += &format!(
                "  upstream {}: {host} ({})\n",
                u.config.name,
                format!("{:?}", u.config.provider).to_lowercase()
            );
        }
    }
    let keys_from = c
        .keys
        .file
        .as_ref()
        .map_or(String::new(), |p| format!(" (from {})", p.display()));
    out += &format!("client keys: {}{keys_from}\n", gw.keys.get().len());
    let store = if c.store.redis_url.is_some() {
        "redis"
    } else {
        "memory"
    };
    out += &format!("store: {store}\n");
    out += "ok\n";
    out
}
