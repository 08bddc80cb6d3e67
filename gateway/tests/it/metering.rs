//! Metering through the whole gateway: rows, budgets closing a session,
//! rpm shared by two gateways over Redis, revoked keys, unpriced models.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use patchbay_sim::SimConfig;
use redis::AsyncCommands;

/// Prices for the route: one simulator turn (usage_for(1, 5)) costs
/// 25×4 + 100×32 + 12×16 + 50×64 = 6692 µ$ = $0.006692.
const PRICES: &str = "[[prices]]\nmodel = \"gpt-realtime\"\ntext_input = 4.0\ncached_text_input = 0.4\n\
                      audio_input = 32.0\ncached_audio_input = 0.4\ntext_output = 16.0\naudio_output = 64.0\n";
const FIRST_TURN_COST: f64 = 0.006692;

#[tokio::test]
async fn completed_turn_lands_in_the_redis_stream_with_its_usage_and_cost() {
    let Some(url) = redis_url("completed_turn_lands_in_the_redis_stream") else {
        return;
    };
    let sim = sim(SimConfig::default()).await;
    let id = unique("stream");
    let keys = TempFile::new(
        "keys.toml",
        &key_entry(&id, "pb-stream", "team = \"voice\""),
    );
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!(
            "{PRICES}[store]\nredis_url_env = \"{REDIS_ENV}\"\n[keys]\nfile = \"{}\"\n",
            keys.0.display()
        ),
    ))
    .await;
    let mut ws = open_with(gw.addr, "pb-stream").await.unwrap();
    one_turn(&mut ws).await;
    ws.close(None).await.unwrap();
    let _ = until_close(&mut ws).await;

    let mut r = redis(&url).await;
    let mut row = None;
    for _ in 0..100 {
        let entries: redis::streams::StreamRangeReply = r
            .xrevrange_count("patchbay:request_logs", "+", "-", 200)
            .await
            .unwrap();
        row = entries.ids.into_iter().find(|e| {
            e.map
                .get("key_id")
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                == Some(id.clone())
        });
        if row.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let row = row.expect("a row for the turn");
    let field = |k: &str| -> String { redis::from_redis_value(row.map[k].clone()).unwrap() };
    assert!(
        field("request_id").ends_with(":1"),
        "{}",
        field("request_id")
    );
    assert_eq!(field("team"), "voice");
    assert_eq!(field("model"), MODEL);
    assert_eq!(field("status"), "200");
    assert_eq!(field("usage_unknown"), "false");
    assert_eq!(field("input_tokens"), "125");
    assert_eq!(field("output_tokens"), "62");
    assert_eq!(field("output_audio_tokens"), "50");
    let cost: f64 = field("cost_usd").parse().unwrap();
    assert!((cost - FIRST_TURN_COST).abs() < 1e-9, "{cost}");
}

#[tokio::test]
async fn a_spent_budget_closes_the_session_with_an_error_event_and_1008_then_refuses_402() {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new(
        "keys.toml",
        &key_entry(
            "budgeted",
            "pb-budget",
            "team = \"support\"\nbudget_usd = 0.005",
        ),
    );
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!(
            "{PRICES}[metering]\nflush_secs = 0\n[keys]\nfile = \"{}\"\n",
            keys.0.display()
        ),
    ))
    .await;
    let mut ws = open_with(gw.addr, "pb-budget").await.unwrap();
    one_turn(&mut ws).await;
    let (texts, code, _) = until_close(&mut ws).await;
    let e: serde_json::Value = serde_json::from_str(texts.last().expect("an error event")).unwrap();
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["code"], "insufficient_quota");
    assert!(e["event_id"]
        .as_str()
        .unwrap()
        .starts_with("event_patchbay_"));
    assert!(
        e["error"]["message"].as_str().unwrap().contains("budgeted"),
        "{e}"
    );
    assert_eq!(code, Some(1008));
    assert!(
        eventually(|| sim.stats.sessions_active.load(Ordering::Relaxed) == 0).await,
        "the upstream leg is closed too"
    );
    assert_eq!(open_with(gw.addr, "pb-budget").await.err(), Some(402));
    assert!(metric(gw.admin_addr, "patchbay_budget_blocks_total", "").await >= 2.0);
}

