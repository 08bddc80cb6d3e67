//! The access log: the real binary, logging JSON, writes exactly one line
//! under `patchbay_gateway::access` per refused upgrade (a wrong key 401,
//! an rpm 429), per completed session (101, when it ends) and per HTTP
//! answer, each with its status, code, key id, path and client, and never
//! a key or a query's secret; `[server] access_log = false` (here through
//! its environment variable) writes none.

use crate::common::*;
use patchbay_sim::SimConfig;

/// The keys file's key, limited to one session a minute.
const LIMITED_KEY: &str = "pb-limited-5d1e2f3a4b";
/// A key the gateway does not know.
const WRONG_KEY: &str = "pb-wrong-9a8b7c6d5e";
/// A secret a client put in the query string.
const QUERY_SECRET: &str = "pb-in-query-0f1e2d3c";

/// The access lines in `logs` (JSON lines), in order.
fn access_lines(logs: &str) -> Vec<serde_json::Value> {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "patchbay_gateway::access")
        .map(|v| v["fields"].clone())
        .collect()
}

async fn start(env: &[(&str, &str)]) -> (patchbay_sim::SimHandle, TempFile, Child) {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new("keys.toml", &key_entry("limited", LIMITED_KEY, "rpm = 1"));
    let child = Child::start(
        &sim.url(false),
        &format!("[keys]\nfile = \"{}\"\n", keys.0.display()),
        &[
            &[("PATCHBAY_LOG_FORMAT", "json"), ("RUST_LOG", "info")],
            env,
        ]
        .concat(),
    )
    .await;
    (sim, keys, child)
}

#[tokio::test]
async fn refusals_and_a_completed_session_each_write_one_access_line_without_secrets() {
    let (_sim, _keys, child) = start(&[]).await;

    let bearer = format!("Bearer {WRONG_KEY}");
    let query = format!("?model={MODEL}&api-key={QUERY_SECRET}");
    let (status, _, _) = refused(child.addr, &query, &[("authorization", &bearer)]).await;
    assert_eq!(status, 401);

    let mut ws = open_with(child.addr, LIMITED_KEY).await.expect("a session");
    assert_eq!(open_with(child.addr, LIMITED_KEY).await.err(), Some(429));

    let (status, _, _) = crate::client_secrets::mint_with(
        child.addr,
        WRONG_KEY,
        serde_json::json!({"session": {"type": "realtime", "model": MODEL}}),
    )
    .await;
    assert_eq!(status, 401);

    ws.close(None).await.expect("close");
    assert!(
        eventually(|| access_lines(&child.logs()).len() >= 4).await,
        "four access lines:\n{}",
        child.logs()
    );
    // Give a duplicate line the chance to show.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let logs = child.logs();
    let lines = access_lines(&logs);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    let path = format!("/v1/realtime?model={MODEL}");

    let wrong = lines
        .iter()
        .find(|l| l["status"] == 401 && l["kind"] == "websocket");
    let wrong = wrong.unwrap_or_else(|| panic!("a 401 upgrade line: {lines:#?}"));
    assert_eq!(
        wrong["path"],
        path.as_str(),
        "the query's secret is dropped"
    );
    assert_eq!(wrong["method"], "GET");
    assert_eq!(wrong["code"], "invalid_api_key", "{wrong}");
    assert!(wrong.get("key_id").is_none(), "{wrong}");
    assert!(wrong["client"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert!(wrong["duration_ms"].is_u64());

    let limited = lines
        .iter()
        .find(|l| l["status"] == 429)
        .expect("a 429 line");
    assert_eq!(limited["kind"], "websocket");
    assert_eq!(limited["key_id"], "limited");
    assert_eq!(limited["path"], path.as_str());
    assert_eq!(limited["model"], MODEL);
    assert_eq!(limited["code"], "rate_limit_exceeded", "{limited}");

    let done = lines
        .iter()
        .find(|l| l["status"] == 101)
        .expect("a 101 line");
    assert_eq!(done["key_id"], "limited");
    assert_eq!(done["path"], path.as_str());
    assert_eq!(done["model"], MODEL);
    assert_eq!(done["outcome"], "client_closed", "{done}");
    // The session's end line is its access line: one line per session.
    assert_eq!(done["message"], "session ended", "{done}");
    assert!(done["session_id"].is_string(), "{done}");
    assert_eq!(logs.matches("session ended").count(), 1, "{logs}");

    let http = lines
        .iter()
        .find(|l| l["kind"] == "http")
        .expect("an HTTP line");
    assert_eq!(http["status"], 401);
    assert_eq!(http["method"], "POST");
    assert_eq!(http["path"], "/v1/realtime/client_secrets");
    assert!(http.get("key_id").is_none(), "{http}");

    for secret in [LIMITED_KEY, WRONG_KEY, QUERY_SECRET, UPSTREAM_KEY] {
        assert!(!logs.contains(secret), "{secret} is logged:\n{logs}");
    }
}

#[tokio::test]
async fn access_log_false_writes_no_access_line() {
    let (_sim, _keys, child) = start(&[("PATCHBAY_SERVER_ACCESS_LOG", "false")]).await;
    let mut ws = open_with(child.addr, LIMITED_KEY).await.expect("a session");
    assert_eq!(open_with(child.addr, LIMITED_KEY).await.err(), Some(429));
    ws.close(None).await.expect("close");
    assert!(
        eventually(|| child.logs().contains("session ended")).await,
        "{}",
        child.logs()
    );
    assert_eq!(access_lines(&child.logs()), Vec::<serde_json::Value>::new());
}
