//! Trusted CA certificates from a PEM file (`ca_file` of an upstream or of
//! the store): read once by configuration validation (the error names the
//! key) and again by each TLS client that trusts them.

use std::path::Path;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

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
