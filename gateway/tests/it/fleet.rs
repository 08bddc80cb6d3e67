//! A key's `max_sessions` across the fleet: gateways sharing one real Redis
//! count the key's sessions together through leases, a killed gateway's
//! slots come back within the lease TTL, and an unreachable Redis falls back
//! to the per-process count. Every test uses its own key id, so its lease set
//! (`patchbay:sessions:<id>`) is its own.

use std::net::SocketAddr;
use std::time::Duration;

use patchbay_gateway::bootstrap::Running;
use patchbay_gateway::store::leases::{LEASE_RENEW, LEASE_TTL};
use patchbay_sim::{SimConfig, SimHandle};
use tokio::time::Instant;

use crate::common::*;

/// A capped key for one test: its id and its secret.
struct Key {
    id: String,
    secret: String,
    file: TempFile,
}

fn capped_key(cap: usize) -> Key {
    let id = unique("fleet");
    let secret = format!("pb-{id}");
    let file = TempFile::new(
        "keys.toml",
        &key_entry(&id, &secret, &format!("max_sessions = {cap}")),
    );
    Key { id, secret, file }
}

/// Gateway config: the store is the Redis named by `redis_env`, keys from
/// `key`'s file.
fn fleet_extra(key: &Key, redis_env: &str) -> String {
    format!(
        "[store]\nredis_url_env = \"{redis_env}\"\n[keys]\nfile = \"{}\"\n",
        key.file.0.display()
    )
}

async fn fleet_gateway(sim: &SimHandle, key: &Key) -> Running {
    gateway(&gateway_toml(&sim.url(false), &fleet_extra(key, REDIS_ENV))).await
}

async fn lease_count(url: &str, key_id: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(format!("patchbay:sessions:{key_id}"))
        .query_async(&mut redis(url).await)
        .await
        .unwrap()
}

