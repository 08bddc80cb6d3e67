//! SIGTERM on a real child process: 1001 to every client, 503 for new
//! upgrades, `/readyz` failing, exit 0 within the wait; linger mode; SIGHUP
//! and SIGQUIT drain the same way, SIGUSR1 and SIGUSR2 are ignored.

use std::time::{Duration, Instant};

use crate::common::*;
use futures_util::SinkExt;
use patchbay_sim::SimConfig;
use tokio_tungstenite::tungstenite::Message;

/// A simulator whose responses stream for a long time (mid-response on
/// SIGTERM).
fn slow_responses() -> SimConfig {
    SimConfig {
        audio_deltas: 10_000,
        delta_interval: Duration::from_millis(20),
        ..SimConfig::default()
    }
}

async fn mid_response(addr: std::net::SocketAddr) -> Client {
    let mut ws = connect(addr).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    send_json(&mut ws, serde_json::json!({"type": "response.create"})).await;
    loop {
        if kind(&recv_text(&mut ws).await) == "response.output_audio.delta" {
            return ws;
        }
    }
}

#[tokio::test]
async fn sigterm_closes_every_session_with_1001_and_exits_0() {
    let sim = sim(slow_responses()).await;
    let mut child = Child::start(&sim.url(false), "", &[]).await;
    let mut clients = Vec::new();
    for _ in 0..50 {
        clients.push(mid_response(child.addr).await);
    }
    child.sigterm();
    let signalled = Instant::now();
    let closes = clients.into_iter().map(|mut ws| async move {
        let (_, code, _) = until_close(&mut ws).await;
        (code, signalled.elapsed())
    });
    let results = futures_util::future::join_all(closes).await;
    for (code, took) in &results {
        assert_eq!(*code, Some(1001));
        assert!(*took < Duration::from_secs(1), "close took {took:?}");
    }
    let (code, _) = child.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0));
    assert!(
        eventually(|| sim
            .stats
            .sessions_active
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0)
        .await,
        "every upstream leg was closed"
    );
}

/// Sends `signal` to a gateway with sessions mid-response and checks it
/// drains exactly as on SIGTERM: every client gets 1001 within a second,
/// the process exits 0, every response in flight has its `503 shutdown`
/// row on stdout (charged with the usage of the `response.done` that
/// answered the drain's cancel), and the log names the signal.
async fn drains_on(signal: &str) {
    const SESSIONS: usize = 5;
    let sim = sim(slow_responses()).await;
    let mut child = Child::start(
        &sim.url(false),
        "",
        &[("RUST_LOG", "patchbay_gateway=info")],
    )
    .await;
    let mut clients = Vec::new();
    for _ in 0..SESSIONS {
        clients.push(mid_response(child.addr).await);
    }
    child.signal(signal);
    let signalled = Instant::now();
    for ws in &mut clients {
        let (_, code, _) = until_close(ws).await;
        assert_eq!(code, Some(1001), "SIG{signal}");
        assert!(signalled.elapsed() < Duration::from_secs(1), "SIG{signal}");
    }
    let (code, _) = child.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0), "SIG{signal}");
    let rows = child.stdout_rows();
    let cut = rows
        .iter()
        .filter(|r| {
            r["key_id"] == "master"
                && r["status"] == 503
                && r["end_reason"] == "shutdown"
                && r["usage_unknown"] == false
        })
        .count();
    assert_eq!(
        (rows.len(), cut),
        (SESSIONS, SESSIONS),
        "SIG{signal}: {rows:?}"
    );
    let logs = child.logs();
    assert!(
        logs.contains(&format!("SIG{signal}")),
        "the log names the signal\n{logs}"
    );
}

#[tokio::test]
async fn sighup_drains_like_sigterm_with_1001_and_every_row_written() {
    drains_on("HUP").await;
}

#[tokio::test]
async fn sigquit_drains_like_sigterm_with_1001_and_every_row_written() {
    drains_on("QUIT").await;
}

#[tokio::test]
async fn sigusr1_and_sigusr2_are_logged_and_ignored() {
    let sim = sim(SimConfig::default()).await;
    let mut child = Child::start(
        &sim.url(false),
        "",
        &[("RUST_LOG", "patchbay_gateway=info")],
    )
    .await;
    let mut ws = connect(child.addr).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    for signal in ["USR1", "USR2"] {
        child.signal(signal);
        let name = format!("SIG{signal}");
        assert!(
            eventually(|| child.logs().contains(&name)).await,
            "{name} is logged\n{}",
            child.logs()
        );
    }
    // Still serving: the live session, a new one, and readiness.
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
    let mut other = connect(child.addr).await;
    assert_eq!(kind(&recv_text(&mut other).await), "session.created");
    assert_eq!(http_get(child.admin_addr, "/readyz").await.0, 200);
    assert!(child.process.try_wait().unwrap().is_none(), "still running");
    child.sigterm();
    assert_eq!(child.wait_exit(Duration::from_secs(10)).await.0, Some(0));
    assert_eq!(until_close(&mut ws).await.1, Some(1001));
}

