//! The upstream side: dialling (with TLS) and, in `pool`, warm sockets.

pub mod dial;
pub mod key;
pub mod pool;
pub mod tls;
