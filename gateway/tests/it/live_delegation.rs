//! GPT-Live sessions that delegate to a Responses backend: each delegated
//! response is charged once, at its own model's token rates, beside the
//! session's seconds, with a row of its own; an unpriced delegated model
//! follows the `unpriced` policy.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use http::HeaderValue;
use patchbay_sim::{
    LiveFault, LiveSim, SimConfig, SimHandle, DELEGATED_CACHED_TOKENS, DELEGATED_INPUT_TOKENS,
    DELEGATED_OUTPUT_TOKENS,
};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const LIVE: &str = "gpt-live-1";
const USD_PER_MINUTE: f64 = 0.05;
/// The delegated model and its token rates (USD per 1M tokens).
const DELEGATE: &str = "gpt-5.5";
const TEXT_INPUT: f64 = 1.25;
const CACHED_TEXT_INPUT: f64 = 0.125;
const TEXT_OUTPUT: f64 = 10.0;

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

/// The Live route on `sim` priced per minute, the delegated model priced
/// per token when `delegate_priced`, and `extra` under `[metering]`.
fn config(sim: &SimHandle, delegate_priced: bool, metering: &str) -> String {
    let mut c = format!(
        "[[routes]]\nmodel = \"{LIVE}\"\nendpoint = \"live\"\nupstream_url = \"ws://{}/v1/live/sessions\"\n\
         api_key_env = \"SIM_KEY\"\n\
         [[prices]]\nmodel = \"{LIVE}\"\nusd_per_minute = {USD_PER_MINUTE}\n",
        sim.addr
    );
    if delegate_priced {
        c += &format!(
            "[[prices]]\nmodel = \"{DELEGATE}\"\ntext_input = {TEXT_INPUT}\n\
             cached_text_input = {CACHED_TEXT_INPUT}\ntext_output = {TEXT_OUTPUT}\n"
        );
    }
    c + "[metering]\nflush_secs = 1\n" + metering
}

async fn connect_live(addr: std::net::SocketAddr) -> Client {
    connect_live_as(addr, CLIENT_KEY).await
}

