//! Shared helpers for the gateway's integration tests: a simulator and a
//! gateway on 127.0.0.1 ephemeral ports, and a small WebSocket client.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::HeaderValue;
use patchbay_gateway::bootstrap::{self, Running};
use patchbay_gateway::config::{Config, MASTER_KEY_ENV};
use patchbay_gateway::event::event_type;
use patchbay_sim::{self as sim, SimConfig, SimHandle};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

pub const CLIENT_KEY: &str = "pb-test-key";
pub const UPSTREAM_KEY: &str = "sk-sim-test";
pub const MODEL: &str = "gpt-realtime";
/// Upper bound on any single wait in a test.
pub const WAIT: Duration = Duration::from_secs(10);

pub type Client = WebSocketStream<TcpStream>;

pub fn localhost() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

pub async fn sim(config: SimConfig) -> SimHandle {
    sim::start(
        localhost(),
        SimConfig {
            keys: vec![UPSTREAM_KEY.into()],
            ..config
        },
    )
    .await
    .expect("simulator starts")
}

/// Gateway TOML for one route to `upstream_url`, plus `extra` appended
/// (route keys first, then tables). The pool is off unless `extra` has a
/// `[pool]` table, so upstream connections are the sessions' own.
pub fn gateway_toml(upstream_url: &str, extra: &str) -> String {
    let pool = if extra.contains("[pool]") {
        ""
    } else {
        "[pool]\nsize = 0\n"
    };
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nupgrade_timeout_secs = 5\n\
         [[routes]]\nmodel = \"{MODEL}\"\nupstream_url = \"{upstream_url}\"\napi_key_env = \"SIM_KEY\"\n{extra}\n{pool}"
    )
}

/// The environment a test gateway sees: the simulator's key, the master
/// client key, and the test Redis URL when one is set.
pub fn test_env(k: &str) -> Option<String> {
    match k {
        "SIM_KEY" => Some(UPSTREAM_KEY.into()),
        MASTER_KEY_ENV => Some(CLIENT_KEY.into()),
        REDIS_ENV => std::env::var(REDIS_ENV).ok(),
        _ => None,
    }
}

pub const REDIS_ENV: &str = "PATCHBAY_TEST_REDIS_URL";

/// The test Redis URL, or `None` after printing why the test skips.
pub fn redis_url(test: &str) -> Option<String> {
    match std::env::var(REDIS_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            skipped(
                test,
                &format!("{REDIS_ENV} is not set (it points Redis-backed tests at a server)"),
            );
            None
        }
    }
}

/// Prints `SKIPPED <test>: <why>` on the process's stderr itself, seen at
/// the default verbosity: libtest captures a passing test's `println!` and
/// `eprintln!`, so a skip said that way showed only with `--nocapture`.
pub fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {why}");
}

pub async fn redis(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("the test Redis answers")
}

/// A keys file line for `key` with id `id` and extra TOML fields.
pub fn key_entry(id: &str, key: &str, extra: &str) -> String {
    format!(
        "[[keys]]\nid = \"{id}\"\nsha256 = \"{}\"\n{extra}\n",
        hex::encode(patchbay_gateway::secret::Secret::new(key).sha256())
    )
}

