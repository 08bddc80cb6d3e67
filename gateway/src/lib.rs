//! Patchbay gateway: an authenticated, pooled, metered relay for the OpenAI
//! Realtime API. See `DESIGN.md`-style module docs in each file; the path of
//! a session is `server` (checks before the 101) → `admission` → `session`
//! (upgrade, upstream, `session.created`) → `relay` (the splice).

pub mod access;
pub mod admin;
pub mod admission;
pub mod api;
pub mod auth;
pub mod body;
pub mod bootstrap;
pub mod calls;
pub mod client_conn;
pub mod client_secret;
pub mod client_tls;
pub mod config;
pub mod config_checks;
pub mod config_diff;
pub mod config_env;
pub mod config_paths;
pub mod descriptors;
pub mod drain;
pub mod event;
pub mod gateway;
pub mod http_access;
pub mod http_error;
pub mod ids;
pub mod lane;
pub mod linger;
pub mod live;
pub mod live_records;
pub mod logging;
pub mod logs;
pub mod metering;
pub mod metric_family;
pub mod metrics;
pub mod pem;
pub mod pool_watch;
pub mod redis_url;
pub mod relay;
pub mod reload;
pub mod secret;
pub mod server;
pub mod session;
pub mod status_page;
pub mod store;
pub mod telemetry;
#[cfg(test)]
mod test_skip;
pub mod upstream;
pub mod upstream_key;
pub mod usage_api;
pub mod watch;
