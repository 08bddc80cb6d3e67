//! GPT-Live sessions (`/v1/live/sessions`, primary WebSocket): admitted on
//! their `session.start`, metered by the upstream's cumulative seconds
//! (charged by their increase, whatever the events' order, repetition or
//! loss), a final row for every end, a spent budget ending the session
//! within a window, and every refusal before a dial.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use http::HeaderValue;
use patchbay_sim::{LiveFault, LiveSim, SimConfig, SimHandle};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const LIVE: &str = "gpt-live-1";
const USD_PER_MINUTE: f64 = 0.05;

/// A simulator whose Live sessions bill a minute per real second,
/// reported every 50 ms.
async fn live_sim(fault: Option<LiveFault>) -> SimHandle {
    sim(SimConfig {
        live: LiveSim {
            usage_interval: Duration::from_millis(50),
            time_scale: 60.0,
            fault,
        },
        record: true,
        ..SimConfig::default()
    })
    .await
}

/// A Live route `model` on `sim`, and its per-minute price.
fn live_route(model: &str, sim: &SimHandle) -> String {
    format!(
        "[[routes]]\nmodel = \"{model}\"\nendpoint = \"live\"\nupstream_url = \"ws://{}/v1/live/sessions\"\n\
         api_key_env = \"SIM_KEY\"\nupstream_model = \"{LIVE}\"\n\
         [[prices]]\nmodel = \"{model}\"\nusd_per_minute = {USD_PER_MINUTE}\n",
        sim.addr
    )
}

async fn connect_live(addr: std::net::SocketAddr, key: &str) -> Client {
    try_live(addr, key).await.expect("upgraded")
}

async fn try_live(
    addr: std::net::SocketAddr,
    key: &str,
) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
    let mut request = format!("ws://{addr}/v1/live/sessions")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
    );
    let tcp = TcpStream::connect(addr).await.unwrap();
    tokio::time::timeout(WAIT, tokio_tungstenite::client_async(request, tcp))
        .await
        .expect("upgrade answered in time")
        .map(|(ws, _)| ws)
}

/// A gateway with the Live route on `s`, keys from `keys`, and a flush
/// every second.
async fn keyed_gateway(s: &SimHandle, keys: &TempFile) -> Child {
    Child::start(
        &s.url(false),
        &format!(
            "{}[metering]\nflush_secs = 1\n[keys]\nfile = \"{}\"\n",
            live_route(LIVE, s),
            keys.0.display()
        ),
        &[],
    )
    .await
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

/// Sends `session.start` for `model`; the first event back.
async fn start(ws: &mut Client, model: &str) -> Value {
    send_json(
        ws,
        json!({"type": "session.start", "event_id": "start_1",
               "session": {"model": model, "instructions": "be brief"}}),
    )
    .await;
    json_of(&recv_text(ws).await)
}

/// Reads events for `d`; the highest usage figure seen.
async fn listen(ws: &mut Client, d: Duration) -> f64 {
    let mut highest: f64 = 0.0;
    let until = tokio::time::Instant::now() + d;
    while let Ok(r) = tokio::time::timeout_at(until, recv(ws)).await {
        match r {
            Received::Text(t) => {
                let v = json_of(&t);
                assert_ne!(v["type"], "error", "{v}");
                if let Some(s) = v["usage"]["seconds"].as_f64() {
                    highest = highest.max(s);
                }
            }
            _ => panic!("the session ended early"),
        }
    }
    highest
}

fn rows_of<'a>(rows: &'a [Value], model: &str) -> Vec<&'a Value> {
    rows.iter().filter(|r| r["model"] == model).collect()
}

fn seconds(rows: &[&Value]) -> f64 {
    rows.iter()
        .map(|r| r["audio_seconds"].as_f64().unwrap())
        .sum()
}

fn cost(rows: &[&Value]) -> f64 {
    rows.iter().map(|r| r["cost_usd"].as_f64().unwrap()).sum()
}

