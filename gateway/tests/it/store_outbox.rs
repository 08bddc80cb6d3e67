//! The outbox and the row pipe, against real `redis-server` processes the
//! tests start on free ports and a real gateway in front of the simulator:
//! a Redis outage loses no row and no spend, a write whose reply was lost
//! counts once, the drain waits for the outbox, and a stdout nobody reads
//! never stalls a session.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use patchbay_gateway::bootstrap;
use patchbay_gateway::config::Config;
use patchbay_sim::SimConfig;
use redis::AsyncCommands;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::redis_server::{RedisServer, TempDir};

const PRICES: &str = "[[prices]]\nmodel = \"gpt-realtime\"\ntext_input = 4.0\naudio_input = 32.0\n\
                      text_output = 16.0\naudio_output = 64.0\n";

const PASS: u8 = 0;
const REFUSE: u8 = 1;
const DROP_REPLIES: u8 = 2;

/// A TCP relay in front of Redis with three modes: pass everything;
/// refuse (reset every relayed connection and refuse new ones, as a dead
/// Redis does); drop replies (requests reach Redis, but its first reply on
/// a connection is swallowed and the connection closed: a write applied
/// whose reply never came back).
struct FaultRelay {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    conns: Arc<Mutex<CancellationToken>>,
}

impl FaultRelay {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = FaultRelay {
            addr: listener.local_addr().unwrap(),
            mode: Arc::new(AtomicU8::new(PASS)),
            conns: Arc::new(Mutex::new(CancellationToken::new())),
        };
        let (mode, conns) = (relay.mode.clone(), relay.conns.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if mode.load(Ordering::SeqCst) == REFUSE {
                    drop(client);
                    continue;
                }
                let token = conns.lock().unwrap().clone();
                let mode = mode.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::io::copy(&mut cr, &mut sw);
                    let down = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if mode.load(Ordering::SeqCst) == DROP_REPLIES {
                                return;
                            }
                            if cw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                        _ = token.cancelled() => {}
                    }
                });
            }
        });
        relay
    }

    fn set(&self, m: u8) {
        self.mode.store(m, Ordering::SeqCst);
        if m == REFUSE {
            let mut t = self.conns.lock().unwrap();
            t.cancel();
            *t = CancellationToken::new();
        }
    }
}

async fn gateway_with_env(toml: &str, env: Vec<(&'static str, String)>) -> bootstrap::Running {
    let lookup = move |k: &str| {
        env.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.clone())
            .or_else(|| test_env(k))
    };
    let config = Config::from_toml_with_env(toml, &lookup).expect("test config is valid");
    bootstrap::start(config).await.expect("gateway starts")
}

/// A gateway on `redis_url` with one key `id` (secret `pb-<id>`), a
/// budget on it, every turn flushed at once.
async fn metered_gateway(
    dir: &TempDir,
    upstream: &str,
    id: &str,
    redis_url: &str,
) -> bootstrap::Running {
    let keys = dir.file(
        "keys.toml",
        &key_entry(
            id,
            &format!("pb-{id}"),
            "budget_usd = 1000.0\ntpm = 100000000",
        ),
    );
    let toml = gateway_toml(
        upstream,
        &format!(
            "{PRICES}[metering]\nflush_secs = 0\n[store]\nredis_url_env = \"PB_REDIS\"\n[keys]\nfile = \"{}\"\n",
            keys.display()
        ),
    );
    gateway_with_env(&toml, vec![("PB_REDIS", redis_url.to_string())]).await
}

/// A `redis-server` of the test's own (with `redis_args`), the simulator,
/// and a metered gateway on both with one key; `None` (the test skips)
/// without a `redis-server` binary.
struct Rig {
    redis: RedisServer,
    _sim: patchbay_sim::SimHandle,
    _dir: TempDir,
    /// The key's id; its secret is `key`.
    id: String,
    key: String,
    gw: bootstrap::Running,
}

async fn rig(name: &str, redis_args: &[&str]) -> Option<Rig> {
    let redis = RedisServer::plain(name, redis_args).await?;
    let sim = sim(SimConfig::default()).await;
    let dir = TempDir::new(name);
    let id = unique(name);
    let gw = metered_gateway(
        &dir,
        &sim.url(false),
        &id,
        &format!("redis://{}", redis.addr()),
    )
    .await;
    Some(Rig {
        redis,
        _sim: sim,
        _dir: dir,
        key: format!("pb-{id}"),
        id,
        gw,
    })
}

