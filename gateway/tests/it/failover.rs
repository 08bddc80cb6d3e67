//! Several upstreams per route: failover before the client notices, weights,
//! circuit breakers and their recovery, and pools that follow the breakers.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::*;
use patchbay_sim::{SimConfig, SimFault, SimHandle};
use redis::AsyncCommands;

/// Breakers open for 1 s (2 s at most) so recovery is quick to observe.
fn two_upstreams(a: &SimHandle, a_extra: &str, b: &SimHandle, b_extra: &str, rest: &str) -> String {
    let pool = if rest.contains("[pool]") {
        ""
    } else {
        "[pool]\nsize = 0\n"
    };
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nupgrade_timeout_secs = 1\n\
         breaker_open_secs = 1\nbreaker_max_open_secs = 2\n\
         [[routes]]\nmodel = \"{MODEL}\"\n\
         [[routes.upstreams]]\nname = \"a\"\nupstream_url = \"{}\"\napi_key_env = \"SIM_KEY\"\n{a_extra}\n\
         [[routes.upstreams]]\nname = \"b\"\nupstream_url = \"{}\"\napi_key_env = \"SIM_KEY\"\n{b_extra}\n\
         {rest}\n{pool}",
        a.url(false),
        b.url(false)
    )
}

fn refusing(status: u16) -> SimConfig {
    SimConfig {
        fault: Some(SimFault::Refuse { status }),
        ..SimConfig::default()
    }
}

fn upgrades(s: &SimHandle) -> u64 {
    s.stats.upgrades.load(Ordering::Relaxed)
}

fn attempts(s: &SimHandle) -> u64 {
    s.stats.tcp_accepted.load(Ordering::Relaxed)
}

/// Opens a session, reads its `session.created`, closes it.
async fn one_session(addr: std::net::SocketAddr) {
    let mut ws = connect(addr).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    ws.close(None).await.unwrap();
    let _ = until_close(&mut ws).await;
}

#[tokio::test]
async fn a_refusing_upstream_is_failed_over_and_then_left_alone_by_its_breaker() {
    for status in [429, 500] {
        let a = sim(refusing(status)).await;
        let b = sim(SimConfig::default()).await;
        let gw = gateway(&two_upstreams(&a, "priority = 0", &b, "priority = 1", "")).await;
        for _ in 0..200 {
            one_session(gw.addr).await;
        }
        assert_eq!(upgrades(&b), 200, "{status}: every session on b");
        // Five failures open a's breaker; after that only a probe now and
        // then (1 s, then 2 s apart) reaches it.
        let tried = attempts(&a);
        assert!(
            (5..=20).contains(&tried),
            "{status}: a saw {tried} attempts"
        );
        let reason = if status == 429 {
            "rate_limited"
        } else {
            "server_error"
        };
        let failovers = metric(
            gw.admin_addr,
            "patchbay_upstream_failovers_total",
            &format!("from=\"a\",to=\"b\",reason=\"{reason}\""),
        )
        .await;
        assert_eq!(
            failovers, tried as f64,
            "{status}: one failover per refusal"
        );
        assert_eq!(
            metric(
                gw.admin_addr,
                "patchbay_upstream_circuit_open",
                "upstream=\"a\""
            )
            .await,
            1.0
        );
        a.stop();
        b.stop();
    }
}

#[tokio::test]
async fn an_upstream_that_times_out_is_failed_over_within_the_dial_bounds() {
    // a answers its upgrades after 3 s; the dial timeout is 1 s.
    let a = sim(SimConfig {
        upgrade_delay: Duration::from_secs(3),
        ..SimConfig::default()
    })
    .await;
    let b = sim(SimConfig::default()).await;
    let gw = gateway(&two_upstreams(&a, "priority = 0", &b, "priority = 1", "")).await;
    let started = Instant::now();
    let mut ws = connect(gw.addr).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    let took = started.elapsed();
    // (1 + max_failovers) × upgrade_timeout bounds any set-up.
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(upgrades(&b), 1);
    assert_eq!(
        metric(
            gw.admin_addr,
            "patchbay_upstream_failovers_total",
            "reason=\"timeout\""
        )
        .await,
        1.0
    );
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
}

