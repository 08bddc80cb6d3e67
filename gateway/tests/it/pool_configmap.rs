//! The pool size watched through the Kubernetes API (`[pool]
//! size_configmap`), against a mock API server on 127.0.0.1 speaking
//! HTTPS with a test certificate: the gateway binary GETs the ConfigMap
//! with the ServiceAccount's token, watches it, and each new value reaches
//! `patchbay_pool_target_sockets` within seconds; an expired watch GETs
//! again, a finished one resumes, a dropped one reconnects with the
//! rotated token; an untrusted certificate is refused.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use patchbay_sim::SimConfig;
use rcgen::{CertificateParams, KeyPair, SanType};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

const GET_PATH: &str = "/api/v1/namespaces/voice/configmaps/voice-pool";
const WATCH_PREFIX: &str = "/api/v1/namespaces/voice/configmaps?fieldSelector=metadata.name%3Dvoice-pool&watch=true&resourceVersion=";
const WATCH_SUFFIX: &str = "&allowWatchBookmarks=true&timeoutSeconds=290";

/// A self-signed certificate for 127.0.0.1: its PEM and its key's PEM.
fn self_signed() -> (String, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// What the test tells an open watch to do.
enum Cmd {
    /// Send one line (an event).
    Line(String),
    /// End the stream cleanly, as at `timeoutSeconds`.
    End,
    /// Drop the connection mid-stream.
    Drop,
}

#[derive(Default)]
struct State {
    token: String,
    value: String,
    rv: u64,
    /// Each request's path and `Authorization` header, in order.
    requests: Vec<(String, String)>,
}

/// A mock API server holding one ConfigMap, `voice/voice-pool`.
struct Api {
    addr: SocketAddr,
    cert: String,
    state: Arc<Mutex<State>>,
    cmds: mpsc::UnboundedSender<Cmd>,
}

fn configmap(value: &str, rv: u64) -> serde_json::Value {
    serde_json::json!({
        "kind": "ConfigMap", "apiVersion": "v1",
        "metadata": {"name": "voice-pool", "namespace": "voice", "resourceVersion": rv.to_string()},
        "data": {"REALTIME_POOL_SIZE": value}
    })
}

impl Api {
    async fn start(token: &str, value: &str) -> Api {
        let (cert, key) = self_signed();
        let pair = {
            use rustls_pki_types::pem::PemObject;
            let certs =
                vec![rustls_pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()];
            let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
            (certs, key)
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(pair.0, pair.1)
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            token: token.into(),
            value: value.into(),
            rv: 1,
            requests: Vec::new(),
        }));
        let (cmds, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, st, rx) = (acceptor.clone(), st.clone(), rx.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        serve(tls, st, rx).await;
                    }
                });
            }
        });
        Api {
            addr,
            cert,
            state,
            cmds,
        }
    }

    fn requests(&self) -> Vec<(String, String)> {
        self.state.lock().unwrap().requests.clone()
    }

    fn count(&self, get: bool) -> usize {
        self.requests()
            .iter()
            .filter(|(p, _)| (p == GET_PATH) == get)
            .count()
    }

    /// Changes the value and sends the watch a MODIFIED event.
    fn modify(&self, value: &str) {
        let line = {
            let mut st = self.state.lock().unwrap();
            st.value = value.into();
            st.rv += 1;
            serde_json::json!({"type": "MODIFIED", "object": configmap(value, st.rv)}).to_string()
        };
        self.cmds.send(Cmd::Line(line)).unwrap();
    }

    fn send(&self, cmd: Cmd) {
        self.cmds.send(cmd).unwrap();
    }
}

