//! WebRTC translation calls (`POST /v1/realtime/translations/calls`)
//! through a gateway process in front of the simulator: admitted like any
//! call, metered over their sideband by connected time in a row per flush
//! window with a charged last row, hung up on a spent budget, controlled
//! only by their owner and at their own path; each model created at its own
//! endpoint's calls path only.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use patchbay_sim::{SimConfig, SimHandle};

const TRANSLATE: &str = "gpt-realtime-translate";
const USD_PER_MINUTE: f64 = 0.034;
const CALLS: &str = "/v1/realtime/translations/calls";

/// A browser's offer: audio and the `oai-events` data channel.
const OFFER: &str = "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n\
m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=setup:actpass\r\na=sendrecv\r\n\
a=rtcp-mux\r\na=rtpmap:111 opus/48000/2\r\n\
m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\nc=IN IP4 0.0.0.0\r\na=mid:1\r\na=sctp-port:5000\r\n";

/// The translations route on `sim` priced per minute, keys from `keys`,
/// flushed every second.
fn config(sim: &SimHandle, keys: &TempFile) -> String {
    format!(
        "[[routes]]\nmodel = \"{TRANSLATE}\"\nendpoint = \"translations\"\n\
         upstream_url = \"ws://{}/v1/realtime/translations\"\napi_key_env = \"SIM_KEY\"\n\
         [[prices]]\nmodel = \"{TRANSLATE}\"\nusd_per_minute = {USD_PER_MINUTE}\n\
         [metering]\nflush_secs = 1\n[keys]\nfile = \"{}\"\n",
        sim.addr,
        keys.0.display()
    )
}

/// A simulated speaker whose transcript arrives on the sideband every 200 ms.
fn speaker() -> SimConfig {
    SimConfig {
        caller_turn_interval: Duration::from_millis(200),
        ..SimConfig::default()
    }
}

async fn post(addr: SocketAddr, path: &str, key: &str, content_type: &str, body: &str) -> Answer {
    let bearer = format!("Bearer {key}");
    request(
        addr,
        "POST",
        path,
        &[("Authorization", &bearer), ("Content-Type", content_type)],
        body.as_bytes(),
    )
    .await
}

/// A raw SDP offer with `key`, at `path`.
async fn offer(addr: SocketAddr, path: &str, key: &str) -> Answer {
    post(addr, path, key, "application/sdp", OFFER).await
}

/// A raw SDP offer for the translation model with a Patchbay key (a
/// client secret names its model itself).
async fn offer_translation(addr: SocketAddr, key: &str) -> Answer {
    offer(addr, &format!("{CALLS}?model={TRANSLATE}"), key).await
}

fn hangups(sim: &SimHandle, call_id: &str) -> usize {
    let actions = sim.stats.calls.actions();
    actions
        .iter()
        .filter(|a| a.call_id == call_id && a.action == "hangup")
        .count()
}

fn call_rows<'a>(rows: &'a [serde_json::Value], call_id: &str) -> Vec<&'a serde_json::Value> {
    rows.iter()
        .filter(|r| r["model"] == TRANSLATE && r["call_id"] == call_id)
        .collect()
}

fn sum(rows: &[&serde_json::Value], field: &str) -> f64 {
    rows.iter().map(|r| r[field].as_f64().unwrap()).sum()
}

#[tokio::test]
async fn a_translation_call_is_metered_by_its_connected_time_in_a_row_per_window_and_hung_up_by_its_owner(
) {
    let sim = sim(speaker()).await;
    let keys = TempFile::new(
        "keys.toml",
        &(key_entry("alice", "pb-alice", "") + &key_entry("mallory", "pb-mallory", "")),
    );
    let mut gw = Child::start(&sim.url(false), &config(&sim, &keys), &[]).await;

    let a = offer_translation(gw.addr, "pb-alice").await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.header("content-type").as_deref(), Some("application/sdp"));
    assert!(a.body.contains("a=mid:0") && a.body.contains("a=setup:active"));
    let location = a.header("location").expect("a Location");
    let call_id = location
        .strip_prefix("/v1/realtime/translations/calls/")
        .expect("the gateway's own translation call path")
        .to_string();
    // Upstream: the offer with the gateway's key and a translation session
    // (the route's model, no `type`: the simulator refuses unknown fields).
    let created = sim.stats.calls.created();
    assert_eq!(created.len(), 1);
    assert_eq!(
        (created[0].key.as_str(), created[0].call_id.as_str()),
        (UPSTREAM_KEY, call_id.as_str())
    );
    assert_eq!(created[0].session.as_ref().unwrap()["model"], TRANSLATE);
    // The sideband is the translation endpoint's, opened with the call id.
    let sideband = format!("call_id={call_id}");
    assert!(
        eventually(|| sim
            .stats
            .queries
            .lock()
            .unwrap()
            .iter()
            .any(|q| q.contains(&sideband)))
        .await
    );

    // Another key, or the Realtime calls path: no such call.
    let theirs = format!("{CALLS}/{call_id}/hangup");
    let r = post(gw.addr, &theirs, "pb-mallory", "application/json", "").await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "call_not_found");
    let elsewhere = format!("/v1/realtime/calls/{call_id}/hangup");
    let r = post(gw.addr, &elsewhere, "pb-alice", "application/json", "").await;
    assert_eq!(r.status, 404, "{}", r.body);
    let r = post(
        gw.addr,
        &format!("{CALLS}/{call_id}/refer"),
        "pb-alice",
        "application/json",
        "{}",
    )
    .await;
    assert_eq!(
        r.status, 404,
        "a translation call takes a hangup only: {}",
        r.body
    );
    assert_eq!(hangups(&sim, &call_id), 0, "nothing was forwarded");

    // Connected for about 2.5 s, then hung up by its owner.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let h = post(gw.addr, &theirs, "pb-alice", "application/json", "").await;
    assert_eq!(h.status, 200, "{}", h.body);
    assert_eq!(hangups(&sim, &call_id), 1);
    let upstream_secs = sim.stats.calls.connected_secs(&call_id).unwrap();

    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = gw.stdout_rows();
    let rows = call_rows(&rows, &call_id);
    assert!(rows.len() >= 2, "a row per window: {rows:?}");
    assert!(rows
        .iter()
        .all(|r| r["transport"] == "webrtc" && r["key_id"] == "alice"));
    assert!(
        rows.iter().all(|r| r["output_audio_seconds"].is_null()),
        "a call's output audio is not seen: {rows:?}"
    );
    let billed = sum(&rows, "audio_seconds");
    assert!(
        (billed - upstream_secs).abs() < 0.15,
        "billed {billed} s, connected {upstream_secs} s upstream"
    );
    let cost = sum(&rows, "cost_usd");
    let expected = billed / 60.0 * USD_PER_MINUTE;
    assert!(
        (cost - expected).abs() / expected < 0.01,
        "{cost} vs {expected}"
    );
    let last = rows.last().unwrap();
    assert!(
        last["cost_usd"].as_f64().unwrap() > 0.0,
        "the last row is charged: {last}"
    );
}

