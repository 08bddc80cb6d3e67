//! The exporter's connections to a collector: HTTP/1.1 for `http/protobuf`,
//! HTTP/2 for `grpc` (h2c with prior knowledge for `http://`, TLS with
//! ALPN `h2` for `https://`), over rustls with the webpki roots.
//!
//! HTTP/1.1 is hyper's client connection; HTTP/2 is the `h2` crate's
//! client (hyper's HTTP/2 is the same crate). hyper's own `http2` feature
//! is left off: it would build HTTP/2 into hyper for the whole gateway
//! (its listeners, the calls API's upstream client) for an exporter that
//! makes one unary call at a time.
//!
//! A connection is opened on first use and kept by the exporter between
//! exports; the exporter bounds every use of it (connect included) with
//! its export timeout and drops it after any failure.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::config::Protocol;
use super::grpc::CallError;

/// Why one export failed (logged at most once per failure streak).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("cannot connect to {authority}: {message}")]
    Connect { authority: String, message: String },
    #[error("tls: {0}")]
    Tls(String),
    #[error("http: {0}")]
    Http(String),
    #[error("the collector answered {0}")]
    Status(u16),
    #[error("the collector answered {0}")]
    Grpc(#[from] CallError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// ALPN's name for HTTP/2.
const ALPN_H2: &[u8] = b"h2";
/// The most of a collector's answer that is read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// An open connection to a collector.
pub enum Conn {
    Http1(http1::SendRequest<Full<Bytes>>),
    Http2(h2::client::SendRequest<Bytes>),
}

/// A collector's answer: its head and trailers (its body is read and
/// dropped: a small protobuf, or an error text).
#[derive(Debug)]
pub struct Answer {
    pub head: http::response::Parts,
    pub trailers: Option<HeaderMap>,
}

fn http_err(e: impl std::fmt::Display) -> ExportError {
    ExportError::Http(e.to_string())
}

impl Conn {
    /// Whether a kept connection can carry another request.
    pub async fn ready(&mut self) -> bool {
        match self {
            Conn::Http1(c) => c.ready().await.is_ok(),
            Conn::Http2(c) => match c.clone().ready().await {
                Ok(ready) => {
                    *c = ready;
                    true
                }
                Err(_) => false,
            },
        }
    }

    /// Sends `req` and reads the whole answer (so the connection can carry
    /// the next one), at most [`MAX_ANSWER_BYTES`] of body.
    pub async fn exchange(&mut self, req: Request<Bytes>) -> Result<Answer, ExportError> {
        match self {
            Conn::Http1(c) => {
                let resp = c.send_request(req.map(Full::new)).await.map_err(http_err)?;
                let (head, body) = resp.into_parts();
                let _ = Limited::new(body, MAX_ANSWER_BYTES).collect().await;
                Ok(Answer {
                    head,
                    trailers: None,
                })
            }
            Conn::Http2(c) => {
                let (parts, body) = req.into_parts();
                let (answer, mut stream) = c
                    .send_request(Request::from_parts(parts, ()), false)
                    .map_err(http_err)?;
                stream.send_data(body, true).map_err(http_err)?;
                let (head, mut body) = answer.await.map_err(http_err)?.into_parts();
                let mut read = 0;
                while let Some(chunk) = body.data().await {
                    let chunk = chunk.map_err(http_err)?;
                    read += chunk.len();
                    let _ = body.flow_control().release_capacity(chunk.len());
                    if read > MAX_ANSWER_BYTES {
                        return Err(ExportError::Http("the answer is too long".into()));
                    }
                }
                let trailers = body.trailers().await.map_err(http_err)?;
                Ok(Answer { head, trailers })
            }
        }
    }
}

/// Opens a connection to `url`'s host for `protocol`.
pub async fn connect(url: &url::Url, protocol: Protocol) -> Result<Conn, ExportError> {
    let host = url.host_str().unwrap_or_default().to_string();
    let port = url.port_or_known_default().unwrap_or(80);
    let authority = format!("{host}:{port}");
    let tcp = TcpStream::connect(&authority)
        .await
        .map_err(|e| ExportError::Connect {
            authority: authority.clone(),
            message: e.to_string(),
        })?;
    let _ = tcp.set_nodelay(true);
    if url.scheme() != "https" {
        return handshake(tcp, protocol).await;
    }
    let config = tls_config(protocol)?;
    let name = rustls_pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
        .map_err(|e| ExportError::Tls(e.to_string()))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| ExportError::Tls(e.to_string()))?;
    if protocol == Protocol::Grpc && tls.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
        return Err(ExportError::Tls(
            "the collector did not agree to HTTP/2 (ALPN h2), which gRPC needs".into(),
        ));
    }
    handshake(tls, protocol).await
}

/// rustls (ring) trusting the webpki roots; offering `h2` for gRPC.
fn tls_config(protocol: Protocol) -> Result<Arc<rustls::ClientConfig>, ExportError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ExportError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn(protocol);
    Ok(Arc::new(config))
}

/// The ALPN protocols offered: `h2` for gRPC, none (HTTP/1.1) otherwise.
fn alpn(protocol: Protocol) -> Vec<Vec<u8>> {
    match protocol {
        Protocol::Grpc => vec![ALPN_H2.to_vec()],
        Protocol::HttpProtobuf => Vec::new(),
    }
}

async fn handshake<T>(io: T, protocol: Protocol) -> Result<Conn, ExportError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    let err = |e: hyper::Error| ExportError::Http(e.to_string());
    // Each connection's driver ends when its sender is dropped.
    match protocol {
        Protocol::HttpProtobuf => {
            let (sender, conn) = http1::handshake(io).await.map_err(err)?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Conn::Http1(sender))
        }
        Protocol::Grpc => {
            let (sender, conn) = h2::client::handshake(io.into_inner())
                .await
                .map_err(http_err)?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Conn::Http2(sender))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_offers_h2_over_tls_and_http_protobuf_offers_nothing() {
        assert_eq!(alpn(Protocol::Grpc), vec![b"h2".to_vec()]);
        assert!(alpn(Protocol::HttpProtobuf).is_empty());
        let config = tls_config(Protocol::Grpc).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec()]);
    }
}
