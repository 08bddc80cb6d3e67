//! The relay path end to end: real WebSocket sessions through an in-process
//! gateway to the simulator, on 127.0.0.1.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use futures_util::SinkExt;
use patchbay_gateway::bootstrap::Running;
use patchbay_sim::{SimConfig, SimFault, SimHandle};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn full_session_relays_every_upstream_event_byte_for_byte() {
    let (sim, gw) = sim_and_gateway(
        SimConfig {
            record: true,
            ..SimConfig::default()
        },
        "",
    )
    .await;
    let mut ws = connect(gw.addr).await;
    let mut received = vec![recv_text(&mut ws).await];
    send_json(
        &mut ws,
        serde_json::json!({"type": "session.update", "session": {"type": "realtime", "instructions": "x"}}),
    )
    .await;
    received.push(recv_text(&mut ws).await);
    received.extend(one_turn(&mut ws).await);
    received.extend(one_turn(&mut ws).await);
    ws.close(None).await.unwrap();

    let sent = sim.stats.sent.lock().unwrap().clone();
    assert_eq!(kind(&received[0]), "session.created");
    assert_eq!(kind(&received[1]), "session.updated");
    assert!(
        received.len() > 20,
        "two turns of events: {}",
        received.len()
    );
    assert_eq!(
        received, sent,
        "the client saw exactly what the upstream sent"
    );
}

#[tokio::test]
async fn bearer_api_key_and_subprotocol_credentials_are_accepted() {
    let (sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let q = format!("?model={MODEL}");

    let bearer = format!("Bearer {CLIENT_KEY}");
    let (mut ws, resp) = connect_with(gw.addr, &q, &[("authorization", &bearer)])
        .await
        .unwrap();
    assert!(resp.headers().get("sec-websocket-protocol").is_none());
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");

    let (mut ws, _) = connect_with(gw.addr, &q, &[("api-key", CLIENT_KEY)])
        .await
        .unwrap();
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");

    let protocols = format!("realtime, openai-insecure-api-key.{CLIENT_KEY}");
    let (mut ws, resp) = connect_with(gw.addr, &q, &[("sec-websocket-protocol", &protocols)])
        .await
        .unwrap();
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").unwrap(),
        "realtime",
        "the 101 selects the realtime subprotocol"
    );
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");

    // The client's key never travels upstream; only the route's key does.
    let seen = sim.stats.auth_headers.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|k| k == UPSTREAM_KEY), "{seen:?}");
}

#[tokio::test]
async fn a_beta_client_on_a_ga_route_is_refused_400_before_any_dial_and_a_beta_route_serves_it() {
    let (sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let q = format!("?model={MODEL}");
    let bearer = format!("Bearer {CLIENT_KEY}");
    let beta_subprotocol =
        format!("realtime, openai-insecure-api-key.{CLIENT_KEY}, openai-beta.realtime-v1");
    for headers in [
        vec![
            ("authorization", bearer.as_str()),
            ("openai-beta", "realtime=v1"),
        ],
        vec![("sec-websocket-protocol", beta_subprotocol.as_str())],
    ] {
        let (status, _, body) = refused(gw.addr, &q, &headers).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["code"], "beta_protocol_retired", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("/v1/realtime?model={MODEL}")),
            "{message}"
        );
    }
    assert_eq!(
        sim.stats.upgrades.load(Ordering::Relaxed),
        0,
        "nothing was dialled"
    );
    assert_eq!(
        metric(
            gw.admin_addr,
            "patchbay_admission_refusals_total",
            "reason=\"beta_protocol_retired\""
        )
        .await,
        2.0
    );
    drop(gw);

    // A route configured for the beta dialect (an Azure preview deployment)
    // serves the same client.
    let gw = gateway(&gateway_toml(&sim.url(false), "protocol = \"beta\"")).await;
    let (mut ws, _) = connect_with(
        gw.addr,
        &q,
        &[("authorization", &bearer), ("openai-beta", "realtime=v1")],
    )
    .await
    .unwrap();
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
}