#[tokio::test]
async fn a_spent_budget_hangs_a_translation_call_up_within_a_window_with_a_charged_last_row() {
    let sim = sim(speaker()).await;
    // $0.001 is 1.76 s of a call at $0.034 a minute.
    let keys = TempFile::new(
        "keys.toml",
        &key_entry("small", "pb-small", "budget_usd = 0.001"),
    );
    let mut gw = Child::start(&sim.url(false), &config(&sim, &keys), &[]).await;
    let started = tokio::time::Instant::now();
    let a = offer_translation(gw.addr, "pb-small").await;
    assert_eq!(a.status, 201, "{}", a.body);
    let call_id = a
        .header("location")
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    let hung_up = async {
        while hangups(&sim, &call_id) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(6), hung_up)
        .await
        .expect("the gateway hung the call up");
    assert!(
        started.elapsed() < Duration::from_millis(3500),
        "within a window of running out: {:?}",
        started.elapsed()
    );
    assert!(sim.stats.calls.ended(&call_id));
    let next = offer_translation(gw.addr, "pb-small").await;
    assert_eq!(next.status, 402, "{}", next.body);
    assert_eq!(
        sim.stats.calls.created().len(),
        1,
        "refused before upstream"
    );

    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = gw.stdout_rows();
    let rows = call_rows(&rows, &call_id);
    let cost = sum(&rows, "cost_usd");
    assert!(cost >= 0.001, "the call's rows are charged: {rows:?}");
    assert!(rows.last().unwrap()["cost_usd"].as_f64().unwrap() > 0.0);
}

#[tokio::test]
async fn a_model_is_created_at_its_own_endpoints_calls_path_only() {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new("keys.toml", &key_entry("alice", "pb-alice", ""));
    let signing = TempFile::new(
        "signing.key",
        &format!("{}\n", "call-signing-key-".repeat(3)),
    );
    let secrets = format!(
        "[client_secrets]\nsigning_key_files = [\"{}\"]\n",
        signing.0.display()
    );
    let toml = config(&sim, &keys) + &secrets;
    let mut gw = Child::start(&sim.url(false), &toml, &[]).await;
    let wrong = format!("/v1/realtime/calls?model={TRANSLATE}");
    let r = offer(gw.addr, &wrong, "pb-alice").await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "wrong_endpoint");
    assert!(r.body.contains(CALLS), "{}", r.body);
    let r = offer(gw.addr, &format!("{CALLS}?model={MODEL}"), "pb-alice").await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "wrong_endpoint");
    assert!(
        sim.stats.calls.created().is_empty(),
        "nothing went upstream"
    );
    // The Azure-style prefix serves it too; the session names the model.
    let session = serde_json::json!({"sdp": OFFER, "session": {"model": TRANSLATE,
        "audio": {"output": {"language": "de"}}}});
    let r = post(
        gw.addr,
        "/openai/v1/realtime/translations/calls",
        "pb-alice",
        "application/json",
        &session.to_string(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let created = sim.stats.calls.created();
    assert_eq!(
        created[0].session.as_ref().unwrap()["audio"]["output"]["language"],
        "de"
    );
    let id = r
        .header("location")
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();

    // A browser's call: a translation client secret, its raw offer naming
    // no model (the secret's), configured by the secret.
    let mint = serde_json::json!({"session": {"model": TRANSLATE,
        "audio": {"output": {"language": "fr"}}}});
    let minted = post(
        gw.addr,
        "/v1/realtime/translations/client_secrets",
        "pb-alice",
        "application/json",
        &mint.to_string(),
    )
    .await;
    assert_eq!(minted.status, 200, "{}", minted.body);
    let secret = minted.json()["value"].as_str().unwrap().to_string();
    let r = offer(gw.addr, CALLS, &secret).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let created = sim.stats.calls.created();
    let session = created[1].session.as_ref().unwrap();
    assert_eq!(
        (&session["model"], &session["audio"]["output"]["language"]),
        (&serde_json::json!(TRANSLATE), &serde_json::json!("fr"))
    );
    let h = post(
        gw.addr,
        &format!("{CALLS}/{id}/hangup"),
        "pb-alice",
        "application/json",
        "",
    )
    .await;
    assert_eq!(h.status, 200, "{}", h.body);
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
}