#[tokio::test]
async fn linger_mode_refuses_new_upgrades_with_503_and_lets_a_live_session_finish() {
    let sim = sim(SimConfig::default()).await;
    let mut child = Child::start(
        &sim.url(false),
        "[drain]\nmode = \"linger\"\nlinger_secs = 5\nwait_secs = 5\n",
        &[],
    )
    .await;
    let mut ws = connect(child.addr).await;
    recv_text(&mut ws).await;
    child.sigterm();
    // Draining has begun once `/readyz` fails: admission refuses from then.
    let deadline = Instant::now() + WAIT;
    while http_get(child.admin_addr, "/readyz").await.0 != 503 {
        assert!(
            Instant::now() < deadline,
            "/readyz never failed after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let bearer = format!("Bearer {CLIENT_KEY}");
    let (status, headers, body) = refused(
        child.addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "shutting_down");
    assert!(headers.contains_key("retry-after"));
    assert_eq!(http_get(child.admin_addr, "/readyz").await.0, 503);

    // The live session carries on, then ends by itself.
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
    ws.close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
        code: 1000.into(),
        reason: "done".into(),
    }))
    .await
    .unwrap();
    let (_, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(1000));
    let (code, took) = child.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0));
    assert!(
        took < Duration::from_secs(4),
        "exit as soon as the last session ended: {took:?}"
    );
}

#[tokio::test]
async fn linger_mode_closes_a_session_that_outlives_linger_secs_with_1001() {
    let sim = sim(SimConfig::default()).await;
    let mut child = Child::start(
        &sim.url(false),
        "[drain]\nmode = \"linger\"\nlinger_secs = 1\n",
        &[],
    )
    .await;
    let mut ws = connect(child.addr).await;
    recv_text(&mut ws).await;
    child.sigterm();
    let signalled = Instant::now();
    ws.send(Message::text(
        r#"{"type":"session.update","session":{"type":"realtime"}}"#,
    ))
    .await
    .unwrap();
    let (texts, code, _) = until_close(&mut ws).await;
    assert!(
        texts.iter().any(|t| kind(t) == "session.updated"),
        "alive while lingering"
    );
    assert_eq!(code, Some(1001));
    assert!(signalled.elapsed() >= Duration::from_millis(900));
    let (code, _) = child.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn logs_carry_one_json_line_per_session_end_and_never_a_key() {
    let sim = sim(SimConfig::default()).await;
    let mut child = Child::start(
        &sim.url(false),
        "",
        &[
            ("RUST_LOG", "patchbay_gateway=debug"),
            ("PATCHBAY_LOG_FORMAT", "json"),
        ],
    )
    .await;
    let mut ws = connect(child.addr).await;
    recv_text(&mut ws).await;
    one_turn(&mut ws).await;
    ws.close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
        code: 1000.into(),
        reason: "".into(),
    }))
    .await
    .unwrap();
    let _ = until_close(&mut ws).await;
    let wrong = "pb-wrong-secret-key";
    let bearer = format!("Bearer {wrong}");
    let (status, _, _) = refused(
        child.addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 401);
    child.sigterm();
    assert_eq!(child.wait_exit(Duration::from_secs(10)).await.0, Some(0));
    tokio::time::sleep(Duration::from_millis(100)).await;

    let logs = child.logs();
    for secret in [CLIENT_KEY, UPSTREAM_KEY, wrong] {
        assert!(!logs.contains(secret), "a key was logged: {secret}\n{logs}");
    }
    let ends: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "session ended")
        .collect();
    assert_eq!(ends.len(), 1, "{logs}");
    let f = &ends[0]["fields"];
    assert_eq!(f["outcome"], "client_closed");
    assert_eq!(f["client_close_code"], 1000);
    assert_eq!(f["upstream_close_code"], 1000);
    assert!(f["duration_ms"].as_u64().is_some());
}

