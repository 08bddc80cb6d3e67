//! A store primary lost mid-run: 200 metered sessions through a gateway on
//! a Redis Cluster (or a Sentinel set), one primary SIGKILLed while they
//! run, Redis left to promote its replica. Then, once the outbox has
//! replayed: every session completed or was ended by the gateway, no row
//! is there twice and no key has more completed rows (summed over the
//! per-key streams in Cluster mode) than its clients saw responses done,
//! each key's budget equals the sum of its rows' cost, and the team's and
//! the route's budgets (charged by every flush, in other hash slots than
//! the keys' in Cluster mode) the sum of all rows' cost. Rows lost with the
//! old primary (acknowledged, not yet replicated: the documented loss
//! without `[store] replica_acks`) are counted, printed and bounded; a
//! healthy cluster and the standalone store lose none.
//!
//! The same run against the standalone store (killed, then started again)
//! checks the checks.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::StreamExt;
use patchbay_gateway::bootstrap::{self, Running};
use patchbay_gateway::config::Config;
use patchbay_sim::SimConfig;
use tokio_tungstenite::tungstenite::Message;

use crate::common::*;
use crate::redis_server::{RedisServer, TempDir};
use crate::redis_topology::{hash_tag, query, RedisCluster, SentinelSet};

const SESSIONS: usize = 200;
/// Client keys the sessions are spread over (so their slots spread over
/// the cluster's primaries).
const KEYS: usize = 8;
const TURNS: usize = 10;
/// Pause between a session's turns: a session lasts a few seconds, longer
/// than a failover.
const TURN_GAP: Duration = Duration::from_millis(400);
/// When the primary is killed, after the sessions started.
const KILL_AFTER: Duration = Duration::from_millis(1500);
/// Rows a failover may lose without `[store] replica_acks` (acknowledged by
/// the old primary, not yet on its replica): 1 % of the run's turns, far
/// above what a loopback replication lag allows; the figure is printed.
const LOSS_BOUND: usize = SESSIONS * TURNS / 100;
/// How long the standalone server stays down (about a failover's time).
const OUTAGE: Duration = Duration::from_secs(2);
/// Bound on one frame of a session.
const FRAME_WAIT: Duration = Duration::from_secs(30);
/// Bound on the outbox's replay and the rows' arrival after recovery.
const RECOVERY: Duration = Duration::from_secs(60);

const PRICES: &str = "[[prices]]\nmodel = \"gpt-realtime\"\ntext_input = 4.0\naudio_input = 32.0\n\
                      text_output = 16.0\naudio_output = 64.0\n";

/// How one session went.
#[derive(Debug, Default)]
struct Outcome {
    key_id: String,
    /// Ids of the responses the client saw `response.done` for.
    done: Vec<String>,
    /// The gateway's close code, when it ended the session.
    closed_by_gateway: Option<u16>,
    refused: Option<u16>,
}

/// One test's client keys, all in one team.
struct Run {
    keys: Vec<String>,
    team: String,
}

/// What a budget counter charges.
#[derive(Clone, Debug, PartialEq)]
enum Charged {
    Key(String),
    Team,
    Route,
}

impl Run {
    fn new(test: &str) -> Run {
        let run = unique(test);
        Run {
            keys: (0..KEYS).map(|i| format!("{run}-{i}")).collect(),
            team: format!("{run}-team"),
        }
    }

    /// Every budget counter a flush charges (each key's, the team's, the
    /// route's), named as the store names them: with the scope id as hash
    /// tag in Cluster mode (`tagged`).
    fn budget_keys(&self, tagged: bool) -> Vec<(Charged, String)> {
        let name = |scope: &str, id: &str| {
            if tagged {
                format!("patchbay:budget:{scope}:{{{id}}}:total")
            } else {
                format!("patchbay:budget:{scope}:{id}:total")
            }
        };
        let mut all: Vec<_> = self
            .keys
            .iter()
            .map(|k| (Charged::Key(k.clone()), name("key", k)))
            .collect();
        all.push((Charged::Team, name("team", &self.team)));
        all.push((Charged::Route, name("route", MODEL)));
        all
    }
}