async fn connect_live_as(addr: std::net::SocketAddr, key: &str) -> Client {
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
        .expect("upgraded")
        .0
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

/// Sends `session.start` delegating to [`DELEGATE`]; the first event back.
async fn start(ws: &mut Client) -> Value {
    send_json(
        ws,
        json!({"type": "session.start", "event_id": "start_1",
               "session": {"model": LIVE,
                           "delegation": {"type": "responses", "responses": {"model": DELEGATE}}}}),
    )
    .await;
    json_of(&recv_text(ws).await)
}

/// What a session that delegates one response shows: its Live session id,
/// the delegated response's id and delegation id as the client saw them.
struct Ran {
    live_session_id: String,
    response_id: String,
    delegation_id: String,
}

/// Starts a session, asks for one delegated response, lets the session
/// run a simulated minute or so, and closes it.
async fn run_session(addr: std::net::SocketAddr) -> Ran {
    run_session_as(addr, CLIENT_KEY).await
}

async fn run_session_as(addr: std::net::SocketAddr, key: &str) -> Ran {
    let mut ws = connect_live_as(addr, key).await;
    let started = start(&mut ws).await;
    assert_eq!(started["type"], "session.started", "{started}");
    let live_session_id = started["session"]["id"].as_str().unwrap().to_string();
    send_json(
        &mut ws,
        json!({"type": "response.create", "event_id": "c1"}),
    )
    .await;
    let mut completed = None;
    let until = tokio::time::Instant::now() + Duration::from_millis(1200);
    while let Ok(r) = tokio::time::timeout_at(until, recv(&mut ws)).await {
        let Received::Text(t) = r else {
            panic!("the session ended early")
        };
        let v = json_of(&t);
        assert_ne!(v["type"], "error", "{v}");
        if v["type"] == "response.event" && v["event"]["type"] == "response.completed" {
            completed = Some(v);
        }
    }
    let completed = completed.expect("a delegated response.completed");
    send_json(&mut ws, json!({"type": "session.close"})).await;
    until_close(&mut ws).await;
    Ran {
        live_session_id,
        response_id: completed["event"]["response"]["id"]
            .as_str()
            .unwrap()
            .into(),
        delegation_id: completed["delegation_id"].as_str().unwrap().into(),
    }
}

fn cost(rows: &[&Value]) -> f64 {
    rows.iter().map(|r| r["cost_usd"].as_f64().unwrap()).sum()
}

/// What one delegated response owes at [`DELEGATE`]'s rates.
fn delegated_usd() -> f64 {
    let uncached = (DELEGATED_INPUT_TOKENS - DELEGATED_CACHED_TOKENS) as f64;
    (uncached * TEXT_INPUT
        + DELEGATED_CACHED_TOKENS as f64 * CACHED_TEXT_INPUT
        + DELEGATED_OUTPUT_TOKENS as f64 * TEXT_OUTPUT)
        / 1e6
}

/// Runs one delegating session against a gateway configured with
/// `config`; the simulator's billed seconds, what the client saw, and the
/// rows.
async fn rows_of_one_session(
    fault: Option<LiveFault>,
    delegate_priced: bool,
) -> (f64, Ran, Vec<Value>) {
    let s = live_sim(fault).await;
    let mut gw = Child::start(&s.url(false), &config(&s, delegate_priced, ""), &[]).await;
    let ran = run_session(gw.addr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(s.stats.live_delegated_responses.load(Ordering::Relaxed), 1);
    let billed = s.stats.live_seconds.load(Ordering::Relaxed) as f64;
    (billed, ran, gw.stdout_rows())
}

/// The session's seconds are charged as ever, at the Live route's rate.
fn assert_seconds_charged(rows: &[Value], billed: f64) {
    let live: Vec<&Value> = rows.iter().filter(|r| r["model"] == LIVE).collect();
    let seconds: f64 = live
        .iter()
        .map(|r| r["audio_seconds"].as_f64().unwrap())
        .sum();
    assert!(billed >= 60.0, "the session ran a simulated minute");
    assert!((seconds - billed).abs() < 1e-6, "{live:?}");
    assert!((cost(&live) - billed / 60.0 * USD_PER_MINUTE).abs() < 1e-9);
}

#[tokio::test]
async fn a_live_sessions_delegated_response_is_charged_at_its_models_token_rates_beside_its_seconds(
) {
    let (billed, ran, rows) = rows_of_one_session(None, true).await;
    assert_seconds_charged(&rows, billed);
    let delegated: Vec<&Value> = rows.iter().filter(|r| r["model"] == DELEGATE).collect();
    assert_eq!(delegated.len(), 1, "{rows:?}");
    let r = delegated[0];
    assert_eq!(r["response_id"], ran.response_id.as_str());
    assert_eq!(r["delegation_id"], ran.delegation_id.as_str());
    assert_eq!(r["live_session_id"], ran.live_session_id.as_str());
    assert!(r["request_id"]
        .as_str()
        .unwrap()
        .ends_with(&format!(":{}", ran.response_id)));
    assert_eq!(r["input_tokens"], DELEGATED_INPUT_TOKENS);
    assert_eq!(r["input_cached_tokens"], DELEGATED_CACHED_TOKENS);
    assert_eq!(r["output_tokens"], DELEGATED_OUTPUT_TOKENS);
    assert_eq!(r["end_reason"], "completed");
    assert_eq!(r["usage_unpriced"], false);
    assert!((cost(&delegated) - delegated_usd()).abs() < 1e-9, "{r}");
    // The session's total: its seconds plus exactly the delegated tokens.
    let all: Vec<&Value> = rows.iter().collect();
    let expected = billed / 60.0 * USD_PER_MINUTE + delegated_usd();
    assert!((cost(&all) - expected).abs() < 1e-9, "{rows:?}");
}

#[tokio::test]
async fn a_repeated_completed_event_for_the_same_delegated_response_charges_nothing_more() {
    let (billed, ran, rows) =
        rows_of_one_session(Some(LiveFault::DelegatedCompletedRepeated), true).await;
    assert_seconds_charged(&rows, billed);
    let delegated: Vec<&Value> = rows.iter().filter(|r| r["model"] == DELEGATE).collect();
    assert_eq!(delegated.len(), 1, "{rows:?}");
    assert_eq!(delegated[0]["response_id"], ran.response_id.as_str());
    assert!((cost(&delegated) - delegated_usd()).abs() < 1e-9);
}

#[tokio::test]
async fn an_unpriced_delegated_model_is_recorded_flagged_at_cost_0_or_refused_under_block() {
    // `unpriced = "allow"` (the default): the row keeps the tokens, cost 0,
    // flagged; the seconds are charged as ever.
    let (billed, ran, rows) = rows_of_one_session(None, false).await;
    assert_seconds_charged(&rows, billed);
    let delegated: Vec<&Value> = rows.iter().filter(|r| r["model"] == DELEGATE).collect();
    assert_eq!(delegated.len(), 1, "{rows:?}");
    let r = delegated[0];
    assert_eq!(r["response_id"], ran.response_id.as_str());
    assert_eq!(r["input_tokens"], DELEGATED_INPUT_TOKENS);
    assert_eq!(r["cost_usd"], 0.0);
    assert_eq!(r["usage_unpriced"], true);
    for live in rows.iter().filter(|r| r["model"] == LIVE) {
        assert_eq!(live["usage_unpriced"], false);
    }

    // `unpriced = "block"`: refused at `session.start`, before any dial.
    let s = live_sim(None).await;
    let mut gw = Child::start(
        &s.url(false),
        &config(&s, false, "unpriced = \"block\"\n"),
        &[],
    )
    .await;
    let mut ws = connect_live(gw.addr).await;
    let refused = start(&mut ws).await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["error"]["code"], "model_not_priced");
    assert_eq!(
        refused["error"]["param"],
        "session.delegation.responses.model"
    );
    assert_eq!(until_close(&mut ws).await.1, Some(1008));
    assert_eq!(s.stats.upgrades.load(Ordering::Relaxed), 0);
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
}

#[tokio::test]
async fn a_delegation_to_a_model_outside_the_keys_list_is_refused_before_any_dial() {
    // The key may use the Live model, not the model its session delegates to: a model named in
    // a frame is held to the same allow-list as the session's own.
    let s = live_sim(None).await;
    let keys = TempFile::new(
        "keys.toml",
        &key_entry("narrow", "pb-narrow", &format!("models = [\"{LIVE}\"]")),
    );
    let extra = format!(
        "{}[keys]\nfile = \"{}\"\n",
        config(&s, true, ""),
        keys.0.display()
    );
    let mut gw = Child::start(&s.url(false), &extra, &[]).await;
    let mut ws = connect_live_as(gw.addr, "pb-narrow").await;
    let refused = start(&mut ws).await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["error"]["code"], "model_not_allowed");
    assert_eq!(
        refused["error"]["param"],
        "session.delegation.responses.model"
    );
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains(DELEGATE));
    assert_eq!(until_close(&mut ws).await.1, Some(1008));
    assert_eq!(s.stats.upgrades.load(Ordering::Relaxed), 0);
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
}

