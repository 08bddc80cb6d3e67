//! TLS on the client listener: a `wss://` client completes a session, the
//! HTTP API answers over the same listener, a renewed certificate is served
//! to new handshakes without a restart, and a pair that does not match is
//! refused at start.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use futures_util::{SinkExt, StreamExt};
use patchbay_sim::SimConfig;
use rcgen::{CertificateParams, KeyPair, SanType};
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// A self-signed certificate for 127.0.0.1 and its key, as PEM, and the
/// certificate as DER (to trust it).
fn self_signed() -> (String, String, CertificateDer<'static>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (
        cert.pem(),
        key.serialize_pem(),
        CertificateDer::from(cert.der().to_vec()),
    )
}

fn connector(trusted: &CertificateDer<'static>) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}

async fn tls_to(
    addr: std::net::SocketAddr,
    trusted: &CertificateDer<'static>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
    connector(trusted).connect(name, tcp).await
}

/// The type of the next text message.
async fn next_kind<S>(ws: &mut S) -> String
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        if let Message::Text(t) = tokio::time::timeout(WAIT, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            return kind(&t);
        }
    }
}

#[tokio::test]
async fn a_wss_client_completes_a_session_and_a_renewed_certificate_is_served_without_a_restart() {
    let sim = sim(SimConfig::default()).await;
    let (cert, key, der) = self_signed();
    let cert_file = TempFile::new("tls.crt", &cert);
    let key_file = TempFile::new("tls.key", &key);
    let toml = gateway_toml(&sim.url(false), "").replacen(
        "[server]\n",
        &format!(
            "[server]\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
            cert_file.0.display(),
            key_file.0.display()
        ),
        1,
    );
    let gw = gateway(&toml).await;

    // A WebSocket session over TLS, negotiated as HTTP/1.1.
    let tls = tls_to(gw.addr, &der).await.expect("the handshake succeeds");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut request = format!(
        "wss://127.0.0.1:{}/v1/realtime?model={MODEL}",
        gw.addr.port()
    )
    .into_client_request()
    .unwrap();
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {CLIENT_KEY}").parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::client_async(request, tls).await.unwrap();
    assert_eq!(next_kind(&mut ws).await, "session.created");
    ws.send(Message::text(r#"{"type":"response.create"}"#))
        .await
        .unwrap();
    while next_kind(&mut ws).await != "response.done" {}
    drop(ws);

    // The HTTP API answers on the same listener.
    let mut tls = tls_to(gw.addr, &der).await.unwrap();
    tls.write_all(b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(WAIT, tls.read_to_end(&mut answer)).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 404"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // Plain TCP gets no HTTP answer from a TLS listener.
    let mut plain = TcpStream::connect(gw.addr).await.unwrap();
    plain
        .write_all(b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(WAIT, plain.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert!(!buf[..n].starts_with(b"HTTP/1.1 101"));

    // A renewed pair: new handshakes get it, without a restart.
    let (cert2, key2, der2) = self_signed();
    std::fs::write(&key_file.0, key2).unwrap();
    std::fs::write(&cert_file.0, cert2).unwrap();
    let mut renewed = false;
    for _ in 0..100 {
        if tls_to(gw.addr, &der2).await.is_ok() {
            renewed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(renewed, "the renewed certificate is served");
    assert!(
        tls_to(gw.addr, &der).await.is_err(),
        "the old one no longer"
    );
}

#[tokio::test]
async fn a_key_that_does_not_match_its_certificate_is_refused_naming_the_key() {
    let (cert, _, _) = self_signed();
    let (_, other_key, _) = self_signed();
    let cert_file = TempFile::new("tls.crt", &cert);
    let key_file = TempFile::new("tls.key", &other_key);
    let toml = format!(
        "[server]\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n[[routes]]\nmodel = \"m\"\nupstream_url = \"ws://127.0.0.1:9/v1/realtime\"\napi_key_env = \"SIM_KEY\"\n",
        cert_file.0.display(),
        key_file.0.display()
    );
    let e = patchbay_gateway::config::Config::from_toml_with_env(&toml, &test_env).unwrap_err();
    assert_eq!(e.key, "server.tls_cert_file", "{e}");
    assert!(e.to_string().contains("does not match"), "{e}");
    let only_cert = format!(
        "[server]\ntls_cert_file = \"{}\"\n[[routes]]\nmodel = \"m\"\nupstream_url = \"ws://127.0.0.1:9/v1/realtime\"\napi_key_env = \"SIM_KEY\"\n",
        cert_file.0.display()
    );
    let e =
        patchbay_gateway::config::Config::from_toml_with_env(&only_cert, &test_env).unwrap_err();
    assert!(e.to_string().contains("go together"), "{e}");
}