/// Serves one connection's requests: the GET, or a watch fed by the test.
async fn serve(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    state: Arc<Mutex<State>>,
    cmds: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Cmd>>>,
) {
    let (read, mut write) = tokio::io::split(tls);
    let mut read = BufReader::new(read);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_string());
        }
        let path = head[0].split(' ').nth(1).unwrap_or_default().to_string();
        let auth = head
            .iter()
            .find_map(|h| {
                h.strip_prefix("authorization: ")
                    .or(h.strip_prefix("Authorization: "))
            })
            .unwrap_or_default()
            .to_string();
        let (authorised, body) = {
            let mut st = state.lock().unwrap();
            st.requests.push((path.clone(), auth.clone()));
            (
                auth == format!("Bearer {}", st.token),
                configmap(&st.value, st.rv).to_string(),
            )
        };
        if !authorised {
            let _ = write
                .write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")
                .await;
            continue;
        }
        if path == GET_PATH {
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if write.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        if !path.starts_with(WATCH_PREFIX) {
            let _ = write
                .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                .await;
            continue;
        }
        let _ = write
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
            .await;
        let mut cmds = cmds.lock().await;
        let mut probe = [0u8; 1];
        loop {
            let cmd = tokio::select! {
                // The client went away: leave the commands to the next watch.
                _ = read.read(&mut probe) => return,
                cmd = cmds.recv() => cmd,
            };
            match cmd {
                Some(Cmd::Line(line)) => {
                    let chunk = format!("{:x}\r\n{line}\n\r\n", line.len() + 1);
                    if write.write_all(chunk.as_bytes()).await.is_err() {
                        return;
                    }
                }
                Some(Cmd::End) => {
                    let _ = write.write_all(b"0\r\n\r\n").await;
                    break;
                }
                Some(Cmd::Drop) | None => return,
            }
        }
    }
}

/// A ServiceAccount directory: `token`, `ca.crt` and `namespace`.
struct ServiceAccount(PathBuf);

impl ServiceAccount {
    fn new(token: &str, ca: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "patchbay-test-sa-{}",
            patchbay_gateway::ids::short_id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("token"), token).unwrap();
        std::fs::write(dir.join("ca.crt"), ca).unwrap();
        std::fs::write(dir.join("namespace"), "voice\n").unwrap();
        Self(dir)
    }
}

