//! Real Redis topologies for the store tests: a Redis Cluster (three
//! primaries, three replicas) and a primary + replica watched by three
//! sentinels, each node a `redis-server` of the test's own on free
//! 127.0.0.1 ports, in a temporary directory, without persistence.
//!
//! Every process is SIGKILLed when its handle drops (a test that panics
//! leaves nothing behind), and every wait is bounded: forming the cluster,
//! a failover, each command (`CALL`). A failover is driven the way a lost
//! machine drives it: `kill_primary` sends SIGKILL, and `wait_failover`
//! waits for Redis itself (the cluster bus, or the sentinels) to promote
//! the replica. Short timeouts make that take about two seconds in a
//! cluster (`cluster-node-timeout` 1000 ms) and a few in a Sentinel set
//! (`down-after-milliseconds` 1000).
//!
//! Why the replicas are waited for: a replica that never finished its first
//! sync cannot be promoted, so a cluster is ready only once every replica's
//! link to its primary is up, and diskless sync starts at once
//! (`repl-diskless-sync-delay 0`, the default waits five seconds).
//!
//! Each topology also starts TLS-only (`start_tls`): every node and
//! sentinel listens on a TLS port alone (`--port 0`), with the test's
//! certificate for 127.0.0.1; the cluster bus (`tls-cluster`) and
//! replication and the sentinels' links (`tls-replication`) are TLS too,
//! and clients are not asked for a certificate. Redis then reports the TLS
//! ports: `CLUSTER NODES`/`CLUSTER SLOTS` to a TLS client, and the
//! sentinels' master and replica addresses. The harness's own commands
//! (`query_on`, `redis-cli --tls --cacert`) trust only the test's CA.
//!
//! Tests skip with a printed reason when `redis-server` or `redis-cli` is
//! not installed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use redis::FromRedisValue;

use crate::common::{free_port, skipped};
use crate::redis_server::{Pki, TempDir};

/// Hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// The master name the sentinels monitor.
pub const MASTER_NAME: &str = "patchbay";
const NODE_TIMEOUT_MS: u64 = 1000;
const DOWN_AFTER_MS: u64 = 1000;
const FAILOVER_TIMEOUT_MS: u64 = 5000;
/// Bound on forming a topology (start, join, replicas in sync).
const FORM_WAIT: Duration = Duration::from_secs(30);
/// Bound on a failover. A Sentinel election that splits its votes retries
/// after `failover-timeout`, so this leaves room for a second round.
const FAILOVER_WAIT: Duration = Duration::from_secs(30);
/// Bound on one command to one node.
const CALL: Duration = Duration::from_secs(2);
/// Bound on one `redis-cli --cluster` run.
const CLI_WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// `redis-server` and `redis-cli`, or `None` after printing why `test` skips.
fn tools(test: &str) -> Option<(PathBuf, PathBuf)> {
    match (on_path("redis-server"), on_path("redis-cli")) {
        (Some(server), Some(cli)) => Some((server, cli)),
        _ => {
            skipped(
                test,
                "redis-server or redis-cli is not installed (apt-get install redis-server)",
            );
            None
        }
    }
}

/// A process killed (SIGKILL) and reaped when dropped.
struct Proc(Option<std::process::Child>);

impl Proc {
    /// Starts `program` in `dir`, its output appended to `dir/<log>`.
    fn spawn(program: &Path, args: &[String], dir: &Path, log: &str) -> Proc {
        let out = std::fs::File::create(dir.join(log)).unwrap();
        let child = Command::new(program)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("{} starts: {e}", program.display()));
        Proc(Some(child))
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.0.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TLS-only topology's certificate files (in its directory) and CA.
pub struct Tls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    ca_pem: String,
}