/// A gateway on `url` with `run`'s keys (secret `pb-<id>`), each with a
/// budget and a fleet cap, in a team with a budget, on a route with a
/// budget, every turn flushed at once.
async fn gateway_on(dir: &TempDir, upstream: &str, run: &Run, url: &str) -> Running {
    let mut entries: String = run
        .keys
        .iter()
        .map(|id| {
            key_entry(
                id,
                &format!("pb-{id}"),
                &format!(
                    "team = \"{}\"\nbudget_usd = 1000.0\ntpm = 100000000\nrpm = 100000\n\
                     max_sessions = 1000",
                    run.team
                ),
            )
        })
        .collect();
    entries += &format!("[[teams]]\nid = \"{}\"\nbudget_usd = 100000.0\n", run.team);
    let keys_file = dir.file("keys.toml", &entries);
    let toml = gateway_toml(
        upstream,
        &format!(
            "budget_usd = 100000.0\n{PRICES}[limits]\nmax_sessions = 1000\n[metering]\nflush_secs = 0\n\
             [store]\nredis_url_env = \"PB_REDIS\"\n[keys]\nfile = \"{}\"\n",
            keys_file.display()
        ),
    );
    let url = url.to_string();
    let lookup = move |k: &str| {
        if k == "PB_REDIS" {
            Some(url.clone())
        } else {
            test_env(k)
        }
    };
    let config = Config::from_toml_with_env(&toml, &lookup).expect("test config is valid");
    bootstrap::start(config).await.expect("gateway starts")
}

/// One session of `TURNS` turns with key `key_id`, to its end.
async fn session(addr: SocketAddr, key_id: String) -> Outcome {
    let mut out = Outcome {
        key_id: key_id.clone(),
        ..Outcome::default()
    };
    let mut ws = match open_with(addr, &format!("pb-{key_id}")).await {
        Ok(ws) => ws,
        Err(status) => {
            out.refused = Some(status);
            return out;
        }
    };
    for _ in 0..TURNS {
        send_json(&mut ws, serde_json::json!({"type": "response.create"})).await;
        loop {
            let frame = tokio::time::timeout(FRAME_WAIT, ws.next())
                .await
                .expect("a frame within FRAME_WAIT");
            match frame {
                Some(Ok(Message::Text(t))) => {
                    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                    if v["type"] == "response.done" {
                        out.done
                            .push(v["response"]["id"].as_str().unwrap().to_string());
                        break;
                    }
                }
                Some(Ok(Message::Close(f))) => {
                    out.closed_by_gateway = Some(f.map_or(1005, |f| u16::from(f.code)));
                    return out;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    out.closed_by_gateway = Some(1006);
                    return out;
                }
            }
        }
        tokio::time::sleep(TURN_GAP).await;
    }
    let _ = ws.close(None).await;
    let _ = tokio::time::timeout(FRAME_WAIT, until_close(&mut ws)).await;
    out
}

/// `SESSIONS` sessions at once, spread over `keys`; `fault` starts
/// `KILL_AFTER` after they do and runs beside them.
async fn run_sessions(
    addr: SocketAddr,
    keys: &[String],
    fault: impl std::future::Future<Output = ()>,
) -> Vec<Outcome> {
    let tasks: Vec<_> = (0..SESSIONS)
        .map(|i| tokio::spawn(session(addr, keys[i % keys.len()].clone())))
        .collect();
    let sessions = async {
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.expect("session task"));
        }
        outcomes
    };
    let fault = async {
        tokio::time::sleep(KILL_AFTER).await;
        fault.await;
    };
    tokio::join!(sessions, fault).0
}