/// Tries to open a session every 100 ms until one opens or `within` passes;
/// returns it and how long it took.
async fn open_when_admitted(addr: SocketAddr, key: &str, within: Duration) -> (Client, Duration) {
    let started = Instant::now();
    loop {
        match open_with(addr, key).await {
            Ok(ws) => return (ws, started.elapsed()),
            Err(429) => {}
            Err(status) => panic!("unexpected status {status}"),
        }
        assert!(
            started.elapsed() < within,
            "no slot came free within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_key_cap_holds_across_two_gateways_and_a_closed_session_frees_its_slot_on_the_other() {
    let Some(url) = redis_url("fleet cap") else {
        return;
    };
    let sim = sim(SimConfig::default()).await;
    let key = capped_key(2);
    let one = fleet_gateway(&sim, &key).await;
    let two = fleet_gateway(&sim, &key).await;

    let mut first = open_with(one.addr, &key.secret).await.unwrap();
    let _second = open_with(one.addr, &key.secret).await.unwrap();
    assert_eq!(lease_count(&url, &key.id).await, 2);
    let bearer = format!("Bearer {}", key.secret);
    let (status, headers, body) = refused(
        two.addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert!(headers.contains_key("retry-after"));
    assert_eq!(body["error"]["code"], "too_many_sessions");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("across all gateways"), "{message}");
    assert_eq!(
        two.gateway.sessions.key_active(&key.id),
        0,
        "the refusal holds nothing on the second gateway"
    );

    first.close(None).await.unwrap();
    let (_third, took) = open_when_admitted(two.addr, &key.secret, WAIT).await;
    println!("slot freed on the other gateway after {took:?}");
    assert_eq!(lease_count(&url, &key.id).await, 2);
    // The third session is the second gateway's: the first still renews one.
    assert_eq!(one.gateway.leases.as_ref().unwrap().held(&key.id), 1);
    assert_eq!(two.gateway.leases.as_ref().unwrap().held(&key.id), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_simultaneous_connects_for_a_key_capped_at_five_admit_exactly_five() {
    let Some(url) = redis_url("fleet concurrency") else {
        return;
    };
    let sim = sim(SimConfig::default()).await;
    let key = capped_key(5);
    let one = fleet_gateway(&sim, &key).await;
    let two = fleet_gateway(&sim, &key).await;
    let attempts = (0..20).map(|i| {
        let addr = if i % 2 == 0 { one.addr } else { two.addr };
        let secret = key.secret.clone();
        tokio::spawn(async move { open_with(addr, &secret).await })
    });
    let results = futures_util::future::join_all(attempts).await;
    let mut admitted = Vec::new();
    let mut refused = 0;
    for r in results {
        match r.unwrap() {
            Ok(ws) => admitted.push(ws),
            Err(429) => refused += 1,
            Err(status) => panic!("unexpected status {status}"),
        }
    }
    assert_eq!(admitted.len(), 5, "exactly the cap is admitted");
    assert_eq!(refused, 15);
    assert_eq!(lease_count(&url, &key.id).await, 5);
    let held = one.gateway.leases.as_ref().unwrap().held(&key.id)
        + two.gateway.leases.as_ref().unwrap().held(&key.id);
    assert_eq!(held, 5);
}

#[tokio::test]
async fn a_killed_gateways_sessions_free_their_slots_within_the_lease_ttl() {
    let Some(url) = redis_url("fleet SIGKILL") else {
        return;
    };
    let sim = sim(SimConfig::default()).await;
    let key = capped_key(2);
    let mut killed = Child::start(
        &sim.url(false),
        &fleet_extra(&key, REDIS_ENV),
        &[(REDIS_ENV, &url)],
    )
    .await;
    let survivor = fleet_gateway(&sim, &key).await;
    let _a = open_with(killed.addr, &key.secret).await.unwrap();
    let _b = open_with(killed.addr, &key.secret).await.unwrap();
    assert_eq!(open_with(survivor.addr, &key.secret).await.err(), Some(429));

    killed.process.kill().unwrap();
    killed.process.wait().unwrap();
    let died = Instant::now();
    // The dead gateway's leases still count until they expire ...
    assert_eq!(
        open_with(survivor.addr, &key.secret).await.err(),
        Some(429),
        "slots are held until the leases expire, not freed by anything else"
    );
    // ... which is within the TTL of the kill (the last renewal was at or
    // before it); the margin covers this test's own polling.
    let bound = LEASE_TTL + Duration::from_secs(5);
    let (_c, _) = open_when_admitted(survivor.addr, &key.secret, bound).await;
    let (_d, _) = open_when_admitted(survivor.addr, &key.secret, bound).await;
    println!("both slots free {:?} after SIGKILL", died.elapsed());
    assert!(died.elapsed() <= bound);
    assert_eq!(lease_count(&url, &key.id).await, 2);
}

#[tokio::test]
async fn a_drained_gateway_frees_its_slots_at_once() {
    let Some(url) = redis_url("fleet drain") else {
        return;
    };
    let sim = sim(SimConfig::default()).await;
    let key = capped_key(2);
    let mut leaving = Child::start(
        &sim.url(false),
        &fleet_extra(&key, REDIS_ENV),
        &[(REDIS_ENV, &url)],
    )
    .await;
    let _a = open_with(leaving.addr, &key.secret).await.unwrap();
    let _b = open_with(leaving.addr, &key.secret).await.unwrap();
    assert_eq!(lease_count(&url, &key.id).await, 2);
    leaving.sigterm();
    let (code, _) = leaving.wait_exit(WAIT).await;
    assert_eq!(code, Some(0), "{}", leaving.logs());
    // Not after the lease TTL: the drain removed them before exiting.
    assert_eq!(lease_count(&url, &key.id).await, 0);
    let other = fleet_gateway(&sim, &key).await;
    let _c = open_with(other.addr, &key.secret).await.unwrap();
    let _d = open_with(other.addr, &key.secret).await.unwrap();
}

/// A `redis-server` of this test's own on 127.0.0.1, stopped on drop.
struct OwnRedis(std::process::Child);

impl OwnRedis {
    async fn start(port: u16) -> OwnRedis {
        // Owned (and so killed and reaped on drop) before anything can fail.
        let server = OwnRedis(
            std::process::Command::new("redis-server")
                .args(["--port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server starts"),
        );
        let url = format!("redis://127.0.0.1:{port}");
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Ok(client) = redis::Client::open(url.as_str()) {
                if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                    let pong: Result<String, _> = redis::cmd("PING").query_async(&mut c).await;
                    if pong.is_ok() {
                        return server;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server never answered on port {port}");
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn with_redis_unreachable_the_cap_falls_back_to_the_process_and_leases_return_with_redis() {
    if redis_url("fleet fallback").is_none() {
        return;
    }
    let has_server = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok();
    if !has_server {
        skipped("fleet fallback", "no redis-server binary to stop and start");
        return;
    }
    let sim = sim(SimConfig::default()).await;
    let key = capped_key(1);
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let toml = gateway_toml(&sim.url(false), &fleet_extra(&key, "FLEET_REDIS"));
    let env = |k: &str| match k {
        "FLEET_REDIS" => Some(url.clone()),
        other => test_env(other),
    };
    let config = |toml: &str| {
        patchbay_gateway::config::Config::from_toml_with_env(toml, &env).expect("valid config")
    };
    let one = patchbay_gateway::bootstrap::start(config(&toml))
        .await
        .unwrap();

    // Nothing listens on the port: the cap is this process's own.
    let _held = open_with(one.addr, &key.secret).await.unwrap();
    assert_eq!(open_with(one.addr, &key.secret).await.err(), Some(429));
    let errors = metric(one.admin_addr, "patchbay_store_errors_total", "").await;
    assert!(errors >= 2.0, "store errors counted: {errors}");
    assert_eq!(
        metric(one.admin_addr, "patchbay_session_lease_fallbacks_total", "").await,
        2.0
    );

    // Redis comes up: the next renewal tick writes the live session's lease,
    // and a second gateway then counts it.
    let _redis = OwnRedis::start(port).await;
    let started = Instant::now();
    while lease_count(&url, &key.id).await != 1 {
        assert!(
            started.elapsed() < LEASE_RENEW + WAIT,
            "the lease was not registered within a tick"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "lease registered {:?} after Redis came up",
        started.elapsed()
    );
    let two = patchbay_gateway::bootstrap::start(config(&toml))
        .await
        .unwrap();
    assert_eq!(open_with(two.addr, &key.secret).await.err(), Some(429));
}

/// Blocks the Redis at `url` for `ms` milliseconds (a script that spins:
/// Redis runs one command at a time); returns once the script started.
async fn block_redis(url: &str, ms: u64) -> tokio::task::JoinHandle<()> {
    let script = "local t = redis.call('TIME') \
                  local stop = t[1] * 1000000 + t[2] + ARGV[1] * 1000 \
                  repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop \
                  return 1";
    let mut c = redis(url).await;
    let blocking = tokio::spawn(async move {
        let _: i64 = redis::cmd("EVAL")
            .arg(script)
            .arg(0)
            .arg(ms)
            .query_async(&mut c)
            .await
            .unwrap();
    });
    // The script is sent; give Redis a moment to be inside it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    blocking
}

/// A drain that starts while an upgrade's admission waits for Redis waits
/// for that session too: it is admitted, told 1001, and the gateway exits
/// 0. It used to be tracked only from its 101, so the drain ended without
/// it and the process exited under it.
#[tokio::test]
async fn a_drain_that_starts_during_an_admission_waits_for_its_session() {
    if redis_url("drain during admission").is_none() {
        return;
    }
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let _redis = OwnRedis::start(port).await;
    let sim = sim(SimConfig::default()).await;
    let key = capped_key(2);
    let mut child = Child::start(
        &sim.url(false),
        &fleet_extra(&key, REDIS_ENV),
        &[(REDIS_ENV, &url)],
    )
    .await;
    let blocked = block_redis(&url, 450).await;
    let addr = child.addr;
    let secret = key.secret.clone();
    let client = tokio::spawn(async move {
        let bearer = format!("Bearer {secret}");
        let (mut ws, _) = connect_with(
            addr,
            &format!("?model={MODEL}"),
            &[("authorization", &bearer)],
        )
        .await
        .expect("admitted");
        let (_, code, _) = until_close(&mut ws).await;
        code
    });
    // The upgrade's lease acquire now waits behind the script.
    tokio::time::sleep(Duration::from_millis(150)).await;
    child.sigterm();
    let code = tokio::time::timeout(WAIT, client)
        .await
        .expect("the client is closed")
        .unwrap();
    assert_eq!(code, Some(1001), "{}", child.logs());
    let (exit, _) = child.wait_exit(WAIT).await;
    assert_eq!(exit, Some(0), "{}", child.logs());
    blocked.await.unwrap();
}

/// A client that closes mid-response gives its fleet lease back when its
/// connection is closed, not when the upstream leg has cancelled the
/// response (here an upstream that reads nothing until its three-second
/// response is over): another gateway admits the key's next session
/// meanwhile.
#[tokio::test]
async fn a_client_closing_mid_response_frees_its_fleet_lease_before_the_upstream_leg_ends() {
    use futures_util::StreamExt;
    use std::sync::atomic::Ordering;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    let Some(url) = redis_url("fleet lease at close") else {
        return;
    };
    let sim = sim(SimConfig {
        audio_deltas: 150,
        audio_delta_bytes: 16,
        delta_interval: Duration::from_millis(20),
        fault: Some(patchbay_sim::SimFault::FinishResponseBeforeClose),
        ..SimConfig::default()
    })
    .await;
    let key = capped_key(1);
    let one = fleet_gateway(&sim, &key).await;
    let two = fleet_gateway(&sim, &key).await;
    let mut first = open_with(one.addr, &key.secret).await.unwrap();
    assert_eq!(lease_count(&url, &key.id).await, 1);
    send_json(&mut first, serde_json::json!({"type": "response.create"})).await;
    while kind(&recv_text(&mut first).await) != "response.output_audio.delta" {}
    first
        .close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "done".into(),
        }))
        .await
        .unwrap();
    let closed = tokio::time::timeout(WAIT, async {
        while let Some(Ok(_)) = first.next().await {}
    });
    assert!(closed.await.is_ok(), "the connection never closed");
    assert_eq!(
        one.gateway.leases.as_ref().unwrap().held(&key.id),
        0,
        "the lease is given back with the client's connection"
    );
    let (_second, took) = open_when_admitted(two.addr, &key.secret, WAIT).await;
    println!("the key's next session admitted on the other gateway after {took:?}");
    assert_eq!(
        sim.stats.sessions_active.load(Ordering::Relaxed),
        2,
        "the first session's upstream leg is still cancelling"
    );
}
