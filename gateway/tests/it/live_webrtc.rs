//! GPT-Live WebRTC sessions (`POST /v1/live/sessions`) through a real
//! gateway process in front of the simulator: created after admission (the
//! key's models, its budget), owned by the key that created them (anyone
//! else's hangup, recording download or fork is 404), metered over the
//! `/attach` sideband by the cumulative seconds it reports and charged
//! exactly the upstream's figure, forked as new sessions of the parent's
//! model, and with Redis adopted by another process when the metering one
//! dies.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use patchbay_sim::{LiveFault, LiveSim, SimConfig, SimHandle};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Error as WsError;

const LIVE: &str = "gpt-live-1";
const USD_PER_MINUTE: f64 = 0.05;
const OFFER: &str = "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\n\
m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n\
a=setup:actpass\r\na=mid:0\r\na=sendrecv\r\na=rtpmap:111 opus/48000/2\r\n";

/// A simulator whose Live sessions bill a minute per real second,
/// reported every 50 ms.
async fn live_sim() -> SimHandle {
    sim(SimConfig {
        live: LiveSim {
            usage_interval: Duration::from_millis(50),
            time_scale: 60.0,
            fault: None,
        },
        ..SimConfig::default()
    })
    .await
}

/// A gateway serving the Live route on `sim` with `extra` config and the keys
/// file `keys`, which lives as long as the returned file does.
async fn live_gateway(sim: &SimHandle, keys: &str, extra: &str) -> (Child, TempFile) {
    let file = TempFile::new("keys.toml", keys);
    let config = format!(
        "{}{extra}[keys]\nfile = \"{}\"\n",
        live_config(sim),
        file.0.display()
    );
    (Child::start(&sim.url(false), &config, &[]).await, file)
}

/// The Live route on `sim`, priced per minute, a flush every second.
fn live_config(sim: &SimHandle) -> String {
    format!(
        "[[routes]]\nmodel = \"{LIVE}\"\nendpoint = \"live\"\nupstream_url = \"ws://{}/v1/live/sessions\"\n\
         api_key_env = \"SIM_KEY\"\n[[prices]]\nmodel = \"{LIVE}\"\nusd_per_minute = {USD_PER_MINUTE}\n\
         [metering]\nflush_secs = 1\n",
        sim.addr
    )
}

async fn post(addr: SocketAddr, key: &str, path: &str, body: &Value) -> Answer {
    let bearer = format!("Bearer {key}");
    let headers = [
        ("Authorization", bearer.as_str()),
        ("Content-Type", "application/json"),
    ];
    request(addr, "POST", path, &headers, body.to_string().as_bytes()).await
}

async fn get(addr: SocketAddr, key: &str, path: &str) -> Answer {
    let bearer = format!("Bearer {key}");
    request(
        addr,
        "GET",
        path,
        &[("Authorization", bearer.as_str())],
        b"",
    )
    .await
}

/// `client.live.create(session={"model": model}, transport=…)`.
async fn create(addr: SocketAddr, key: &str, model: &str) -> Answer {
    let body = json!({"session": {"model": model, "instructions": "be brief"},
                      "transport": {"type": "webrtc", "sdp": OFFER}});
    post(addr, key, "/v1/live/sessions", &body).await
}

async fn fork(addr: SocketAddr, key: &str, id: &str) -> Answer {
    let body = json!({"transport": {"type": "webrtc", "sdp": OFFER}});
    post(addr, key, &format!("/v1/live/sessions/{id}/fork"), &body).await
}

async fn act(addr: SocketAddr, key: &str, id: &str, action: &str) -> Answer {
    post(
        addr,
        key,
        &format!("/v1/live/sessions/{id}/{action}"),
        &json!({}),
    )
    .await
}

/// `client.live.sideband.connect(session_id=id)`: the socket, or the
/// refusal's status and body.
async fn attach(
    addr: SocketAddr,
    key: &str,
    id: &str,
    query: &str,
) -> Result<Client, (u16, Value)> {
    ws_at(addr, key, &format!("/v1/live/sessions/{id}/attach{query}")).await
}

