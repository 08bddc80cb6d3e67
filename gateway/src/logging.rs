//! Logs: `tracing` to stderr (stdout carries request-log rows), human
//! format by default, JSON lines when `PATCHBAY_LOG_FORMAT=json`. Level from
//! `RUST_LOG` (default `info`). Nothing logged anywhere carries a key:
//! secrets are [`crate::secret::Secret`]s and print as `[REDACTED]`.

use tracing_subscriber::EnvFilter;

pub const LOG_FORMAT_ENV: &str = "PATCHBAY_LOG_FORMAT";

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let json = std::env::var(LOG_FORMAT_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