async fn close(mut ws: Client) {
    let _ = ws.close(None).await;
    let _ = until_close(&mut ws).await;
}

async fn sessions(addr: SocketAddr, key: &str, n: usize) {
    for _ in 0..n {
        let mut ws = open_with(addr, key).await.expect("admitted (fail open)");
        one_turn(&mut ws).await;
        close(ws).await;
    }
}

async fn redis_conn(addr: SocketAddr) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{addr}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("the test Redis answers")
}

/// The stream rows of `key_id`, as field maps.
async fn stream_rows(addr: SocketAddr, key_id: &str) -> Vec<HashMap<String, String>> {
    let entries: redis::streams::StreamRangeReply = redis_conn(addr)
        .await
        .xrange_all("patchbay:request_logs")
        .await
        .unwrap();
    entries
        .ids
        .into_iter()
        .map(|e| {
            e.map
                .into_iter()
                .map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap()))
                .collect::<HashMap<_, _>>()
        })
        .filter(|m| m.get("key_id").map(String::as_str) == Some(key_id))
        .collect()
}

async fn budget(addr: SocketAddr, key_id: &str) -> f64 {
    let v: Option<f64> = redis_conn(addr)
        .await
        .get(format!("patchbay:budget:key:{key_id}:total"))
        .await
        .unwrap();
    v.unwrap_or(0.0)
}

