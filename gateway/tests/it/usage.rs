//! `GET /v1/patchbay/usage` end to end: a key that spent through the
//! simulator and one that did not each see only their own figures; a
//! client secret sees its parent key's; reading counts nothing against the
//! rpm; live sessions are counted while open; refusals are OpenAI-shaped
//! and logged; and over Redis, a second gateway reports the spend and
//! sessions the first one made (what the budgets enforce).

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use patchbay_gateway::bootstrap::Running;
use patchbay_sim::SimConfig;
use redis::AsyncCommands;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One simulator turn at these prices costs $0.006692 (see metering.rs).
const PRICES: &str = "[[prices]]\nmodel = \"gpt-realtime\"\ntext_input = 4.0\ncached_text_input = 0.4\n\
                      audio_input = 32.0\ncached_audio_input = 0.4\ntext_output = 16.0\naudio_output = 64.0\n";
const TURN_COST: f64 = 0.006692;
const PATH: &str = "/v1/patchbay/usage";

const SPENDER: &str = "pb-usage-spender-1a2b3c";
const SAVER: &str = "pb-usage-saver-4d5e6f";
const WRONG: &str = "pb-usage-wrong-7a8b9c";

/// `method path` with `headers`; status, head (lowercased) and JSON body.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String, Value) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    if method == "POST" {
        req.push_str("Content-Length: 0\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut buf))
        .await
        .expect("answered in time")
        .unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let json = serde_json::from_str(body).unwrap_or(Value::Null);
    (status, head.to_ascii_lowercase(), json)
}

/// The usage answer for `credential` (Bearer), which must be a 200.
async fn usage(addr: SocketAddr, credential: &str) -> Value {
    let bearer = format!("Bearer {credential}");
    let (status, head, body) = request(addr, "GET", PATH, &[("Authorization", &bearer)]).await;
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("content-type: application/json"), "{head}");
    assert!(head.contains("cache-control: no-store"), "{head}");
    body
}

/// The budget of `scope` in a usage answer.
fn budget<'a>(u: &'a Value, scope: &str) -> &'a Value {
    u["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["scope"] == scope)
        .unwrap_or_else(|| panic!("no {scope} budget in {u}"))
}

fn spent(u: &Value, scope: &str) -> f64 {
    budget(u, scope)["spent_usd"].as_f64().unwrap()
}

/// Polls the usage of `credential` until `done` holds.
async fn usage_until(addr: SocketAddr, credential: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let u = usage(addr, credential).await;
        if done(&u) {
            return u;
        }
        assert!(tokio::time::Instant::now() < deadline, "never reached: {u}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn close_to(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The keys file: a spender on team `team`, with `spender_extra`, and a
/// saver on no team.
fn keys(spender: &str, team: &str, saver: &str, spender_extra: &str) -> String {
    format!(
        "{}{}[[teams]]\nid = \"{team}\"\nbudget_usd = 5.0\nbudget_period = \"monthly\"\n",
        key_entry(
            spender,
            SPENDER,
            &format!("team = \"{team}\"\nbudget_usd = 1.0\nbudget_period = \"daily\"\ntpm = 100000\n{spender_extra}"),
        ),
        key_entry(saver, SAVER, "budget_usd = 2.0"),
    )
}

/// A simulator and an in-memory gateway metering every turn at once, its
/// route with a budget of its own.
async fn start(spender_extra: &str) -> (patchbay_sim::SimHandle, TempFile, Running) {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new(
        "keys.toml",
        &keys("spender", "voice", "saver", spender_extra),
    );
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!(
            "budget_usd = 100.0\n{PRICES}[metering]\nflush_secs = 0\n[keys]\nfile = \"{}\"\n",
            keys.0.display()
        ),
    ))
    .await;
    (sim, keys, gw)
}

/// One billed turn by `key`, its session closed.
async fn spend(addr: SocketAddr, key: &str) {
    let mut ws = open_with(addr, key).await.expect("a session");
    one_turn(&mut ws).await;
    ws.close(None).await.unwrap();
    let _ = until_close(&mut ws).await;
}