#[tokio::test]
async fn a_live_session_is_charged_exactly_the_upstreams_seconds_whatever_its_usage_events_say() {
    // One simulator per way of reporting, each behind its own route.
    let ways = [
        ("gpt-live-plain", None),
        ("gpt-live-repeated", Some(LiveFault::UsageRepeated)),
        ("gpt-live-reordered", Some(LiveFault::UsageReordered)),
        ("gpt-live-lost", Some(LiveFault::UsageLost)),
    ];
    let mut sims = Vec::new();
    let mut config = String::new();
    for (model, fault) in ways {
        let s = live_sim(fault).await;
        config += &live_route(model, &s);
        sims.push(s);
    }
    let mut gw = Child::start(
        &sims[0].url(false),
        &(config + "[metering]\nflush_secs = 1\n"),
        &[],
    )
    .await;
    let sessions = ways.iter().map(|(model, _)| {
        let addr = gw.addr;
        async move {
            let mut ws = connect_live(addr, CLIENT_KEY).await;
            let started = start(&mut ws, model).await;
            assert_eq!(started["type"], "session.started", "{started}");
            assert_eq!(started["client_event_id"], "start_1");
            // The upstream's model, as the route maps it.
            assert_eq!(started["session"]["model"], LIVE);
            let id = started["session"]["id"].as_str().unwrap().to_string();
            listen(&mut ws, Duration::from_millis(1600)).await;
            send_json(&mut ws, json!({"type": "session.close"})).await;
            let (texts, _, _) = until_close(&mut ws).await;
            let closed = texts
                .iter()
                .map(|t| json_of(t))
                .find(|v| v["type"] == "session.closed")
                .expect("session.closed");
            (id, closed["usage"]["seconds"].as_f64().unwrap())
        }
    });
    let results = futures_util::future::join_all(sessions).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = gw.stdout_rows();
    for (((model, _), s), (id, final_seconds)) in ways.iter().zip(&sims).zip(&results) {
        let rows = rows_of(&rows, model);
        let billed = s.stats.live_seconds.load(Ordering::Relaxed) as f64;
        assert!(
            billed >= 60.0,
            "{model}: the session ran a simulated minute"
        );
        assert_eq!(billed, *final_seconds, "{model}");
        assert!(rows.len() >= 2, "{model}: windows and a last row: {rows:?}");
        assert!(
            (seconds(&rows) - billed).abs() < 1e-6,
            "{model}: charged {} for {billed}: {rows:?}",
            seconds(&rows)
        );
        let expected = billed / 60.0 * USD_PER_MINUTE;
        assert!((cost(&rows) - expected).abs() < 1e-9, "{model}: {rows:?}");
        let last = rows.last().unwrap();
        assert_eq!(
            (&last["end_reason"], &last["status"]),
            (&json!("session_closed"), &json!(200))
        );
        for r in &rows {
            assert_eq!(r["live_session_id"], id.as_str());
            assert_eq!(r["transport"], "websocket");
            assert_eq!(r["usage_estimated"], false);
            assert_eq!(r["upstream_model"], LIVE);
        }
        // What went upstream: one session.start, naming the upstream's
        // model, no model in the URL.
        let received = s.stats.received.lock().unwrap().clone();
        let starts: Vec<&String> = received
            .iter()
            .filter(|t| kind(t) == "session.start")
            .collect();
        assert_eq!(starts.len(), 1, "{received:?}");
        assert_eq!(json_of(starts[0])["session"]["model"], LIVE);
        assert!(s
            .stats
            .queries
            .lock()
            .unwrap()
            .iter()
            .all(|q| !q.contains("model")));
    }
}

#[tokio::test]
async fn a_spent_budget_ends_a_live_session_within_a_window_with_a_charged_last_row() {
    let s = live_sim(None).await;
    // $0.02 is 24 billed seconds: under half a real second here.
    let keys = TempFile::new(
        "keys.toml",
        &key_entry("small", "pb-small-live", "budget_usd = 0.02"),
    );
    let mut gw = keyed_gateway(&s, &keys).await;
    let began = tokio::time::Instant::now();
    let mut ws = connect_live(gw.addr, "pb-small-live").await;
    assert_eq!(start(&mut ws, LIVE).await["type"], "session.started");
    let (texts, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008), "{texts:?}");
    assert!(
        texts
            .iter()
            .any(|t| kind(t) == "error" && t.contains("insufficient_quota")),
        "{texts:?}"
    );
    assert!(
        began.elapsed() < Duration::from_millis(3000),
        "within a window of running out: {:?}",
        began.elapsed()
    );
    // The next session is refused before any dial, after the upgrade.
    let upgrades = s.stats.upgrades.load(Ordering::Relaxed);
    let mut ws = connect_live(gw.addr, "pb-small-live").await;
    let refused = start(&mut ws, LIVE).await;
    assert_eq!(refused["type"], "error");
    assert_eq!(refused["error"]["code"], "insufficient_quota");
    assert_eq!(refused["error"]["client_event_id"], "start_1");
    assert_eq!(until_close(&mut ws).await.1, Some(1008));
    assert_eq!(s.stats.upgrades.load(Ordering::Relaxed), upgrades);

    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = gw.stdout_rows();
    let rows = rows_of(&rows, LIVE);
    assert!(cost(&rows) >= 0.02, "{rows:?}");
    let last = rows.last().unwrap();
    assert_eq!(last["end_reason"], "budget_exhausted", "{rows:?}");
    // The teardown asked the upstream to close and read its final figure.
    assert_eq!(last["usage_estimated"], false, "{rows:?}");
    assert!(
        (seconds(&rows) - s.stats.live_seconds.load(Ordering::Relaxed) as f64).abs() < 1e-6,
        "{rows:?}"
    );
}

