//! TLS on the client listener (`[server] tls_cert_file` and `tls_key_file`,
//! PEM): for `wss://` clients that cannot speak plain `ws://` (the official
//! Node SDK builds only `wss:` URLs) when nothing in front of the gateway
//! ends TLS. Plain TCP stays the default: in a cluster TLS usually ends at
//! the Gateway or the load balancer.
//!
//! - rustls with ring, TLS 1.2 and 1.3, ALPN `http/1.1` only (WebSocket
//!   upgrades are HTTP/1.1; a client offering only `h2` fails the
//!   handshake rather than speak HTTP/2 to an HTTP/1 server).
//! - The certificate and key are read at start (a bad pair stops the
//!   gateway with exit 2, naming the key) and re-read when either file
//!   changes, as a renewed Secret (cert-manager's) is mounted: new
//!   handshakes get the new pair, live sessions keep theirs. A pair that
//!   does not load is refused, logged and counted
//!   (`patchbay_config_reloads_total{file="tls",result="rejected"}`); the
//!   loaded one stays.
//! - A TLS connection is served by hyper (its upgrades included), not by
//!   the plain listener's own first-request path; the handshake is bounded
//!   by `upgrade_timeout_secs` like a request head.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::pem::load_pair;
use crate::watch::{self, Reloads};

/// How often the certificate and key files are read for a change.
pub const TLS_POLL: Duration = Duration::from_secs(2);

/// The pair as loaded now, handed to each handshake.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// The client listener's TLS: its acceptor, and the files it reloads from.
#[derive(Clone)]
pub struct ClientTls {
    pub acceptor: TlsAcceptor,
    current: Arc<Current>,
    cert: PathBuf,
    key: PathBuf,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// From the two files; `Err` says what is wrong with them.
    pub fn new(cert: &Path, key: &Path) -> Result<Self, String> {
        let current = Arc::new(Current(RwLock::new(Arc::new(load_pair(cert, key)?))));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            current,
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        })
    }

    /// Loads the pair again; the loaded one stays when it fails.
    pub fn reload(&self) -> Result<(), String> {
        let pair = load_pair(&self.cert, &self.key)?;
        *self.current.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(pair);
        Ok(())
    }

    /// Re-reads the pair whenever either file changes, until `stop`.
    pub fn watch(&self, stop: CancellationToken, reloads: impl Fn() -> Reloads) {
        for path in [self.cert.clone(), self.key.clone()] {
            let tls = self.clone();
            tokio::spawn(watch::on_change(
                path,
                "TLS certificate or key",
                TLS_POLL,
                stop.clone(),
                reloads(),
                move |_| tls.reload(),
            ));
        }
    }
}
