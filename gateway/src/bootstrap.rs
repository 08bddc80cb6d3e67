//! Start-up, at the top of the crate: raises the descriptor limit, builds
//! the shared [`Gateway`], binds the client and admin listeners, starts
//! pools, leases and the live-file watchers, and spawns the servers.
//! [`start`] returns a [`Running`] handle with the bound addresses (tests
//! bind `127.0.0.1:0`), so the same code path serves `serve`, `demo` and
//! the in-process tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};

use crate::config::Config;
use crate::descriptors;
use crate::gateway::{Gateway, StartError};
use crate::server;

/// Pending-connection queue length of both listeners; connect bursts of
/// hundreds of sessions must not overflow it (the kernel caps it at
/// `net.core.somaxconn`).
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds with `SO_REUSEADDR` and a deep backlog.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// `/readyz` turns ready once every pool first reached its target, or when
/// the warm-up timeout passes, whichever comes first.
async fn mark_ready_when_warm(gw: Arc<Gateway>) {
    let warm = futures_util::future::join_all(
        gw.routes
            .iter()
            .flat_map(|r| r.upstreams.iter().map(|u| u.pool.wait_warm())),
    );
    let timeout = Duration::from_secs(gw.config.pool.warmup_timeout_secs);
    if tokio::time::timeout(timeout, warm).await.is_err() {
        tracing::warn!(
            timeout_secs = timeout.as_secs(),
            "pool warm-up timed out; ready anyway"
        );
    }
    gw.set_ready();
}

/// Raises the soft descriptor limit to the hard one and says so.
fn raise_descriptor_limit() -> Option<descriptors::NofileLimit> {
    match descriptors::raise_nofile_limit() {
        Ok(limit) => {
            tracing::info!(
                soft_before = limit.soft_before,
                soft = limit.soft,
                hard = limit.hard,
                "RLIMIT_NOFILE: soft limit set to the hard limit"
            );
            Some(limit)
        }
        Err(e) => {
            tracing::warn!(error = %e, "RLIMIT_NOFILE could not be read or raised");
            None
        }
    }
}

/// Warns when `[limits] max_sessions` cannot fit in the descriptor limit.
fn check_session_room(gw: &Gateway, limit: descriptors::NofileLimit) {
    let pool_sockets: usize = gw.routes.iter().map(|r| r.pool_size()).sum();
    let fit = descriptors::sessions_that_fit(limit.soft, pool_sockets as u64);
    let max_sessions = gw.config.limits.max_sessions;
    if max_sessions as u64 > fit {
        tracing::warn!(
            max_sessions,
            sessions_that_fit = fit,
            nofile_limit = limit.soft,
            pool_sockets,
            reserved = descriptors::DESCRIPTOR_MARGIN,
            "[limits] max_sessions cannot fit in the descriptor limit (two sockets a session, one a warm socket, and some reserved): raise the hard RLIMIT_NOFILE or lower max_sessions"
        );
    }
}

/// A started gateway.
#[derive(Debug)]
pub struct Running {
    pub gateway: Arc<Gateway>,
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
}

/// Binds the client and admin listeners and starts serving.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let limit = raise_descriptor_limit();
    for var in &config.unread_env {
        tracing::warn!(
            var = %var,
            "the environment sets {var}, which the gateway does not read (a typo? see docs/configuration.md)"
        );
    }
    let gateway = Arc::new(Gateway::new(config)?);
    if let Some(limit) = limit {
        check_session_room(&gateway, limit);
    }
    let bind = |addr: SocketAddr| bind(addr).map_err(|source| StartError::Bind { addr, source });
    let listener = bind(gateway.config.server.listen)?;
    let admin = bind(gateway.config.server.admin_listen)?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: gateway.config.server.listen,
        source,
    })?;
    let admin_addr = admin.local_addr().map_err(|source| StartError::Bind {
        addr: gateway.config.server.admin_listen,
        source,
    })?;
    if let Some(leases) = &gateway.leases {
        leases.spawn_renewal();
    }
    for route in &gateway.routes {
        for u in &route.upstreams {
            gateway
                .tasks
                .spawn(u.pool.clone().replenish(gateway.draining.clone()));
        }
        if route.balanced() {
            tokio::spawn(route.clone().watch_health(gateway.draining.clone()));
        }
    }
    crate::reload::spawn_watchers(&gateway);
    crate::pool_watch::spawn(&gateway);
    tokio::spawn(mark_ready_when_warm(gateway.clone()));
    let tls = match (
        &gateway.config.server.tls_cert_file,
        &gateway.config.server.tls_key_file,
    ) {
        (Some(cert), Some(key)) => {
            let tls = crate::client_tls::ClientTls::new(cert, key).map_err(StartError::Tls)?;
            tls.watch(gateway.draining.clone(), || crate::watch::Reloads {
                file: "tls",
                counters: gateway.metrics.config_reloads.clone(),
            });
            Some(tls)
        }
        _ => None,
    };
    tokio::spawn(server::serve_clients(listener, gateway.clone(), tls));
    tokio::spawn(server::serve_admin(admin, gateway.clone()));
    tracing::info!(%addr, %admin_addr, routes = gateway.routes.len(), "gateway listening");
    Ok(Running {
        gateway,
        addr,
        admin_addr,
    })
}