impl Tls {
    fn write(dir: &TempDir, pki: &Pki) -> Tls {
        Tls {
            ca: dir.file("ca.pem", &pki.ca_pem),
            cert: dir.file("server.pem", &pki.cert_pem),
            key: dir.file("server.key", &pki.key_pem),
            ca_pem: pki.ca_pem.clone(),
        }
    }

    /// Listening on the TLS `port` alone, clients not asked for a
    /// certificate, replication over TLS (config-file lines, or with `--`
    /// command-line arguments).
    fn settings(&self, port: u16) -> Vec<(&'static str, String)> {
        let path = |p: &Path| p.display().to_string();
        vec![
            ("port", "0".into()),
            ("tls-port", port.to_string()),
            ("tls-cert-file", path(&self.cert)),
            ("tls-key-file", path(&self.key)),
            ("tls-ca-cert-file", path(&self.ca)),
            ("tls-auth-clients", "no".into()),
            ("tls-replication", "yes".into()),
        ]
    }

    /// Trusting only this CA, for redis-rs clients.
    pub fn certs(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(self.ca_pem.clone().into_bytes()),
        }
    }

    fn cli_args(&self) -> Vec<String> {
        vec![
            "--tls".into(),
            "--cacert".into(),
            self.ca.display().to_string(),
        ]
    }
}

/// `redis-server` arguments listening on `port` of 127.0.0.1, plain or
/// TLS-only.
fn listen_args(port: u16, tls: Option<&Tls>) -> Vec<String> {
    let mut args = vec!["--bind".to_string(), "127.0.0.1".to_string()];
    match tls {
        None => args.extend(["--port".to_string(), port.to_string()]),
        Some(t) => {
            for (k, v) in t.settings(port) {
                args.extend([format!("--{k}"), v]);
            }
        }
    }
    args
}

/// `redis` or, over TLS, `rediss`.
fn scheme(tls: Option<&Tls>) -> &'static str {
    if tls.is_some() {
        "rediss"
    } else {
        "redis"
    }
}

/// `redis-cli` arguments for the topology's transport.
fn cli_args(tls: Option<&Tls>) -> Vec<String> {
    tls.map(Tls::cli_args).unwrap_or_default()
}

/// One `redis-server` (data node or sentinel) on 127.0.0.1.
struct Node {
    port: u16,
    proc: Proc,
}

/// Runs `args` on the plain node at `port` (a fresh connection, bounded by
/// `CALL`).
pub async fn query<T: FromRedisValue>(port: u16, args: &[&str]) -> Result<T, String> {
    query_on(None, port, args).await
}

/// `SET key value` then `WAIT 1 2000` on one connection of the (plain)
/// node at `port` (a `WAIT` covers only its own connection's writes): the
/// replicas that acknowledged the write.
pub async fn set_replicated(port: u16, key: &str, value: &str) -> i64 {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (acked,): (i64,) = redis::pipe()
        .cmd("SET")
        .arg(key)
        .arg(value)
        .ignore()
        .cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut conn)
        .await
        .unwrap();
    acked
}

/// Runs `args` on the node at `port`, over TLS trusting only `tls`'s CA when
/// given (a fresh connection, bounded by `CALL`).
pub async fn query_on<T: FromRedisValue>(
    tls: Option<&Tls>,
    port: u16,
    args: &[&str],
) -> Result<T, String> {
    let call = async {
        let client = match tls {
            None => redis::Client::open(format!("redis://127.0.0.1:{port}")),
            Some(t) => {
                // redis-rs builds its rustls config with the process-default
                // provider (an error only means one is installed already).
                let _ = rustls::crypto::ring::default_provider().install_default();
                redis::Client::build_with_tls(format!("rediss://127.0.0.1:{port}"), t.certs())
            }
        }
        .map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd(args[0])
            .arg(&args[1..])
            .query_async::<T>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    };
    tokio::time::timeout(CALL, call)
        .await
        .unwrap_or_else(|_| Err(format!("{args:?} on {port}: no answer within {CALL:?}")))
}