#[tokio::test]
async fn sigterm_runs_every_meter_final_flush_before_exit_even_with_slow_redis() {
    use redis::AsyncCommands;
    use std::sync::atomic::Ordering;
    let Some(url) = redis_url("sigterm_runs_every_meter_final_flush") else {
        return;
    };
    let redis_addr: std::net::SocketAddr = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .parse()
        .expect("PATCHBAY_TEST_REDIS_URL is redis://IP:PORT");
    let relay = DelayRelay::start(redis_addr).await;
    let sim = sim(SimConfig {
        audio_deltas: 50,
        delta_interval: Duration::from_millis(10),
        ..SimConfig::default()
    })
    .await;
    let id = unique("drain");
    let keys = TempFile::new(
        "keys.toml",
        &key_entry(
            &id,
            "pb-drain",
            "budget_usd = 100.0\nbudget_period = \"daily\"",
        ),
    );
    let prices = "[[prices]]\nmodel = \"gpt-realtime\"\ntext_input = 4.0\naudio_input = 32.0\n\
                  text_output = 16.0\naudio_output = 64.0\n";
    let mut child = Child::start(
        &sim.url(false),
        &format!(
            "{prices}[metering]\nflush_secs = 60\n[store]\nredis_url_env = \"PB_REDIS\"\n[keys]\nfile = \"{}\"\n",
            keys.0.display()
        ),
        &[("PB_REDIS", &format!("redis://{}", relay.addr))],
    )
    .await;
    const SESSIONS: usize = 20;
    let bearer = "Bearer pb-drain".to_string();
    let opens = (0..SESSIONS).map(|_| {
        let bearer = bearer.clone();
        let addr = child.addr;
        async move {
            let (mut ws, _) = connect_with(
                addr,
                &format!("?model={MODEL}"),
                &[("authorization", &bearer)],
            )
            .await
            .unwrap();
            recv_text(&mut ws).await;
            one_turn(&mut ws).await;
            send_json(&mut ws, serde_json::json!({"type": "response.create"})).await;
            while kind(&recv_text(&mut ws).await) != "response.output_audio.delta" {}
            ws
        }
    });
    let mut clients = futures_util::future::join_all(opens).await;
    // Every turn is waiting on the 60 s flush timer; Redis turns slow.
    relay.delay.store(200, Ordering::Relaxed);
    child.sigterm();
    for ws in &mut clients {
        assert_eq!(until_close(ws).await.1, Some(1001));
    }
    let (code, _) = child.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0));

    // stdout: one row per completed turn, and one 503 `shutdown` row per
    // response that was in flight, charged with the usage of the
    // response.done that answered the drain's cancel.
    let mut stdout = String::new();
    use std::io::Read;
    child
        .process
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|r: &serde_json::Value| r["key_id"] == id.as_str())
        .collect();
    let completed = rows
        .iter()
        .filter(|r| r["status"] == 200 && r["usage_unknown"] == false)
        .count();
    let cut = rows
        .iter()
        .filter(|r| {
            r["status"] == 503
                && r["end_reason"] == "shutdown"
                && r["usage_unknown"] == false
                && r["output_audio_tokens"].as_u64() > Some(0)
                && r["cost_usd"].as_f64() > Some(0.0)
        })
        .count();
    assert_eq!((completed, cut), (SESSIONS, SESSIONS), "{stdout}");
    let charged: f64 = rows.iter().filter_map(|r| r["cost_usd"].as_f64()).sum();

    // Redis: the same rows, and the budget charged with their costs and an
    // expiry.
    let mut r = redis(&url).await;
    let entries: redis::streams::StreamRangeReply = r
        .xrevrange_count("patchbay:request_logs", "+", "-", 5000)
        .await
        .unwrap();
    let statuses: Vec<String> = entries
        .ids
        .iter()
        .filter(|e| {
            e.map
                .get("key_id")
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                == Some(id.clone())
        })
        .map(|e| redis::from_redis_value(e.map["status"].clone()).unwrap())
        .collect();
    assert_eq!(statuses.iter().filter(|s| *s == "200").count(), SESSIONS);
    assert_eq!(statuses.iter().filter(|s| *s == "503").count(), SESSIONS);
    let day = &humantime::format_rfc3339(std::time::SystemTime::now()).to_string()[..10];
    let budget_key = format!("patchbay:budget:key:{id}:d{day}");
    let spent: f64 = r.get(&budget_key).await.unwrap();
    let per_session = (25.0 * 4.0 + 100.0 * 32.0 + 12.0 * 16.0 + 500.0 * 64.0) / 1e6;
    assert!(
        spent > per_session * SESSIONS as f64 && (spent - charged).abs() < 1e-6,
        "budget {spent}, rows {charged}"
    );
    let ttl: i64 = r.ttl(&budget_key).await.unwrap();
    assert!(ttl > 0, "the daily budget key expires ({ttl})");
}
