//! Ephemeral client secrets end to end: minted over HTTP on the client
//! listener, then used (subprotocol or Bearer) by a second client that holds
//! nothing else, against a real gateway and the simulator upstream.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::*;
use patchbay_gateway::client_secret::{read_signing_key, SigningKeys};
use patchbay_sim::SimConfig;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A signing key file and the config lines naming it.
fn signing_key() -> (TempFile, String) {
    let file = TempFile::new(
        "signing.key",
        &format!("{}\n", "s3cr3t-signing-key-".repeat(3)),
    );
    let toml = format!(
        "[client_secrets]\nsigning_key_files = [\"{}\"]\n",
        file.0.display()
    );
    (file, toml)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `POST path` with `headers` and `body`; status, headers (lowercased
/// `name: value` lines) and JSON body.
pub(crate) async fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, Value) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    // A refused oversized body may end in a reset after the answer: keep
    // what was read.
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut buf))
        .await
        .expect("answered in time");
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

pub(crate) async fn mint_with(addr: SocketAddr, key: &str, body: Value) -> (u16, String, Value) {
    let bearer = format!("Bearer {key}");
    post(
        addr,
        "/v1/realtime/client_secrets",
        &[("Authorization", &bearer)],
        &body.to_string(),
    )
    .await
}