#[tokio::test]
async fn a_session_update_delegating_outside_the_keys_list_is_refused_and_not_forwarded() {
    // As at `session.start`: a model a frame names is held to the key's list before the frame
    // goes upstream; the session goes on with its delegation as it was.
    let s = live_sim(None).await;
    let keys = TempFile::new(
        "keys.toml",
        &key_entry(
            "narrow",
            "pb-narrow",
            &format!("models = [\"{LIVE}\", \"{DELEGATE}\"]"),
        ),
    );
    let extra = format!(
        "{}[keys]\nfile = \"{}\"\n",
        config(&s, true, ""),
        keys.0.display()
    );
    let mut gw = Child::start(&s.url(false), &extra, &[]).await;
    let mut ws = connect_live_as(gw.addr, "pb-narrow").await;
    assert_eq!(start(&mut ws).await["type"], "session.started");
    send_json(
        &mut ws,
        json!({"type": "session.update", "event_id": "u1", "session": {"delegation":
            {"type": "responses", "responses": {"model": "gpt-elsewhere"}}}}),
    )
    .await;
    // The usage events go on meanwhile: the first other event, within a bound.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let refused = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no answer to the update"
        );
        let v = json_of(&recv_text(&mut ws).await);
        if v["type"] != "session.usage.updated" {
            break v;
        }
    };
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["error"]["code"], "model_not_allowed");
    assert_eq!(
        refused["error"]["param"],
        "session.delegation.responses.model"
    );
    assert_eq!(refused["error"]["client_event_id"], "u1");
    // Still running, delegating as it started.
    send_json(&mut ws, json!({"type": "session.close"})).await;
    let (texts, _, _) = until_close(&mut ws).await;
    assert!(
        texts.iter().any(|t| kind(t) == "session.closed"),
        "{texts:?}"
    );
    let received = s.stats.received.lock().unwrap().clone();
    assert!(
        !received.iter().any(|t| kind(t) == "session.update"),
        "the refused update went upstream: {received:?}"
    );
    let refusals = metric(
        gw.admin_addr,
        "patchbay_admission_refusals_total",
        "reason=\"model_not_allowed\"",
    )
    .await;
    assert_eq!(refusals, 1.0);
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
}

