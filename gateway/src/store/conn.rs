//! The process's Redis connection, whatever stands behind the URL: one
//! server (`redis://`, `rediss://`, `unix://`), a Redis Cluster
//! (`redis+cluster://`, `rediss+cluster://`) or a primary watched by
//! Sentinel (`redis+sentinel://`, `rediss+sentinel://`). Every user (the
//! metering store, the session leases, the client-secret configs, the calls
//! fleet) talks through [`Conn`], a redis-rs [`ConnectionLike`]; only the
//! key names differ by topology ([`Conn::tagged`]: in a cluster every key
//! carries the hash tag of the scope it serves, [`super::KeyNames`]).
//!
//! - One server: a redis-rs [`ConnectionManager`] (multiplexed, reconnects
//!   on its own).
//! - Cluster: redis-rs's async cluster client, connected on first use
//!   (a failed first connection is retried by the next call). It follows
//!   `MOVED`/`ASK` and retries `TRYAGAIN`/`CLUSTERDOWN` itself; what still
//!   fails is an error to the caller, whose write the outbox keeps.
//! - Sentinel: [`SentinelConn`] asks the sentinels for the primary's address
//!   (`SENTINEL get-master-addr-by-name`), talks to it through a
//!   [`ConnectionManager`], re-asks every [`SENTINEL_POLL`] and at once after
//!   a connection error or a `READONLY`/`MASTERDOWN` reply, so a failover is
//!   followed within about a second of the sentinels announcing it.
//!
//! TLS (`rediss…`) verifies the servers' certificates against the webpki
//! roots, or only against `[store] ca_file` when it is set; credentials in
//! the URL go to every data node (and, for Sentinel, to the sentinels only
//! when `sentinel_username`/`sentinel_password` query parameters say so).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::{StoreError, CALL_TIMEOUT};
use crate::redis_url::{endpoint, parse, ParsedUrl, Topology};

/// Bound on one connection attempt (TCP, TLS and AUTH).
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Reconnect attempts per outage detection; the next call tries again.
const RECONNECT_RETRIES: usize = 1;
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);
/// How often a Sentinel connection re-asks the sentinels where the primary is.
pub const SENTINEL_POLL: Duration = Duration::from_secs(1);
/// Redirection retries of the cluster client (`MOVED`, `ASK`, `TRYAGAIN`,
/// `CLUSTERDOWN`), each after a short wait; the caller's own timeout bounds
/// them all.
const CLUSTER_RETRIES: u32 = 4;

/// One connection to whatever the URL names; cheap to clone.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(Arc<LazyCluster>),
    Sentinel(Arc<SentinelConn>),
}

impl Conn {
    /// A lazily connecting connection to `url`; must be called inside a
    /// Tokio runtime (a Sentinel connection starts its poller).
    pub fn open(url: &str, ca_file: Option<&Path>) -> Result<Self, StoreError> {
        let parsed = parse(url).map_err(|m| {
            StoreError::Url(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "invalid Redis URL",
                m,
            )))
        })?;
        let certs = tls_certificates(ca_file)?;
        if parsed.tls {
            // redis-rs builds its rustls config with the process-default
            // provider: make that ring, whatever else the build links (an
            // error only means one is installed already).
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        match parsed.topology {
            Topology::Single => managed(url, certs).map(Conn::Single),
            Topology::Cluster => {
                let nodes: Vec<String> = parsed.nodes.iter().map(|n| parsed.node_url(n)).collect();
                let mut b = redis::cluster::ClusterClientBuilder::new(nodes)
                    .connection_timeout(CONNECT_TIMEOUT)
                    // Below the callers' bound, so a timeout is seen here
                    // (and renews the connection) before they give up.
                    .response_timeout(CALL_TIMEOUT * 4 / 5)
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(20)
                    .max_retry_wait(200);
                if let Some(c) = certs {
                    b = b.certs(c);
                }
                let client = b.build().map_err(StoreError::Url)?;
                Ok(Conn::Cluster(Arc::new(LazyCluster {
                    client,
                    conn: RwLock::new(None),
                    connecting: tokio::sync::Mutex::new(()),
                })))
            }
            Topology::Sentinel => SentinelConn::start(parsed, ca_file).map(Conn::Sentinel),
        }
    }

    /// True in a cluster: key names carry hash tags and every multi-key
    /// command stays within one of them.
    pub fn tagged(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

fn tls_certificates(ca_file: Option<&Path>) -> Result<Option<redis::TlsCertificates>, StoreError> {
    let Some(path) = ca_file else {
        return Ok(None);
    };
    // Parsed here too, so a bad file is an error naming it.
    crate::pem::read_ca_file(path).map_err(StoreError::CaFile)?;
    let pem = std::fs::read(path).map_err(|source| {
        StoreError::CaFile(crate::pem::TlsSetupError::Read {
            path: path.display().to_string(),
            source,
        })
    })?;
    Ok(Some(redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    }))
}

