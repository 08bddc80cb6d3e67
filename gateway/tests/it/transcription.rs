//! Transcription sessions and the models a client names in its frames:
//! `?intent=transcription` without a model reaches the route configured for
//! it, and a `session.update` naming a model the key may not use, or one
//! without a price under `unpriced = "block"`, is refused before it is
//! forwarded.

use std::time::Duration;

use crate::common::*;
use futures_util::SinkExt;
use patchbay_sim::{SimConfig, SimHandle, TranscriptionUsage};
use serde_json::json;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::Message;

const WHISPER: &str = "gpt-realtime-whisper";
const ALLOWED_KEY: &str = "pb-allowed-whisper";
const ANY_MODEL_KEY: &str = "pb-any-model";

const PRICES: &str = "[[prices]]\nmodel = \"gpt-realtime\"\ntext_input = 4.0\ntext_output = 16.0\n\
     [[prices]]\nmodel = \"gpt-realtime-whisper\"\nusd_per_minute = 0.017\n";

fn transcription_update(model: &str) -> serde_json::Value {
    json!({"type": "session.update", "event_id": "evt_client_1", "session": {"type": "realtime",
        "audio": {"input": {"transcription": {"model": model}}}}})
}

/// The next `error` or `session.updated` event.
async fn answer_to_update(ws: &mut Client) -> serde_json::Value {
    loop {
        let t = recv_text(ws).await;
        if matches!(kind(&t).as_str(), "error" | "session.updated") {
            return serde_json::from_str(&t).unwrap();
        }
    }
}