#[tokio::test]
async fn wrong_or_missing_key_is_refused_with_401_before_any_upstream_connection() {
    let (sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let q = format!("?model={MODEL}");
    let (status, _, body) = refused(gw.addr, &q, &[("authorization", "Bearer pb-wrong")]).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let (status, _, body) = refused(gw.addr, &q, &[]).await;
    assert_eq!(status, 401);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("missing"));
    assert_eq!(sim.stats.tcp_accepted.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn missing_model_is_400_and_unknown_model_is_404() {
    let (sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let bearer = format!("Bearer {CLIENT_KEY}");
    let (status, _, body) = refused(gw.addr, "", &[("authorization", &bearer)]).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["code"], "missing_model");
    let (status, _, body) =
        refused(gw.addr, "?model=gpt-nope", &[("authorization", &bearer)]).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "model_not_found");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("gpt-nope"));
    assert_eq!(sim.stats.tcp_accepted.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn sessions_past_max_sessions_get_429_with_retry_after() {
    let (sim, gw) = sim_and_gateway(SimConfig::default(), "[limits]\nmax_sessions = 2\n").await;
    let mut a = connect(gw.addr).await;
    let mut b = connect(gw.addr).await;
    recv_text(&mut a).await;
    recv_text(&mut b).await;
    let bearer = format!("Bearer {CLIENT_KEY}");
    let (status, headers, body) = refused(
        gw.addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 429);
    assert_eq!(headers.get("retry-after").unwrap(), "1");
    assert_eq!(body["error"]["code"], "too_many_sessions");
    assert_eq!(sim.stats.upgrades.load(Ordering::Relaxed), 2);
    // A slot frees when a session ends.
    a.close(None).await.unwrap();
    let _ = until_close(&mut a).await;
    assert!(eventually(|| gw.gateway.sessions.active() == 1).await);
    let mut c = connect(gw.addr).await;
    assert_eq!(kind(&recv_text(&mut c).await), "session.created");
}

async fn upstream_refusal(status: u16) -> (serde_json::Value, Option<u16>) {
    let (_sim, gw) = sim_and_gateway(
        SimConfig {
            fault: Some(SimFault::Refuse { status }),
            ..SimConfig::default()
        },
        "",
    )
    .await;
    let mut ws = connect(gw.addr).await;
    let (texts, code, _) = until_close(&mut ws).await;
    assert_eq!(texts.len(), 1, "one error event, then the close: {texts:?}");
    (serde_json::from_str(&texts[0]).unwrap(), code)
}

#[tokio::test]
async fn upstream_refusals_reach_the_client_as_error_events_and_close_codes() {
    let (e, code) = upstream_refusal(401).await;
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["code"], "upstream_auth_failed");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("HTTP 401"),
        "{e}"
    );
    assert_eq!(code, Some(1011));

    let (e, code) = upstream_refusal(429).await;
    assert_eq!(e["error"]["code"], "upstream_rate_limited");
    assert_eq!(code, Some(1013));

    let (e, code) = upstream_refusal(500).await;
    assert_eq!(e["error"]["code"], "upstream_unavailable");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("HTTP 500"),
        "{e}"
    );
    assert_eq!(code, Some(1013));
}

#[tokio::test]
async fn a_slow_upstream_costs_the_client_one_upgrade_timeout_in_all() {
    // The upgrade and `session.created` each take 0.7 s: each phase is
    // within the 1 s timeout, the dial as a whole is not.
    let sim = sim(SimConfig {
        upgrade_delay: Duration::from_millis(700),
        session_delay: Duration::from_millis(700),
        ..SimConfig::default()
    })
    .await;
    let toml = gateway_toml(&sim.url(false), "")
        .replace("upgrade_timeout_secs = 5", "upgrade_timeout_secs = 1");
    let gw = gateway(&toml).await;
    let started = std::time::Instant::now();
    let mut ws = connect(gw.addr).await;
    let (texts, code, _) = until_close(&mut ws).await;
    let waited = started.elapsed();
    assert_eq!(texts.len(), 1, "one error event, then the close: {texts:?}");
    let e: serde_json::Value = serde_json::from_str(&texts[0]).unwrap();
    assert_eq!(e["error"]["code"], "upstream_timeout", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("session.created"),
        "names the phase the deadline ran out in: {e}"
    );
    assert_eq!(code, Some(1013));
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
}

