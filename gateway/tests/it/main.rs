//! The gateway's integration tests, as one test binary: each module starts
//! what it needs (simulator, gateway, Redis client) on 127.0.0.1.

mod common;
mod drain;
mod keys;
mod live_config;
mod metering;
mod metering_relay;
mod metering_store;
mod pool;
mod relay;
mod secret_files;
mod tls_and_config;