#[tokio::test]
async fn with_redis_the_keys_budget_counter_rises_by_exactly_the_delegated_charge_beside_the_seconds(
) {
    let Some(url) = redis_url("a delegated charge in the fleet's budget counter") else {
        return;
    };
    let s = live_sim(None).await;
    // A key id of its own: its budget counter in Redis starts at nothing.
    let id = unique("deleg");
    let keys = TempFile::new(
        "keys.toml",
        &key_entry(&id, "pb-budgeted", "budget_usd = 100.0"),
    );
    let toml = format!(
        "{}[store]\nredis_url_env = \"{REDIS_ENV}\"\n[keys]\nfile = \"{}\"\n",
        config(&s, true, ""),
        keys.0.display()
    );
    let mut gw = Child::start(&s.url(false), &toml, &[(REDIS_ENV, url.as_str())]).await;
    let spent = || async {
        let a = request(
            gw.addr,
            "GET",
            "/v1/patchbay/usage",
            &[("Authorization", "Bearer pb-budgeted")],
            b"",
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.body);
        let u = a.json();
        let key = u["budgets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["scope"] == "key")
            .cloned()
            .unwrap_or_else(|| panic!("no key budget in {u}"));
        key["spent_usd"].as_f64().unwrap()
    };
    assert_eq!(spent().await, 0.0);
    run_session_as(gw.addr, "pb-budgeted").await;
    let billed = s.stats.live_seconds.load(Ordering::Relaxed) as f64;
    let seconds_usd = billed / 60.0 * USD_PER_MINUTE;
    // The final flush lands shortly after the close.
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut total = spent().await;
    while total < seconds_usd + delegated_usd() - 1e-9 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        total = spent().await;
    }
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = gw.stdout_rows();
    assert_seconds_charged(&rows, billed);
    // The counter is the rows' sum, and what the seconds leave of it is
    // exactly the delegated response at its model's token rates.
    let all: Vec<&Value> = rows.iter().collect();
    assert!((total - cost(&all)).abs() < 1e-8, "{total} vs {rows:?}");
    assert!(
        (total - seconds_usd - delegated_usd()).abs() < 1e-8,
        "the counter rose by {} beside {seconds_usd} of seconds; the delegated charge is {}",
        total - seconds_usd,
        delegated_usd()
    );
}