#[tokio::test]
async fn a_refused_upstream_key_is_not_quoted_back_to_the_client() {
    // The simulator accepts only UPSTREAM_KEY; this gateway dials with
    // another key, and the 401 body quotes it masked, as OpenAI does.
    let sim = sim(SimConfig::default()).await;
    let wrong = "sk-wrong-upstream-key-7f3a";
    let toml = gateway_toml(&sim.url(false), "").replace("SIM_KEY", "WRONG_SIM_KEY");
    let env = |k: &str| match k {
        "WRONG_SIM_KEY" => Some(wrong.to_string()),
        other => test_env(other),
    };
    let config = patchbay_gateway::config::Config::from_toml_with_env(&toml, &env).unwrap();
    let gw = patchbay_gateway::bootstrap::start(config).await.unwrap();
    let mut ws = connect(gw.addr).await;
    let (texts, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(1011));
    let e: serde_json::Value = serde_json::from_str(&texts[0]).unwrap();
    assert_eq!(e["error"]["code"], "upstream_auth_failed");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("HTTP 401"), "{message}");
    let masked = patchbay_sim::mask_key(wrong);
    assert!(masked.ends_with("7f3a"), "{masked}");
    for leak in [masked.as_str(), "7f3a", "Incorrect API key"] {
        assert!(
            !message.contains(leak),
            "{leak:?} reached the client: {message}"
        );
    }
}