#[tokio::test]
async fn each_key_sees_only_its_own_spend_and_remaining_budget() {
    // An rpm of 1: a counted read would lock the key out of its session.
    let (_sim, _keys, gw) = start("rpm = 1").await;
    // Reading usage counts nothing against the rpm: the session still opens.
    for _ in 0..3 {
        let u = usage(gw.addr, SPENDER).await;
        assert_eq!(
            u["limits"]["rpm"],
            json!({"limit": 1, "used": 0, "remaining": 1})
        );
    }
    spend(gw.addr, SPENDER).await;

    let u = usage_until(gw.addr, SPENDER, |u| spent(u, "key") > 0.0).await;
    assert_eq!(u["object"], "patchbay.usage");
    assert_eq!(u["key_id"], "spender");
    assert_eq!(u["team"], "voice");
    assert_eq!(u["client_secret_id"], Value::Null);
    assert_eq!(u["store"], "memory");
    let own = budget(&u, "key");
    assert_eq!(own["id"], "spender");
    assert_eq!(own["period"], "daily");
    assert!(
        own["resets_at"].as_str().unwrap().ends_with("T00:00:00Z"),
        "{own}"
    );
    assert!(
        close_to(own["spent_usd"].as_f64().unwrap(), TURN_COST),
        "{own}"
    );
    assert!(
        close_to(own["remaining_usd"].as_f64().unwrap(), 1.0 - TURN_COST),
        "{own}"
    );
    assert_eq!(own["limit_usd"], 1.0);
    assert_eq!(own["exhausted"], false);
    let team = budget(&u, "team");
    assert_eq!(
        (&team["id"], &team["period"]),
        (&json!("voice"), &json!("monthly"))
    );
    assert!(
        close_to(team["spent_usd"].as_f64().unwrap(), TURN_COST),
        "{team}"
    );
    let route = budget(&u, "route");
    assert_eq!(
        (&route["id"], &route["period"]),
        (&json!(MODEL), &json!("total"))
    );
    assert_eq!(route["resets_at"], Value::Null);
    assert!(close_to(
        route["remaining_usd"].as_f64().unwrap(),
        100.0 - TURN_COST
    ));
    assert_eq!(u["budgets"].as_array().unwrap().len(), 3, "{u}");
    assert_eq!(u["limits"]["rpm"]["used"], 1, "the session, not the reads");
    assert_eq!(u["limits"]["rpm"]["remaining"], 0);
    let tokens = u["limits"]["tpm"]["used"].as_u64().unwrap();
    assert!((1..=187).contains(&tokens), "the turn's 187 tokens: {u}");
    assert_eq!(u["limits"]["max_sessions"], Value::Null);
    assert_eq!(u["limits"]["models"], json!([MODEL]));
    assert_eq!(u["sessions"], json!({"live": 0, "counted": "process"}));

    // The saver (here by `api-key`) sees its own untouched budget, and the
    // route's shared one; nothing of the spender's key.
    let (status, _, s) = request(gw.addr, "GET", PATH, &[("api-key", SAVER)]).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["key_id"], "saver");
    assert_eq!(s["team"], Value::Null);
    let own = budget(&s, "key");
    assert_eq!(own["id"], "saver");
    assert_eq!(
        (own["spent_usd"].as_f64(), own["remaining_usd"].as_f64()),
        (Some(0.0), Some(2.0))
    );
    assert_eq!(
        s["budgets"].as_array().unwrap().len(),
        2,
        "key and route: {s}"
    );
    assert_eq!(s["limits"]["rpm"], Value::Null);
    let text = s.to_string();
    assert!(
        !text.contains("spender") && !text.contains("voice"),
        "{text}"
    );
    let text = u.to_string();
    assert!(!text.contains("saver"), "{text}");
    for secret in [SPENDER, SAVER, "sha256"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
}