/// A WebSocket to `path` with `key`.
async fn ws_at(addr: SocketAddr, key: &str, path: &str) -> Result<Client, (u16, Value)> {
    let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
    let bearer = format!("Bearer {key}");
    request
        .headers_mut()
        .insert("authorization", bearer.parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    match tokio_tungstenite::client_async(request, tcp).await {
        Ok((ws, _)) => Ok(ws),
        Err(WsError::Http(r)) => {
            let body = r.body().clone().unwrap_or_default();
            Err((
                r.status().as_u16(),
                serde_json::from_slice(&body).unwrap_or(Value::Null),
            ))
        }
        Err(e) => panic!("{e}"),
    }
}

/// `client.live.forks.connect(session_id=id)`: the socket, or the
/// refusal's status and body.
async fn fork_ws(addr: SocketAddr, key: &str, id: &str) -> Result<Client, (u16, Value)> {
    ws_at(addr, key, &format!("/v1/live/sessions/{id}/fork")).await
}

fn id_of(a: &Answer) -> String {
    assert_eq!(a.status, 200, "{}", a.body);
    let v = a.json();
    assert_eq!(v["transport"]["type"], "webrtc", "{v}");
    assert!(
        v["transport"]["sdp"].as_str().unwrap().contains("a=mid:0"),
        "{v}"
    );
    v["session"]["id"].as_str().unwrap().to_string()
}

fn rows_of(rows: &[Value], id: &str) -> Vec<Value> {
    rows.iter()
        .filter(|r| r["live_session_id"] == id)
        .cloned()
        .collect()
}

fn seconds(rows: &[Value]) -> f64 {
    rows.iter()
        .map(|r| r["audio_seconds"].as_f64().unwrap())
        .sum()
}

#[tokio::test]
async fn a_live_webrtc_session_is_metered_over_its_sideband_and_charged_exactly_its_seconds() {
    let sim = live_sim().await;
    let mut gw = Child::start(&sim.url(false), &live_config(&sim), &[]).await;
    let id = id_of(&create(gw.addr, CLIENT_KEY, LIVE).await);
    assert!(id.starts_with("live_"), "{id}");
    let created = sim.stats.calls.created();
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].session.as_ref().unwrap()["model"], LIVE);
    assert_eq!(
        created[0].key, UPSTREAM_KEY,
        "forwarded with the upstream key"
    );
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(act(gw.addr, CLIENT_KEY, &id, "hangup").await.status, 200);
    let recording = get(
        gw.addr,
        CLIENT_KEY,
        &format!("/v1/live/sessions/{id}/content"),
    )
    .await;
    assert_eq!(recording.status, 200, "the ended session's recording");
    assert_eq!(recording.body.len(), patchbay_sim::LIVE_RECORDING_BYTES);
    tokio::time::sleep(Duration::from_millis(500)).await;
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = rows_of(&gw.stdout_rows(), &id);
    let billed = sim.stats.live_seconds.load(Ordering::Relaxed) as f64;
    assert!(billed >= 60.0, "a simulated minute: {billed}");
    assert!(rows.len() >= 2, "windows and a last row: {rows:?}");
    assert!(
        (seconds(&rows) - billed).abs() < 1e-6,
        "charged {} for {billed}: {rows:?}",
        seconds(&rows)
    );
    let cost: f64 = rows.iter().map(|r| r["cost_usd"].as_f64().unwrap()).sum();
    assert!(
        (cost - billed / 60.0 * USD_PER_MINUTE).abs() < 1e-9,
        "{rows:?}"
    );
    let last = rows.last().unwrap();
    assert_eq!(last["end_reason"], "session_closed", "{rows:?}");
    assert!(rows.iter().all(|r| r["transport"] == "webrtc"), "{rows:?}");
}