/// One session ended by `end`; its rows and the simulator's bill.
async fn ended_by<F, Fut>(
    fault: Option<LiveFault>,
    extra: &str,
    end: F,
) -> (Vec<Value>, f64, Option<u16>, f64)
where
    F: FnOnce(Client, Child, SimHandle) -> Fut,
    Fut: std::future::Future<Output = (Option<u16>, Child)>,
{
    let s = live_sim(fault).await;
    let gw = Child::start(
        &s.url(false),
        &format!(
            "{}[metering]\nflush_secs = 1\n{extra}",
            live_route(LIVE, &s)
        ),
        &[],
    )
    .await;
    let mut ws = connect_live(gw.addr, CLIENT_KEY).await;
    assert_eq!(start(&mut ws, LIVE).await["type"], "session.started");
    let seen = listen(&mut ws, Duration::from_millis(400)).await;
    let (code, mut gw) = end(ws, gw, s.clone()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = gw.stdout_rows().into_iter().filter(|r| r["model"] == LIVE);
    (
        rows.collect(),
        s.stats.live_seconds.load(Ordering::Relaxed) as f64,
        code,
        seen,
    )
}

#[tokio::test]
async fn every_end_of_a_live_session_leaves_a_charged_last_row() {
    // A drain: 1001 to the client, the upstream closed with its figure.
    let (rows, billed, code, _) = ended_by(None, "", |mut ws, gw, _| async move {
        gw.sigterm();
        (until_close(&mut ws).await.1, gw)
    })
    .await;
    let rows: Vec<&Value> = rows.iter().collect();
    assert_eq!(code, Some(1001));
    assert_eq!(rows.last().unwrap()["end_reason"], "shutdown", "{rows:?}");
    assert!(
        billed > 0.0 && (seconds(&rows) - billed).abs() < 1e-6,
        "{rows:?} vs {billed}"
    );

    // The client vanishes (no close frame): the gateway closes upstream.
    let (rows, billed, _, _) = ended_by(None, "", |ws, gw, _| async move {
        drop(ws);
        (None, gw)
    })
    .await;
    let rows: Vec<&Value> = rows.iter().collect();
    assert_eq!(rows.last().unwrap()["usage_estimated"], false, "{rows:?}");
    assert!(
        billed > 0.0 && (seconds(&rows) - billed).abs() < 1e-6,
        "{rows:?} vs {billed}"
    );

    // The session's longest life runs out.
    let (rows, billed, code, _) = ended_by(
        None,
        "[relay]\nmax_session_secs = 1\n",
        |mut ws, gw, _| async move { (until_close(&mut ws).await.1, gw) },
    )
    .await;
    let rows: Vec<&Value> = rows.iter().collect();
    assert_eq!(code, Some(1001), "{rows:?}");
    assert_eq!(
        rows.last().unwrap()["end_reason"],
        "max_session_duration",
        "{rows:?}"
    );
    assert!(
        billed > 0.0 && (seconds(&rows) - billed).abs() < 1e-6,
        "{rows:?} vs {billed}"
    );

    // The upstream drops the connection: no final figure, so the last one
    // seen plus the time since it, marked.
    let (rows, _, code, seen) = ended_by(None, "", |mut ws, gw, s| async move {
        s.drop_all();
        (until_close(&mut ws).await.1, gw)
    })
    .await;
    let rows: Vec<&Value> = rows.iter().collect();
    assert!(code.is_some());
    let last = rows.last().unwrap();
    assert_eq!(last["usage_estimated"], true, "{rows:?}");
    assert!(
        seen > 0.0 && seconds(&rows) >= seen,
        "at least the figures seen ({seen}): {rows:?}"
    );
    assert!(cost(&rows) > 0.0);

    // The client closes and the upstream never sends session.closed.
    let (rows, _, _, seen) = ended_by(Some(LiveFault::NoClosed), "", |mut ws, gw, _| async move {
        send_json(&mut ws, json!({"type": "session.close"})).await;
        (until_close(&mut ws).await.1, gw)
    })
    .await;
    let rows: Vec<&Value> = rows.iter().collect();
    assert_eq!(rows.last().unwrap()["usage_estimated"], true, "{rows:?}");
    assert!(seen > 0.0 && seconds(&rows) >= seen, "{seen}: {rows:?}");
}

#[tokio::test]
async fn live_sessions_are_refused_before_any_dial_with_a_live_error() {
    let s = live_sim(None).await;
    let keys = TempFile::new(
        "keys.toml",
        &(key_entry("narrow", "pb-narrow", "models = [\"gpt-realtime\"]")
            + &key_entry("wide", "pb-wide", "")),
    );
    let gw = Child::start(
        &s.url(false),
        &format!(
            "{}[keys]\nfile = \"{}\"\n",
            live_route(LIVE, &s),
            keys.0.display()
        ),
        &[],
    )
    .await;
    let cases: [(&str, Value, &str); 5] = [
        (
            "pb-narrow",
            json!({"type": "session.start", "session": {"model": LIVE}}),
            "model_not_allowed",
        ),
        (
            "pb-wide",
            json!({"type": "session.start", "session": {"model": "gpt-live-9"}}),
            "model_not_found",
        ),
        (
            "pb-wide",
            json!({"type": "session.start", "session": {"model": MODEL}}),
            "wrong_endpoint",
        ),
        (
            "pb-wide",
            json!({"type": "session.input_audio.append", "audio": ""}),
            "session_not_started",
        ),
        (
            "pb-wide",
            json!({"type": "session.start", "session": {}}),
            "missing_required_parameter",
        ),
    ];
    for (key, first, code) in cases {
        let mut ws = connect_live(gw.addr, key).await;
        send_json(&mut ws, first).await;
        let (texts, close, _) = until_close(&mut ws).await;
        let e = json_of(&texts[0]);
        assert_eq!(
            (e["type"].as_str(), e["error"]["code"].as_str()),
            (Some("error"), Some(code))
        );
        assert_eq!(close, Some(1008), "{code}");
    }
    assert_eq!(
        s.stats.upgrades.load(Ordering::Relaxed),
        0,
        "nothing was dialled"
    );

    // Admitted, a second session.start is not forwarded.
    let mut ws = connect_live(gw.addr, "pb-wide").await;
    assert_eq!(start(&mut ws, LIVE).await["type"], "session.started");
    send_json(
        &mut ws,
        json!({"type": "session.start", "event_id": "again", "session": {"model": "gpt-live-2"}}),
    )
    .await;
    loop {
        let v = json_of(&recv_text(&mut ws).await);
        if v["type"] == "error" {
            assert_eq!(v["error"]["code"], "session_already_started");
            assert_eq!(v["error"]["client_event_id"], "again");
            break;
        }
    }
    let starts = s
        .stats
        .received
        .lock()
        .unwrap()
        .iter()
        .filter(|t| kind(t) == "session.start")
        .count();
    assert_eq!(starts, 1);

    // A client secret opens no Live session (OpenAI's Live API takes
    // none): 403 before the upgrade.
    let (status, _, minted) = crate::client_secrets::mint_with(
        gw.addr,
        "pb-wide",
        json!({"session": {"type": "realtime", "model": MODEL}}),
    )
    .await;
    assert_eq!(status, 200, "{minted}");
    match try_live(gw.addr, minted["value"].as_str().unwrap()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status().as_u16(), 403);
            let body: Value = serde_json::from_slice(r.body().as_deref().unwrap()).unwrap();
            assert_eq!(body["error"]["code"], "client_secret_not_accepted");
        }
        other => panic!("expected a 403, got {other:?}"),
    }
}