/// A key refused by an `error` event after the upgrade (quoting the key
/// masked) is told to the client as a refused key, not forwarded.
#[tokio::test]
async fn a_key_refused_by_an_error_event_is_not_quoted_back_to_the_client() {
    let (_sim, gw) = sim_and_gateway(
        SimConfig {
            fault: Some(SimFault::KeyErrorFirst),
            ..SimConfig::default()
        },
        "",
    )
    .await;
    let mut ws = connect(gw.addr).await;
    let (texts, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(1011));
    assert_eq!(texts.len(), 1, "{texts:?}");
    let e: serde_json::Value = serde_json::from_str(&texts[0]).unwrap();
    assert_eq!(e["error"]["code"], "upstream_auth_failed", "{e}");
    let masked = patchbay_sim::mask_key(UPSTREAM_KEY);
    let tail = &UPSTREAM_KEY[UPSTREAM_KEY.len() - 4..];
    for leak in [masked.as_str(), tail, "Incorrect API key"] {
        assert!(!texts[0].contains(leak), "{leak:?} reached the client: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_holds_at_most_its_budget_of_frames_during_a_slow_dial() {
    // 60 events of 1 MiB while the upstream takes 500 ms to upgrade: under
    // the 64-frame cap, so only the 1 MiB byte budget stops the gateway from
    // holding all 60 MiB. Past it, the gateway stops reading: the kernel's
    // buffers take a few MB more and the client's sends stall until the
    // upstream is ready. Then everything is relayed, in order.
    const EVENTS: usize = 60;
    let (_sim, gw) = sim_and_gateway(
        SimConfig {
            upgrade_delay: Duration::from_millis(500),
            ..SimConfig::default()
        },
        "",
    )
    .await;
    let ws = connect(gw.addr).await;
    let (mut tx, mut rx) = futures_util::StreamExt::split(ws);
    let pad = "x".repeat(1 << 20);
    let sender = tokio::spawn(async move {
        for i in 0..EVENTS {
            let event = serde_json::json!({"type": "conversation.item.create", "n": i, "pad": pad});
            tx.send(Message::text(event.to_string())).await.unwrap();
        }
        (std::time::Instant::now(), tx)
    });
    let first = tokio::time::timeout(WAIT, futures_util::StreamExt::next(&mut rx))
        .await
        .expect("session.created in time");
    let created_at = std::time::Instant::now();
    match first {
        Some(Ok(Message::Text(t))) => assert_eq!(kind(&t), "session.created"),
        other => panic!("expected session.created, got {other:?}"),
    }
    let (sent_at, _tx) = sender.await.unwrap();
    assert!(
        sent_at > created_at,
        "all {EVENTS} MiB were taken before the upstream was ready: the gateway held them"
    );
    let mut items = Vec::new();
    while items.len() < EVENTS {
        match tokio::time::timeout(WAIT, futures_util::StreamExt::next(&mut rx)).await {
            Ok(Some(Ok(Message::Text(t)))) if kind(&t) == "conversation.item.added" => {
                let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                items.push(v["item"]["id"].as_str().unwrap().to_string());
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("relay ended early: {other:?}"),
        }
    }
    let expected: Vec<String> = (1..=EVENTS).map(|i| format!("item_{i}")).collect();
    assert_eq!(items, expected);
}

#[tokio::test]
async fn upstream_first_event_error_is_forwarded_then_closed_1011() {
    let (sim, gw) = sim_and_gateway(
        SimConfig {
            fault: Some(SimFault::ErrorFirst),
            record: true,
            ..SimConfig::default()
        },
        "",
    )
    .await;
    let mut ws = connect(gw.addr).await;
    let (texts, code, _) = until_close(&mut ws).await;
    assert_eq!(texts, sim.stats.sent.lock().unwrap().clone());
    assert_eq!(kind(&texts[0]), "error");
    assert_eq!(code, Some(1011));
}

#[tokio::test]
async fn client_close_code_and_reason_reach_the_upstream() {
    let (sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let mut ws = connect(gw.addr).await;
    recv_text(&mut ws).await;
    ws.close(Some(CloseFrame {
        code: CloseCode::from(4000),
        reason: "bye".into(),
    }))
    .await
    .unwrap();
    let (_, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(4000), "the close reply echoes the code");
    assert!(eventually(|| sim.stats.close_codes.lock().unwrap().contains(&4000)).await);
}

#[tokio::test]
async fn upstream_close_code_and_reason_reach_the_client() {
    let (_sim, gw) = sim_and_gateway(
        SimConfig {
            fault: Some(SimFault::CloseAfterResponse {
                code: 4001,
                reason: "upstream says bye".into(),
            }),
            ..SimConfig::default()
        },
        "",
    )
    .await;
    let mut ws = connect(gw.addr).await;
    recv_text(&mut ws).await;
    one_turn(&mut ws).await;
    let (_, code, reason) = until_close(&mut ws).await;
    assert_eq!(code, Some(4001));
    assert_eq!(reason, "upstream says bye");
}

#[tokio::test]
async fn upstream_dropping_mid_response_closes_the_client_with_1011() {
    let (_sim, gw) = sim_and_gateway(
        SimConfig {
            fault: Some(SimFault::DropMidResponse { after_deltas: 2 }),
            ..SimConfig::default()
        },
        "",
    )
    .await;
    let mut ws = connect(gw.addr).await;
    recv_text(&mut ws).await;
    send_json(&mut ws, serde_json::json!({"type": "response.create"})).await;
    let (texts, code, _) = until_close(&mut ws).await;
    assert!(texts
        .iter()
        .any(|t| kind(t) == "response.output_audio.delta"));
    assert_eq!(code, Some(1011));
}

#[tokio::test]
async fn idle_session_is_closed_after_the_idle_timeout() {
    let (sim, gw) = sim_and_gateway(SimConfig::default(), "[relay]\nidle_timeout_secs = 1\n").await;
    let mut ws = connect(gw.addr).await;
    recv_text(&mut ws).await;
    let started = std::time::Instant::now();
    let (_, code, reason) = until_close(&mut ws).await;
    assert_eq!(code, Some(1001));
    assert_eq!(reason, "idle timeout");
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert!(eventually(|| sim.stats.close_codes.lock().unwrap().contains(&1001)).await);
}

#[tokio::test]
async fn session_past_max_session_secs_gets_an_error_event_and_1001() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "[relay]\nmax_session_secs = 1\n").await;
    let mut ws = connect(gw.addr).await;
    recv_text(&mut ws).await;
    let (texts, code, _) = until_close(&mut ws).await;
    let e: serde_json::Value = serde_json::from_str(texts.last().unwrap()).unwrap();
    assert_eq!(e["error"]["code"], "session_expired");
    assert_eq!(code, Some(1001));
}

#[tokio::test]
async fn oversize_client_message_closes_that_session_with_1009_only() {
    let (_sim, gw) =
        sim_and_gateway(SimConfig::default(), "[relay]\nmax_message_bytes = 65536\n").await;
    let mut big = connect(gw.addr).await;
    let mut other = connect(gw.addr).await;
    recv_text(&mut big).await;
    recv_text(&mut other).await;
    let payload = format!(
        "{{\"type\":\"input_audio_buffer.append\",\"audio\":\"{}\"}}",
        "A".repeat(100_000)
    );
    big.send(Message::text(payload)).await.unwrap();
    let (_, code, _) = until_close(&mut big).await;
    assert_eq!(code, Some(1009));
    let turn = one_turn(&mut other).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
}

#[tokio::test]
async fn half_open_upgrades_do_not_block_a_normal_session() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let mut stalled = Vec::new();
    for _ in 0..200 {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(
            b"GET /v1/realtime?model=gpt-realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n",
        )
        .await
        .unwrap();
        stalled.push(s);
    }
    let mut ws = connect(gw.addr).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
    drop(stalled);
}

/// A client that asked for a ~1.7 GB response and will read none of it.
async fn stalled_client(extra: &str) -> (SimHandle, Running, Client) {
    let (sim, gw) = sim_and_gateway(
        SimConfig {
            audio_deltas: 40_000,
            audio_delta_bytes: 32 * 1024,
            ..SimConfig::default()
        },
        extra,
    )
    .await;
    let mut ws = connect(gw.addr).await;
    recv_text(&mut ws).await;
    send_json(&mut ws, serde_json::json!({"type": "response.create"})).await;
    (sim, gw, ws)
}

#[tokio::test]
async fn a_client_that_stops_reading_does_not_grow_the_gateway_without_bound() {
    // The upstream tries to send ~1.7 GB of audio; the client reads nothing.
    let (sim, _gw, ws) = stalled_client("").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let at_2s = sim.stats.audio_bytes_sent.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let at_3s = sim.stats.audio_bytes_sent.load(Ordering::Relaxed);
    println!("upstream bytes sent into a stalled client: {at_3s}");
    // What is in flight is one message per hop plus the kernel's socket
    // buffers on the two loopback legs: tens of MB at most, not 1.7 GB.
    assert!(
        at_3s < 64 << 20,
        "upstream sent {at_3s} bytes into a stalled client"
    );
    assert_eq!(
        at_2s, at_3s,
        "the upstream is held back once buffers are full"
    );
    drop(ws);
}

#[tokio::test]
async fn a_client_that_stops_reading_is_still_ended_at_the_session_limit() {
    // The client reads nothing while a long response fills every buffer on
    // its leg; the gateway's error event to it can never be written. The
    // session must end anyway, its slot freed and its upstream closed.
    let (sim, gw, ws) = stalled_client("[relay]\nmax_session_secs = 1\n").await;
    // Limit (1 s) + one close grace per leg (2 s), with room to spare.
    let ended = tokio::time::timeout(Duration::from_secs(6), async {
        while gw.gateway.sessions.active() != 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(ended.is_ok(), "the session outlived its limit by > 5 s");
    assert!(
        eventually(|| sim.stats.sessions_active.load(Ordering::Relaxed) == 0).await,
        "upstream leg closed"
    );
    drop(ws);
}

#[tokio::test]
async fn admin_endpoints_report_health_readiness_and_metrics() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    assert_eq!(http_get(gw.admin_addr, "/healthz").await.0, 200);
    assert_eq!(http_get(gw.admin_addr, "/readyz").await.0, 200);
    let mut ws = connect(gw.addr).await;
    recv_text(&mut ws).await;
    let active = metric(
        gw.admin_addr,
        "patchbay_realtime_sessions_active",
        "gpt-realtime",
    )
    .await;
    assert_eq!(active, 1.0);
    ws.close(None).await.unwrap();
    let _ = until_close(&mut ws).await;
    assert!(eventually(|| gw.gateway.sessions.active() == 0).await);
    let ended = metric(
        gw.admin_addr,
        "patchbay_realtime_sessions_total",
        "client_closed",
    )
    .await;
    assert_eq!(ended, 1.0);
    let dials = metric(gw.admin_addr, "patchbay_upstream_dial_seconds_count", "").await;
    assert_eq!(dials, 1.0);
}

/// An upstream that answers the first client event with one large message
/// and its close, back to back.
async fn upstream_that_floods_then_closes(message_bytes: usize) -> std::net::SocketAddr {
    use futures_util::StreamExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(None)
            .max_frame_size(None);
        let mut ws = tokio_tungstenite::accept_async_with_config(tcp, Some(config))
            .await
            .unwrap();
        ws.send(Message::text(
            r#"{"type":"session.created","event_id":"e1","session":{"id":"sess_flood"}}"#,
        ))
        .await
        .unwrap();
        let _ = ws.next().await;
        let big = format!(
            r#"{{"type":"response.output_audio.delta","delta":"{}"}}"#,
            "A".repeat(message_bytes)
        );
        let _ = ws.feed(Message::text(big)).await;
        let _ = ws
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "done".into(),
            })))
            .await;
        // Hold the connection until the gateway drops it.
        while let Some(Ok(_)) = ws.next().await {}
    });
    addr
}

