//! Files the gateway re-reads while it runs, and what a change does: the
//! pool size file, the keys file, the config file's live part (prices,
//! metering, upstream balance), upstream key files, the Redis URL file and
//! the client-secret signing keys. Each is polled by [`crate::watch`]
//! until draining starts; an invalid edit is refused (logged and counted in
//! `patchbay_config_reloads_total{file,result}`) and keeps what is loaded.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::KeySet;
use crate::gateway::Gateway;
use crate::store::conn::RedisConn;
use crate::upstream::pool::parse_size_file;
use crate::watch;

/// How often `[pool] size_file` is re-read.
pub const SIZE_FILE_POLL: Duration = Duration::from_secs(2);
/// How often the keys file is checked for changes.
pub const KEYS_FILE_POLL: Duration = Duration::from_secs(2);
/// How often the config file is checked for price edits.
pub const CONFIG_FILE_POLL: Duration = Duration::from_secs(2);

/// A live-reloaded file: its path (if configured), what it is, how often it
/// is polled, and what a change does.
/// A live-reloaded file: its path, what it is (for log lines), its label in
/// `patchbay_config_reloads_total{file}`, the poll period and how to apply it.
type Watcher = (
    Option<std::path::PathBuf>,
    &'static str,
    &'static str,
    Duration,
    fn(&Gateway, &str) -> Result<(), String>,
);

/// Where a new pool size came from (`patchbay_pool_size_updates_total{source}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeSource {
    /// `[pool] size_file`, polled.
    File,
    /// `[pool] size_configmap`, watched ([`crate::pool_watch`]).
    ConfigMap,
}

impl SizeSource {
    pub fn label(self) -> &'static str {
        match self {
            SizeSource::File => "file",
            SizeSource::ConfigMap => "configmap",
        }
    }
}

/// Applies a pool size read from the size file or the size ConfigMap (the
/// same text: a bare number or `REALTIME_POOL_SIZE=N`), capped at `[pool]
/// max_size`, to every route's pools when it differs. A bad value is
/// refused and changes nothing.
pub fn apply_pool_size(gw: &Gateway, text: &str, source: SizeSource) -> Result<(), String> {
    let n = parse_size_file(text)?.min(gw.config.pool.max_size);
    let old = gw.pool_size();
    if old != n {
        tracing::info!(old, size = n, source = source.label(), "pool size changed");
        gw.set_pool_size(n);
        gw.metrics.pool_size_updated(source.label());
    }
    Ok(())
}

/// Applies the size file's size; while the size ConfigMap's watch holds
/// the current size, the mounted file is an older copy of that ConfigMap
/// (the kubelet syncs it a minute later) and is only checked, so a stale
/// copy never undoes a newer size.
fn apply_size_file(gw: &Gateway, text: &str) -> Result<(), String> {
    if gw
        .pool_size_watched
        .load(std::sync::atomic::Ordering::Acquire)
    {
        parse_size_file(text)?;
        tracing::debug!("pool size file changed; the ConfigMap watch already holds the size");
        return Ok(());
    }
    apply_pool_size(gw, text, SizeSource::File)
}

/// Swaps in the keys file's key set; an invalid file keeps the current one.
fn apply_keys_file(gw: &Gateway, text: &str) -> Result<(), String> {
    let set = KeySet::parse(text)?;
    let set = match &gw.config.master_key {
        Some(m) => set.with_master(m),
        None => set,
    };
    set.replaces(&gw.keys.get())?.log();
    gw.keys.replace(set);
    Ok(())
}

/// Applies the live part of the config file ([`crate::config::LiveConfig`]: `[metering]` and
/// `[[prices]]`; the meter reads prices at every flush, the unpriced policy at every admission,
/// the flush interval when a session starts) and the `priority` and `weight` of every
/// `[[routes.upstreams]]` entry. Other sections need a restart; an invalid edit is refused (and
/// counted) and keeps what is loaded.
fn apply_live_config(gw: &Gateway, text: &str) -> Result<(), String> {
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let live =
        crate::config::live_from_toml(text, &|k| env.get(k).cloned()).map_err(|e| e.to_string())?;
    let balances = crate::config::balances_from_toml(text).map_err(|e| e.to_string())?;
    warn_restart_only(gw, text);
    if live.prices != *gw.metering.prices() {
        tracing::info!(rows = live.prices.len(), "prices reloaded");
        gw.metering.set_prices(live.prices);
    }
    if live.metering != gw.metering.config() {
        tracing::info!(
            flush_secs = live.metering.flush_secs,
            unpriced = ?live.metering.unpriced,
            "metering settings reloaded"
        );
        gw.metering.set_config(live.metering);
    }
    for route in &gw.routes {
        let mut changed = false;
        for u in &route.upstreams {
            let Some(b) = balances
                .iter()
                .find(|b| b.route == route.config.model && b.upstream == u.name())
            else {
                continue;
            };
            if (b.priority, b.weight) != (u.priority(), u.weight()) {
                u.set_balance(b.priority, b.weight);
                tracing::info!(model = %route.config.model, upstream = %u.name(),
                    priority = b.priority, weight = b.weight, "upstream balance reloaded");
                changed = true;
            }
        }
        if changed {
            route.rebalance();
        }
    }
    Ok(())
}

