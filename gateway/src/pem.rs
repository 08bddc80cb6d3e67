//! Trusted CA certificates from a PEM file (`ca_file` of an upstream or of
//! the store): read once by configuration validation (the error names the
//! key) and again by each TLS client that trusts them. Also the client
//! listener's certificate and key ([`load_pair`]).

use std::path::Path;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    Empty { path: String },
    #[error("{path}: invalid certificate: {message}")]
    Invalid { path: String, message: String },
}

/// Reads every certificate of a PEM file.
pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| TlsSetupError::Read {
        path: shown.clone(),
        source,
    })?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsSetupError::Invalid {
            path: shown.clone(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsSetupError::Empty { path: shown });
    }
    Ok(certs)
}
/// Reads a certificate chain and its private key (PEM).
pub fn load_pair(cert: &Path, key: &Path) -> Result<rustls::sign::CertifiedKey, String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
    let cert_pem = read(cert)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: invalid certificate: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", cert.display()));
    }
    let key_der = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|e| format!("{}: no PEM private key: {e}", key.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| format!("{}: unusable private key: {e}", key.display()))?;
    let pair = rustls::sign::CertifiedKey::new(certs, signing);
    pair.keys_match()
        .map_err(|e| format!("{} does not match {}: {e}", key.display(), cert.display()))?;
    Ok(pair)
}
