//! SIGTERM on a real child process: 1001 to every client, 503 for new
//! upgrades, `/readyz` failing, exit 0 within the wait; linger mode.

use std::time::{Duration, Instant};

use crate::common::*;
use futures_util::SinkExt;
use patchbay_gateway::sim::SimConfig;
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
    tokio::time::sleep(Duration::from_millis(200)).await;

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