#[tokio::test]
async fn a_client_secret_sees_the_figures_of_the_key_that_minted_it() {
    let (_sim, _keys, gw) = start("").await;
    spend(gw.addr, SPENDER).await;
    let by_key = usage_until(gw.addr, SPENDER, |u| spent(u, "key") > 0.0).await;
    for (key, id) in [(SPENDER, "spender"), (SAVER, "saver")] {
        let (status, _, minted) = crate::client_secrets::mint_with(
            gw.addr,
            key,
            json!({"session": {"type": "realtime", "model": MODEL}}),
        )
        .await;
        assert_eq!(status, 200, "{minted}");
        let secret = minted["value"].as_str().unwrap();
        let u = usage(gw.addr, secret).await;
        assert_eq!(u["key_id"], id);
        assert!(
            u["client_secret_id"].as_str().unwrap().starts_with("cs_"),
            "{u}"
        );
        assert!(!u.to_string().contains(secret), "the secret is not echoed");
        if id == "spender" {
            assert_eq!(u["budgets"], by_key["budgets"]);
            assert_eq!(u["limits"], by_key["limits"]);
            assert!(close_to(spent(&u, "key"), TURN_COST), "{u}");
        } else {
            assert_eq!(spent(&u, "key"), 0.0, "{u}");
            assert!(!u.to_string().contains("spender"), "{u}");
        }
    }

    let (status, _, e) = request(
        gw.addr,
        "GET",
        PATH,
        &[("Authorization", "Bearer pbek_not-a-real-secret")],
    )
    .await;
    assert_eq!(status, 401, "{e}");
    assert_eq!(e["error"]["code"], "invalid_api_key");
}

#[tokio::test]
async fn live_sessions_are_counted_while_open() {
    let (_sim, _keys, gw) = start("max_sessions = 3").await;
    let mut a = open_with(gw.addr, SPENDER).await.expect("a session");
    let mut b = open_with(gw.addr, SPENDER).await.expect("a second session");
    let u = usage(gw.addr, SPENDER).await;
    assert_eq!(u["sessions"], json!({"live": 2, "counted": "process"}));
    assert_eq!(u["limits"]["max_sessions"], 3);
    // The other key's count is its own.
    assert_eq!(usage(gw.addr, SAVER).await["sessions"]["live"], 0);
    a.close(None).await.unwrap();
    let _ = until_close(&mut a).await;
    usage_until(gw.addr, SPENDER, |u| u["sessions"]["live"] == 1).await;
    b.close(None).await.unwrap();
    let _ = until_close(&mut b).await;
    usage_until(gw.addr, SPENDER, |u| u["sessions"]["live"] == 0).await;
}

/// The access lines (JSON) in a child's logs for the usage path.
fn usage_access_lines(logs: &str) -> Vec<Value> {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "patchbay_gateway::access" && v["fields"]["path"] == PATH)
        .map(|v| v["fields"].clone())
        .collect()
}

