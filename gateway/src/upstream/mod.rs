//! The upstream side: dialling (with TLS), warm sockets in `pool`, and, for
//! routes with several upstreams, health (`breaker`) and choice (`select`).

pub mod breaker;
pub mod dial;
pub mod failover;
pub mod handshake;
pub mod pool;
pub mod resolve;
pub mod select;
pub mod tls;