/// A lazily connecting [`ConnectionManager`] on one server's `url` with the
/// store's bounds: connect and response timeouts, one reconnect attempt per
/// failure.
fn managed(
    url: &str,
    certs: Option<redis::TlsCertificates>,
) -> Result<ConnectionManager, StoreError> {
    let client = match certs {
        Some(c) => redis::Client::build_with_tls(url, c),
        None => redis::Client::open(url),
    }
    .map_err(StoreError::Url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(CALL_TIMEOUT))
        .set_number_of_retries(RECONNECT_RETRIES)
        .set_min_delay(RECONNECT_MIN_DELAY)
        .set_max_delay(CONNECT_TIMEOUT);
    ConnectionManager::new_lazy_with_config(client, config).map_err(StoreError::Url)
}

/// The cluster client, connected on first use, and connected afresh (its
/// topology read again from the seeds) after a timeout, a connection error
/// or `CLUSTERDOWN` once its connection is [`CLUSTER_REBUILD_AFTER`] old:
/// measured here, redis-rs's cluster connection could keep timing out after
/// a primary's failover while a fresh one found the promoted replica at once.
pub struct LazyCluster {
    client: redis::cluster::ClusterClient,
    conn: RwLock<Option<(ClusterConnection, std::time::Instant)>>,
    /// One connection attempt at a time.
    connecting: tokio::sync::Mutex<()>,
}

/// The youngest cluster connection an error makes the next call replace.
pub const CLUSTER_REBUILD_AFTER: Duration = Duration::from_secs(1);

impl LazyCluster {
    fn cached(&self) -> Option<ClusterConnection> {
        self.conn
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(c, _)| c.clone())
    }

    async fn get(&self) -> redis::RedisResult<ClusterConnection> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let _one = self.connecting.lock().await;
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let c = self.client.get_async_connection().await?;
        *self.conn.write().unwrap_or_else(|p| p.into_inner()) =
            Some((c.clone(), std::time::Instant::now()));
        Ok(c)
    }

    /// Drops the connection after an error that says the topology may have
    /// moved under it.
    fn saw(&self, e: &redis::RedisError) {
        let moved = e.is_timeout()
            || e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || matches!(e.code(), Some("CLUSTERDOWN" | "MASTERDOWN"));
        if !moved {
            return;
        }
        let mut conn = self.conn.write().unwrap_or_else(|p| p.into_inner());
        if conn
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() >= CLUSTER_REBUILD_AFTER)
        {
            *conn = None;
        }
    }
}

/// A primary found through Sentinel.
pub struct SentinelConn {
    url: ParsedUrl,
    certs: Option<redis::TlsCertificates>,
    sentinels: Vec<ConnectionManager>,
    /// The primary's `host:port` and the connection to it.
    current: RwLock<Option<(String, ConnectionManager)>>,
    /// One resolution at a time.
    resolving: tokio::sync::Mutex<()>,
}

impl SentinelConn {
    fn start(url: ParsedUrl, ca_file: Option<&Path>) -> Result<Arc<Self>, StoreError> {
        let sentinels = url
            .nodes
            .iter()
            .map(|n| managed(&url.sentinel_url(n), tls_certificates(ca_file)?))
            .collect::<Result<Vec<_>, _>>()?;
        let conn = Arc::new(Self {
            certs: tls_certificates(ca_file)?,
            url,
            sentinels,
            current: RwLock::new(None),
            resolving: tokio::sync::Mutex::new(()),
        });
        tokio::spawn(poll(Arc::downgrade(&conn)));
        Ok(conn)
    }

