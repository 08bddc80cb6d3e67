//! A wss upstream trusted through `ca_file`, and configuration errors that
//! stop the real binary with exit code 2 and name the offending key.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use crate::common::*;
use patchbay_sim::SimConfig;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, SanType};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "patchbay-test-{}-{}-{name}",
        std::process::id(),
        patchbay_gateway::ids::short_id()
    ))
}

/// A CA, and a server config for 127.0.0.1 signed by it.
fn test_pki() -> (String, Arc<rustls::ServerConfig>) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let mut leaf_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf_params.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &ca).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(leaf.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
        )
        .unwrap();
    (ca.pem(), Arc::new(server))
}

#[tokio::test]
async fn wss_upstream_is_trusted_through_ca_file_and_refused_without_it() {
    let (ca_pem, server) = test_pki();
    let sim = sim(SimConfig {
        tls: Some(server),
        ..SimConfig::default()
    })
    .await;
    let ca_file = temp_path("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();

    let with_ca = gateway(&gateway_toml(
        &sim.url(true),
        &format!("ca_file = \"{}\"\n", ca_file.display()),
    ))
    .await;
    let mut ws = connect(with_ca.addr).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");

    // Without the CA the certificate is unknown: a clear error, then 1011.
    let without_ca = gateway(&gateway_toml(&sim.url(true), "")).await;
    let mut ws = connect(without_ca.addr).await;
    let (texts, code, _) = until_close(&mut ws).await;
    let e: serde_json::Value = serde_json::from_str(&texts[0]).unwrap();
    assert_eq!(e["error"]["code"], "upstream_unavailable");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("TLS"),
        "{e}"
    );
    assert_eq!(code, Some(1011));
    let _ = std::fs::remove_file(ca_file);
}

/// A route's active-sessions gauge (what the HPA and the operator read) is
/// exported at 0 before the pod's first session.
#[tokio::test]
async fn a_routes_active_sessions_are_exported_before_its_first_session() {
    let gw = gateway(&gateway_toml("ws://127.0.0.1:9/v1/realtime", "")).await;
    let body = http_get(gw.admin_addr, "/metrics").await.1;
    assert!(
        body.lines()
            .any(|l| l == format!("patchbay_realtime_sessions_active{{model=\"{MODEL}\"}} 0")),
        "{body}"
    );
}

/// Where the upstream is stays in the logs: a client whose session cannot
/// reach it is told so, not the upstream's host and port (it may name an
/// internal proxy).
#[tokio::test]
async fn an_unreachable_upstream_is_not_named_to_the_client() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let gw = gateway(&gateway_toml(
        &format!("ws://127.0.0.1:{port}/v1/realtime"),
        "",
    ))
    .await;
    let mut ws = connect(gw.addr).await;
    let (texts, code, _) = until_close(&mut ws).await;
    let e: serde_json::Value = serde_json::from_str(&texts[0]).unwrap();
    assert_eq!(e["error"]["code"], "upstream_unavailable");
    let message = e["error"]["message"].as_str().unwrap();
    assert_eq!(message, "cannot connect to the upstream");
    assert!(!texts[0].contains(&port.to_string()), "{e}");
    assert_eq!(code, Some(1011));
}

/// An upstream given by host name (resolved once, then from the cache) is
/// reached by the pool and by sessions alike.
#[tokio::test]
async fn an_upstream_named_by_host_name_is_reached() {
    let sim = sim(SimConfig::default()).await;
    let url = sim.url(false).replace("127.0.0.1", "localhost");
    assert!(url.starts_with("ws://localhost:"), "{url}");
    let gw = gateway(&gateway_toml(&url, "")).await;
    for _ in 0..3 {
        let mut ws = connect(gw.addr).await;
        assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
        let turn = one_turn(&mut ws).await;
        assert_eq!(kind(turn.last().unwrap()), "response.done");
    }
}

/// Runs `patchbay-gateway serve --config FILE` and returns (exit code, stderr).
fn serve_with(toml: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let file = temp_path("gateway.toml");
    std::fs::write(&file, toml).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_patchbay-gateway"));
    cmd.args(["serve", "--config"]).arg(&file).env_clear();
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the binary runs");
    let _ = std::fs::remove_file(file);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

const OK_ENV: &[(&str, &str)] = &[("SIM_KEY", "sk"), ("PATCHBAY_MASTER_KEY", "pb")];

#[test]
fn config_errors_exit_2_and_name_the_key() {
    let route = "[[routes]]\nmodel = \"m\"\nupstream_url = \"ws://127.0.0.1:1/v1/realtime\"\napi_key_env = \"SIM_KEY\"\n";

    let (code, err) = serve_with(&format!("[server]\nlisten_port = 1\n{route}"), OK_ENV);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("listen_port"), "{err}");

    let bad_url = route.replace("ws://127.0.0.1:1/v1/realtime", "http://x");
    let (code, err) = serve_with(&bad_url, OK_ENV);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("routes[0].upstream_url"), "{err}");

    let (code, err) = serve_with(route, &[("PATCHBAY_MASTER_KEY", "pb")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("routes[0].api_key_env") && err.contains("SIM_KEY"),
        "{err}"
    );

    let (code, err) = serve_with(
        &format!("[limits]\nmax_sessions = \"many\"\n{route}"),
        OK_ENV,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("max_sessions"), "{err}");

    let mut env = OK_ENV.to_vec();
    env.push(("PATCHBAY_RELAY_IDLE_TIMEOUT_SECS", "0"));
    let (code, err) = serve_with(route, &env);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("relay.idle_timeout_secs"), "{err}");

    // Secrets never appear in what is printed.
    assert!(!err.contains("pb\n") && !err.contains("\"sk\""), "{err}");
}