/// Field maps of the rows in `stream` on the node at `port`.
async fn stream_rows(port: u16, stream: &str) -> Vec<HashMap<String, String>> {
    let entries: Vec<(String, Vec<String>)> =
        query(port, &["XRANGE", stream, "-", "+"]).await.unwrap();
    entries
        .into_iter()
        .map(|(_, kv)| {
            kv.chunks(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect::<HashMap<_, _>>()
        })
        .collect()
}

async fn number(port: u16, key: &str) -> f64 {
    query::<Option<String>>(port, &["GET", key])
        .await
        .unwrap()
        .map_or(0.0, |v| v.parse().unwrap())
}

/// Waits (bounded) until the outbox is empty.
async fn until_replayed(gw: &Running) {
    let deadline = tokio::time::Instant::now() + RECOVERY;
    while gw.gateway.metering.outbox_len() > 0 {
        if tokio::time::Instant::now() >= deadline {
            // The store's and the outbox's own figures say why.
            let (_, metrics) = http_get(gw.admin_addr, "/metrics").await;
            let store: Vec<&str> = metrics
                .lines()
                .filter(|l| !l.starts_with('#') && (l.contains("outbox") || l.contains("store")))
                .collect();
            panic!(
                "the outbox still holds {} writes after {RECOVERY:?}; metrics:\n{}",
                gw.gateway.metering.outbox_len(),
                store.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The checks after recovery, over `rows` (every row of every key of
/// `run`) and `budgets` (each budget counter's value): nothing counted
/// twice, and at most `may_lose` rows lost (the writes a primary
/// acknowledged and had not replicated when it died: the documented loss
/// without `replica_acks`). A lost flush takes its key's charge along, so a
/// key's budget still equals its rows; a team or route budget, written by
/// its own part on another node in a cluster, may keep at most the lost
/// rows' charges. Returns the rows lost.
fn assert_counted_once(
    run: &Run,
    outcomes: &[Outcome],
    rows: &[HashMap<String, String>],
    budgets: &[(Charged, f64)],
    may_lose: usize,
) -> usize {
    for o in outcomes {
        assert_eq!(o.refused, None, "a session of {} was refused", o.key_id);
        assert!(
            o.done.len() == TURNS || o.closed_by_gateway.is_some(),
            "a session neither completed nor was ended by the gateway: {o:?}"
        );
    }
    let mut request_ids = HashSet::new();
    for r in rows {
        assert!(
            request_ids.insert(r["request_id"].clone()),
            "row {} is in the streams twice",
            r["request_id"]
        );
    }
    // Rows name their session, not the upstream's response id: count per
    // key, each completed turn a client saw against the key's completed rows.
    let mut lost = 0;
    for key in &run.keys {
        let seen: usize = outcomes
            .iter()
            .filter(|o| &o.key_id == key)
            .map(|o| o.done.len())
            .sum();
        let completed = rows
            .iter()
            .filter(|r| &r["key_id"] == key && r["end_reason"] == "completed")
            .count();
        assert!(
            completed <= seen,
            "key {key}: {completed} completed rows for {seen} responses done: rows applied twice"
        );
        lost += seen - completed;
    }
    assert!(
        lost <= may_lose,
        "{lost} rows lost (at most {may_lose} allowed): fewer completed rows than responses done"
    );
    let max_row_cost = rows
        .iter()
        .map(|r| r["cost_usd"].parse::<f64>().unwrap())
        .fold(0.0, f64::max);
    for (charged, spent) in budgets {
        let cost: f64 = rows
            .iter()
            .filter(|r| match charged {
                Charged::Key(key) => &r["key_id"] == key,
                Charged::Team | Charged::Route => true,
            })
            .map(|r| r["cost_usd"].parse::<f64>().unwrap())
            .sum();
        assert!(cost > 0.0, "{charged:?} has rows");
        let close = (spent - cost).abs() < 1e-9 * cost.max(1.0);
        match charged {
            Charged::Key(_) => assert!(
                close,
                "{charged:?}: budget {spent} against its rows' cost {cost} ({lost} rows lost)"
            ),
            // A lost key part takes its row and the key's charge along;
            // the team's and route's parts live on other nodes and may
            // keep the lost rows' charges, or lose their own part of a
            // write whose row was kept (the same replication window on the
            // node that held them): within the bound on rows lost.
            Charged::Team | Charged::Route => assert!(
                close || (spent - cost).abs() <= lost.max(LOSS_BOUND) as f64 * max_row_cost + 1e-9,
                "{charged:?}: budget {spent} against its rows' cost {cost} ({lost} rows lost)"
            ),
        }
    }
    lost
}

/// A cluster, a simulator and a gateway on both, with `test`'s keys;
/// `None` (the test skips) without the Redis tools.
async fn on_cluster(
    test: &str,
) -> Option<(RedisCluster, patchbay_sim::SimHandle, TempDir, Run, Running)> {
    let cluster = RedisCluster::start(test).await?;
    let sim = sim(SimConfig::default()).await;
    let dir = TempDir::new(test);
    let run = Run::new(test);
    let gw = gateway_on(&dir, &sim.url(false), &run, &cluster.url()).await;
    Some((cluster, sim, dir, run, gw))
}

// Failed on the store before 325c02f: a redis-rs cluster connection with
// ~150 or more requests in flight when a primary dies stayed wedged (every
// call timing out; the store now connects afresh after such errors), and
// `MOVED` replies the client could not follow within its retries were taken
// for rejections and dropped by the outbox (now transient: kept, replayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_primary_killed_under_200_sessions_counts_nothing_twice() {
    let Some((mut cluster, _sim, _dir, run, gw)) = on_cluster("cluster_primary_killed").await
    else {
        return;
    };
    let victim = cluster
        .primary_for_key(&format!("patchbay:budget:key:{{{}}}:total", run.keys[0]))
        .await;

    let outcomes = run_sessions(gw.addr, &run.keys, async {
        cluster.kill_primary(victim).await;
    })
    .await;
    let promoted = cluster.wait_failover(victim).await;
    assert_ne!(promoted, victim);
    until_replayed(&gw).await;

    let (rows, budgets) = cluster_rows_and_budgets(&mut cluster, &run).await;
    let lost = assert_counted_once(&run, &outcomes, &rows, &budgets, LOSS_BOUND);
    eprintln!("rows lost with the old primary (replica_acks = 0): {lost}");
    assert_keys_tagged(&mut cluster).await;
    assert_eq!(
        metric(gw.admin_addr, "patchbay_outbox_dropped_total", "").await,
        0.0
    );
}

/// The rows of `run`'s keys (one stream per key in a cluster; the
/// untagged stream is not used) and every budget counter it charged.
async fn cluster_rows_and_budgets(
    cluster: &mut RedisCluster,
    run: &Run,
) -> (Vec<HashMap<String, String>>, Vec<(Charged, f64)>) {
    let mut rows = Vec::new();
    for key in &run.keys {
        let stream = format!("patchbay:request_logs:{{{key}}}");
        let port = cluster.primary_for_key(&stream).await;
        let mut mine = stream_rows(port, &stream).await;
        assert!(mine.iter().all(|r| &r["key_id"] == key), "{stream}");
        rows.append(&mut mine);
    }
    let mut budgets = Vec::new();
    for (charged, name) in run.budget_keys(true) {
        let port = cluster.primary_for_key(&name).await;
        budgets.push((charged, number(port, &name).await));
    }
    (rows, budgets)
}

/// `redis-cli --cluster check` passes, and every Patchbay key carries a
/// hash tag and sits on the primary serving its slot.
async fn assert_keys_tagged(cluster: &mut RedisCluster) {
    let (ok, out) = cluster.check().await;
    assert!(ok, "redis-cli --cluster check:\n{out}");
    let keys = cluster.keys().await;
    assert!(keys.iter().any(|k| k.key.starts_with("patchbay:")));
    for k in keys {
        if k.key.starts_with("patchbay:") {
            assert!(hash_tag(&k.key).is_some(), "{} has no hash tag", k.key);
            assert_eq!(cluster.primary_for_key(&k.key).await, k.port, "{k:?}");
        }
    }
}

/// The same load on a healthy cluster: every write lands once, in the slot
/// of its scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_store_under_200_sessions_counts_once_with_every_key_in_its_tags_slot() {
    let Some((mut cluster, _sim, _dir, run, gw)) = on_cluster("cluster_store_load").await else {
        return;
    };

    let outcomes = run_sessions(gw.addr, &run.keys, async {}).await;
    until_replayed(&gw).await;

    let (rows, budgets) = cluster_rows_and_budgets(&mut cluster, &run).await;
    assert_counted_once(&run, &outcomes, &rows, &budgets, 0);
    assert_keys_tagged(&mut cluster).await;
    // Store errors are not asserted away: on a loaded two-core machine a
    // call may outlast its 500 ms bound, and its write is then replayed
    // (counted once above); none is dropped.
    assert_eq!(
        metric(gw.admin_addr, "patchbay_outbox_dropped_total", "").await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_under_200_sessions_counts_nothing_twice() {
    let test = "sentinel_failover_load";
    let Some(mut set) = SentinelSet::start(test).await else {
        return;
    };
    let sim = sim(SimConfig::default()).await;
    let dir = TempDir::new(test);
    let run = Run::new(test);
    let gw = gateway_on(&dir, &sim.url(false), &run, &set.url()).await;

    let outcomes = run_sessions(gw.addr, &run.keys, async { set.kill_primary() }).await;
    let primary = set.wait_failover().await;
    until_replayed(&gw).await;

    let rows: Vec<_> = stream_rows(primary, "patchbay:request_logs")
        .await
        .into_iter()
        .filter(|r| run.keys.contains(&r["key_id"]))
        .collect();
    let mut budgets = Vec::new();
    for (charged, name) in run.budget_keys(false) {
        budgets.push((charged, number(primary, &name).await));
    }
    let lost = assert_counted_once(&run, &outcomes, &rows, &budgets, LOSS_BOUND);
    eprintln!("rows lost with the old primary (replica_acks = 0): {lost}");
    // The failover fell inside the run: writes waited in the outbox.
    assert!(metric(gw.admin_addr, "patchbay_outbox_replayed_total", "").await > 0.0);
    assert_eq!(
        metric(gw.admin_addr, "patchbay_outbox_dropped_total", "").await,
        0.0
    );
}

/// The same load and checks on today's standalone store: its one server
/// SIGKILLed mid-run and started again two seconds later (its append-only
/// file fsynced on every write, as a managed Redis keeps acknowledged
/// writes), the outbox carrying the writes of the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_store_killed_and_restarted_under_200_sessions_loses_and_doubles_nothing() {
    let test = "standalone_killed_load";
    let Some(mut redis) =
        RedisServer::plain(test, &["--appendonly", "yes", "--appendfsync", "always"]).await
    else {
        return;
    };
    let sim = sim(SimConfig::default()).await;
    let dir = TempDir::new(test);
    let run = Run::new(test);
    let url = format!("redis://{}", redis.addr());
    let gw = gateway_on(&dir, &sim.url(false), &run, &url).await;

    let outcomes = run_sessions(gw.addr, &run.keys, async {
        redis.kill();
        tokio::time::sleep(OUTAGE).await;
        redis.start().await;
    })
    .await;
    until_replayed(&gw).await;

    let rows: Vec<_> = stream_rows(redis.port, "patchbay:request_logs")
        .await
        .into_iter()
        .filter(|r| run.keys.contains(&r["key_id"]))
        .collect();
    let mut budgets = Vec::new();
    for (charged, name) in run.budget_keys(false) {
        budgets.push((charged, number(redis.port, &name).await));
    }
    assert_counted_once(&run, &outcomes, &rows, &budgets, 0);
    assert!(metric(gw.admin_addr, "patchbay_outbox_replayed_total", "").await > 0.0);
    assert_eq!(
        metric(gw.admin_addr, "patchbay_outbox_dropped_total", "").await,
        0.0
    );
}
