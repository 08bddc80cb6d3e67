//! The warm pool through the whole gateway: hand-off, misses, live resizing
//! from the size file, readiness, and size 0.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use patchbay_sim::SimConfig;

#[tokio::test]
async fn warm_socket_hands_over_its_buffered_session_created_byte_for_byte() {
    let (sim, gw) = sim_and_gateway(
        SimConfig {
            record: true,
            ..SimConfig::default()
        },
        "[pool]\nsize = 1\n",
    )
    .await;
    let pool = gw.gateway.routes[0].pool.clone();
    assert!(eventually(|| pool.len() == 1).await);
    let first_sent = sim.stats.sent.lock().unwrap()[0].clone();
    let mut ws = connect(gw.addr).await;
    let created = recv_text(&mut ws).await;
    assert_eq!(
        created, first_sent,
        "the pooled socket's session.created, as sent"
    );
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
    assert_eq!(
        metric(gw.admin_addr, "patchbay_pool_hits_total", "").await,
        1.0
    );
    assert_eq!(
        metric(gw.admin_addr, "patchbay_pool_misses_total", "").await,
        0.0
    );
}

#[tokio::test]
async fn a_miss_falls_back_to_a_fresh_dial() {
    let (sim, gw) = sim_and_gateway(
        SimConfig {
            // Slow refills: the second session finds the pool empty.
            upgrade_delay: Duration::from_millis(400),
            ..SimConfig::default()
        },
        "[pool]\nsize = 1\n",
    )
    .await;
    let pool = gw.gateway.routes[0].pool.clone();
    assert!(eventually(|| pool.len() == 1).await);
    let mut a = connect(gw.addr).await;
    let mut b = connect(gw.addr).await;
    assert_eq!(kind(&recv_text(&mut a).await), "session.created");
    assert_eq!(kind(&recv_text(&mut b).await), "session.created");
    assert_eq!(
        kind(one_turn(&mut b).await.last().unwrap()),
        "response.done"
    );
    assert_eq!(
        metric(gw.admin_addr, "patchbay_pool_hits_total", "").await,
        1.0
    );
    assert_eq!(
        metric(
            gw.admin_addr,
            "patchbay_pool_misses_total",
            "reason=\"empty\""
        )
        .await,
        1.0
    );
    assert!(sim.stats.upgrades.load(Ordering::Relaxed) >= 2);
}

#[tokio::test]
async fn size_file_grows_and_shrinks_the_pool_live_and_bad_values_are_ignored() {
    let sim = sim(SimConfig::default()).await;
    let file = std::env::temp_dir().join(format!(
        "patchbay-pool-size-{}",
        patchbay_gateway::ids::short_id()
    ));
    std::fs::write(&file, "2\n").unwrap();
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!("[pool]\nsize = 1\nsize_file = \"{}\"\n", file.display()),
    ))
    .await;
    let pool = gw.gateway.routes[0].pool.clone();
    assert_eq!(
        pool.target(),
        2,
        "the size file overrides [pool] size at start"
    );
    assert!(eventually(|| pool.len() == 2).await);

    std::fs::write(&file, "REALTIME_POOL_SIZE=4\n").unwrap();
    assert!(eventually(|| pool.len() == 4).await);
    assert_eq!(
        metric(gw.admin_addr, "patchbay_pool_warm_sockets", "").await,
        4.0
    );

    std::fs::write(&file, "1").unwrap();
    assert!(eventually(|| pool.len() == 1).await);
    assert!(eventually(|| sim.stats.sessions_active.load(Ordering::Relaxed) == 1).await);

    assert_eq!(reloads(&gw, "pool_size", "rejected"), 0);
    std::fs::write(&file, "lots").unwrap();
    assert!(
        eventually(|| reloads(&gw, "pool_size", "rejected") == 1).await,
        "the watcher never refused the invalid size"
    );
    assert_eq!(pool.target(), 1, "an invalid size is ignored");
    assert_eq!(pool.len(), 1);
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn readiness_waits_for_the_pool_to_warm_up() {
    let (_sim, gw) = sim_and_gateway(
        SimConfig {
            upgrade_delay: Duration::from_millis(800),
            ..SimConfig::default()
        },
        "[pool]\nsize = 2\n",
    )
    .await;
    assert_eq!(http_get(gw.admin_addr, "/readyz").await.0, 503);
    let pool = gw.gateway.routes[0].pool.clone();
    assert!(eventually(|| pool.len() == 2).await);
    assert!(eventually(|| gw.gateway.is_ready()).await);
    assert_eq!(http_get(gw.admin_addr, "/readyz").await.0, 200);
}