#[tokio::test]
async fn a_wrong_or_missing_key_gets_an_openai_shaped_401_and_another_method_405_each_logged() {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new(
        "keys.toml",
        &format!(
            "{}{}",
            key_entry("saver", SAVER, ""),
            key_entry("off", SPENDER, "disabled = true")
        ),
    );
    let child = Child::start(
        &sim.url(false),
        &format!("[keys]\nfile = \"{}\"\n", keys.0.display()),
        &[("PATCHBAY_LOG_FORMAT", "json"), ("RUST_LOG", "info")],
    )
    .await;
    let wrong = format!("Bearer {WRONG}");
    let disabled = format!("Bearer {SPENDER}");
    for headers in [
        vec![("Authorization", wrong.as_str())],
        vec![("api-key", WRONG)],
        vec![("Authorization", disabled.as_str())],
        vec![],
    ] {
        let (status, head, e) = request(child.addr, "GET", PATH, &headers).await;
        assert_eq!(status, 401, "{headers:?}: {e}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
        assert_eq!(e["error"]["code"], "invalid_api_key", "{e}");
        assert!(e["error"]["message"].is_string(), "{e}");
        assert_eq!(e["error"]["param"], Value::Null, "{e}");
    }
    let saver = format!("Bearer {SAVER}");
    let (status, _, e) = request(child.addr, "POST", PATH, &[("Authorization", &saver)]).await;
    assert_eq!(status, 405, "{e}");
    assert_eq!(e["error"]["code"], "method_not_allowed", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("GET"),
        "{e}"
    );
    let (status, _, _) = request(child.addr, "GET", PATH, &[("Authorization", &saver)]).await;
    assert_eq!(status, 200);

    assert!(
        eventually(|| usage_access_lines(&child.logs()).len() >= 6).await,
        "six access lines:\n{}",
        child.logs()
    );
    let logs = child.logs();
    let lines = usage_access_lines(&logs);
    assert_eq!(lines.len(), 6, "{lines:#?}");
    let refused: Vec<&Value> = lines.iter().filter(|l| l["status"] == 401).collect();
    assert_eq!(refused.len(), 4, "{lines:#?}");
    for l in &refused {
        assert_eq!(l["kind"], "http");
        assert_eq!(l["method"], "GET");
        assert_eq!(l["code"], "invalid_api_key", "{l}");
    }
    // An unknown or missing key logs no key id; a disabled one its own, as
    // on the other client endpoints.
    let ids: Vec<&Value> = refused.iter().filter_map(|l| l.get("key_id")).collect();
    assert_eq!(ids, [&json!("off")], "{refused:#?}");
    let not_allowed = lines
        .iter()
        .find(|l| l["status"] == 405)
        .expect("a 405 line");
    assert_eq!(not_allowed["code"], "method_not_allowed");
    assert_eq!(not_allowed["key_id"], "saver");
    let ok = lines
        .iter()
        .find(|l| l["status"] == 200)
        .expect("a 200 line");
    assert_eq!(ok["key_id"], "saver");
    for secret in [SAVER, SPENDER, WRONG, UPSTREAM_KEY] {
        assert!(!logs.contains(secret), "{secret} is logged");
    }
}

#[tokio::test]
async fn over_redis_a_second_gateway_reports_the_spend_and_sessions_the_first_made() {
    let Some(url) = redis_url("over_redis_a_second_gateway_reports_the_spend") else {
        return;
    };
    let sim = sim(SimConfig::default()).await;
    // Unique ids: the budgets, windows and leases of this run are its own.
    let (spender, team, saver) = (unique("usage"), unique("usage-team"), unique("usage"));
    let keys = TempFile::new(
        "keys.toml",
        &keys(&spender, &team, &saver, "rpm = 100\nmax_sessions = 2"),
    );
    let toml = gateway_toml(
        &sim.url(false),
        &format!(
            "{PRICES}[metering]\nflush_secs = 0\n[store]\nredis_url_env = \"{REDIS_ENV}\"\n[keys]\nfile = \"{}\"\n",
            keys.0.display()
        ),
    );
    let a = gateway(&toml).await;
    let b = gateway(&toml).await;

    let mut ws = open_with(a.addr, SPENDER).await.expect("a session on A");
    one_turn(&mut ws).await;
    let u = usage_until(b.addr, SPENDER, |u| spent(u, "key") > 0.0).await;
    assert_eq!(u["store"], "redis");
    assert_eq!(u["key_id"], spender.as_str());
    assert!(close_to(spent(&u, "key"), TURN_COST), "{u}");
    assert!(close_to(spent(&u, "team"), TURN_COST), "{u}");
    // The session on A holds a fleet lease: B counts it.
    assert_eq!(u["sessions"], json!({"live": 1, "counted": "fleet"}));
    assert_eq!(u["limits"]["rpm"]["used"], 1, "{u}");

    // What B reports is what the budget counters in Redis hold (one
    // counter each: this day's for the key, this month's for the team).
    let mut r = redis(&url).await;
    for (scope, pattern) in [
        ("key", format!("patchbay:budget:key:{spender}:d*")),
        ("team", format!("patchbay:budget:team:{team}:m*")),
    ] {
        let counters: Vec<String> = r.keys(&pattern).await.unwrap();
        assert_eq!(counters.len(), 1, "{counters:?}");
        let held: f64 = r.get(&counters[0]).await.unwrap();
        assert!(close_to(held, spent(&u, scope)), "{scope}: {held} vs {u}");
    }

    // The other key sees nothing of it, on either gateway.
    for gw in [&a, &b] {
        let s = usage(gw.addr, SAVER).await;
        assert_eq!(s["key_id"], saver.as_str());
        assert_eq!(spent(&s, "key"), 0.0);
        assert_eq!(s["sessions"]["live"], 0);
        assert!(!s.to_string().contains(&spender), "{s}");
    }

    ws.close(None).await.unwrap();
    let _ = until_close(&mut ws).await;
    usage_until(b.addr, SPENDER, |u| u["sessions"]["live"] == 0).await;
}