/// Waits (bounded) until `f` holds.
async fn until<F, Fut>(what: &str, within: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Every row once, and the key's budget equal to the rows' cost.
async fn assert_exactly_once(addr: SocketAddr, key_id: &str, expected_rows: usize) {
    let rows = stream_rows(addr, key_id).await;
    let ids: HashSet<&str> = rows.iter().map(|r| r["request_id"].as_str()).collect();
    assert_eq!(ids.len(), rows.len(), "a row is in the stream twice");
    assert_eq!(rows.len(), expected_rows, "rows in the stream");
    let cost: f64 = rows
        .iter()
        .map(|r| r["cost_usd"].parse::<f64>().unwrap())
        .sum();
    assert!(cost > 0.0);
    let spent = budget(addr, key_id).await;
    assert!(
        (spent - cost).abs() < 1e-9,
        "the budget ({spent}) equals the rows' cost ({cost})"
    );
}

#[tokio::test]
async fn a_redis_outage_loses_no_row_and_no_spend() {
    // Acknowledged writes survive the kill (as on a managed Redis).
    let Some(Rig {
        mut redis,
        _sim,
        _dir,
        id,
        key,
        gw,
    }) = rig(
        "outage",
        &["--appendonly", "yes", "--appendfsync", "always"],
    )
    .await
    else {
        return;
    };

    sessions(gw.addr, &key, 5).await;
    // Three sessions live across the outage.
    let mut live = Vec::new();
    for _ in 0..3 {
        let mut ws = open_with(gw.addr, &key).await.unwrap();
        one_turn(&mut ws).await;
        live.push(ws);
    }
    until("the first rows in Redis", WAIT, || async {
        stream_rows(redis.addr(), &id).await.len() == 8
    })
    .await;

    redis.kill();
    sessions(gw.addr, &key, 5).await;
    for ws in &mut live {
        one_turn(ws).await;
    }
    for ws in live {
        close(ws).await;
    }
    let metering = gw.gateway.metering.clone();
    let admin = gw.admin_addr;
    until(
        "the outage's writes waiting in the outbox",
        WAIT,
        || async {
            metering.outbox_len() > 0
                && metric(admin, "patchbay_outbox_rows", "sink=\"store\"").await > 0.0
        },
    )
    .await;

    redis.start().await;
    sessions(gw.addr, &key, 2).await;
    until("the outbox replayed", WAIT, || async {
        metering.outbox_len() == 0
    })
    .await;
    assert!(metric(gw.admin_addr, "patchbay_outbox_replayed_total", "").await > 0.0);
    assert_eq!(
        metric(gw.admin_addr, "patchbay_outbox_dropped_total", "").await,
        0.0
    );
    // 5 + 3 + 5 + 3 + 2 turns.
    until("every row in the stream", WAIT, || async {
        stream_rows(redis.addr(), &id).await.len() >= 18
    })
    .await;
    assert_exactly_once(redis.addr(), &id, 18).await;
}

#[tokio::test]
async fn a_flush_whose_reply_was_lost_is_replayed_without_counting_twice() {
    let Some(redis) = RedisServer::plain("lost_reply", &[]).await else {
        return;
    };
    let relay = FaultRelay::start(redis.addr()).await;
    let sim = sim(SimConfig::default()).await;
    let dir = TempDir::new("lost-reply");
    let id = unique("lost");
    let gw = metered_gateway(
        &dir,
        &sim.url(false),
        &id,
        &format!("redis://{}", relay.addr),
    )
    .await;
    let metering = gw.gateway.metering.clone();

    let mut ws = open_with(gw.addr, &format!("pb-{id}")).await.unwrap();
    one_turn(&mut ws).await;
    until("the first row", WAIT, || async {
        stream_rows(redis.addr(), &id).await.len() == 1
    })
    .await;

    relay.set(DROP_REPLIES);
    one_turn(&mut ws).await;
    // Redis applied the second flush, but the gateway never heard back, so
    // it keeps the write for replay.
    until("the second row applied", WAIT, || async {
        stream_rows(redis.addr(), &id).await.len() == 2
    })
    .await;
    until("the unconfirmed write queued", WAIT, || async {
        metering.outbox_len() == 1
    })
    .await;

    relay.set(PASS);
    until("the outbox replayed", WAIT, || async {
        metering.outbox_len() == 0
    })
    .await;
    assert!(metric(gw.admin_addr, "patchbay_outbox_replayed_total", "").await >= 1.0);
    one_turn(&mut ws).await;
    close(ws).await;
    until("the third row", WAIT, || async {
        stream_rows(redis.addr(), &id).await.len() >= 3
    })
    .await;
    assert_exactly_once(redis.addr(), &id, 3).await;
}

/// `/readyz` status, or `None` when the admin listener is gone.
async fn readyz(admin: SocketAddr) -> Option<u16> {
    let mut s = TcpStream::connect(admin).await.ok()?;
    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test]
async fn the_drain_waits_for_the_outbox_within_wait_secs() {
    let Some(redis) = RedisServer::plain("drain_outbox", &[]).await else {
        return;
    };
    let relay = FaultRelay::start(redis.addr()).await;
    let sim = sim(SimConfig::default()).await;
    let dir = TempDir::new("drain-outbox");
    let id = unique("drainob");
    let keys = dir.file(
        "keys.toml",
        &key_entry(&id, &format!("pb-{id}"), "budget_usd = 1000.0"),
    );
    let mut child = Child::start(
        &sim.url(false),
        &format!(
            "{PRICES}[metering]\nflush_secs = 0\n[store]\nredis_url_env = \"PB_REDIS\"\n[keys]\nfile = \"{}\"\n[drain]\nwait_secs = 20\n",
            keys.display()
        ),
        &[("PB_REDIS", &format!("redis://{}", relay.addr))],
    )
    .await;
    let key = format!("pb-{id}");
    let mut ws = open_with(child.addr, &key).await.unwrap();
    one_turn(&mut ws).await;
    until("the first row", WAIT, || async {
        stream_rows(redis.addr(), &id).await.len() == 1
    })
    .await;

    relay.set(REFUSE);
    one_turn(&mut ws).await;
    close(ws).await;
    let admin = child.admin_addr;
    until("the write queued in the outbox", WAIT, || async {
        metric(admin, "patchbay_outbox_rows", "sink=\"store\"").await > 0.0
    })
    .await;

    child.sigterm();
    until("the drain to start", WAIT, || async {
        readyz(admin).await != Some(200)
    })
    .await;
    // Redis is back while the drain waits: the outbox goes out before exit.
    relay.set(PASS);
    let (code, _) = child.wait_exit(Duration::from_secs(25)).await;
    assert_eq!(code, Some(0));
    assert_exactly_once(redis.addr(), &id, 2).await;
}

#[tokio::test]
async fn sessions_keep_completing_while_nobody_reads_the_row_pipe() {
    const SESSIONS: usize = 300;
    let sim = sim(SimConfig::default()).await;
    // One runtime thread: a row write that blocked it would stall every
    // session. stdout is a pipe this test does not read until the end.
    let mut child = Child::start(
        &sim.url(false),
        "",
        &[("PATCHBAY_SERVER_WORKER_THREADS", "1")],
    )
    .await;
    for _ in 0..SESSIONS {
        let mut ws = open_with(child.addr, CLIENT_KEY).await.expect("admitted");
        one_turn(&mut ws).await;
        close(ws).await;
    }
    // The pipe is full (300 rows are far more than its buffer), so rows
    // wait in the queue rather than in a runtime thread.
    let admin = child.admin_addr;
    until("rows waiting for stdout", WAIT, || async {
        metric(admin, "patchbay_outbox_rows", "sink=\"stdout\"").await > 0.0
    })
    .await;

    let mut stdout = child.process.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        use std::io::Read;
        let _ = stdout.read_to_string(&mut text);
        text
    });
    until("the queue written", WAIT, || async {
        metric(admin, "patchbay_outbox_rows", "sink=\"stdout\"").await == 0.0
    })
    .await;
    assert_eq!(
        metric(admin, "patchbay_outbox_dropped_total", "").await,
        0.0,
        "nothing dropped"
    );
    child.sigterm();
    let (code, _) = child.wait_exit(WAIT).await;
    assert_eq!(code, Some(0));
    let text = reader.join().unwrap();
    let ids: HashSet<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["request_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        ids.len(),
        SESSIONS,
        "every row reached stdout once the reader came"
    );
}