impl Drop for ServiceAccount {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The gateway binary watching `api`'s ConfigMap, with `[pool] size = 1`,
/// `max_size = 6` and a size file holding 1.
async fn gateway_watching(
    api: &Api,
    sa: &ServiceAccount,
    size_file: &TempFile,
) -> (patchbay_sim::SimHandle, Child) {
    let sim = sim(SimConfig::default()).await;
    let extra = format!(
        "[pool]\nsize = 1\nmax_size = 6\nsize_configmap = \"voice-pool\"\nsize_file = \"{}\"\n",
        size_file.0.display()
    );
    let port = api.addr.port().to_string();
    let sa_dir = sa.0.display().to_string();
    let child = Child::start(
        &sim.url(false),
        &extra,
        &[
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", &port),
            ("PATCHBAY_KUBE_SERVICEACCOUNT_DIR", &sa_dir),
        ],
    )
    .await;
    (sim, child)
}

/// Polls a metric of the child's admin listener until it reads `want`
/// (within a few seconds).
async fn reaches(admin: SocketAddr, name: &str, labels: &str, want: f64) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    loop {
        if metric(admin, name, labels).await == want {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn until(mut f: impl FnMut() -> bool) -> bool {
    eventually(&mut f).await
}

const TARGET: &str = "patchbay_pool_target_sockets";
const UP: &str = "patchbay_pool_size_watch_up";

#[tokio::test]
async fn configmap_sizes_reach_the_pool_in_seconds_capped_at_max_size_and_a_stale_file_or_bad_value_changes_nothing(
) {
    let api = Api::start("tok-1", "2").await;
    let sa = ServiceAccount::new("tok-1", &api.cert);
    let size_file = TempFile::new("REALTIME_POOL_SIZE", "1\n");
    let (_sim, gw) = gateway_watching(&api, &sa, &size_file).await;
    let admin = gw.admin_addr;

    assert!(
        reaches(admin, TARGET, "", 2.0).await,
        "the GET's size applies"
    );
    assert!(
        until(|| api.count(false) == 1).await,
        "{:?}",
        api.requests()
    );
    assert_eq!(
        api.requests(),
        vec![
            (GET_PATH.to_string(), "Bearer tok-1".to_string()),
            (
                format!("{WATCH_PREFIX}1{WATCH_SUFFIX}"),
                "Bearer tok-1".to_string()
            ),
        ]
    );
    assert!(reaches(admin, UP, "", 1.0).await);

    api.modify("3");
    assert!(
        reaches(admin, TARGET, "", 3.0).await,
        "a MODIFIED size applies"
    );

    // The mounted file lags behind: an older size in it is not applied
    // while the watch holds the current one.
    let applied = "file=\"pool_size\",result=\"applied\"";
    let before = metric(admin, "patchbay_config_reloads_total", applied).await;
    std::fs::write(&size_file.0, "5\n").unwrap();
    let mut read = false;
    for _ in 0..100 {
        if metric(admin, "patchbay_config_reloads_total", applied).await > before {
            read = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(read, "the size file was never re-read");
    assert_eq!(metric(admin, TARGET, "").await, 3.0);

    api.modify("100");
    assert!(
        reaches(admin, TARGET, "", 6.0).await,
        "a size over max_size is capped"
    );

    api.modify("lots");
    assert!(
        reaches(
            admin,
            "patchbay_config_reloads_total",
            "file=\"pool_configmap\",result=\"rejected\"",
            1.0
        )
        .await
    );
    assert_eq!(
        metric(admin, TARGET, "").await,
        6.0,
        "a bad value changes nothing"
    );
    assert!(gw.logs().contains("holds no valid size"), "{}", gw.logs());
    assert_eq!(
        metric(
            admin,
            "patchbay_pool_size_updates_total",
            "source=\"configmap\""
        )
        .await,
        3.0
    );
    assert_eq!(
        metric(admin, "patchbay_pool_size_updates_total", "source=\"file\"").await,
        0.0
    );
    assert!(!gw.logs().contains("tok-1"), "the token is never logged");
}

#[tokio::test]
async fn an_expired_watch_gets_again_a_finished_one_resumes_and_a_dropped_one_reconnects_with_the_rotated_token(
) {
    let api = Api::start("tok-1", "2").await;
    let sa = ServiceAccount::new("tok-1", &api.cert);
    let size_file = TempFile::new("REALTIME_POOL_SIZE", "1\n");
    let (_sim, gw) = gateway_watching(&api, &sa, &size_file).await;
    let admin = gw.admin_addr;
    assert!(reaches(admin, TARGET, "", 2.0).await);
    assert!(until(|| api.count(false) == 1).await);

    // 410 Gone: the resourceVersion is too old; GET, then watch again.
    api.send(Cmd::Line(
        r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (7)","reason":"Expired","code":410}}"#.into(),
    ));
    assert!(
        until(|| api.count(true) == 2 && api.count(false) == 2).await,
        "{:?}",
        api.requests()
    );

    // A bookmark moves the resourceVersion; a watch the server ends is
    // resumed from it, without a GET.
    api.send(Cmd::Line(
        r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"50"}}}"#.into(),
    ));
    api.send(Cmd::End);
    assert!(
        until(|| api.count(false) == 3).await,
        "{:?}",
        api.requests()
    );
    assert_eq!(
        api.requests().last().unwrap().0,
        format!("{WATCH_PREFIX}50{WATCH_SUFFIX}")
    );
    assert_eq!(api.count(true), 2);

    // The token rotates, then the connection drops: the reconnection
    // reads the new token.
    std::fs::write(sa.0.join("token"), "tok-2\n").unwrap();
    api.state.lock().unwrap().token = "tok-2".into();
    api.send(Cmd::Drop);
    assert!(reaches(admin, UP, "", 0.0).await, "the up gauge falls");
    assert!(
        until(|| api.count(false) == 4).await,
        "never reconnected: {:?}",
        api.requests()
    );
    let requests = api.requests();
    assert_eq!(
        requests[requests.len() - 2],
        (GET_PATH.into(), "Bearer tok-2".into())
    );
    assert_eq!(requests.last().unwrap().1, "Bearer tok-2");
    assert!(reaches(admin, UP, "", 1.0).await);
    api.modify("4");
    assert!(reaches(admin, TARGET, "", 4.0).await);
}

#[tokio::test]
async fn an_api_server_whose_certificate_the_ca_does_not_sign_is_refused() {
    let api = Api::start("tok-1", "2").await;
    let (other_ca, _) = self_signed();
    let sa = ServiceAccount::new("tok-1", &other_ca);
    let size_file = TempFile::new("REALTIME_POOL_SIZE", "1\n");
    let (_sim, gw) = gateway_watching(&api, &sa, &size_file).await;
    assert!(
        until(|| gw.logs().contains("cannot watch the pool size ConfigMap")).await,
        "{}",
        gw.logs()
    );
    assert!(
        api.requests().is_empty(),
        "no request crosses the refused handshake"
    );
    assert_eq!(metric(gw.admin_addr, UP, "").await, 0.0);
    assert_eq!(
        metric(gw.admin_addr, TARGET, "").await,
        1.0,
        "the size stays"
    );
}