#[tokio::test]
async fn another_keys_hangup_recording_fork_and_control_of_a_live_session_are_404() {
    let sim = live_sim().await;
    let (gw, _keys) = live_gateway(
        &sim,
        &(key_entry("owner", "pb-owner", "") + &key_entry("other", "pb-other", "")),
        "",
    )
    .await;
    let id = id_of(&create(gw.addr, "pb-owner", LIVE).await);
    let content = format!("/v1/live/sessions/{id}/content");
    // Every endpoint's 404 for the id is the same Live error.
    let mut answers = Vec::new();
    for action in ["hangup", "refer", "reject", "accept"] {
        let a = act(gw.addr, "pb-other", &id, action).await;
        answers.push((action, a.status, a.json()));
    }
    let a = get(gw.addr, "pb-other", &content).await;
    answers.push(("content", a.status, a.json()));
    let a = fork(gw.addr, "pb-other", &id).await;
    answers.push(("fork", a.status, a.json()));
    let (status, body) = attach(gw.addr, "pb-other", &id, "").await.err().unwrap();
    answers.push(("attach", status, body));
    let (status, body) = fork_ws(gw.addr, "pb-other", &id).await.err().unwrap();
    answers.push(("fork websocket", status, body));
    for (what, status, body) in &answers {
        assert_eq!(*status, 404, "{what}: {body}");
        assert_eq!(body, &answers[0].2, "{what}");
    }
    let error = &answers[0].2["error"];
    assert_eq!(error["code"], "session_not_found", "{error}");
    assert_eq!(error["type"], "invalid_request_error", "{error}");
    assert!(error["message"].as_str().unwrap().contains(&id), "{error}");
    assert!(
        sim.stats.calls.actions().is_empty(),
        "nothing went upstream"
    );
    assert_eq!(sim.stats.calls.created().len(), 1, "no fork went upstream");

    // The owner's fork is a new session of the parent's model.
    let child = id_of(&fork(gw.addr, "pb-owner", &id).await);
    assert_ne!(child, id);
    assert_eq!(sim.stats.calls.created().len(), 2);
    assert_eq!(get(gw.addr, "pb-owner", &content).await.status, 200);
    assert_eq!(act(gw.addr, "pb-other", &child, "hangup").await.status, 404);
    for s in [&id, &child] {
        assert_eq!(act(gw.addr, "pb-owner", s, "hangup").await.status, 200);
        assert!(sim.stats.calls.ended(s));
    }
    let unknown = act(gw.addr, "pb-owner", "live_unknown", "hangup").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"]["code"], "session_not_found");
    // A call's own 404 keeps the calls API's code.
    let call = post(
        gw.addr,
        "pb-owner",
        "/v1/realtime/calls/rtc_unknown/hangup",
        &json!({}),
    )
    .await;
    assert_eq!(call.status, 404, "{}", call.body);
    assert_eq!(call.json()["error"]["code"], "call_not_found");
}