/// Opens a session with `key`; the HTTP status when the upgrade is refused.
pub async fn open_with(addr: std::net::SocketAddr, key: &str) -> Result<Client, u16> {
    let bearer = format!("Bearer {key}");
    match connect_with(
        addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await
    {
        Ok((mut ws, _)) => {
            assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
            Ok(ws)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

/// Per-test unique id (Redis keys, key ids).
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", patchbay_gateway::ids::short_id())
}

pub fn config(toml: &str) -> Config {
    Config::from_toml_with_env(toml, &test_env).expect("test config is valid")
}

pub async fn gateway(toml: &str) -> Running {
    bootstrap::start(config(toml))
        .await
        .expect("gateway starts")
}

/// A gateway on `sim` whose client keys come from the keys file `keys`
/// (re-read while it runs).
pub async fn keys_file_gateway(sim: &SimHandle, keys: &TempFile) -> Running {
    gateway(&gateway_toml(
        &sim.url(false),
        &format!("[keys]\nfile = \"{}\"\n", keys.0.display()),
    ))
    .await
}

/// A simulator and a gateway in front of it.
pub async fn sim_and_gateway(sim_config: SimConfig, extra: &str) -> (SimHandle, Running) {
    let s = sim(sim_config).await;
    let g = gateway(&gateway_toml(&s.url(false), extra)).await;
    (s, g)
}

/// Opens a client session; `headers` replace the default Bearer header.
pub async fn connect_with(
    addr: SocketAddr,
    query: &str,
    headers: &[(&'static str, &str)],
) -> Result<(Client, http::Response<Option<Vec<u8>>>), WsError> {
    let mut request = format!("ws://{addr}/v1/realtime{query}")
        .into_client_request()
        .unwrap();
    for (k, v) in headers {
        request
            .headers_mut()
            .insert(*k, HeaderValue::from_str(v).unwrap());
    }
    let tcp = TcpStream::connect(addr).await.map_err(WsError::Io)?;
    tcp.set_nodelay(true).unwrap();
    tokio::time::timeout(WAIT, tokio_tungstenite::client_async(request, tcp))
        .await
        .expect("upgrade answered in time")
}

pub async fn connect(addr: SocketAddr) -> Client {
    let bearer = format!("Bearer {CLIENT_KEY}");
    connect_with(
        addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await
    .expect("session opens")
    .0
}

/// The HTTP status of a refused upgrade, with its headers and body.
pub async fn refused(
    addr: SocketAddr,
    query: &str,
    headers: &[(&'static str, &str)],
) -> (u16, http::HeaderMap, serde_json::Value) {
    match connect_with(addr, query, headers).await {
        Err(WsError::Http(resp)) => {
            let body = resp.body().clone().unwrap_or_default();
            let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            (resp.status().as_u16(), resp.headers().clone(), json)
        }
        Ok(_) => panic!("upgrade for {query} was accepted, expected a refusal"),
        Err(e) => panic!("unexpected error {e}"),
    }
}

pub enum Received {
    Text(String),
    Close(Option<CloseFrame>),
    Ended,
}

/// Next text frame or close, skipping pings/pongs.
pub async fn recv(ws: &mut Client) -> Received {
    loop {
        match tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a frame arrives in time")
        {
            Some(Ok(Message::Text(t))) => return Received::Text(t.to_string()),
            Some(Ok(Message::Close(f))) => return Received::Close(f),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return Received::Ended,
        }
    }
}

pub async fn recv_text(ws: &mut Client) -> String {
    match recv(ws).await {
        Received::Text(t) => t,
        Received::Close(f) => panic!("expected a text frame, got close {f:?}"),
        Received::Ended => panic!("expected a text frame, connection ended"),
    }
}

/// Reads frames until the close; returns the texts seen and the close code.
pub async fn until_close(ws: &mut Client) -> (Vec<String>, Option<u16>, String) {
    let mut texts = Vec::new();
    loop {
        match recv(ws).await {
            Received::Text(t) => texts.push(t),
            Received::Close(f) => {
                let code = f.as_ref().map(|f| u16::from(f.code));
                let reason = f.map(|f| f.reason.to_string()).unwrap_or_default();
                return (texts, code, reason);
            }
            Received::Ended => return (texts, None, String::new()),
        }
    }
}

pub fn kind(text: &str) -> String {
    event_type(text).map(|t| t.into_owned()).unwrap_or_default()
}

pub async fn send_json(ws: &mut Client, v: serde_json::Value) {
    ws.send(Message::text(v.to_string())).await.expect("send");
}

/// Sends `response.create` and reads until `response.done`; returns every
/// text frame received, in order.
pub async fn one_turn(ws: &mut Client) -> Vec<String> {
    send_json(ws, serde_json::json!({"type": "response.create"})).await;
    let mut texts = Vec::new();
    loop {
        let t = recv_text(ws).await;
        let done = kind(&t) == "response.done";
        texts.push(t);
        if done {
            return texts;
        }
    }
}

/// Scrapes one metric's value (sum over label sets matching `labels`).
pub async fn metric(admin: SocketAddr, name: &str, labels: &str) -> f64 {
    let body = http_get(admin, "/metrics").await.1;
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter(|l| l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A minimal HTTP/1.1 GET; returns status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut buf))
        .await
        .expect("admin answers")
        .unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (status, body)
}

/// How often a live-reloaded file's changed content was `applied` or
/// `rejected` by an in-process gateway (`file`: `pool_size`, `keys`,
/// `config`).
pub fn reloads(gw: &Running, file: &str, result: &str) -> u64 {
    gw.gateway
        .metrics
        .config_reloads
        .get_or_create(&patchbay_gateway::metrics::ReloadLabels {
            file: file.into(),
            result: result.into(),
        })
        .get()
}

/// Polls `f` until it is true or [`WAIT`] passes.
pub async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

/// A free port on 127.0.0.1 (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `patchbay-gateway serve` as a child process, killed on drop.
pub struct Child {
    pub process: std::process::Child,
    /// Everything the child wrote to stderr so far (its logs).
    pub stderr: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    _config: TempFile,
}

impl Child {
    /// The config file the child was started with (to edit it live).
    pub fn config_path(&self) -> &std::path::Path {
        &self._config.0
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A file removed on drop.
pub struct TempFile(pub std::path::PathBuf);

impl TempFile {
    pub fn new(name: &str, contents: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "patchbay-test-{}-{}-{name}",
            std::process::id(),
            patchbay_gateway::ids::short_id()
        ));
        std::fs::write(&path, contents).unwrap();
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Whether a [`Child`]'s stderr is collected ([`Child::logs`]) or left in
/// a pipe nobody reads. Its stdout is a pipe read only by a test that takes
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stderr {
    Collected,
    Unread,
}

impl Child {
    /// Starts the binary on free ports with `extra` config appended to a
    /// route to `upstream_url`, and waits until `/readyz` answers 200.
    pub async fn start(upstream_url: &str, extra: &str, env: &[(&str, &str)]) -> Child {
        Self::start_with(upstream_url, extra, env, Stderr::Collected).await
    }

    /// [`Child::start`], with the child's stderr collected or not.
    pub async fn start_with(
        upstream_url: &str,
        extra: &str,
        env: &[(&str, &str)],
        stderr_is: Stderr,
    ) -> Child {
        Self::start_configured(upstream_url, extra, env, stderr_is, |_| {}).await
    }

    /// [`Child::start_with`], the command set up by `configure` before it
    /// is spawned (resource limits, say).
    pub async fn start_configured(
        upstream_url: &str,
        extra: &str,
        env: &[(&str, &str)],
        stderr_is: Stderr,
        configure: impl FnOnce(&mut std::process::Command),
    ) -> Child {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let admin_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let toml = gateway_toml(upstream_url, extra)
            .replace(
                "admin_listen = \"127.0.0.1:0\"",
                &format!("admin_listen = \"{admin_addr}\""),
            )
            .replace(
                "\nlisten = \"127.0.0.1:0\"",
                &format!("\nlisten = \"{addr}\""),
            );
        let config = TempFile::new("gateway.toml", &toml);
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_patchbay-gateway"));
        cmd.args(["serve", "--config"])
            .arg(&config.0)
            .env("SIM_KEY", UPSTREAM_KEY)
            .env(MASTER_KEY_ENV, CLIENT_KEY)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        configure(&mut cmd);
        let mut process = cmd.spawn().expect("the gateway binary starts");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        if stderr_is == Stderr::Collected {
            let mut pipe = process.stderr.take().unwrap();
            let sink = stderr.clone();
            std::thread::spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 8192];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    sink.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
        let child = Child {
            process,
            stderr,
            addr,
            admin_addr,
            _config: config,
        };
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Ok(Ok(mut s)) =
                tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(admin_addr))
                    .await
            {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let _ = s
                    .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .await;
                let mut buf = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(1), s.read_to_end(&mut buf)).await;
                if buf.starts_with(b"HTTP/1.1 200") {
                    return child;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the gateway never became ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn logs(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).to_string()
    }

    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// Sends the signal `name` (`TERM`, `HUP`, `QUIT`, `USR1`, …).
    pub fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.process.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// The request-log rows (JSON lines) the child wrote to stdout: reads
    /// the pipe to its end, so call it once the child has exited.
    pub fn stdout_rows(&mut self) -> Vec<serde_json::Value> {
        use std::io::Read;
        let mut stdout = String::new();
        self.process
            .stdout
            .take()
            .expect("stdout is read once")
            .read_to_string(&mut stdout)
            .unwrap();
        stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits for the exit; returns its code and how long it took.
    pub async fn wait_exit(&mut self, limit: Duration) -> (Option<i32>, Duration) {
        let started = tokio::time::Instant::now();
        loop {
            if let Some(status) = self.process.try_wait().unwrap() {
                return (status.code(), started.elapsed());
            }
            assert!(
                started.elapsed() < limit,
                "the gateway did not exit within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A TCP relay in front of a server that can delay every reply chunk
/// (e.g. Redis replies during a drain), on 127.0.0.1.
pub struct DelayRelay {
    pub addr: SocketAddr,
    pub delay: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl DelayRelay {
    pub async fn start(target: SocketAddr) -> DelayRelay {
        use std::sync::atomic::{AtomicU64, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind(localhost()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let delay = std::sync::Arc::new(AtomicU64::new(0));
        let d = delay.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                });
                let d = d.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = sr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let ms = d.load(Ordering::Relaxed);
                        if ms > 0 {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        DelayRelay { addr, delay }
    }
}

/// The server side of a WebSocket upgrade on `tcp` (the request read up
/// to its blank line, a 101 with the accept key written).
pub async fn accept_raw(tcp: &mut tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let key = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("sec-websocket-key")
                .then(|| value.trim().to_string())
        })
        .expect("an upgrade request");
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let reply = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    tcp.write_all(reply.as_bytes()).await.unwrap();
}

/// [`accept_raw`], giving the relay's raw client leg, as the gateway's HTTP
/// server does.
pub async fn accept_leg(
    mut tcp: tokio::net::TcpStream,
    max_message_bytes: usize,
) -> patchbay_gateway::relay::leg::Leg<tokio::net::TcpStream> {
    use patchbay_gateway::relay::leg::{Leg, Side};
    accept_raw(&mut tcp).await;
    Leg::new(tcp, &[], Side::Server, max_message_bytes)
}

/// An HTTP answer, its head lowercased.
pub struct Answer {
    pub status: u16,
    /// Lowercased `name: value` lines.
    pub head: String,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// One HTTP/1.1 request; the answer with its head lowercased.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    // A refused large body may be cut off by the answer: keep what was read.
    let _ = s.write_all(&bytes).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut buf))
        .await
        .expect("answered in time");
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Answer {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}