#[tokio::test]
async fn a_session_is_closed_on_its_own_spend_while_its_writes_wait_in_the_outbox() {
    let Some(redis) = RedisServer::plain("kill_while_queued", &[]).await else {
        return;
    };
    let relay = FaultRelay::start(redis.addr()).await;
    let sim = sim(SimConfig::default()).await;
    let dir = TempDir::new("kill-queued");
    let id = unique("killq");
    // The simulator's first three turns cost $0.006692, $0.004664 and
    // $0.004684: the third crosses $0.015.
    let keys = dir.file(
        "keys.toml",
        &key_entry(&id, &format!("pb-{id}"), "budget_usd = 0.015"),
    );
    let toml = gateway_toml(
        &sim.url(false),
        &format!(
            "{PRICES}[metering]\nflush_secs = 0\n[store]\nredis_url_env = \"PB_REDIS\"\n[keys]\nfile = \"{}\"\n",
            keys.display()
        ),
    );
    let gw = gateway_with_env(&toml, vec![("PB_REDIS", format!("redis://{}", relay.addr))]).await;
    let metering = gw.gateway.metering.clone();
    let mut ws = open_with(gw.addr, &format!("pb-{id}")).await.unwrap();
    one_turn(&mut ws).await;
    until("the first row", WAIT, || async {
        stream_rows(redis.addr(), &id).await.len() == 1
    })
    .await;

    relay.set(REFUSE);
    one_turn(&mut ws).await;
    until("the second write queued", WAIT, || async {
        metering.outbox_len() == 1
    })
    .await;
    one_turn(&mut ws).await;
    // The store cannot say the budget is spent, but the session's own
    // spend (known total + what waits in the outbox) does.
    let (texts, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008));
    assert!(
        texts.iter().any(|t| t.contains("insufficient_quota")),
        "{texts:?}"
    );

    relay.set(PASS);
    until("the outbox replayed", WAIT, || async {
        metering.outbox_len() == 0
    })
    .await;
    until("every row in the stream", WAIT, || async {
        stream_rows(redis.addr(), &id).await.len() >= 3
    })
    .await;
    assert_exactly_once(redis.addr(), &id, 3).await;
}