#[tokio::test]
async fn rpm_applies_per_key_across_two_gateways_sharing_redis() {
    let Some(_url) = redis_url("rpm_applies_per_key_across_two_gateways") else {
        return;
    };
    let sim = sim(SimConfig::default()).await;
    let id = unique("rpm");
    let keys = TempFile::new("keys.toml", &key_entry(&id, "pb-rpm", "rpm = 2"));
    let toml = gateway_toml(
        &sim.url(false),
        &format!(
            "[store]\nredis_url_env = \"{REDIS_ENV}\"\n[keys]\nfile = \"{}\"\n",
            keys.0.display()
        ),
    );
    let a = gateway(&toml).await;
    let b = gateway(&toml).await;
    let _s1 = open_with(a.addr, "pb-rpm").await.unwrap();
    let _s2 = open_with(b.addr, "pb-rpm").await.unwrap();
    let bearer = "Bearer pb-rpm".to_string();
    for gw in [&a, &b] {
        let (status, headers, body) = refused(
            gw.addr,
            &format!("?model={MODEL}"),
            &[("authorization", &bearer)],
        )
        .await;
        assert_eq!(status, 429);
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=120).contains(&retry));
    }
    // Another key is not limited by this one.
    assert!(open_with(a.addr, CLIENT_KEY).await.is_ok());
}

#[tokio::test]
async fn removing_a_key_from_the_keys_file_ends_its_live_session_with_1008() {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new("keys.toml", &key_entry("leaving", "pb-leaving", ""));
    let gw = keys_file_gateway(&sim, &keys).await;
    let mut ws = open_with(gw.addr, "pb-leaving").await.unwrap();
    std::fs::write(&keys.0, key_entry("other", "pb-other", "")).unwrap();
    let (texts, code, _) = until_close(&mut ws).await;
    let e: serde_json::Value = serde_json::from_str(texts.last().expect("an error event")).unwrap();
    assert_eq!(e["error"]["code"], "invalid_api_key");
    assert_eq!(code, Some(1008));
}

#[tokio::test]
async fn giving_a_key_id_a_new_secret_ends_the_sessions_opened_with_the_old_one() {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new("keys.toml", &key_entry("app", "pb-app-old", ""));
    let gw = keys_file_gateway(&sim, &keys).await;
    let mut ws = open_with(gw.addr, "pb-app-old").await.unwrap();
    // Rotated: the same id (its budgets and counters carry over), a new
    // secret; written whole, as a deployment swaps the file.
    let next = keys.0.with_extension("next");
    std::fs::write(&next, key_entry("app", "pb-app-new", "")).unwrap();
    std::fs::rename(&next, &keys.0).unwrap();
    let (texts, code, _) = until_close(&mut ws).await;
    let e: serde_json::Value = serde_json::from_str(texts.last().expect("an error event")).unwrap();
    assert_eq!(e["error"]["code"], "invalid_api_key");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("replaced"),
        "{e}"
    );
    assert_eq!(code, Some(1008));
    assert!(open_with(gw.addr, "pb-app-new").await.is_ok());
}