#[tokio::test]
async fn a_create_is_refused_by_the_keys_models_and_a_spent_budget_before_anything_goes_upstream() {
    let sim = live_sim().await;
    let (gw, _keys) = live_gateway(
        &sim,
        &(key_entry("narrow", "pb-narrow", "models = [\"gpt-realtime\"]")
            + &key_entry("broke", "pb-broke", "budget_usd = 0.0")
            + &key_entry("wide", "pb-wide", "models = [\"gpt-live-1\"]")),
        "",
    )
    .await;
    let narrow = create(gw.addr, "pb-narrow", LIVE).await;
    assert_eq!(narrow.status, 403, "{}", narrow.body);
    let broke = create(gw.addr, "pb-broke", LIVE).await;
    assert_eq!(broke.status, 402, "{}", broke.body);
    assert_eq!(broke.json()["error"]["code"], "insufficient_quota");
    let realtime = create(gw.addr, "pb-wide", MODEL).await;
    assert_eq!(
        realtime.json()["error"]["code"],
        "wrong_endpoint",
        "{}",
        realtime.body
    );
    let bad = post(
        gw.addr,
        "pb-wide",
        "/v1/live/sessions",
        &json!({"session": {"model": LIVE}, "transport": {"type": "webrtc"}}),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(
        sim.stats.calls.created().is_empty(),
        "nothing went upstream"
    );
    let wide = create(gw.addr, "pb-wide", LIVE).await;
    assert_eq!(wide.status, 200, "{}", wide.body);
}

#[tokio::test]
async fn with_redis_a_live_session_is_adopted_when_its_metering_process_dies_and_charged_once() {
    let Some(url) = redis_url("live session hand-over between processes") else {
        return;
    };
    let sim = live_sim().await;
    let extra = format!(
        "{}[store]\nredis_url_env = \"{REDIS_ENV}\"\n",
        live_config(&sim)
    );
    let env = [(REDIS_ENV, url.as_str())];
    let mut first = Child::start(&sim.url(false), &extra, &env).await;
    let mut second = Child::start(&sim.url(false), &extra, &env).await;
    let id = id_of(&create(first.addr, CLIENT_KEY, LIVE).await);
    // A few windows charged by the first, then it dies.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    first.process.kill().unwrap();
    let _ = first.process.wait();
    let first_rows = rows_of(&first.stdout_rows(), &id);
    assert!(!first_rows.is_empty(), "the first process metered windows");
    // The second adopts it once the hold lapses, and meters from there.
    tokio::time::sleep(patchbay_gateway::calls::fleet::HOLD_TTL + Duration::from_secs(4)).await;
    assert_eq!(
        act(second.addr, CLIENT_KEY, &id, "hangup").await.status,
        200
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    second.sigterm();
    second.wait_exit(Duration::from_secs(15)).await;
    let second_rows = rows_of(&second.stdout_rows(), &id);
    assert!(!second_rows.is_empty(), "the second process metered it");
    let billed = sim.stats.live_seconds.load(Ordering::Relaxed) as f64;
    let charged = seconds(&first_rows) + seconds(&second_rows);
    assert!(
        (charged - billed).abs() < 1e-6,
        "charged {charged} for {billed}: {first_rows:?} {second_rows:?}"
    );
    assert_eq!(second_rows.last().unwrap()["end_reason"], "session_closed");
}

#[tokio::test]
async fn a_clients_attach_is_relayed_for_its_owner_only_and_the_session_is_charged_once() {
    let sim = sim(SimConfig {
        keys: vec![UPSTREAM_KEY.into()],
        live: LiveSim {
            usage_interval: Duration::from_millis(50),
            time_scale: 60.0,
            fault: None,
        },
        ..SimConfig::default()
    })
    .await;
    let (mut gw, _keys) = live_gateway(
        &sim,
        &(key_entry("owner", "pb-owner", "") + &key_entry("other", "pb-other", "")),
        "",
    )
    .await;
    let id = id_of(&create(gw.addr, "pb-owner", LIVE).await);
    let upgrades = || sim.stats.upgrades.load(Ordering::Relaxed);
    assert!(
        eventually(|| upgrades() == 1).await,
        "the gateway's sideband"
    );

    let (status, body) = attach(gw.addr, "pb-other", &id, "").await.err().unwrap();
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "session_not_found", "{body}");
    let (status, _) = attach(gw.addr, "pb-owner", "live_unknown", "")
        .await
        .err()
        .unwrap();
    assert_eq!(status, 404);
    assert_eq!(upgrades(), 1, "nothing went upstream");

    // The owner's attach: upstream with the upstream key (the simulator
    // takes no other) and its graceful_close, events both ways.
    let mut ws = attach(gw.addr, "pb-owner", &id, "?graceful_close=true")
        .await
        .unwrap();
    assert_eq!(upgrades(), 2);
    let queries = sim.stats.queries.lock().unwrap().clone();
    assert!(
        queries.iter().any(|q| q == "graceful_close=true"),
        "{queries:?}"
    );
    assert_eq!(kind(&recv_text(&mut ws).await), "session.usage.updated");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    send_json(&mut ws, json!({"type": "session.close"})).await;
    let (texts, _, _) = until_close(&mut ws).await;
    let closed = texts
        .iter()
        .find(|t| kind(t) == "session.closed")
        .expect("session.closed relayed");
    assert!(
        sim.stats.calls.ended(&id),
        "the client's session.close went upstream"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = rows_of(&gw.stdout_rows(), &id);
    let billed = sim.stats.live_seconds.load(Ordering::Relaxed) as f64;
    let final_seconds = serde_json::from_str::<Value>(closed).unwrap()["usage"]["seconds"]
        .as_f64()
        .unwrap();
    assert_eq!(final_seconds, billed);
    assert!(billed >= 60.0, "{billed}");
    assert!(
        (seconds(&rows) - billed).abs() < 1e-6,
        "charged {} for {billed} with a client attached: {rows:?}",
        seconds(&rows)
    );
    assert_eq!(rows.last().unwrap()["end_reason"], "session_closed");
}

#[tokio::test]
async fn a_websocket_fork_is_a_new_session_of_the_parents_model_admitted_for_the_forking_key() {
    let sim = live_sim().await;
    let (mut gw, _keys) = live_gateway(
        &sim,
        &(key_entry("owner", "pb-owner", "team = \"t\"")
            + &key_entry("broke", "pb-broke", "team = \"t\"\nbudget_usd = 0.0")
            + &key_entry("other", "pb-other", "")),
        "",
    )
    .await;
    let parent = id_of(&create(gw.addr, "pb-owner", LIVE).await);
    let upgrades = || sim.stats.upgrades.load(Ordering::Relaxed);
    assert!(
        eventually(|| upgrades() == 1).await,
        "the gateway's sideband"
    );

    let (status, body) = fork_ws(gw.addr, "pb-other", &parent).await.err().unwrap();
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "session_not_found", "{body}");
    // Of the owner's team, but out of budget: refused after the upgrade, as
    // a Live start is, before anything is dialled.
    let mut broke = fork_ws(gw.addr, "pb-broke", &parent).await.unwrap();
    send_json(&mut broke, json!({"type": "session.start", "session": {}})).await;
    let (texts, code, _) = until_close(&mut broke).await;
    assert_eq!(kind(&texts[0]), "error", "{texts:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&texts[0]).unwrap()["error"]["code"],
        "insufficient_quota"
    );
    assert_eq!(code, Some(1008));
    let mut named = fork_ws(gw.addr, "pb-owner", &parent).await.unwrap();
    send_json(
        &mut named,
        json!({"type": "session.start", "session": {"model": LIVE}}),
    )
    .await;
    let (texts, _, _) = until_close(&mut named).await;
    assert!(texts[0].contains("invalid_value"), "{texts:?}");
    assert_eq!(upgrades(), 1, "nothing went upstream");

    let mut ws = fork_ws(gw.addr, "pb-owner", &parent).await.unwrap();
    send_json(
        &mut ws,
        json!({"type": "session.start", "event_id": "f1", "session": {}}),
    )
    .await;
    let started: Value = serde_json::from_str(&recv_text(&mut ws).await).unwrap();
    assert_eq!(started["type"], "session.started", "{started}");
    assert_eq!(started["session"]["model"], LIVE, "the parent's model");
    let child = started["session"]["id"].as_str().unwrap().to_string();
    assert_ne!(child, parent);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    send_json(&mut ws, json!({"type": "session.close"})).await;
    let (texts, _, _) = until_close(&mut ws).await;
    let closed = texts.iter().find(|t| kind(t) == "session.closed").unwrap();
    let final_seconds = serde_json::from_str::<Value>(closed).unwrap()["usage"]["seconds"]
        .as_f64()
        .unwrap();
    assert!(final_seconds >= 60.0, "{final_seconds}");
    assert_eq!(
        act(gw.addr, "pb-owner", &parent, "hangup").await.status,
        200
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = rows_of(&gw.stdout_rows(), &child);
    assert!(
        (seconds(&rows) - final_seconds).abs() < 1e-6,
        "the fork charged {} for {final_seconds}: {rows:?}",
        seconds(&rows)
    );
    assert!(
        rows.iter().all(|r| r["transport"] == "websocket"),
        "{rows:?}"
    );
    assert!(rows.iter().all(|r| r["key_id"] == "owner"), "{rows:?}");
}

/// How a gateway-ended WebRTC Live session ended: the rows of the session,
/// the simulator's bill, and how long after the create the gateway's hangup
/// reached the simulator.
struct HungUp {
    rows: Vec<Value>,
    billed: f64,
    after: Duration,
}

/// A session of `key` (in `keys`) on a gateway with `extra` config, ended by
/// the gateway once `meanwhile` has done its part; fails unless the gateway
/// hangs it up with the upstream key.
async fn hung_up_by_the_gateway<F, Fut>(keys: &str, extra: &str, meanwhile: F) -> HungUp
where
    F: FnOnce(std::path::PathBuf) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let sim = live_sim().await;
    let (mut gw, keys) = live_gateway(&sim, keys, extra).await;
    let began = tokio::time::Instant::now();
    let id = id_of(&create(gw.addr, "pb-live", LIVE).await);
    meanwhile(keys.0.clone()).await;
    let hung_up = || {
        sim.stats
            .calls
            .actions()
            .iter()
            .any(|a| a.call_id == id && a.action == "hangup" && a.key == UPSTREAM_KEY)
    };
    assert!(eventually(hung_up).await, "the gateway hung the session up");
    let after = began.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    HungUp {
        rows: rows_of(&gw.stdout_rows(), &id),
        billed: sim.stats.live_seconds.load(Ordering::Relaxed) as f64,
        after,
    }
}

/// The final row of a session the gateway hung up for `reason`: charged
/// the upstream's own final figure (read from `session.closed`), not an
/// estimate.
fn charged_final_row(h: &HungUp, reason: &str) {
    let last = h.rows.last().expect("rows");
    assert_eq!(last["end_reason"], reason, "{:?}", h.rows);
    assert_eq!(last["usage_estimated"], false, "{:?}", h.rows);
    assert!(h.billed > 0.0);
    assert!(
        (seconds(&h.rows) - h.billed).abs() < 1e-6,
        "charged {} for {}: {:?}",
        seconds(&h.rows),
        h.billed,
        h.rows
    );
}

#[tokio::test]
async fn a_budget_spent_mid_session_hangs_a_live_webrtc_session_up_within_a_window() {
    // $0.02 is 24 billed seconds: under half a real second here.
    let keys = key_entry("live", "pb-live", "budget_usd = 0.02");
    let h = hung_up_by_the_gateway(&keys, "", |_| async {}).await;
    assert!(
        h.after < Duration::from_millis(3000),
        "within a window of running out: {:?}",
        h.after
    );
    charged_final_row(&h, "budget_exhausted");
    assert!(h.billed >= 24.0, "{}", h.billed);
}

#[tokio::test]
async fn a_revoked_key_hangs_its_live_webrtc_session_up_with_a_charged_final_row() {
    let keys = key_entry("live", "pb-live", "") + &key_entry("stays", "pb-stays", "");
    let h = hung_up_by_the_gateway(&keys, "", |file| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(file, key_entry("stays", "pb-stays", "")).unwrap();
    })
    .await;
    charged_final_row(&h, "key_revoked");
    assert_eq!(h.rows.last().unwrap()["key_id"], "live");
}