/// `field:value` lines of an `INFO`-style answer.
fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// Waits until `port` accepts connections (bounded), or panics with the log.
async fn wait_listening(node: &mut Node, dir: &Path, log: &str) {
    let deadline = tokio::time::Instant::now() + FORM_WAIT;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", node.port))
            .await
            .is_ok()
        {
            return;
        }
        let log_text = || std::fs::read_to_string(dir.join(log)).unwrap_or_default();
        assert!(
            node.proc.running(),
            "redis-server on {} exited at start: {}",
            node.port,
            log_text()
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "redis-server never listened on {}: {}",
            node.port,
            log_text()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `f` every `POLL` until it is `Some` (bounded by `within`), or
/// panics naming `what` and the last state `f` reported.
async fn until<T, F, Fut>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(last) => assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {within:?} waiting for {what}; last seen: {last}"
            ),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Runs `redis-cli` with `args` (bounded by `CLI_WAIT`, killed past it);
/// its exit status and its output (stdout then stderr, colours off).
async fn run_cli(cli: &Path, args: &[String], dir: &Path) -> (bool, String) {
    let log = format!("cli-{}.log", patchbay_gateway::ids::short_id());
    let mut proc = Proc::spawn(cli, args, dir, &log);
    let deadline = tokio::time::Instant::now() + CLI_WAIT;
    let ok = loop {
        let child = proc.0.as_mut().unwrap();
        if let Some(status) = child.try_wait().unwrap() {
            proc.0 = None;
            break status.success();
        }
        if tokio::time::Instant::now() >= deadline {
            proc.kill();
            break false;
        }
        tokio::time::sleep(POLL).await;
    };
    let out = std::fs::read_to_string(dir.join(&log)).unwrap_or_default();
    (ok, strip_ansi(&out))
}

/// `redis-cli` colours its `--cluster` output even into a file.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The hash slot of `key` (CRC16/XMODEM of the key, or of its hash tag:
/// the text between the first `{` and the next `}` when not empty).
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    let mut crc: u16 = 0;
    for &b in hashed {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

/// The hash tag of `key`, as Redis reads it.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// The primary's id, for a replica.
    pub primary: Option<String>,
    /// Slot ranges served (inclusive), for a primary.
    pub slots: Vec<(u16, u16)>,
}

impl NodeLine {
    pub fn is_primary(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    pub fn failed(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// Parses `CLUSTER NODES` (slots being migrated, `[…]`, are left out).
pub fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let addr = f[1].split('@').next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeLine {
                id: f[0].to_string(),
                port,
                flags: f[2].split(',').map(str::to_string).collect(),
                primary: (f[3] != "-").then(|| f[3].to_string()),
                slots,
            })
        })
        .collect()
}

/// A key found on a cluster primary, with its slot.
#[derive(Clone, Debug)]
pub struct ClusterKey {
    pub key: String,
    pub slot: u16,
    /// The primary it was found on.
    pub port: u16,
}

/// Three primaries and three replicas, formed by `redis-cli --cluster create`.
pub struct RedisCluster {
    cli: PathBuf,
    nodes: Vec<Node>,
    /// Killed primaries and the replicas they had (read before the kill: a
    /// promoted replica no longer names its old primary).
    killed: Vec<(u16, Vec<u16>)>,
    tls: Option<Tls>,
    dir: TempDir,
}

impl RedisCluster {
    /// Six nodes, the cluster formed, every slot served, every replica in
    /// sync; `None` (the test skips) without the Redis tools.
    pub async fn start(test: &str) -> Option<RedisCluster> {
        Self::start_with(test, None).await
    }

    /// As `start`, TLS-only with `pki`'s certificate, the cluster bus too.
    pub async fn start_tls(test: &str, pki: &Pki) -> Option<RedisCluster> {
        Self::start_with(test, Some(pki)).await
    }

