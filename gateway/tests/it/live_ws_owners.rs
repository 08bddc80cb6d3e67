//! The owner of a GPT-Live WebSocket session (`GET /v1/live/sessions`) is
//! recorded once `session.started` names it: the owner (or its team) can
//! attach to it and fork it by id, anyone else gets 404, with Redis a second
//! gateway serves the owner too, and no replica ever adopts it (it is not a
//! sideband-metered call: nothing attaches to it but the clients).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use patchbay_sim::{LiveSim, SimConfig, SimHandle};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Error as WsError;

const LIVE: &str = "gpt-live-1";

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

/// The Live route on `sim`, the keys `owner`, `mate` (its team) and
/// `other`, and `extra` config.
fn config(sim: &SimHandle, keys: &TempFile, extra: &str) -> String {
    format!(
        "[[routes]]\nmodel = \"{LIVE}\"\nendpoint = \"live\"\nupstream_url = \"ws://{}/v1/live/sessions\"\n\
         api_key_env = \"SIM_KEY\"\n[[prices]]\nmodel = \"{LIVE}\"\nusd_per_minute = 0.05\n\
         [metering]\nflush_secs = 1\n{extra}[keys]\nfile = \"{}\"\n",
        sim.addr,
        keys.0.display()
    )
}

fn keys() -> TempFile {
    TempFile::new(
        "keys.toml",
        &(key_entry("owner", "pb-owner", "team = \"t\"")
            + &key_entry("mate", "pb-mate", "team = \"t\"")
            + &key_entry("other", "pb-other", "")),
    )
}

/// A WebSocket to `path` with `key`: the socket, or the refusal's status
/// and body.
async fn ws_at(addr: SocketAddr, key: &str, path: &str) -> Result<Client, (u16, Value)> {
    let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    match tokio::time::timeout(WAIT, tokio_tungstenite::client_async(request, tcp))
        .await
        .expect("upgrade answered in time")
    {
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

/// `client.live.connect()` and `session.start`: the socket and the id.
async fn started(addr: SocketAddr, key: &str) -> (Client, String) {
    let mut ws = ws_at(addr, key, "/v1/live/sessions").await.unwrap();
    send_json(
        &mut ws,
        json!({"type": "session.start", "session": {"model": LIVE}}),
    )
    .await;
    let v: Value = serde_json::from_str(&recv_text(&mut ws).await).unwrap();
    assert_eq!(v["type"], "session.started", "{v}");
    let id = v["session"]["id"].as_str().unwrap().to_string();
    (ws, id)
}

fn not_found(r: Result<Client, (u16, Value)>) {
    let Err((status, body)) = r else {
        panic!("not refused")
    };
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "session_not_found", "{body}");
}

/// `client.live.sideband.connect(session_id=id)` for the owner: attached
/// upstream, its usage events relayed; closed again.
async fn owner_attaches(addr: SocketAddr, key: &str, id: &str) {
    let mut ws = ws_at(addr, key, &format!("/v1/live/sessions/{id}/attach"))
        .await
        .unwrap();
    assert_eq!(kind(&recv_text(&mut ws).await), "session.usage.updated");
    ws.close(None).await.unwrap();
    let _ = until_close(&mut ws).await;
}

/// `client.live.forks.connect(session_id=id)` for the owner: a new session
/// of the parent's model; closed again.
async fn owner_forks(addr: SocketAddr, key: &str, id: &str) {
    let mut ws = ws_at(addr, key, &format!("/v1/live/sessions/{id}/fork"))
        .await
        .unwrap();
    send_json(&mut ws, json!({"type": "session.start", "session": {}})).await;
    let v: Value = serde_json::from_str(&recv_text(&mut ws).await).unwrap();
    assert_eq!(v["type"], "session.started", "{v}");
    assert_eq!(v["session"]["model"], LIVE, "the parent's model");
    assert_ne!(v["session"]["id"], id);
    send_json(&mut ws, json!({"type": "session.close"})).await;
    let (texts, _, _) = until_close(&mut ws).await;
    assert!(
        texts.iter().any(|t| kind(t) == "session.closed"),
        "{texts:?}"
    );
}

#[tokio::test]
async fn the_owner_of_a_websocket_live_session_attaches_to_it_and_forks_it_and_no_one_else_can() {
    let sim = live_sim().await;
    let keys = keys();
    let gw = Child::start(&sim.url(false), &config(&sim, &keys, ""), &[]).await;
    let (mut primary, id) = started(gw.addr, "pb-owner").await;
    let upgrades = || sim.stats.upgrades.load(Ordering::Relaxed);
    assert_eq!(upgrades(), 1);

    let attach = format!("/v1/live/sessions/{id}/attach");
    let fork = format!("/v1/live/sessions/{id}/fork");
    not_found(ws_at(gw.addr, "pb-other", &attach).await);
    not_found(ws_at(gw.addr, "pb-other", &fork).await);
    let other_fork = post_fork(gw.addr, "pb-other", &id).await;
    assert_eq!(other_fork.status, 404, "{}", other_fork.body);
    assert_eq!(upgrades(), 1, "nothing went upstream for another key");
    // Counted by action and the refusal's code, as every refused action is.
    let admin = gw.admin_addr;
    let refused = |action: &'static str| {
        let labels = format!("action=\"{action}\",reason=\"session_not_found\"");
        async move { metric(admin, "patchbay_call_action_refusals_total", &labels).await }
    };
    assert_eq!(refused("attach").await, 1.0);
    assert_eq!(refused("fork").await, 1.0);
    assert_eq!(
        metric(
            gw.admin_addr,
            "patchbay_call_action_refusals_total",
            "action=\"unknown\""
        )
        .await,
        0.0
    );

    owner_attaches(gw.addr, "pb-owner", &id).await;
    owner_forks(gw.addr, "pb-mate", &id).await;
    assert_eq!(upgrades(), 3, "the attach and the fork went upstream");

    // The primary goes on, and ends as usual.
    send_json(&mut primary, json!({"type": "session.close"})).await;
    let (texts, _, _) = until_close(&mut primary).await;
    assert!(
        texts.iter().any(|t| kind(t) == "session.closed"),
        "{texts:?}"
    );
    // Ended, it stays its owner's: another key still gets 404.
    not_found(ws_at(gw.addr, "pb-other", &fork).await);
}

