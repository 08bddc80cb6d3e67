//! The gateway's integration tests, as one test binary: each module starts
//! what it needs (simulator, gateway, Redis client) on 127.0.0.1.

mod access_log;
mod calls;
mod cli;
mod client_secrets;
mod client_tls;
mod common;
mod descriptors;
mod drain;
mod early_refusals;
mod failover;
mod first_request;
mod fleet;
mod keys;
mod live_config;
mod live_sessions;
mod log_pipe;
mod log_secrets;
mod metering;
mod metering_relay;
mod metering_store;
mod metrics_at_start;
mod passthrough;
mod pool;
mod redis_server;
mod redis_url_file;
mod relay;
mod secret_files;
mod skips;
mod store_outbox;
mod store_tls;
mod tls_and_config;
mod transcription;
mod translation;
mod translation_calls;
mod usage;