#[tokio::test]
async fn a_client_that_stopped_reading_holds_bounded_memory_and_gets_its_close_within_the_grace() {
    // The client asks for a response and stops reading; the upstream sends
    // a 32 MiB message (far past the socket buffers) and closes. The relay
    // stops reading the upstream once its queue towards the client is full
    // (it holds that queue and one message, never all the upstream sends),
    // so nothing more is read from either leg and the session ends at its
    // idle timeout (2 s here); the close to the stalled client is then
    // bounded like every other end step (an unbounded send would wait
    // forever).
    let upstream = upstream_that_floods_then_closes(32 << 20).await;
    let gw = gateway(&gateway_toml(
        &format!("ws://{upstream}/v1/realtime"),
        "[relay]\nidle_timeout_secs = 2\nmax_message_bytes = 67108864\n",
    ))
    .await;
    let mut ws = connect(gw.addr).await;
    send_json(&mut ws, serde_json::json!({"type": "response.create"})).await;
    let ended = async {
        loop {
            let n = metric(
                gw.admin_addr,
                "patchbay_realtime_sessions_total",
                "outcome=\"idle_timeout\"",
            )
            .await;
            if n >= 1.0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(WAIT, ended)
        .await
        .expect("the session ended at its idle timeout, its close to the client bounded");
    drop(ws);
}

#[tokio::test]
async fn the_admin_listener_answers_health_readiness_and_metrics_and_nothing_else() {
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    assert_eq!(
        http_get(gw.admin_addr, "/healthz").await,
        (200, "ok\n".into())
    );
    assert!(eventually(|| gw.gateway.is_ready()).await);
    assert_eq!(
        http_get(gw.admin_addr, "/readyz").await,
        (200, "ready\n".into())
    );
    let (status, body) = http_get(gw.admin_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("# TYPE patchbay_pool_warm_sockets gauge"),
        "{body}"
    );
    assert!(body.trim_end().ends_with("# EOF"), "OpenMetrics text");
    assert_eq!(http_get(gw.admin_addr, "/v1/realtime").await.0, 404);
    // Draining: not ready at once, still alive.
    gw.gateway.sessions.start_draining();
    assert_eq!(http_get(gw.admin_addr, "/readyz").await.0, 503);
    assert_eq!(http_get(gw.admin_addr, "/healthz").await.0, 200);
}

/// The gateway, the server of the client's connection, closes the TCP
/// connection once it has answered the client's close (RFC 6455 §7.1.1):
/// it used to read on for the client's EOF while the client waited for
/// the gateway's, both until the 2 s close grace ran out.
#[tokio::test]
async fn a_client_close_is_answered_and_the_connection_closed_at_once() {
    use futures_util::StreamExt;
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), "").await;
    let mut ws = connect(gw.addr).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    let started = std::time::Instant::now();
    ws.close(None).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    let took = started.elapsed();
    assert!(ended.is_ok(), "the connection never closed");
    assert!(
        took < Duration::from_millis(1500),
        "the gateway closed the connection {took:?} after the client's close"
    );
}