#[tokio::test]
async fn when_every_upstream_fails_the_client_gets_one_error_naming_the_last_cause_then_1013() {
    let a = sim(refusing(429)).await;
    let b = sim(refusing(503)).await;
    let gw = gateway(&two_upstreams(&a, "", &b, "priority = 1", "")).await;
    let mut ws = connect(gw.addr).await;
    let (texts, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(1013));
    assert_eq!(texts.len(), 1, "{texts:?}");
    let error: serde_json::Value = serde_json::from_str(&texts[0]).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["code"], "upstream_unavailable");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("HTTP 503"),
        "{error}"
    );
    assert_eq!((attempts(&a), attempts(&b)), (1, 1));
}

#[tokio::test]
async fn equal_priorities_share_sessions_by_weight() {
    let a = sim(SimConfig::default()).await;
    let b = sim(SimConfig::default()).await;
    let gw = gateway(&two_upstreams(&a, "weight = 3", &b, "weight = 1", "")).await;
    for _ in 0..400 {
        one_session(gw.addr).await;
    }
    let (on_a, on_b) = (upgrades(&a), upgrades(&b));
    assert_eq!(on_a + on_b, 400);
    assert!((270..=330).contains(&on_a), "a {on_a}, b {on_b}");
}

#[tokio::test]
async fn a_recovered_upstream_gets_its_traffic_back_after_a_probe() {
    let a = sim(SimConfig::default()).await;
    let b = sim(SimConfig::default()).await;
    let gw = gateway(&two_upstreams(&a, "priority = 0", &b, "priority = 1", "")).await;
    one_session(gw.addr).await;
    assert_eq!(upgrades(&a), 1);
    // a refuses our key: its breaker opens at once (for 2 s here).
    a.set_refusing(true);
    one_session(gw.addr).await;
    assert_eq!(upgrades(&b), 1, "failed over");
    for _ in 0..5 {
        one_session(gw.addr).await;
    }
    assert_eq!(upgrades(&b), 6, "a is left alone while open");
    assert_eq!(
        attempts(&a),
        2,
        "no dial went to a while its breaker was open"
    );
    a.set_refusing(false);
    // The next session after the open time is a's probe; it succeeds and
    // closes the breaker.
    let deadline = Instant::now() + WAIT;
    while upgrades(&a) < 2 {
        assert!(Instant::now() < deadline, "a never got its probe");
        one_session(gw.addr).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..5 {
        one_session(gw.addr).await;
    }
    assert_eq!(upgrades(&a), 7, "traffic is back on priority 0");
    assert_eq!(
        metric(
            gw.admin_addr,
            "patchbay_upstream_circuit_open",
            "upstream=\"a\""
        )
        .await,
        0.0
    );
}

/// A key refused by an `error` event after the upgrade (not a 401) is
/// the same refusal: the session fails over, the upstream's breaker opens
/// at once, and no client is told the masked key.
#[tokio::test]
async fn a_key_refused_by_an_error_event_fails_over_and_opens_the_breaker() {
    let a = sim(SimConfig {
        fault: Some(SimFault::KeyErrorFirst),
        ..SimConfig::default()
    })
    .await;
    let b = sim(SimConfig::default()).await;
    let gw = gateway(&two_upstreams(&a, "priority = 0", &b, "priority = 1", "")).await;
    for _ in 0..20 {
        one_session(gw.addr).await;
    }
    assert_eq!(upgrades(&b), 20, "every session on b");
    assert_eq!(upgrades(&a), 1, "the first refusal opened a's breaker");
    let failovers = metric(
        gw.admin_addr,
        "patchbay_upstream_failovers_total",
        "from=\"a\",to=\"b\",reason=\"auth\"",
    )
    .await;
    assert_eq!(failovers, 1.0);
}

#[tokio::test]
async fn warm_sockets_of_an_upstream_whose_breaker_opened_are_not_handed_out() {
    let a = sim(SimConfig::default()).await;
    let b = sim(SimConfig::default()).await;
    let gw = gateway(&two_upstreams(
        &a,
        "priority = 0",
        &b,
        "priority = 1",
        "[pool]\nsize = 2\n",
    ))
    .await;
    let route = gw.gateway.routes[0].clone();
    assert!(eventually(|| route.upstreams[0].pool.len() == 2).await);
    assert_eq!(
        route.upstreams[1].pool.target(),
        0,
        "only the best priority keeps warm sockets"
    );
    // a starts refusing our key. A session with a session-selecting
    // parameter always dials fresh: its 401 opens a's breaker at once.
    a.set_refusing(true);
    let bearer = format!("Bearer {CLIENT_KEY}");
    let (mut ws, _) = connect_with(
        gw.addr,
        &format!("?model={MODEL}&intent=transcription"),
        &[("authorization", &bearer)],
    )
    .await
    .unwrap();
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    assert_eq!(
        metric(
            gw.admin_addr,
            "patchbay_upstream_failovers_total",
            "from=\"a\",to=\"b\",reason=\"auth\""
        )
        .await,
        1.0,
        "failed over to b"
    );
    // a's two warm sockets are still there, but a plain session does not
    // get one: it runs on b, whose pool now takes the warm share.
    let mut plain = connect(gw.addr).await;
    assert_eq!(kind(&recv_text(&mut plain).await), "session.created");
    let turn = one_turn(&mut plain).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
    assert_eq!(
        a.stats.responses_done.load(Ordering::Relaxed),
        0,
        "no session ran on a"
    );
    assert_eq!(b.stats.responses_done.load(Ordering::Relaxed), 1);
    assert!(eventually(|| route.upstreams[1].pool.target() == 2).await);
    assert!(eventually(|| route.upstreams[0].pool.is_empty()).await);
}

#[tokio::test]
async fn rows_name_the_upstream_that_served_the_session() {
    let Some(url) = redis_url("rows_name_the_upstream_that_served_the_session") else {
        return;
    };
    let a = sim(refusing(503)).await;
    let b = sim(SimConfig::default()).await;
    let id = unique("failover");
    let keys = TempFile::new("keys.toml", &key_entry(&id, "pb-failover", ""));
    let gw = gateway(&two_upstreams(
        &a,
        "",
        &b,
        "priority = 1",
        &format!(
            "[store]\nredis_url_env = \"{REDIS_ENV}\"\n[keys]\nfile = \"{}\"\n",
            keys.0.display()
        ),
    ))
    .await;
    let mut ws = open_with(gw.addr, "pb-failover").await.unwrap();
    one_turn(&mut ws).await;
    ws.close(None).await.unwrap();
    let _ = until_close(&mut ws).await;
    let mut r = redis(&url).await;
    let mut upstream = None;
    for _ in 0..200 {
        let entries: redis::streams::StreamRangeReply = r
            .xrevrange_count("patchbay:request_logs", "+", "-", 500)
            .await
            .unwrap();
        upstream = entries.ids.iter().find_map(|e| {
            let key: Option<String> = e
                .map
                .get("key_id")
                .and_then(|v| redis::from_redis_value(v.clone()).ok());
            (key.as_deref() == Some(id.as_str()))
                .then(|| redis::from_redis_value::<String>(e.map["upstream"].clone()).unwrap())
        });
        if upstream.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(upstream.as_deref(), Some("b"));
}

#[tokio::test]
async fn weights_and_priorities_are_live_settings() {
    let a = sim(SimConfig::default()).await;
    let b = sim(SimConfig::default()).await;
    let file = TempFile::new(
        "gateway.toml",
        &two_upstreams(&a, "weight = 1", &b, "weight = 1", ""),
    );
    let config = patchbay_gateway::config::Config::from_file_with_env(&file.0, &test_env).unwrap();
    let gw = patchbay_gateway::bootstrap::start(config).await.unwrap();
    for _ in 0..20 {
        one_session(gw.addr).await;
    }
    assert_eq!((upgrades(&a), upgrades(&b)), (10, 10));
    // b becomes the only priority 0: every session goes there, no restart.
    std::fs::write(
        &file.0,
        two_upstreams(&a, "priority = 1", &b, "priority = 0\nweight = 7", ""),
    )
    .unwrap();
    let route = gw.gateway.routes[0].clone();
    assert!(eventually(|| route.upstreams[1].weight() == 7).await);
    for _ in 0..20 {
        one_session(gw.addr).await;
    }
    assert_eq!((upgrades(&a), upgrades(&b)), (10, 30));
}
