//! The contract between the Patchbay gateway and the operator that renders its config: the types
//! of the `gateway.toml` sections a renderer writes, the words its enums are spelled with, the
//! bounds on its seconds, and the rules an upstream URL must follow.
//!
//! The gateway deserialises these types in its loader (`patchbay_gateway::config`, which re-exports
//! them and adds the process-level parts: `[server]`, secrets, env overrides and validation); the
//! operator fills the same types from a `RealtimeRoute` and serialises them, and derives its CRD's
//! enums from the same enums (feature `schemars`). So a key, a variant or a bound exists once, and a
//! change to it changes both sides or fails to compile.
//!
//! What stays out: everything that needs the gateway's runtime (secret types, the breaker, files
//! read at start), and every check whose error names a gateway config key; the gateway's loader
//! keeps those, with the bounds taken from here.

mod bounds;
mod enums;
mod sections;
mod upstream_url;

pub use bounds::{
    MAX_CLIENT_SECRET_TTL_SECS, MAX_PRICE_USD_PER_MILLION_TOKENS, MAX_PRICE_USD_PER_MINUTE,
    MAX_SECS, MIN_CLIENT_SECRET_TTL_SECS, MIN_DRAIN_WAIT_SECS, MIN_POOL_MAX_IDLE_SECS,
};
pub use enums::{BudgetPeriod, DrainMode, Endpoint, Intent, Protocol, Provider, Unpriced};
pub use sections::{
    ClientSecretsConfig, DrainConfig, KeysConfig, LimitsConfig, MeteringConfig, PoolConfig,
    PriceRow, RelayConfig, RouteConfig, StoreConfig, UpstreamConfig, DEFAULT_MAX_TURN_USD,
    DEFAULT_UPSTREAM_WEIGHT,
};
pub use upstream_url::{
    endpoint_of_url, openai_url, validate_upstream_url, UpstreamUrlError, OPENAI_REALTIME_URL,
};