#[tokio::test]
async fn an_unpriced_model_is_refused_under_block_before_any_dial() {
    let sim = sim(SimConfig::default()).await;
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        "[metering]\nunpriced = \"block\"\n",
    ))
    .await;
    let bearer = format!("Bearer {CLIENT_KEY}");
    let (status, _, body) = refused(
        gw.addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 402);
    assert_eq!(body["error"]["code"], "model_not_priced");
    assert_eq!(sim.stats.tcp_accepted.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn an_edited_price_in_the_config_file_applies_from_the_next_flush() {
    let sim = sim(SimConfig::default()).await;
    let toml = |factor: f64| {
        gateway_toml(
            &sim.url(false),
            &format!(
                "[[prices]]\nmodel = \"gpt-realtime\"\ntext_input = {}\ncached_text_input = {}\n\
                 audio_input = {}\ncached_audio_input = {}\ntext_output = {}\naudio_output = {}\n\
                 [metering]\nflush_secs = 0\n",
                4.0 * factor,
                0.4 * factor,
                32.0 * factor,
                0.4 * factor,
                16.0 * factor,
                64.0 * factor
            ),
        )
    };
    let file = TempFile::new("gateway.toml", &toml(1.0));
    let config = patchbay_gateway::config::Config::from_file_with_env(&file.0, &test_env).unwrap();
    let gw = patchbay_gateway::bootstrap::start(config).await.unwrap();
    let cost = || metric(gw.admin_addr, "patchbay_cost_usd_total", "");
    let mut ws = open_with(gw.addr, CLIENT_KEY).await.unwrap();
    one_turn(&mut ws).await;
    let mut seen = 0.0;
    for _ in 0..100 {
        seen = cost().await;
        if seen > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!((seen - FIRST_TURN_COST).abs() < 1e-9, "{seen}");

    std::fs::write(&file.0, toml(2.0)).unwrap();
    assert!(eventually(|| gw.gateway.metering.prices()[0].text_input == 8.0).await);
    one_turn(&mut ws).await;
    // Turn 2 (usage_for(2, 5)): 30 text in, 36 audio in + 64 cached audio,
    // 12 text out, 50 audio out, all at doubled prices: $0.0093792.
    let expected = FIRST_TURN_COST + 0.0093792;
    for _ in 0..100 {
        seen = cost().await;
        if seen > FIRST_TURN_COST {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!((seen - expected).abs() < 1e-9, "{seen} vs {expected}");
}

/// An upstream reporting 2^64-1 for every usage count: the row keeps the
/// reported figures and is flagged, the charge is capped at
/// `[metering] max_turn_usd` (default 100 USD), so a key with a 500 USD
/// budget is not spent by one impossible turn and opens sessions again.
#[tokio::test]
async fn usage_of_2_64_minus_1_is_flagged_charged_at_most_max_turn_usd_and_the_key_still_opens() {
    let sim = sim(SimConfig {
        fault: Some(patchbay_sim::SimFault::UsageMax),
        ..SimConfig::default()
    })
    .await;
    let keys = TempFile::new(
        "keys.toml",
        &key_entry("huge", "pb-huge", "budget_usd = 500.0"),
    );
    let mut child = Child::start(
        &sim.url(false),
        &format!(
            "{PRICES}[metering]\nflush_secs = 0\n[keys]\nfile = \"{}\"\n",
            keys.0.display()
        ),
        &[],
    )
    .await;
    let mut ws = open_with(child.addr, "pb-huge").await.unwrap();
    one_turn(&mut ws).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while metric(child.admin_addr, "patchbay_cost_usd_total", "").await == 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the turn was never charged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut again = open_with(child.addr, "pb-huge")
        .await
        .expect("the key still opens a session (not 402)");
    let turn = one_turn(&mut again).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
    while metric(child.admin_addr, "patchbay_cost_usd_total", "").await < 200.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second turn was never charged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metric(child.admin_addr, "patchbay_usage_implausible_total", "").await,
        2.0
    );
    drop((ws, again));
    child.sigterm();
    assert_eq!(child.wait_exit(Duration::from_secs(10)).await.0, Some(0));
    let rows: Vec<serde_json::Value> = child
        .stdout_rows()
        .into_iter()
        .filter(|r| r["key_id"] == "huge")
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(r["usage_implausible"], true, "{r}");
        assert_eq!(r["total_tokens"].as_u64(), Some(u64::MAX), "{r}");
        assert_eq!(r["cost_usd"].as_f64(), Some(100.0), "{r}");
    }
}