/// Mints with the master key; the secret's value.
async fn mint(addr: SocketAddr, instructions: &str) -> String {
    let (status, _, body) = mint_with(
        addr,
        CLIENT_KEY,
        json!({"expires_after": {"anchor": "created_at", "seconds": 600},
               "session": {"type": "realtime", "model": MODEL, "instructions": instructions}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["value"].as_str().unwrap().to_string()
}

/// The refusal of a session opened with `secret` as a Bearer token on the
/// test route: status and JSON body.
async fn refused_by_bearer(addr: SocketAddr, secret: &str) -> (u16, Value) {
    let bearer = format!("Bearer {secret}");
    let (status, _, body) = refused(
        addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    (status, body)
}

/// Opens a session with `secret` in the browser subprotocol; the client
/// and the first two events' texts.
async fn open_by_subprotocol(addr: SocketAddr, secret: &str) -> (Client, String, String) {
    let protocols = format!("realtime, openai-insecure-api-key.{secret}");
    let (mut ws, resp) = connect_with(
        addr,
        &format!("?model={MODEL}"),
        &[("sec-websocket-protocol", &protocols)],
    )
    .await
    .expect("a session opens with the secret");
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").unwrap(),
        "realtime"
    );
    let created = recv_text(&mut ws).await;
    let updated = recv_text(&mut ws).await;
    (ws, created, updated)
}

fn secret_id(key_file: &TempFile, secret: &str) -> String {
    let keys = SigningKeys::new(vec![read_signing_key(&key_file.0).unwrap()]).unwrap();
    keys.verify(secret, now_secs()).unwrap().id
}

#[tokio::test]
async fn a_minted_secret_opens_a_configured_session_by_subprotocol_and_by_bearer() {
    let sim = sim(SimConfig {
        record: true,
        ..SimConfig::default()
    })
    .await;
    let gw = gateway(&gateway_toml(&sim.url(false), "")).await;
    let (status, head, body) = mint_with(
        gw.addr,
        CLIENT_KEY,
        json!({"expires_after": {"anchor": "created_at", "seconds": 60},
               "session": {"type": "realtime", "model": MODEL, "instructions": "Speak like a pirate."}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("cache-control: no-store"), "{head}");
    let secret = body["value"].as_str().unwrap().to_string();
    assert!(secret.starts_with("pbek_"), "{secret}");
    let expires_at = body["expires_at"].as_u64().unwrap();
    assert!((now_secs() + 55..=now_secs() + 60).contains(&expires_at));
    assert_eq!(body["session"]["instructions"], "Speak like a pirate.");
    assert_eq!(body["session"]["model"], MODEL);
    assert_eq!(body["session"]["type"], "realtime");

    // Browser form. The client asks for a response before the config is
    // confirmed: the gateway holds it until `session.updated`.
    let (mut ws, created, updated) = {
        let protocols = format!("realtime, openai-insecure-api-key.{secret}");
        let (mut ws, resp) = connect_with(
            gw.addr,
            &format!("?model={MODEL}"),
            &[("sec-websocket-protocol", &protocols)],
        )
        .await
        .expect("the secret opens a session");
        assert_eq!(
            resp.headers().get("sec-websocket-protocol").unwrap(),
            "realtime"
        );
        let created = recv_text(&mut ws).await;
        send_json(&mut ws, json!({"type": "response.create"})).await;
        let updated = recv_text(&mut ws).await;
        (ws, created, updated)
    };
    assert_eq!(kind(&created), "session.created");
    assert_eq!(kind(&updated), "session.updated", "{updated}");
    let v: Value = serde_json::from_str(&updated).unwrap();
    assert_eq!(v["session"]["instructions"], "Speak like a pirate.");
    loop {
        if kind(&recv_text(&mut ws).await) == "response.done" {
            break;
        }
    }
    let received = sim.stats.received.lock().unwrap().clone();
    assert_eq!(kind(&received[0]), "session.update", "{received:?}");
    let update: Value = serde_json::from_str(&received[0]).unwrap();
    assert_eq!(update["session"]["instructions"], "Speak like a pirate.");
    assert!(
        update["session"].get("model").is_none(),
        "the upstream socket is already for the route's model: {update}"
    );
    assert_eq!(kind(&received[1]), "response.create", "{received:?}");
    drop(ws);

    // Bearer form: only the secret, and no ?model= (the secret's own).
    let bearer = format!("Bearer {secret}");
    let (mut ws, _) = connect_with(gw.addr, "", &[("authorization", &bearer)])
        .await
        .expect("the secret opens a session by Bearer");
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    assert_eq!(kind(&recv_text(&mut ws).await), "session.updated");
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
    assert!(
        metric(
            gw.admin_addr,
            "patchbay_client_secrets_minted_total",
            &format!("model=\"{MODEL}\"")
        )
        .await
            >= 1.0
    );
}

#[tokio::test]
async fn expired_and_forged_secrets_are_refused_with_401() {
    let sim = sim(SimConfig::default()).await;
    let (key_file, toml) = signing_key();
    let gw = gateway(&gateway_toml(&sim.url(false), &toml)).await;
    let keys = SigningKeys::new(vec![read_signing_key(&key_file.0).unwrap()]).unwrap();
    // Signed with the gateway's key, expired a second ago.
    // The master key's digest, as the gateway's key set holds it.
    let master = gw
        .gateway
        .keys
        .get()
        .by_id("master")
        .unwrap()
        .sha256
        .clone();
    let expired = keys
        .mint([3; 16], "master", &master, MODEL, now_secs() - 1)
        .unwrap();
    let bearer = format!("Bearer {}", expired.expose());
    let (status, _, body) = refused(
        gw.addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{body}"
    );
    // Signed with another key.
    let other = SigningKeys::new(vec![
        patchbay_gateway::client_secret::SigningKey::random().unwrap()
    ])
    .unwrap();
    let forged = other
        .mint([4; 16], "master", &master, MODEL, now_secs() + 600)
        .unwrap();
    let bearer = format!("Bearer {}", forged.expose());
    let (status, _, _) = refused(
        gw.addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 401);
    // Correctly signed, but never minted: no config to apply.
    let unminted = keys
        .mint([5; 16], "master", &master, MODEL, now_secs() + 600)
        .unwrap();
    let bearer = format!("Bearer {}", unminted.expose());
    let (status, _, body) = refused(
        gw.addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 401, "{body}");
    for reason in ["expired", "bad_signature", "config_missing"] {
        assert_eq!(
            metric(
                gw.admin_addr,
                "patchbay_client_secrets_refused_total",
                &format!("reason=\"{reason}\"")
            )
            .await,
            1.0,
            "{reason}"
        );
    }
}

#[tokio::test]
async fn a_secret_is_bound_to_its_model_with_403() {
    let sim = sim(SimConfig::default()).await;
    let other = format!(
        "[[routes]]\nmodel = \"other-model\"\nupstream_url = \"{}\"\napi_key_env = \"SIM_KEY\"\n",
        sim.url(false)
    );
    let gw = gateway(&gateway_toml(&sim.url(false), &other)).await;
    let secret = mint(gw.addr, "x").await;
    let bearer = format!("Bearer {secret}");
    let (status, _, body) =
        refused(gw.addr, "?model=other-model", &[("authorization", &bearer)]).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "model_not_allowed");
    // Minting for the other route is fine, and that secret opens only it.
    let (status, _, body) = mint_with(
        gw.addr,
        CLIENT_KEY,
        json!({"session": {"type": "realtime", "model": "other-model"}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let bearer = format!("Bearer {}", body["value"].as_str().unwrap());
    let (mut ws, _) = connect_with(gw.addr, "?model=other-model", &[("authorization", &bearer)])
        .await
        .unwrap();
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    let (status, _, _) = refused(
        gw.addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn disabling_the_parent_key_ends_live_secret_sessions_and_refuses_the_next_connect() {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new("keys.toml", &key_entry("parent", "pb-parent", ""));
    let gw = keys_file_gateway(&sim, &keys).await;
    let (status, _, body) = mint_with(gw.addr, "pb-parent", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let secret = body["value"].as_str().unwrap().to_string();
    let (mut live, _, updated) = open_by_subprotocol(gw.addr, &secret).await;
    assert_eq!(kind(&updated), "session.updated");

    std::fs::write(&keys.0, key_entry("parent", "pb-parent", "disabled = true")).unwrap();
    // The live session of the disabled parent ends as any of its sessions.
    let (texts, code, _) = until_close(&mut live).await;
    assert_eq!(code, Some(1008), "{texts:?}");
    assert!(
        texts.iter().any(|t| t.contains("invalid_api_key")),
        "{texts:?}"
    );
    assert!(
        eventually(|| gw
            .gateway
            .keys
            .get()
            .by_id("parent")
            .is_some_and(|k| k.disabled))
        .await
    );
    let (status, body) = refused_by_bearer(gw.addr, &secret).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disabled"),
        "{body}"
    );

    // Removed entirely: still refused, and the key itself cannot mint.
    std::fs::write(&keys.0, key_entry("other", "pb-other", "")).unwrap();
    assert!(eventually(|| gw.gateway.keys.get().by_id("parent").is_none()).await);
    let (status, _) = refused_by_bearer(gw.addr, &secret).await;
    assert_eq!(status, 401);
    let (status, _, _) = mint_with(gw.addr, "pb-parent", json!({})).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn the_mint_endpoint_answers_bad_requests_like_openai() {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new(
        "keys.toml",
        &(key_entry("limited", "pb-limited", "rpm = 1")
            + &key_entry("broke", "pb-broke", "budget_usd = 0.0")),
    );
    let gw = keys_file_gateway(&sim, &keys).await;
    let secret = mint(gw.addr, "x").await;
    // A secret cannot mint secrets; no key or a wrong key is 401 too.
    let (status, _, body) = mint_with(gw.addr, &secret, json!({})).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot mint"),
        "{body}"
    );
    let (status, _, _) = post(gw.addr, "/v1/realtime/client_secrets", &[], "{}").await;
    assert_eq!(status, 401);
    let (status, _, _) = mint_with(gw.addr, "pb-wrong", json!({})).await;
    assert_eq!(status, 401);
    // Bad bodies name the field.
    for (body, status, param) in [
        (
            json!({"expires_after": {"seconds": 5}}),
            400,
            "expires_after.seconds",
        ),
        (
            json!({"session": {"type": "transcription"}}),
            400,
            "session.type",
        ),
        (
            json!({"session": {"type": "realtime", "model": "gpt-4o"}}),
            404,
            "session.model",
        ),
        (json!({"surprise": true}), 400, "surprise"),
    ] {
        let (got, _, answer) = mint_with(gw.addr, CLIENT_KEY, body.clone()).await;
        assert_eq!(got, status, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{body}: {answer}");
    }
    let (status, _, answer) = post(
        gw.addr,
        "/v1/realtime/client_secrets",
        &[("Authorization", &format!("Bearer {CLIENT_KEY}"))],
        "{not json",
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(answer["error"]["code"], "invalid_json");
    let big = format!(
        "{{\"session\":{{\"instructions\":\"{}\"}}}}",
        "a".repeat(70_000)
    );
    let (status, _, _) = post(
        gw.addr,
        "/v1/realtime/client_secrets",
        &[("Authorization", &format!("Bearer {CLIENT_KEY}"))],
        &big,
    )
    .await;
    assert_eq!(status, 413);
    // ?model= picks the default route.
    let (status, _, body) = post(
        gw.addr,
        "/v1/realtime/client_secrets?model=nope",
        &[("Authorization", &format!("Bearer {CLIENT_KEY}"))],
        "{}",
    )
    .await;
    assert_eq!(status, 404, "{body}");
    // Minting is one request against the key's rpm, and refused when its
    // budget is spent.
    assert_eq!(mint_with(gw.addr, "pb-limited", json!({})).await.0, 200);
    let (status, head, _) = mint_with(gw.addr, "pb-limited", json!({})).await;
    assert_eq!(status, 429);
    assert!(head.contains("retry-after:"), "{head}");
    assert_eq!(mint_with(gw.addr, "pb-broke", json!({})).await.0, 402);
    let (status, body) = http_get(gw.addr, "/v1/realtime/client_secrets").await;
    assert_eq!(status, 405);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed");
    // Other paths keep their answers.
    assert_eq!(http_get(gw.addr, "/v1/realtime?model=x").await.0, 400);
    assert_eq!(http_get(gw.addr, "/v1/nothing").await.0, 404);
    assert_eq!(
        metric(
            gw.admin_addr,
            "patchbay_client_secrets_refused_total",
            "reason=\"minted_by_secret\""
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn an_upstream_that_refuses_the_minted_config_ends_the_session_with_its_error_and_1011() {
    let sim = sim(SimConfig::default()).await;
    let gw = gateway(&gateway_toml(&sim.url(false), "")).await;
    let (status, _, body) = mint_with(
        gw.addr,
        CLIENT_KEY,
        json!({"session": {"type": "realtime", "instructions": 42}}),
    )
    .await;
    assert_eq!(
        status, 200,
        "the gateway leaves config validation to the upstream: {body}"
    );
    let bearer = format!("Bearer {}", body["value"].as_str().unwrap());
    let (mut ws, _) = connect_with(gw.addr, "", &[("authorization", &bearer)])
        .await
        .unwrap();
    assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
    send_json(&mut ws, json!({"type": "response.create"})).await;
    let (texts, code, _) = until_close(&mut ws).await;
    assert_eq!(texts.len(), 1, "{texts:?}");
    let error: Value = serde_json::from_str(&texts[0]).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(
        error["error"]["param"], "session.instructions",
        "the upstream's own error"
    );
    assert_eq!(code, Some(1011));
    assert_eq!(
        sim.stats
            .responses_done
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test]
async fn a_secret_session_is_metered_as_its_parent_with_the_secret_id() {
    let Some(url) = redis_url("a_secret_session_is_metered_as_its_parent_with_the_secret_id")
    else {
        return;
    };
    let sim = sim(SimConfig::default()).await;
    let (key_file, toml) = signing_key();
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!("{toml}[store]\nredis_url_env = \"{REDIS_ENV}\"\n[metering]\nflush_secs = 0\n"),
    ))
    .await;
    let secret = mint(gw.addr, "metered").await;
    let id = secret_id(&key_file, &secret);
    let (mut ws, _, _) = open_by_subprotocol(gw.addr, &secret).await;
    one_turn(&mut ws).await;
    let mut conn = redis(&url).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let row = loop {
        let entries: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
            .arg("patchbay:request_logs")
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(500)
            .query_async(&mut conn)
            .await
            .unwrap();
        let row = entries
            .ids
            .into_iter()
            .find(|e| e.get::<String>("client_secret_id").as_deref() == Some(id.as_str()));
        if let Some(row) = row {
            break row;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no row with client_secret_id {id}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(row.get::<String>("key_id").as_deref(), Some("master"));
    assert_eq!(row.get::<String>("model").as_deref(), Some(MODEL));
}

#[tokio::test]
async fn a_secret_minted_on_one_gateway_opens_a_configured_session_on_another() {
    if redis_url("a_secret_minted_on_one_gateway_opens_a_configured_session_on_another").is_none() {
        return;
    }
    let sim = sim(SimConfig::default()).await;
    let (_key_file, toml) = signing_key();
    let extra = format!("{toml}[store]\nredis_url_env = \"{REDIS_ENV}\"\n");
    let a = gateway(&gateway_toml(&sim.url(false), &extra)).await;
    let b = gateway(&gateway_toml(&sim.url(false), &extra)).await;
    let secret = mint(a.addr, "Minted on A.").await;
    let (mut ws, created, updated) = open_by_subprotocol(b.addr, &secret).await;
    assert_eq!(kind(&created), "session.created");
    let v: Value = serde_json::from_str(&updated).unwrap();
    assert_eq!(v["session"]["instructions"], "Minted on A.");
    one_turn(&mut ws).await;
}

#[tokio::test]
async fn signing_key_files_are_re_read_live() {
    let sim = sim(SimConfig::default()).await;
    let (key_file, toml) = signing_key();
    let gw = gateway(&gateway_toml(&sim.url(false), &toml)).await;
    let before = mint(gw.addr, "before").await;
    let (ws, _, _) = open_by_subprotocol(gw.addr, &before).await;
    drop(ws);
    // The key is replaced (not rotated): secrets it signed stop verifying.
    std::fs::write(&key_file.0, "a-completely-different-signing-key-0123456789").unwrap();
    let bearer = format!("Bearer {before}");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match connect_with(gw.addr, "", &[("authorization", &bearer)]).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                assert_eq!(r.status().as_u16(), 401);
                break;
            }
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replaced key was never re-read"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = mint(gw.addr, "after").await;
    let (_ws, _, updated) = open_by_subprotocol(gw.addr, &after).await;
    assert_eq!(kind(&updated), "session.updated");
}

#[tokio::test]
async fn a_keys_model_allow_list_applies_when_minting_and_again_when_the_secret_is_used() {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new(
        "keys.toml",
        &key_entry("narrow", "pb-narrow", "models = [\"gpt-realtime\"]"),
    );
    let other = format!(
        "[[routes]]\nmodel = \"other-model\"\nupstream_url = \"{}\"\napi_key_env = \"SIM_KEY\"\n",
        sim.url(false)
    );
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!("{other}[keys]\nfile = \"{}\"\n", keys.0.display()),
    ))
    .await;
    let (status, _, body) = mint_with(
        gw.addr,
        "pb-narrow",
        json!({"session": {"type": "realtime", "model": "other-model"}}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "model_not_allowed");
    // A secret minted while the model was allowed stops working once the
    // key's list no longer has it.
    let (status, _, body) = mint_with(
        gw.addr,
        "pb-narrow",
        json!({"session": {"type": "realtime", "model": MODEL}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let bearer = format!("Bearer {}", body["value"].as_str().unwrap());
    std::fs::write(
        &keys.0,
        key_entry("narrow", "pb-narrow", "models = [\"other-model\"]"),
    )
    .unwrap();
    let mut status = 0;
    for _ in 0..100 {
        status = match connect_with(
            gw.addr,
            &format!("?model={MODEL}"),
            &[("authorization", &bearer)],
        )
        .await
        {
            Ok(_) => 101,
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
            Err(e) => panic!("{e}"),
        };
        if status == 403 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 403, "the reloaded allow-list refuses the secret");
    let upgrades = sim
        .stats
        .upgrades
        .load(std::sync::atomic::Ordering::Relaxed);
    let (status, _, body) = refused(
        gw.addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (403, &json!("model_not_allowed"))
    );
    assert_eq!(
        sim.stats
            .upgrades
            .load(std::sync::atomic::Ordering::Relaxed),
        upgrades,
        "nothing is dialled for a refused session"
    );
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_answered_408() {
    let (_key_file, toml) = signing_key();
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), &toml).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    // 100 bytes declared, 2 sent, the connection held open: the gateway
    // (upgrade_timeout_secs = 5 in the tests) stops waiting.
    let head = format!(
        "POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CLIENT_KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{}}"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(WAIT, s.read(&mut buf))
        .await
        .expect("answered while the body is still awaited")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408 "), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
}

#[tokio::test]
async fn azure_clients_mint_under_the_openai_prefix() {
    let (_key_file, toml) = signing_key();
    let (_sim, gw) = sim_and_gateway(SimConfig::default(), &toml).await;
    let bearer = format!("Bearer {CLIENT_KEY}");
    let (status, _, body) = post(
        gw.addr,
        "/openai/v1/realtime/client_secrets",
        &[("Authorization", &bearer)],
        &json!({"session": {"type": "realtime", "model": MODEL}}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let secret = body["value"].as_str().unwrap();
    let (mut ws, _, _) = open_by_subprotocol(gw.addr, secret).await;
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
}

#[tokio::test]
async fn a_new_secret_under_the_parents_id_revokes_what_the_old_one_minted() {
    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new("keys.toml", &key_entry("app", "pb-app-old", ""));
    let gw = keys_file_gateway(&sim, &keys).await;
    let (status, _, body) = mint_with(gw.addr, "pb-app-old", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let old_secret = body["value"].as_str().unwrap().to_string();
    let old_sha = gw.gateway.keys.get().by_id("app").unwrap().sha256.clone();

    // Rotated: the same id, a new secret.
    std::fs::write(&keys.0, key_entry("app", "pb-app-new", "")).unwrap();
    assert!(
        eventually(|| gw
            .gateway
            .keys
            .get()
            .by_id("app")
            .is_some_and(|k| k.sha256 != old_sha))
        .await
    );
    let (status, body) = refused_by_bearer(gw.addr, &old_secret).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("replaced"),
        "{body}"
    );
    // What the new secret mints opens sessions.
    let (status, _, body) = mint_with(gw.addr, "pb-app-new", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (mut ws, _, _) = open_by_subprotocol(gw.addr, body["value"].as_str().unwrap()).await;
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done");
}
