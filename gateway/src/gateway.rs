//! The gateway's shared state and its start-up: routes with their prepared
//! upstreams, the key store, counters, metrics, and the listeners.
//!
//! [`start`] binds both listeners and returns a [`Running`] handle with the
//! bound addresses (tests bind `127.0.0.1:0`), so the same code path serves
//! `serve`, `demo` and the in-process tests.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::Sessions;
use crate::auth::{KeySet, KeyStore};
use crate::config::{Config, RouteConfig};
use crate::metrics::Metrics;
use crate::server;
use crate::upstream::dial::Upstream;

/// A configured route, ready to dial.
#[derive(Debug)]
pub struct Route {
    pub config: RouteConfig,
    pub upstream: Upstream,
}

#[derive(Debug)]
pub struct Gateway {
    pub config: Config,
    pub routes: Vec<Arc<Route>>,
    pub keys: Arc<KeyStore>,
    pub metrics: Arc<Metrics>,
    pub sessions: Arc<Sessions>,
    /// Cancelled when the process starts draining.
    pub shutdown: CancellationToken,
    /// Every session task, from admission to its last close frame.
    pub tasks: TaskTracker,
    ready: AtomicBool,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("route {model}: {message}")]
    Route { model: String, message: String },
    #[error(transparent)]
    Keys(#[from] crate::auth::KeysError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl Gateway {
    pub fn new(config: Config) -> Result<Self, StartError> {
        let timeout = Duration::from_secs(config.server.upgrade_timeout_secs);
        let routes = config
            .routes
            .iter()
            .map(|r| {
                Upstream::new(r, timeout, config.relay.max_message_bytes)
                    .map(|upstream| {
                        Arc::new(Route {
                            config: r.clone(),
                            upstream,
                        })
                    })
                    .map_err(|message| StartError::Route {
                        model: r.model.clone(),
                        message,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let keys = load_keys(&config)?;
        Ok(Self {
            config,
            routes,
            keys: Arc::new(KeyStore::new(keys)),
            metrics: Arc::new(Metrics::new()),
            sessions: Arc::default(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            ready: AtomicBool::new(true),
        })
    }

    pub fn route(&self, model: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|r| r.config.model == model)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.sessions.is_draining()
    }
}

/// The key set from the keys file and/or the master key.
pub fn load_keys(config: &Config) -> Result<KeySet, crate::auth::KeysError> {
    let set = match &config.keys.file {
        Some(path) => KeySet::from_file(path)?,
        None => KeySet::default(),
    };
    Ok(match &config.master_key {
        Some(m) => set.with_master(m),
        None => set,
    })
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
    let gateway = Arc::new(Gateway::new(config)?);
    let bind =
        |addr: SocketAddr| server::bind(addr).map_err(|source| StartError::Bind { addr, source });
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
    tokio::spawn(server::serve_clients(listener, gateway.clone()));
    tokio::spawn(server::serve_admin(admin, gateway.clone()));
    tracing::info!(%addr, %admin_addr, routes = gateway.routes.len(), "gateway listening");
    Ok(Running {
        gateway,
        addr,
        admin_addr,
    })
}