#[tokio::test]
async fn readiness_gives_up_waiting_after_the_warmup_timeout() {
    let sim = sim(SimConfig::default()).await;
    sim.set_refusing(true);
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        "[pool]\nsize = 2\nwarmup_timeout_secs = 1\n",
    ))
    .await;
    assert_eq!(http_get(gw.admin_addr, "/readyz").await.0, 503);
    assert!(eventually(|| gw.gateway.is_ready()).await);
    assert!(
        gw.gateway.routes[0].pool.is_empty(),
        "ready although never warm"
    );
}

#[tokio::test]
async fn pool_size_zero_behaves_like_a_fresh_dial() {
    let (sim, gw) = sim_and_gateway(SimConfig::default(), "[pool]\nsize = 0\n").await;
    assert_eq!(
        http_get(gw.admin_addr, "/readyz").await.0,
        200,
        "nothing to warm"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        sim.stats.tcp_accepted.load(Ordering::Relaxed),
        0,
        "no dial before a session"
    );
    let mut ws = connect(gw.addr).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    assert_eq!(sim.stats.upgrades.load(Ordering::Relaxed), 1);
    assert_eq!(
        metric(gw.admin_addr, "patchbay_pool_hits_total", "").await,
        0.0
    );
    assert_eq!(
        metric(gw.admin_addr, "patchbay_pool_misses_total", "").await,
        0.0
    );
}

#[tokio::test]
async fn a_transcription_session_gets_a_fresh_dial_with_its_intent_and_nothing_else_forwarded() {
    for (protocol, first) in [
        ("beta", "transcription_session.created"),
        ("ga", "session.created"),
    ] {
        let (sim, gw) = sim_and_gateway(
            SimConfig::default(),
            &format!("protocol = \"{protocol}\"\n[pool]\nsize = 1\n"),
        )
        .await;
        let pool = gw.gateway.routes[0].pool.clone();
        assert!(eventually(|| pool.len() == 1).await);
        let bearer = format!("Bearer {CLIENT_KEY}");
        let (mut ws, _) = connect_with(
            gw.addr,
            &format!("?model={MODEL}&intent=transcription&foo=bar&model=other"),
            &[("authorization", &bearer)],
        )
        .await
        .expect("session opens");
        let created = recv_text(&mut ws).await;
        assert_eq!(kind(&created), first, "{protocol}: {created}");
        let session: serde_json::Value = serde_json::from_str(&created).unwrap();
        if protocol == "ga" {
            assert_eq!(session["session"]["type"], "transcription");
        }
        // The warm socket (dialled without the intent) was left alone.
        assert_eq!(pool.len(), 1, "{protocol}");
        let queries = sim.stats.queries.lock().unwrap().clone();
        assert_eq!(
            queries.last().map(String::as_str),
            Some("model=gpt-realtime&intent=transcription"),
            "{protocol}: {queries:?}"
        );
        // The transcription session works like any other.
        send_json(
            &mut ws,
            serde_json::json!({"type": "input_audio_buffer.commit"}),
        )
        .await;
        loop {
            let t = recv_text(&mut ws).await;
            if kind(&t) == "conversation.item.input_audio_transcription.completed" {
                break;
            }
        }
        // A plain session still takes the warm socket.
        let mut plain = connect(gw.addr).await;
        assert_eq!(kind(&recv_text(&mut plain).await), "session.created");
        assert_eq!(
            metric(gw.admin_addr, "patchbay_pool_hits_total", "").await,
            1.0,
            "{protocol}"
        );
        sim.stop();
    }
}