    async fn start_with(test: &str, pki: Option<&Pki>) -> Option<RedisCluster> {
        let (server, cli) = tools(test)?;
        let dir = TempDir::new(&format!("cluster-{test}"));
        let tls = pki.map(|p| Tls::write(&dir, p));
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let (port, bus) = (free_port(), free_port());
            let mut args = listen_args(port, tls.as_ref());
            if tls.is_some() {
                args.extend(["--tls-cluster".to_string(), "yes".to_string()]);
            }
            args.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus.to_string(),
                    "--cluster-config-file",
                    &format!("nodes-{port}.conf"),
                    "--cluster-node-timeout",
                    &NODE_TIMEOUT_MS.to_string(),
                    // A replica may always stand in for its primary, however
                    // long since it last heard from it.
                    "--cluster-replica-validity-factor",
                    "0",
                    "--repl-diskless-sync-delay",
                    "0",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    &dir.0.display().to_string(),
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            let log = format!("node-{port}.log");
            let mut node = Node {
                port,
                proc: Proc::spawn(&server, &args, &dir.0, &log),
            };
            wait_listening(&mut node, &dir.0, &log).await;
            nodes.push(node);
        }
        let mut cluster = RedisCluster {
            cli,
            nodes,
            killed: Vec::new(),
            tls,
            dir,
        };
        let mut create = cli_args(cluster.tls.as_ref());
        create.extend(["--cluster".to_string(), "create".to_string()]);
        create.extend(
            cluster
                .nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port)),
        );
        create.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let (ok, out) = run_cli(&cluster.cli, &create, &cluster.dir.0).await;
        assert!(ok, "redis-cli --cluster create failed:\n{out}");
        cluster.wait_formed().await;
        Some(cluster)
    }

    /// Until every node sees a healthy cluster of three primaries serving
    /// every slot, each with one replica whose link is up.
    async fn wait_formed(&mut self) {
        let ports = self.node_ports();
        let tls = self.tls.as_ref();
        until("the cluster to form", FORM_WAIT, || async {
            for &port in &ports {
                let info: String = query_on(tls, port, &["CLUSTER", "INFO"]).await?;
                let state = info_field(&info, "cluster_state");
                let slots = info_field(&info, "cluster_slots_ok");
                let known = info_field(&info, "cluster_known_nodes");
                if state.as_deref() != Some("ok")
                    || slots != Some(SLOTS.to_string())
                    || known.as_deref() != Some("6")
                {
                    return Err(format!(
                        "{port}: {state:?}, slots {slots:?}, known {known:?}"
                    ));
                }
                let table =
                    parse_nodes(&query_on::<String>(tls, port, &["CLUSTER", "NODES"]).await?);
                let primaries = table.iter().filter(|n| n.is_primary()).count();
                let replicas = table.iter().filter(|n| n.primary.is_some()).count();
                if primaries != 3 || replicas != 3 {
                    return Err(format!(
                        "{port}: {primaries} primaries, {replicas} replicas"
                    ));
                }
                let repl: String = query_on(tls, port, &["INFO", "replication"]).await?;
                if info_field(&repl, "role").as_deref() == Some("slave")
                    && info_field(&repl, "master_link_status").as_deref() != Some("up")
                {
                    return Err(format!("{port}: replica link not up yet"));
                }
            }
            Ok(())
        })
        .await
    }

    /// `redis+cluster://` (`rediss+cluster://` over TLS) with every node
    /// as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!(
            "{}+cluster://{}",
            scheme(self.tls.as_ref()),
            seeds.join(",")
        )
    }

    /// The TLS files and CA of a TLS-only cluster.
    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    pub fn node_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    fn live_ports(&mut self) -> Vec<u16> {
        self.nodes
            .iter_mut()
            .filter_map(|n| n.proc.running().then_some(n.port))
            .collect()
    }

    /// `CLUSTER NODES` as seen by the first live node that answers.
    pub async fn nodes_table(&mut self) -> Vec<NodeLine> {
        for port in self.live_ports() {
            if let Ok(text) =
                query_on::<String>(self.tls.as_ref(), port, &["CLUSTER", "NODES"]).await
            {
                return parse_nodes(&text);
            }
        }
        panic!("no cluster node answers CLUSTER NODES");
    }

    /// The ports of the primaries serving slots, healthy ones only.
    pub async fn primaries(&mut self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .nodes_table()
            .await
            .iter()
            .filter(|n| n.is_primary() && !n.failed() && !n.slots.is_empty())
            .map(|n| n.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The port of the primary serving `key`'s slot (`CLUSTER KEYSLOT`).
    pub async fn primary_for_key(&mut self, key: &str) -> u16 {
        let port = self.live_ports()[0];
        let slot: u16 = query_on(self.tls.as_ref(), port, &["CLUSTER", "KEYSLOT", key])
            .await
            .unwrap();
        self.nodes_table()
            .await
            .into_iter()
            .find(|n| n.is_primary() && !n.failed() && n.serves(slot))
            .unwrap_or_else(|| panic!("no healthy primary serves slot {slot}"))
            .port
    }

    /// SIGKILL to the primary on `port`, as a lost machine (its replicas
    /// noted first, for `wait_failover`).
    pub async fn kill_primary(&mut self, port: u16) {
        let table = self.nodes_table().await;
        let id = &table
            .iter()
            .find(|n| n.port == port && n.is_primary())
            .unwrap_or_else(|| panic!("no primary on {port}"))
            .id;
        let replicas: Vec<u16> = table
            .iter()
            .filter(|n| n.primary.as_ref() == Some(id))
            .map(|n| n.port)
            .collect();
        assert!(!replicas.is_empty(), "the primary on {port} has no replica");
        self.killed.push((port, replicas));
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on {port}"));
        node.proc.kill();
    }

    /// Until a replica of the (killed) primary that was on `old_port` is a
    /// primary and every live node reports `cluster_state:ok`; its port.
    pub async fn wait_failover(&mut self, old_port: u16) -> u16 {
        let replicas = self
            .killed
            .iter()
            .find(|(port, _)| *port == old_port)
            .map(|(_, replicas)| replicas.clone())
            .unwrap_or_else(|| panic!("{old_port} was not killed by kill_primary"));
        let live = self.live_ports();
        let tls = self.tls.as_ref();
        until(
            "a replica promoted and the cluster ok",
            FAILOVER_WAIT,
            || {
                let (replicas, live) = (&replicas, &live);
                async move {
                    let mut promoted = None;
                    for &r in replicas {
                        let role: Vec<redis::Value> = query_on(tls, r, &["ROLE"]).await?;
                        if String::from_redis_value(role[0].clone()).ok().as_deref()
                            == Some("master")
                        {
                            promoted = Some(r);
                        }
                    }
                    let promoted = promoted.ok_or("no replica promoted yet")?;
                    for &port in live {
                        let info: String = query_on(tls, port, &["CLUSTER", "INFO"]).await?;
                        if info_field(&info, "cluster_state").as_deref() != Some("ok") {
                            return Err(format!("{port} does not report cluster_state:ok yet"));
                        }
                    }
                    Ok(promoted)
                }
            },
        )
        .await
    }

    /// `redis-cli --cluster check` through a live node: whether it passed
    /// (exit status 0, no `[ERR]`), and its output.
    pub async fn check(&mut self) -> (bool, String) {
        let port = self.live_ports()[0];
        let args = cli_args(self.tls.as_ref())
            .into_iter()
            .chain(["--cluster", "check"].map(String::from))
            .chain([format!("127.0.0.1:{port}")])
            .collect::<Vec<_>>();
        let (ok, out) = run_cli(&self.cli, &args, &self.dir.0).await;
        (ok && !out.contains("[ERR]"), out)
    }

    /// Every key on every healthy primary (`SCAN`), with its slot
    /// (`CLUSTER KEYSLOT` on the node holding it).
    pub async fn keys(&mut self) -> Vec<ClusterKey> {
        let mut found = Vec::new();
        for port in self.primaries().await {
            let mut cursor = "0".to_string();
            loop {
                let (next, keys): (String, Vec<String>) =
                    query_on(self.tls.as_ref(), port, &["SCAN", &cursor, "COUNT", "1000"])
                        .await
                        .unwrap();
                for key in keys {
                    let slot = query_on(self.tls.as_ref(), port, &["CLUSTER", "KEYSLOT", &key])
                        .await
                        .unwrap();
                    found.push(ClusterKey { key, slot, port });
                }
                if next == "0" {
                    break;
                }
                cursor = next;
            }
        }
        found
    }
}

/// One primary, one replica, three sentinels monitoring them as
/// [`MASTER_NAME`] with a quorum of two.
pub struct SentinelSet {
    primary: Node,
    replica: Node,
    sentinels: Vec<Node>,
    tls: Option<Tls>,
    _dir: TempDir,
}

impl SentinelSet {
    /// The set, ready: the replica in sync, and every sentinel seeing the
    /// primary, the replica and the two other sentinels; `None` (the test
    /// skips) without the Redis tools.
    pub async fn start(test: &str) -> Option<SentinelSet> {
        Self::start_with(test, None).await
    }

    /// As `start`, TLS-only with `pki`'s certificate: the data nodes, the
    /// replication, the sentinels and their links to every instance.
    pub async fn start_tls(test: &str, pki: &Pki) -> Option<SentinelSet> {
        Self::start_with(test, Some(pki)).await
    }

    async fn start_with(test: &str, pki: Option<&Pki>) -> Option<SentinelSet> {
        let (server, _cli) = tools(test)?;
        let dir = TempDir::new(&format!("sentinel-{test}"));
        let tls = pki.map(|p| Tls::write(&dir, p));
        let data_node = |port: u16, extra: &[String]| -> Vec<String> {
            let mut args = listen_args(port, tls.as_ref());
            args.extend(
                [
                    "--repl-diskless-sync-delay",
                    "0",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    &dir.0.display().to_string(),
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            args.extend_from_slice(extra);
            args
        };
        let primary_port = free_port();
        let log = format!("primary-{primary_port}.log");
        let mut primary = Node {
            port: primary_port,
            proc: Proc::spawn(&server, &data_node(primary_port, &[]), &dir.0, &log),
        };
        wait_listening(&mut primary, &dir.0, &log).await;
        let replica_port = free_port();
        let log = format!("replica-{replica_port}.log");
        let replica_of = [
            "--replicaof".to_string(),
            format!("127.0.0.1 {primary_port}"),
        ];
        let mut replica = Node {
            port: replica_port,
            proc: Proc::spawn(&server, &data_node(replica_port, &replica_of), &dir.0, &log),
        };
        wait_listening(&mut replica, &dir.0, &log).await;
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let listen: String = match &tls {
                None => format!("port {port}\n"),
                Some(t) => t
                    .settings(port)
                    .into_iter()
                    .map(|(k, v)| format!("{k} {v}\n"))
                    .collect(),
            };
            // Sentinel rewrites its config file: one of its own, writable.
            let conf = dir.file(
                &format!("sentinel-{port}.conf"),
                &format!(
                    "{listen}bind 127.0.0.1\ndir {}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                     sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir.0.display()
                ),
            );
            let args = [conf.display().to_string(), "--sentinel".to_string()];
            let log = format!("sentinel-{port}.log");
            let mut node = Node {
                port,
                proc: Proc::spawn(&server, &args, &dir.0, &log),
            };
            wait_listening(&mut node, &dir.0, &log).await;
            sentinels.push(node);
        }
        let set = SentinelSet {
            primary,
            replica,
            sentinels,
            tls,
            _dir: dir,
        };
        set.wait_ready().await;
        Some(set)
    }

    async fn wait_ready(&self) {
        let replica = self.replica.port;
        let sentinels = self.sentinel_ports();
        let tls = self.tls.as_ref();
        until("the sentinel set to be ready", FORM_WAIT, || {
            let sentinels = &sentinels;
            async move {
                let repl: String = query_on(tls, replica, &["INFO", "replication"]).await?;
                if info_field(&repl, "master_link_status").as_deref() != Some("up") {
                    return Err("the replica's link is not up yet".into());
                }
                for &s in sentinels {
                    let fields: Vec<String> =
                        query_on(tls, s, &["SENTINEL", "MASTER", MASTER_NAME]).await?;
                    let map: BTreeMap<&str, &str> = fields
                        .chunks(2)
                        .filter_map(|kv| Some((kv.first()?.as_str(), kv.get(1)?.as_str())))
                        .collect();
                    if map.get("flags") != Some(&"master")
                        || map.get("num-slaves") != Some(&"1")
                        || map.get("num-other-sentinels") != Some(&"2")
                    {
                        return Err(format!("sentinel {s}: {map:?}"));
                    }
                }
                Ok(())
            }
        })
        .await
    }

    /// `redis+sentinel://` (`rediss+sentinel://` over TLS) with the three
    /// sentinels and the master name.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .sentinels
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!(
            "{}+sentinel://{}/{MASTER_NAME}",
            scheme(self.tls.as_ref()),
            seeds.join(",")
        )
    }

    /// The TLS files and CA of a TLS-only set.
    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    pub fn primary_port(&self) -> u16 {
        self.primary.port
    }

    pub fn replica_port(&self) -> u16 {
        self.replica.port
    }

    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|n| n.port).collect()
    }

    /// SIGKILL to the primary, as a lost machine.
    pub fn kill_primary(&mut self) {
        self.primary.proc.kill();
    }

    /// Until every sentinel names the replica as the master and the replica
    /// reports the master role; its port.
    pub async fn wait_failover(&self) -> u16 {
        let replica = self.replica.port;
        let sentinels = self.sentinel_ports();
        let tls = self.tls.as_ref();
        until(
            "the sentinels to promote the replica",
            FAILOVER_WAIT,
            || {
                let sentinels = &sentinels;
                async move {
                    for &s in sentinels {
                        let addr: Vec<String> = query_on(
                            tls,
                            s,
                            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
                        )
                        .await?;
                        if addr.get(1).map(String::as_str) != Some(replica.to_string().as_str()) {
                            return Err(format!("sentinel {s} names {addr:?}"));
                        }
                    }
                    let role: Vec<redis::Value> = query_on(tls, replica, &["ROLE"]).await?;
                    match String::from_redis_value(role[0].clone()).ok().as_deref() {
                        Some("master") => Ok(replica),
                        other => Err(format!("the replica's role is {other:?}")),
                    }
                }
            },
        )
        .await
    }
}