/// Names, in a WARN, the keys of an edited config file that only a restart
/// applies (the edit's live part is applied all the same).
fn warn_restart_only(gw: &Gateway, text: &str) {
    let (Some(started), Some(path)) = (&gw.config.file_doc, &gw.config.source) else {
        return;
    };
    let Ok(mut edited) = toml::from_str::<toml::Table>(text) else {
        return;
    };
    crate::config_paths::resolve(&mut edited, path.parent().unwrap_or(Path::new("")));
    let keys = crate::config_diff::restart_only_changes(started, &edited);
    if !keys.is_empty() {
        tracing::warn!(
            keys = %keys.join(", "),
            "config file edited: these keys need a restart to apply; the running gateway keeps their values"
        );
    }
}

/// Polls `path` until draining starts and hands each changed content to
/// `apply`, counted in `patchbay_config_reloads_total{file}`.
fn watch_file(
    gw: &Gateway,
    path: std::path::PathBuf,
    what: &'static str,
    file: &'static str,
    poll: Duration,
    apply: impl FnMut(&str) -> Result<(), String> + Send + 'static,
) {
    let reloads = watch::Reloads {
        file,
        counters: gw.metrics.config_reloads.clone(),
    };
    tokio::spawn(watch::on_change(
        path,
        what,
        poll,
        gw.draining.clone(),
        reloads,
        apply,
    ));
}

/// Points the shared Redis connection at the URL in a changed URL file; an
/// invalid URL keeps the current connection (the error never quotes it).
fn apply_redis_url(conn: &RedisConn, has_ca_file: bool, text: &str) -> Result<(), String> {
    let url = crate::config::checked_redis_url(text, has_ca_file)
        .map_err(|m| format!("store.redis_url_file: {m}"))?;
    // The first read of the file is the URL the process started with.
    if conn.is_for(url.expose()) {
        return Ok(());
    }
    conn.reconnect(url.expose()).map_err(|e| e.to_string())?;
    tracing::info!(store = %conn.endpoint(), "Redis URL changed; the store reconnects there");
    Ok(())
}

/// Starts a watcher for every configured live file.
pub fn spawn_watchers(gateway: &Arc<Gateway>) {
    let watchers: [Watcher; 3] = [
        (
            gateway.config.pool.size_file.clone(),
            "pool size file",
            "pool_size",
            SIZE_FILE_POLL,
            apply_size_file,
        ),
        (
            gateway.config.keys.file.clone(),
            "keys file",
            "keys",
            KEYS_FILE_POLL,
            apply_keys_file,
        ),
        (
            gateway.config.source.clone(),
            "config file",
            "config",
            CONFIG_FILE_POLL,
            apply_live_config,
        ),
    ];
    for (path, what, file, poll, apply) in watchers {
        if let Some(path) = path {
            let gw = gateway.clone();
            watch_file(gateway, path, what, file, poll, move |text| {
                apply(&gw, text)
            });
        }
    }
    for route in &gateway.routes {
        for u in &route.upstreams {
            let Some(path) = u.config.api_key_file.clone() else {
                continue;
            };
            let (model, key) = (route.config.model.clone(), u.config.api_key.clone());
            watch_file(
                gateway,
                path,
                "upstream key file",
                "upstream_key",
                KEYS_FILE_POLL,
                move |text| crate::upstream_key::apply_key_file(&model, &key, text),
            );
        }
    }
    // A rotated Redis URL file moves the shared connection (store, leases,
    // client-secret configs, call records) to the new URL; calls fail open
    // meanwhile.
    if let (Some(path), Some(conn)) = (
        gateway.config.store.redis_url_file.clone(),
        gateway.redis.clone(),
    ) {
        let has_ca = gateway.config.store.ca_file.is_some();
        watch_file(
            gateway,
            path,
            "Redis URL file",
            "redis_url",
            KEYS_FILE_POLL,
            move |text| apply_redis_url(&conn, has_ca, text),
        );
    }
    // Each signing key file is polled; a change to any re-reads them all.
    for path in gateway.client_secrets.signing_key_files() {
        let gw = gateway.clone();
        watch_file(
            gateway,
            path.clone(),
            "client-secret signing key",
            "signing_key",
            KEYS_FILE_POLL,
            move |_| gw.client_secrets.reload(),
        );
    }
}
