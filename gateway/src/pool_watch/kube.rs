//! A minimal in-cluster Kubernetes API client: what the pool size watch
//! needs and nothing more (one GET, one watch stream), over HTTP/1.1 and
//! rustls trusting only the ServiceAccount's CA.
//!
//! Settings, as a pod gets them:
//! - the API server at `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`
//!   (an IPv6 host is put in brackets);
//! - `token`, `ca.crt` and `namespace` in the ServiceAccount directory,
//!   [`DEFAULT_SERVICEACCOUNT_DIR`] unless [`SERVICEACCOUNT_DIR_ENV`] names
//!   another (for tests and for running outside a cluster).
//!
//! The token and the CA are read again at every connection: a projected
//! token is rotated by the kubelet (hourly), and a connection outlives no
//! watch (at most [`super::event::WATCH_TIMEOUT_SECS`]). The token is sent
//! as a sensitive header and appears in no error or log line. `kube-rs`
//! would do all this and much more; it would also bring a second HTTP and
//! TLS stack into a gateway that needs two requests.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use super::event::{Lines, MAX_LINE_BYTES};

/// Where a pod's ServiceAccount credentials are mounted.
pub const DEFAULT_SERVICEACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Names another directory holding `token`, `ca.crt` and `namespace`.
pub const SERVICEACCOUNT_DIR_ENV: &str = "PATCHBAY_KUBE_SERVICEACCOUNT_DIR";
/// Bound on connect + TLS + a GET and its body, and on a watch's answer head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a call to the API server failed. No variant carries the token.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("not in a cluster: {0} is not set")]
    NotInCluster(&'static str),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("tls: {0}")]
    Tls(String),
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        authority: String,
        source: std::io::Error,
    },
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("http: {0}")]
    Http(String),
    #[error("the API server answered {status}{hint}")]
    Status { status: u16, hint: &'static str },
    #[error(transparent)]
    LineTooLong(#[from] super::event::LineTooLong),
}

/// Where the API server is and where the credentials are.
#[derive(Debug, Clone)]
pub struct InCluster {
    /// `host:port`, an IPv6 host in brackets (the `Host` header).
    authority: String,
    host: String,
    port: u16,
    dir: PathBuf,
    pub namespace: String,
}

impl InCluster {
    /// From the environment (`env`) and the namespace file.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Self, KubeError> {
        let host = env("KUBERNETES_SERVICE_HOST")
            .filter(|h| !h.is_empty())
            .ok_or(KubeError::NotInCluster("KUBERNETES_SERVICE_HOST"))?;
        let port = env("KUBERNETES_SERVICE_PORT")
            .ok_or(KubeError::NotInCluster("KUBERNETES_SERVICE_PORT"))?;
        let port: u16 = port.trim().parse().map_err(|_| {
            KubeError::Invalid(format!("KUBERNETES_SERVICE_PORT is not a port: {port:?}"))
        })?;
        let host = host.trim().trim_matches(['[', ']']).to_string();
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let dir = env(SERVICEACCOUNT_DIR_ENV)
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| DEFAULT_SERVICEACCOUNT_DIR.into())
            .into();
        let namespace = read_text(&Path::new(&dir).join("namespace"))?;
        if !crate::config_checks::is_dns_name(&namespace, true) {
            return Err(KubeError::Invalid(format!(
                "the namespace file holds no namespace name: {namespace:?}"
            )));
        }
        Ok(Self {
            authority,
            host,
            port,
            dir,
            namespace,
        })
    }

    /// The API server's URL, for log lines.
    pub fn server(&self) -> String {
        format!("https://{}", self.authority)
    }

    /// Opens an HTTP/1.1 connection over TLS, reading the token and the CA
    /// afresh.
    pub async fn connect(&self) -> Result<Conn, KubeError> {
        let bearer = self.bearer()?;
        let config = self.tls_config()?;
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| KubeError::Invalid(format!("KUBERNETES_SERVICE_HOST: {e}")))?;
        let open = async {
            let tcp = TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|source| KubeError::Connect {
                    authority: self.authority.clone(),
                    source,
                })?;
            let _ = tcp.set_nodelay(true);
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| KubeError::Tls(e.to_string()))?;
            let (sender, conn) = http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| KubeError::Http(e.to_string()))?;
            // The driver ends when the sender is dropped.
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok::<_, KubeError>(sender)
        };
        let sender = tokio::time::timeout(REQUEST_TIMEOUT, open)
            .await
            .map_err(|_| KubeError::Timeout(REQUEST_TIMEOUT))??;
        Ok(Conn {
            sender,
            authority: self.authority.clone(),
            bearer,
        })
    }

    fn bearer(&self) -> Result<HeaderValue, KubeError> {
        let token = read_text(&self.dir.join("token"))?;
        if token.is_empty() {
            return Err(KubeError::Invalid("the token file is empty".into()));
        }
        let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            KubeError::Invalid("the token file holds characters a header cannot carry".into())
        })?;
        value.set_sensitive(true);
        Ok(value)
    }

    /// rustls (ring) trusting the ServiceAccount's CA only, offering no
    /// ALPN (HTTP/1.1).
    fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, KubeError> {
        let path = self.dir.join("ca.crt");
        let mut roots = rustls::RootCertStore::empty();
        let tls_err = |e: String| KubeError::Tls(format!("{}: {e}", path.display()));
        for cert in crate::pem::read_ca_file(&path).map_err(|e| KubeError::Tls(e.to_string()))? {
            roots.add(cert).map_err(|e| tls_err(e.to_string()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Arc::new(config))
    }
}

/// A file's content, trimmed.
fn read_text(path: &Path) -> Result<String, KubeError> {
    std::fs::read_to_string(path)
        .map(|t| t.trim().to_string())
        .map_err(|source| KubeError::Read {
            path: path.to_path_buf(),
            source,
        })
}

/// An open connection to the API server, with the token read for it.
pub struct Conn {
    sender: http1::SendRequest<Empty<Bytes>>,
    authority: String,
    bearer: HeaderValue,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("authority", &self.authority)
            .field("bearer", &"[REDACTED]")
            .finish_non_exhaustive()
    }
}