#[test]
fn key_slots_follow_redis_hash_tags() {
    // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
    assert_eq!(key_slot("123456789"), 0x31c3 % SLOTS);
    assert_eq!(key_slot("foo"), 12182);
    assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
    assert_ne!(key_slot("foo{}{bar}"), key_slot("bar"));
    assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
    assert_eq!(hash_tag("patchbay:budget:key:{k1}:total"), Some("k1"));
    assert_eq!(hash_tag("patchbay:request_logs"), None);
    assert_eq!(hash_tag("a{}b"), None);
}

#[tokio::test]
async fn a_cluster_of_three_primaries_and_three_replicas_forms_and_passes_its_check() {
    let Some(mut cluster) = RedisCluster::start("cluster_forms").await else {
        return;
    };
    assert_eq!(cluster.primaries().await.len(), 3);
    let (ok, out) = cluster.check().await;
    assert!(ok, "redis-cli --cluster check:\n{out}");
    assert!(out.contains("[OK] All 16384 slots covered"), "{out}");
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
    assert_eq!(cluster.url().matches(',').count(), 5);

    // Keys of one tag land on one primary, in the tag's slot, and the
    // listing finds each where `CLUSTER KEYSLOT` says.
    let keys = [
        "patchbay:budget:key:{k1}:total",
        "patchbay:flushed:{k1}:sess-1",
        "patchbay:budget:team:{t1}:total",
        "untagged",
    ];
    for key in keys {
        let port = cluster.primary_for_key(key).await;
        let _: () = query(port, &["SET", key, "1"]).await.unwrap();
    }
    assert_eq!(
        cluster.primary_for_key(keys[0]).await,
        cluster.primary_for_key(keys[1]).await
    );
    let found = cluster.keys().await;
    assert_eq!(found.len(), keys.len(), "{found:?}");
    for k in &found {
        assert_eq!(k.slot, key_slot(&k.key), "{k:?}");
        assert_eq!(cluster.primary_for_key(&k.key).await, k.port, "{k:?}");
        if let Some(tag) = hash_tag(&k.key) {
            assert_eq!(k.slot, key_slot(tag), "{k:?}");
        }
    }
    let (ok, out) = cluster.check().await;
    assert!(ok && out.contains("4 keys in 3 masters"), "{out}");
}