#[tokio::test]
async fn a_redis_that_refuses_writes_for_a_while_loses_no_row_and_no_spend() {
    // Writes are refused (NOREPLICAS) until the replica requirement is
    // lifted: a state that clears up on its own, so nothing may be dropped.
    let Some(Rig {
        redis,
        _sim,
        _dir,
        id,
        key,
        gw,
    }) = rig("noreplicas", &["--min-replicas-to-write", "1"]).await
    else {
        return;
    };
    sessions(gw.addr, &key, 3).await;
    let metering = gw.gateway.metering.clone();
    let admin = gw.admin_addr;
    // The direct flushes and then several replays refused.
    until("replays refused", WAIT, || async {
        metric(admin, "patchbay_store_errors_total", "").await >= 6.0
    })
    .await;
    assert!(metering.outbox_len() > 0, "the refused writes wait");
    assert_eq!(
        metric(admin, "patchbay_outbox_dropped_total", "").await,
        0.0,
        "nothing dropped"
    );
    let mut conn = redis_conn(redis.addr()).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("min-replicas-to-write")
        .arg("0")
        .query_async(&mut conn)
        .await
        .unwrap();
    until("the outbox replayed", WAIT, || async {
        metering.outbox_len() == 0
    })
    .await;
    assert_eq!(
        metric(admin, "patchbay_outbox_dropped_total", "").await,
        0.0
    );
    assert_exactly_once(redis.addr(), &id, 3).await;
}

/// Runs `cmd` on the rig's Redis as its admin (the default user).
async fn redis_admin(addr: SocketAddr, cmd: &[&str]) {
    let mut conn = redis_conn(addr).await;
    let mut c = redis::cmd(cmd[0]);
    for a in &cmd[1..] {
        c.arg(*a);
    }
    let _: redis::Value = c.query_async(&mut conn).await.unwrap();
}

/// The store refuses a write whole for a while (`breaks` it, `mends` it
/// after three sessions): nothing of the refused writes is applied, they
/// wait in the outbox counted by `reason`, and once the store takes them
/// every row and every cent is there exactly once.
async fn refused_for_a_while(name: &str, breaks: &[&[&str]], mends: &[&[&str]], reason: &str) {
    let Some(Rig {
        redis,
        _sim,
        _dir,
        id,
        key,
        gw,
    }) = rig(name, &[]).await
    else {
        return;
    };
    let breaks: Vec<Vec<String>> = breaks
        .iter()
        .map(|c| c.iter().map(|a| a.replace("{id}", &id)).collect())
        .collect();
    for c in &breaks {
        redis_admin(
            redis.addr(),
            &c.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await;
    }
    sessions(gw.addr, &key, 3).await;
    let metering = gw.gateway.metering.clone();
    let admin = gw.admin_addr;
    let label = format!("reason=\"{reason}\"");
    until("refusals counted", WAIT, || async {
        metric(admin, "patchbay_store_refusals_total", &label).await >= 3.0
    })
    .await;
    assert!(metering.outbox_len() > 0, "the refused writes wait");
    assert!(
        stream_rows(redis.addr(), &id).await.is_empty(),
        "nothing of a refused write is applied"
    );
    for c in mends {
        let c: Vec<String> = c.iter().map(|a| a.replace("{id}", &id)).collect();
        redis_admin(
            redis.addr(),
            &c.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await;
    }
    until("the outbox replayed", WAIT, || async {
        metering.outbox_len() == 0
    })
    .await;
    assert_eq!(
        metric(admin, "patchbay_outbox_dropped_total", "").await,
        0.0,
        "nothing dropped"
    );
    assert_exactly_once(redis.addr(), &id, 3).await;
}

#[tokio::test]
async fn a_user_denied_xadd_for_a_while_loses_no_row_and_no_spend() {
    refused_for_a_while(
        "acl-xadd",
        &[&["ACL", "SETUSER", "default", "-xadd"]],
        &[&["ACL", "SETUSER", "default", "+xadd"]],
        "noperm",
    )
    .await;
}

#[tokio::test]
async fn a_user_denied_incrbyfloat_for_a_while_loses_no_row_and_no_spend() {
    refused_for_a_while(
        "acl-incrbyfloat",
        &[&["ACL", "SETUSER", "default", "-incrbyfloat"]],
        &[&["ACL", "SETUSER", "default", "+incrbyfloat"]],
        "noperm",
    )
    .await;
}

#[tokio::test]
async fn a_budget_key_of_another_type_holds_the_writes_until_it_is_repaired() {
    refused_for_a_while(
        "wrongtype",
        &[&["RPUSH", "patchbay:budget:key:{id}:total", "x"]],
        &[&["DEL", "patchbay:budget:key:{id}:total"]],
        "wrongtype",
    )
    .await;
}