/// Commits the input audio, waits for its transcription, closes, and gives
/// what the gateway charged on the transcription model once it shows.
async fn transcribe_and_close(ws: &mut Client, admin: std::net::SocketAddr) -> f64 {
    send_json(ws, json!({"type": "input_audio_buffer.commit"})).await;
    loop {
        let t = recv_text(ws).await;
        if kind(&t) == "conversation.item.input_audio_transcription.completed" {
            break;
        }
    }
    ws.close(None).await.unwrap();
    let label = format!("model=\"{WHISPER}\"");
    let cost = || metric(admin, "patchbay_cost_usd_total", &label);
    for _ in 0..100 {
        if cost().await > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cost().await
}

/// The `session.update`s the simulator received, by the transcription
/// model each names.
fn updates_received(sim: &SimHandle) -> Vec<String> {
    sim.stats
        .received
        .lock()
        .unwrap()
        .iter()
        .filter_map(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .filter(|v| v["type"] == "session.update")
        .map(|v| {
            v["session"]["audio"]["input"]["transcription"]["model"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn a_frame_naming_a_disallowed_or_unpriced_transcription_model_is_refused_and_not_forwarded()
{
    let sim = sim(SimConfig {
        record: true,
        ..SimConfig::default()
    })
    .await;
    let keys = TempFile::new(
        "keys.toml",
        &(key_entry(
            "allowed",
            ALLOWED_KEY,
            &format!("models = [\"{MODEL}\", \"{WHISPER}\"]"),
        ) + &key_entry("any", ANY_MODEL_KEY, "")),
    );
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!(
            "[keys]\nfile = \"{}\"\n[metering]\nunpriced = \"block\"\n{PRICES}",
            keys.0.display()
        ),
    ))
    .await;

    // Outside the key's list.
    let mut ws = open_with(gw.addr, ALLOWED_KEY).await.unwrap();
    send_json(&mut ws, transcription_update("gpt-4o-transcribe")).await;
    let e = answer_to_update(&mut ws).await;
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["error"]["code"], "model_not_allowed", "{e}");
    assert_eq!(
        e["error"]["param"], "session.audio.input.transcription.model",
        "{e}"
    );
    assert_eq!(e["error"]["event_id"], "evt_client_1", "{e}");

    // A session.update in two fragments is refused whole, not forwarded.
    let text = format!(
        r#"{{"type":"session.update","session":{}}}"#,
        transcription_update(WHISPER)["session"]
    );
    let (a, b) = text.as_bytes().split_at(40);
    ws.send(Message::Frame(Frame::message(
        a.to_vec(),
        OpCode::Data(Data::Text),
        false,
    )))
    .await
    .unwrap();
    ws.send(Message::Frame(Frame::message(
        b.to_vec(),
        OpCode::Data(Data::Continue),
        true,
    )))
    .await
    .unwrap();
    let e = answer_to_update(&mut ws).await;
    assert_eq!(e["error"]["code"], "invalid_session_update", "{e}");

    // The session goes on: an allowed, priced model is forwarded.
    send_json(&mut ws, transcription_update(WHISPER)).await;
    let updated = answer_to_update(&mut ws).await;
    assert_eq!(updated["type"], "session.updated", "{updated}");
    assert_eq!(
        updated["session"]["audio"]["input"]["transcription"]["model"],
        WHISPER
    );

    // Any model allowed, but not priced while unpriced = "block".
    let mut other = open_with(gw.addr, ANY_MODEL_KEY).await.unwrap();
    send_json(&mut other, transcription_update("gpt-4o-transcribe")).await;
    let e = answer_to_update(&mut other).await;
    assert_eq!(e["error"]["code"], "model_not_priced", "{e}");
    // Another session model is taken out; the rest of the update goes on.
    send_json(
        &mut other,
        json!({"type": "session.update", "session": {"type": "realtime", "model": "gpt-realtime-2",
            "instructions": "Be brief."}}),
    )
    .await;
    let updated = answer_to_update(&mut other).await;
    assert_eq!(updated["type"], "session.updated", "{updated}");
    assert_eq!(updated["session"]["instructions"], "Be brief.");
    let last = sim.stats.received.lock().unwrap().last().cloned().unwrap();
    let last: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(last["session"]["instructions"], "Be brief.");
    assert!(last["session"].get("model").is_none(), "{last}");
    assert_eq!(
        updates_received(&sim),
        vec![WHISPER.to_string(), String::new()],
        "only the allowed updates reached the upstream"
    );
    for (reason, n) in [
        ("model_not_allowed", 1.0),
        ("model_not_priced", 1.0),
        ("invalid_session_update", 1.0),
    ] {
        assert_eq!(
            metric(
                gw.admin_addr,
                "patchbay_admission_refusals_total",
                &format!("reason=\"{reason}\"")
            )
            .await,
            n,
            "{reason}"
        );
    }
}

#[tokio::test]
async fn a_transcription_session_naming_no_model_reaches_the_intent_route_and_is_billed_per_minute()
{
    let sim = sim(SimConfig {
        record: true,
        transcription_usage: TranscriptionUsage::Duration { seconds: 30.0 },
        ..SimConfig::default()
    })
    .await;
    let url = sim.url(false);
    let gw = gateway(&gateway_toml(
        &url,
        &format!(
            "[[routes]]\nmodel = \"transcribe\"\nintent = \"transcription\"\nupstream_url = \"{url}\"\napi_key_env = \"SIM_KEY\"\n{PRICES}"
        ),
    ))
    .await;
    let bearer = format!("Bearer {CLIENT_KEY}");
    let (mut ws, _) = connect_with(
        gw.addr,
        "?intent=transcription",
        &[("authorization", &bearer)],
    )
    .await
    .expect("the intent route admits the session");
    let created: serde_json::Value = serde_json::from_str(&recv_text(&mut ws).await).unwrap();
    assert_eq!(created["type"], "session.created");
    assert_eq!(created["session"]["type"], "transcription", "{created}");
    assert_eq!(
        sim.stats.queries.lock().unwrap().clone(),
        vec!["intent=transcription".to_string()],
        "dialled as OpenAI's SDK connects: the intent, no model"
    );

    send_json(
        &mut ws,
        json!({"type": "session.update", "session": {"type": "transcription",
            "audio": {"input": {"transcription": {"model": WHISPER}}}}}),
    )
    .await;
    assert_eq!(answer_to_update(&mut ws).await["type"], "session.updated");
    let cost = transcribe_and_close(&mut ws, gw.admin_addr).await;
    // 30 s at $0.017 per minute.
    assert!((cost - 0.0085).abs() < 1e-9, "{cost}");
    drop(gw);

    // Without a route for the intent, the refusal says what to configure.
    let gw = gateway(&gateway_toml(&url, "")).await;
    let (status, _, body) = refused(
        gw.addr,
        "?intent=transcription",
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["code"], "missing_model");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("intent = \"transcription\""),
        "{body}"
    );
}

#[tokio::test]
async fn a_transcription_client_secret_mints_checked_and_connects_to_the_intent_route() {
    let sim = sim(SimConfig {
        record: true,
        transcription_usage: TranscriptionUsage::Duration { seconds: 60.0 },
        ..SimConfig::default()
    })
    .await;
    let url = sim.url(false);
    let signing = TempFile::new(
        "signing.key",
        &format!("{}\n", "k3y-for-transcription-".repeat(2)),
    );
    let keys = TempFile::new(
        "keys.toml",
        &key_entry(
            "allowed",
            ALLOWED_KEY,
            &format!("models = [\"{MODEL}\", \"transcribe\", \"{WHISPER}\"]"),
        ),
    );
    let gw = gateway(&gateway_toml(
        &url,
        &format!(
            "[[routes]]\nmodel = \"transcribe\"\nintent = \"transcription\"\nupstream_url = \"{url}\"\napi_key_env = \"SIM_KEY\"\n\
             [client_secrets]\nsigning_key_files = [\"{}\"]\n[keys]\nfile = \"{}\"\n{PRICES}",
            signing.0.display(),
            keys.0.display()
        ),
    ))
    .await;
    let config = |model: &str| {
        json!({"session": {"type": "transcription",
            "audio": {"input": {"transcription": {"model": model}}}}})
    };

    // A model outside the key's list is refused at mint, naming the field.
    let (status, _, body) =
        crate::client_secrets::mint_with(gw.addr, ALLOWED_KEY, config("gpt-4o-transcribe")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "model_not_allowed");
    assert_eq!(
        body["error"]["param"],
        "session.audio.input.transcription.model"
    );

    let (status, _, minted) =
        crate::client_secrets::mint_with(gw.addr, ALLOWED_KEY, config(WHISPER)).await;
    assert_eq!(status, 200, "{minted}");
    assert_eq!(minted["session"]["type"], "transcription");
    let secret = minted["value"].as_str().unwrap();

    // The browser holds only the secret and names no model.
    let bearer = format!("Bearer {secret}");
    let (mut ws, _) = connect_with(
        gw.addr,
        "?intent=transcription",
        &[("authorization", &bearer)],
    )
    .await
    .expect("the secret opens a transcription session");
    let mut model = None;
    while model.is_none() {
        let t: serde_json::Value = serde_json::from_str(&recv_text(&mut ws).await).unwrap();
        if t["type"] == "session.updated" {
            model = t["session"]["audio"]["input"]["transcription"]["model"]
                .as_str()
                .map(String::from);
        }
    }
    assert_eq!(
        model.as_deref(),
        Some(WHISPER),
        "the minted config was applied"
    );
    let cost = transcribe_and_close(&mut ws, gw.admin_addr).await;
    assert!((cost - 0.017).abs() < 1e-9, "{cost}");

    // The key loses the model after minting: the secret is refused at
    // connect, before the config reaches the upstream.
    let (status, _, second) =
        crate::client_secrets::mint_with(gw.addr, ALLOWED_KEY, config(WHISPER)).await;
    assert_eq!(status, 200, "{second}");
    std::fs::write(
        &keys.0,
        key_entry(
            "allowed",
            ALLOWED_KEY,
            &format!("models = [\"{MODEL}\", \"transcribe\"]"),
        ),
    )
    .unwrap();
    let reloaded = eventually(|| {
        !patchbay_gateway::auth::model_allowed(
            gw.gateway.keys.get().by_id("allowed").unwrap(),
            None,
            WHISPER,
        )
    })
    .await;
    assert!(reloaded, "the keys file was re-read");
    let updates_before = updates_received(&sim).len();
    let bearer = format!("Bearer {}", second["value"].as_str().unwrap());
    let (mut ws, _) = connect_with(
        gw.addr,
        "?intent=transcription",
        &[("authorization", &bearer)],
    )
    .await
    .unwrap();
    let (texts, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008), "{texts:?}");
    assert!(
        texts.iter().any(|t| t.contains("model_not_allowed")),
        "{texts:?}"
    );
    assert_eq!(updates_received(&sim).len(), updates_before);
}

/// What the frame check cannot read (a fragmented message whose type comes
/// after its first 256 bytes) reaches the upstream; its `session.updated`
/// then shows the refused model, and the session is closed at once.
#[tokio::test]
async fn a_session_the_upstream_moved_to_a_refused_model_is_closed_with_1008() {
    let sim = sim(SimConfig {
        record: true,
        ..SimConfig::default()
    })
    .await;
    let keys = TempFile::new(
        "keys.toml",
        &key_entry(
            "allowed",
            ALLOWED_KEY,
            &format!("models = [\"{MODEL}\", \"{WHISPER}\"]"),
        ),
    );
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!("[keys]\nfile = \"{}\"\n{PRICES}", keys.0.display()),
    ))
    .await;
    let mut ws = open_with(gw.addr, ALLOWED_KEY).await.unwrap();
    let mut update = transcription_update("gpt-4o-transcribe");
    update["event_id"] = json!("e".repeat(300));
    let text = update.to_string();
    assert!(
        text.starts_with("{\"event_id\""),
        "serde_json sorts: {text}"
    );
    let (a, b) = text.as_bytes().split_at(100);
    ws.send(Message::Frame(Frame::message(
        a.to_vec(),
        OpCode::Data(Data::Text),
        false,
    )))
    .await
    .unwrap();
    ws.send(Message::Frame(Frame::message(
        b.to_vec(),
        OpCode::Data(Data::Continue),
        true,
    )))
    .await
    .unwrap();
    let (texts, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008), "{texts:?}");
    let error = texts
        .iter()
        .find(|t| kind(t) == "error")
        .expect("an error event before the close");
    assert!(error.contains("model_not_allowed"), "{error}");
    assert_eq!(
        updates_received(&sim),
        vec!["gpt-4o-transcribe".to_string()]
    );
}