#[tokio::test]
async fn killing_a_cluster_primary_promotes_its_replica_with_the_replicated_writes() {
    let Some(mut cluster) = RedisCluster::start("cluster_failover").await else {
        return;
    };
    let key = "patchbay:budget:key:{k1}:total";
    let old = cluster.primary_for_key(key).await;
    let acked = set_replicated(old, key, "7").await;
    assert_eq!(acked, 1, "the replica acknowledged the write");

    cluster.kill_primary(old).await;
    let started = std::time::Instant::now();
    let promoted = cluster.wait_failover(old).await;
    eprintln!("cluster failover took {:?}", started.elapsed());
    assert_ne!(promoted, old);
    assert_eq!(cluster.primary_for_key(key).await, promoted);
    // The promoted node may still be settling (loading, redirecting).
    let value: String = until(
        "the promoted node to answer",
        FAILOVER_WAIT,
        || async move { query::<String>(promoted, &["GET", key]).await },
    )
    .await;
    assert_eq!(value, "7");
    let (ok, out) = cluster.check().await;
    assert!(ok, "redis-cli --cluster check after the failover:\n{out}");
    assert_eq!(cluster.primaries().await.len(), 3);
}

#[tokio::test]
async fn a_sentinel_failover_promotes_the_replica_and_every_sentinel_names_it() {
    let Some(mut set) = SentinelSet::start("sentinel_failover").await else {
        return;
    };
    assert_eq!(set.url().matches(',').count(), 2);
    assert!(set.url().ends_with("/patchbay"));
    let primary = set.primary_port();
    for s in set.sentinel_ports() {
        let addr: Vec<String> = query(s, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
            .await
            .unwrap();
        assert_eq!(addr, vec!["127.0.0.1".to_string(), primary.to_string()]);
    }
    assert_eq!(set_replicated(primary, "patchbay:probe", "1").await, 1);

    set.kill_primary();
    let started = std::time::Instant::now();
    let promoted = set.wait_failover().await;
    eprintln!("sentinel failover took {:?}", started.elapsed());
    assert_eq!(promoted, set.replica_port());
    assert_eq!(
        query::<String>(promoted, &["GET", "patchbay:probe"])
            .await
            .unwrap(),
        "1"
    );
    // The new primary takes writes.
    let _: () = query(promoted, &["SET", "patchbay:after", "1"])
        .await
        .unwrap();
}