#[tokio::test]
async fn a_revoked_key_ends_its_live_session_with_a_charged_last_row() {
    let s = live_sim(None).await;
    let keys = TempFile::new(
        "keys.toml",
        &(key_entry("goes", "pb-goes", "") + &key_entry("stays", "pb-stays", "")),
    );
    let mut gw = keyed_gateway(&s, &keys).await;
    let mut ws = connect_live(gw.addr, "pb-goes").await;
    assert_eq!(start(&mut ws, LIVE).await["type"], "session.started");
    listen(&mut ws, Duration::from_millis(300)).await;
    std::fs::write(&keys.0, key_entry("stays", "pb-stays", "")).unwrap();
    let (texts, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008), "{texts:?}");
    assert!(
        texts.iter().any(|t| t.contains("invalid_api_key")),
        "{texts:?}"
    );
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = gw.stdout_rows();
    let rows = rows_of(&rows, LIVE);
    let last = rows.last().unwrap();
    assert_eq!(last["end_reason"], "key_revoked", "{rows:?}");
    assert_eq!(last["key_id"], "goes");
    assert_eq!(last["usage_estimated"], false, "{rows:?}");
    let billed = s.stats.live_seconds.load(Ordering::Relaxed) as f64;
    assert!(
        billed > 0.0 && (seconds(&rows) - billed).abs() < 1e-6,
        "{rows:?} vs {billed}"
    );
}