    /// The primary's address by the first sentinel that knows it.
    async fn ask(&self) -> redis::RedisResult<String> {
        let mut last = None;
        for s in &self.sentinels {
            let mut s = s.clone();
            let cmd = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.url.master)
                .to_owned();
            match tokio::time::timeout(
                CALL_TIMEOUT,
                cmd.query_async::<Option<(String, u16)>>(&mut s),
            )
            .await
            {
                Ok(Ok(Some((host, port)))) => return Ok(format!("{host}:{port}")),
                Ok(Ok(None)) => {
                    last = Some(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "the sentinel does not know the primary",
                        self.url.master.clone(),
                    )))
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => {
                    last = Some(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "the sentinel did not answer in time",
                    )))
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Client, "no sentinel configured"))
        }))
    }

    fn cached(&self) -> Option<(String, ConnectionManager)> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Asks the sentinels and moves to the primary they name if it changed.
    async fn refresh(&self) -> redis::RedisResult<ConnectionManager> {
        let _one = self.resolving.lock().await;
        let addr = self.ask().await?;
        if let Some((at, conn)) = self.cached() {
            if at == addr {
                return Ok(conn);
            }
        }
        let conn = managed(&self.url.node_url(&addr), self.certs.clone()).map_err(|e| match e {
            StoreError::Url(e) => e,
            other => redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "sentinel",
                other.to_string(),
            )),
        })?;
        tracing::info!(primary = %addr, name = %self.url.master, "Sentinel: the store's primary is here");
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some((addr, conn.clone()));
        Ok(conn)
    }

    async fn primary(&self) -> redis::RedisResult<ConnectionManager> {
        match self.cached() {
            Some((_, c)) => Ok(c),
            None => self.refresh().await,
        }
    }

    /// Forgets the primary after an error that says it may have moved.
    fn saw(&self, e: &redis::RedisError) {
        let moved = e.is_io_error()
            || e.is_connection_refusal()
            || e.is_connection_dropped()
            || matches!(e.code(), Some("READONLY" | "MASTERDOWN"))
            || e.to_string().contains("-READONLY ");
        if moved {
            *self.current.write().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

async fn poll(conn: Weak<SentinelConn>) {
    loop {
        tokio::time::sleep(SENTINEL_POLL).await;
        let Some(c) = conn.upgrade() else { return };
        if let Err(e) = c.refresh().await {
            tracing::debug!(error = %e, "Sentinel: no answer on the primary's address");
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(l) => {
                Box::pin(async move { l.get().await?.req_packed_command(cmd).await })
            }
            Conn::Sentinel(s) => Box::pin(async move {
                let r = s.primary().await?.req_packed_command(cmd).await;
                if let Err(e) = &r {
                    s.saw(e);
                }
                r
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipe, offset, count),
            Conn::Cluster(l) => Box::pin(async move {
                let r = l
                    .get()
                    .await?
                    .req_packed_commands(pipe, offset, count)
                    .await;
                if let Err(e) = &r {
                    l.saw(e);
                }
                r
            }),
            Conn::Sentinel(s) => Box::pin(async move {
                let r = s
                    .primary()
                    .await?
                    .req_packed_commands(pipe, offset, count)
                    .await;
                match &r {
                    Err(e) => s.saw(e),
                    Ok(values) => {
                        // An ignore_errors pipeline answers READONLY in place.
                        for v in values {
                            if let Value::ServerError(e) = v {
                                s.saw(&redis::RedisError::from(e.clone()));
                            }
                        }
                    }
                }
                r
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(_) => 0,
            Conn::Sentinel(_) => 0,
        }
    }
}

/// The process's Redis connection, shared by the metering store, the
/// session leases, the client-secret configs and the calls fleet, and
/// swappable: when the URL changes (`[store] redis_url_file`, a rotated
/// Secret) [`RedisConn::reconnect`] puts a connection to the new URL in
/// place, and every user's next call goes there (calls meanwhile fail open
/// as during any outage). Cheap to clone; clones share the slot.
#[derive(Clone)]
pub struct RedisConn {
    /// The connection and the URL it was made for.
    slot: Arc<RwLock<(Conn, crate::secret::Secret)>>,
    ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for RedisConn {
    // The URL may carry a password: only scheme, hosts and ports.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConn")
            .field("endpoint", &self.endpoint())
            .finish_non_exhaustive()
    }
}

impl RedisConn {
    /// A lazily connecting connection to `url`; must be called inside a
    /// Tokio runtime.
    pub fn new(url: &str, ca_file: Option<&Path>) -> Result<Self, StoreError> {
        let conn = Conn::open(url, ca_file)?;
        Ok(Self {
            slot: Arc::new(RwLock::new((conn, crate::secret::Secret::new(url)))),
            ca_file: ca_file.map(Path::to_path_buf),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, (Conn, crate::secret::Secret)> {
        self.slot.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection to use for the next call.
    pub fn get(&self) -> Conn {
        self.read().0.clone()
    }

    /// Whether key names carry hash tags (a cluster).
    pub fn tagged(&self) -> bool {
        self.read().0.tagged()
    }

    /// The current URL's hosts and ports, without credentials.
    pub fn endpoint(&self) -> String {
        endpoint(self.read().1.expose())
    }

    /// Whether the connection is the one made for `url`.
    pub fn is_for(&self, url: &str) -> bool {
        self.read().1.expose() == url
    }

    /// Points every user at `url` from their next call on.
    pub fn reconnect(&self, url: &str) -> Result<(), StoreError> {
        let conn = Conn::open(url, self.ca_file.as_deref())?;
        *self.slot.write().unwrap_or_else(|p| p.into_inner()) =
            (conn, crate::secret::Secret::new(url));
        Ok(())
    }
}