/// What a refusal most likely means, for the log line.
fn hint(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => " (the ServiceAccount token was not accepted)",
        403 => " (the pod's Role must grant get, list and watch on this ConfigMap by name)",
        404 => " (no such ConfigMap in the pod's namespace)",
        _ => "",
    }
}

impl Conn {
    async fn send(&mut self, path: &str) -> Result<hyper::Response<Incoming>, KubeError> {
        let req = Request::get(path)
            .header(header::HOST, &self.authority)
            .header(header::ACCEPT, "application/json")
            .header(header::AUTHORIZATION, self.bearer.clone())
            .body(Empty::new())
            .map_err(|e| KubeError::Http(e.to_string()))?;
        let http = |e: hyper::Error| KubeError::Http(e.to_string());
        self.sender.ready().await.map_err(http)?;
        let resp = self.sender.send_request(req).await.map_err(http)?;
        if resp.status() != StatusCode::OK {
            return Err(KubeError::Status {
                status: resp.status().as_u16(),
                hint: hint(resp.status()),
            });
        }
        Ok(resp)
    }

    /// GETs `path` and reads its body (at most [`MAX_LINE_BYTES`]), within
    /// [`REQUEST_TIMEOUT`].
    pub async fn get(&mut self, path: &str) -> Result<Bytes, KubeError> {
        let get = async {
            let body = self.send(path).await?.into_body();
            Limited::new(body, MAX_LINE_BYTES)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| KubeError::Http(e.to_string()))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, get)
            .await
            .map_err(|_| KubeError::Timeout(REQUEST_TIMEOUT))?
    }

    /// Opens a watch at `path` (its answer's head within
    /// [`REQUEST_TIMEOUT`]); read its events with [`Watch::next_line`].
    pub async fn watch(&mut self, path: &str, idle: Duration) -> Result<Watch, KubeError> {
        let resp = tokio::time::timeout(REQUEST_TIMEOUT, self.send(path))
            .await
            .map_err(|_| KubeError::Timeout(REQUEST_TIMEOUT))??;
        Ok(Watch {
            body: resp.into_body(),
            lines: Lines::new(MAX_LINE_BYTES),
            ready: std::collections::VecDeque::new(),
            idle,
        })
    }
}

/// An open watch stream, read line by line.
#[derive(Debug)]
pub struct Watch {
    body: Incoming,
    lines: Lines,
    ready: std::collections::VecDeque<Vec<u8>>,
    /// The longest wait for the next bytes before the stream is deemed dead.
    idle: Duration,
}

impl Watch {
    /// The next line, `None` when the API server ended the stream.
    pub async fn next_line(&mut self) -> Result<Option<Vec<u8>>, KubeError> {
        loop {
            if let Some(line) = self.ready.pop_front() {
                return Ok(Some(line));
            }
            let frame = tokio::time::timeout(self.idle, self.body.frame())
                .await
                .map_err(|_| KubeError::Timeout(self.idle))?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(KubeError::Http(e.to_string())),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.ready.extend(self.lines.push(&data)?);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: Vec<(&str, String)>) -> impl Fn(&str) -> Option<String> + '_ {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn outside_a_cluster_there_is_nothing_to_watch() {
        let err = InCluster::from_env(&env(Vec::new())).unwrap_err();
        assert!(matches!(
            err,
            KubeError::NotInCluster("KUBERNETES_SERVICE_HOST")
        ));
    }

    #[test]
    fn an_ipv6_host_is_bracketed_and_the_namespace_is_read_from_the_directory() {
        let dir = std::env::temp_dir().join(format!("pb-sa-{}", crate::ids::short_id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("namespace"), "voice\n").unwrap();
        let d = dir.display().to_string();
        let settings = |host: &str| {
            vec![
                ("KUBERNETES_SERVICE_HOST", host.to_string()),
                ("KUBERNETES_SERVICE_PORT", "443".to_string()),
                (SERVICEACCOUNT_DIR_ENV, d.clone()),
            ]
        };
        let c = InCluster::from_env(&env(settings("fd00::1"))).unwrap();
        assert_eq!(c.server(), "https://[fd00::1]:443");
        assert_eq!(c.namespace, "voice");
        std::fs::write(dir.join("namespace"), "../etc").unwrap();
        assert!(InCluster::from_env(&env(settings("10.96.0.1"))).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
