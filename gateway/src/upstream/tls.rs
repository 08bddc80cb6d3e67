//! TLS for wss upstreams: rustls (ring) with the webpki roots, plus an
//! optional extra trust root per route (`ca_file`, PEM). No ALPN: the
//! WebSocket upgrade is HTTP/1.1.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;

use crate::pem::{read_ca_file, TlsSetupError};

/// A client config trusting the webpki roots and the certificates of `ca_file`.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        for cert in read_ca_file(path)? {
            roots.add(cert).map_err(|e| TlsSetupError::Invalid {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError::Invalid {
            path: "tls".into(),
            message: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