/// `client.live.forks.create(session_id=id, …)` over HTTP.
async fn post_fork(addr: SocketAddr, key: &str, id: &str) -> Answer {
    let body = json!({"transport": {"type": "webrtc", "sdp": "v=0\r\n"}});
    let bearer = format!("Bearer {key}");
    request(
        addr,
        "POST",
        &format!("/v1/live/sessions/{id}/fork"),
        &[
            ("Authorization", bearer.as_str()),
            ("Content-Type", "application/json"),
        ],
        body.to_string().as_bytes(),
    )
    .await
}

#[tokio::test]
async fn with_redis_another_gateway_serves_the_owner_of_a_websocket_live_session_and_none_adopts_it(
) {
    let Some(url) = redis_url("a Live WebSocket session's owner across processes") else {
        return;
    };
    let sim = live_sim().await;
    let keys = keys();
    let toml = config(
        &sim,
        &keys,
        &format!("[store]\nredis_url_env = \"{REDIS_ENV}\"\n"),
    );
    let env = [(REDIS_ENV, url.as_str())];
    let first = Child::start(&sim.url(false), &toml, &env).await;
    let second = Child::start(&sim.url(false), &toml, &env).await;
    let (mut primary, id) = started(first.addr, "pb-owner").await;
    let upgrades = || sim.stats.upgrades.load(Ordering::Relaxed);
    // The record is written beside the session's start (the client has
    // `session.started` first): a moment for it to reach Redis.
    tokio::time::sleep(Duration::from_millis(200)).await;

    not_found(
        ws_at(
            second.addr,
            "pb-other",
            &format!("/v1/live/sessions/{id}/attach"),
        )
        .await,
    );
    owner_attaches(second.addr, "pb-owner", &id).await;
    owner_forks(second.addr, "pb-owner", &id).await;
    assert_eq!(upgrades(), 3);

    // Several adoption polls later nothing else attached to it, and
    // nothing hung it up: both gateways left it to its client.
    tokio::time::sleep(patchbay_gateway::calls::fleet::ADOPT_POLL * 3).await;
    assert_eq!(upgrades(), 3, "no replica adopted the WebSocket session");
    assert!(sim.stats.calls.actions().is_empty());
    send_json(&mut primary, json!({"type": "usage.ping"})).await;
    let v: Value = serde_json::from_str(&recv_text(&mut primary).await).unwrap();
    assert_eq!(v["type"], "session.usage.updated", "still running: {v}");

    // Its end retires the record: still the owner's on the other replica.
    send_json(&mut primary, json!({"type": "session.close"})).await;
    let _ = until_close(&mut primary).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    not_found(
        ws_at(
            second.addr,
            "pb-other",
            &format!("/v1/live/sessions/{id}/fork"),
        )
        .await,
    );
    owner_forks(second.addr, "pb-owner", &id).await;
}