#[tokio::test]
async fn max_session_secs_hangs_a_live_webrtc_session_up_with_a_charged_final_row() {
    let keys = key_entry("live", "pb-live", "");
    let h = hung_up_by_the_gateway(&keys, "[relay]\nmax_session_secs = 2\n", |_| async {}).await;
    assert!(
        h.after >= Duration::from_secs(2) && h.after < Duration::from_secs(4),
        "{:?}",
        h.after
    );
    charged_final_row(&h, "max_session_duration");
}

#[tokio::test]
async fn a_live_webrtc_session_whose_sideband_closes_without_session_closed_is_charged_an_estimate()
{
    let sim = sim(SimConfig {
        live: LiveSim {
            usage_interval: Duration::from_millis(50),
            time_scale: 1.0,
            fault: Some(LiveFault::NoClosed),
        },
        ..SimConfig::default()
    })
    .await;
    let mut gw = Child::start(&sim.url(false), &live_config(&sim), &[]).await;
    let id = id_of(&create(gw.addr, CLIENT_KEY, LIVE).await);
    tokio::time::sleep(Duration::from_millis(2600)).await;
    assert_eq!(act(gw.addr, CLIENT_KEY, &id, "hangup").await.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = rows_of(&gw.stdout_rows(), &id);
    let billed = sim.stats.live_seconds.load(Ordering::Relaxed) as f64;
    assert_eq!(billed, 2.0, "the upstream's own figure");
    let last = rows.last().expect("rows");
    assert_eq!(last["usage_estimated"], true, "{rows:?}");
    assert!(
        rows.iter()
            .rev()
            .skip(1)
            .all(|r| r["usage_estimated"] == false),
        "only the last row is an estimate: {rows:?}"
    );
    // The last figure seen (2 s, reported within 50 ms of the end) plus
    // the time since it: never below the figure, never $0.
    let charged = seconds(&rows);
    assert!(
        (2.0..2.5).contains(&charged),
        "charged {charged} for a last figure of 2: {rows:?}"
    );
}

#[tokio::test]
async fn a_drain_without_a_store_hangs_a_live_webrtc_session_up_with_a_charged_final_row() {
    // Without Redis no other replica would meter it: the drain hangs it up
    // before its wait ends, and its final figure is charged.
    let sim = live_sim().await;
    let keys = key_entry("live", "pb-live", "");
    let (mut gw, _keys) = live_gateway(&sim, &keys, "[drain]\nwait_secs = 3\n").await;
    let id = id_of(&create(gw.addr, "pb-live", LIVE).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let hung_up = || {
        sim.stats
            .calls
            .actions()
            .iter()
            .any(|a| a.call_id == id && a.action == "hangup" && a.key == UPSTREAM_KEY)
    };
    assert!(!hung_up(), "nothing hangs it up before the drain");
    gw.sigterm();
    assert!(eventually(hung_up).await, "the drain hung the session up");
    let (_, took) = gw.wait_exit(Duration::from_secs(15)).await;
    assert!(
        took < Duration::from_secs(6),
        "exit within the drain wait: {took:?}"
    );
    let h = HungUp {
        rows: rows_of(&gw.stdout_rows(), &id),
        billed: sim.stats.live_seconds.load(Ordering::Relaxed) as f64,
        after: Duration::ZERO,
    };
    charged_final_row(&h, "shutdown");
}