/// A client that closes mid-response is done at once: its connection is
/// closed and its admission slot free while the upstream leg is still
/// cancelling the response (here an upstream that reads nothing until its
/// three-second response is over). Both used to wait for the upstream
/// leg: the client's TCP connection stayed open, and a second session
/// under a cap of one was refused, until the upstream had closed.
#[tokio::test]
async fn a_client_closing_mid_response_frees_its_connection_and_slot_before_the_upstream_leg_ends()
{
    use futures_util::StreamExt;
    let sim_config = SimConfig {
        audio_deltas: 150,
        audio_delta_bytes: 16,
        delta_interval: Duration::from_millis(20),
        fault: Some(SimFault::FinishResponseBeforeClose),
        ..SimConfig::default()
    };
    let (sim, gw) = sim_and_gateway(sim_config, "[limits]\nmax_sessions = 1\n").await;
    let mut ws = connect(gw.addr).await;
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    send_json(&mut ws, serde_json::json!({"type": "response.create"})).await;
    while kind(&recv_text(&mut ws).await) != "response.output_audio.delta" {}
    ws.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "done".into(),
    }))
    .await
    .unwrap();
    let closed = tokio::time::timeout(WAIT, async { while let Some(Ok(_)) = ws.next().await {} });
    assert!(closed.await.is_ok(), "the connection never closed");
    assert_eq!(
        sim.stats.sessions_active.load(Ordering::Relaxed),
        1,
        "the client's connection closed only once the upstream leg had"
    );
    let second = open_with(gw.addr, CLIENT_KEY).await;
    assert!(
        second.is_ok(),
        "refused {:?} under a cap of one",
        second.err()
    );
    assert_eq!(
        sim.stats.sessions_active.load(Ordering::Relaxed),
        2,
        "the first session's upstream leg is still cancelling"
    );
}
