//! Translation sessions (`/v1/realtime/translations`) metered by the audio
//! they carry: a row per flush window priced per minute of input audio,
//! compared with what the simulated upstream received; a spent budget ends
//! the session within a window; a drain leaves a charged last row; each
//! model is served at its own endpoint only.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use base64::Engine;
use futures_util::SinkExt;
use http::HeaderValue;
use patchbay_sim::{SimConfig, SimHandle, TRANSLATION_BYTES_PER_SEC};
use serde_json::json;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const TRANSLATE: &str = "gpt-realtime-translate";
const USD_PER_MINUTE: f64 = 0.034;
/// 200 ms of 24 kHz PCM16 mono, as OpenAI advises appending it.
const CHUNK_BYTES: usize = 9600;

/// The translations route on `sim`, a per-minute price, and `extra`.
fn translation_config(sim: &SimHandle, extra: &str) -> String {
    format!(
        "[[routes]]\nmodel = \"{TRANSLATE}\"\nendpoint = \"translations\"\n\
         upstream_url = \"ws://{}/v1/realtime/translations\"\napi_key_env = \"SIM_KEY\"\n\
         [[prices]]\nmodel = \"{TRANSLATE}\"\nusd_per_minute = {USD_PER_MINUTE}\n{extra}",
        sim.addr
    )
}

async fn connect_translation(
    addr: std::net::SocketAddr,
    path: &str,
    key: &str,
) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
    let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
    request.headers_mut().insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
    );
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::client_async(request, tcp))
        .await
        .expect("upgrade answered in time")?;
    Ok(ws)
}

/// Appends `chunks` chunks of audio, each answered by the simulator with a
/// delta of the same length; returns the output bytes received.
async fn speak(ws: &mut Client, chunks: usize) -> usize {
    let audio = base64::engine::general_purpose::STANDARD.encode(vec![3u8; CHUNK_BYTES]);
    let mut out = 0;
    for _ in 0..chunks {
        ws.send(Message::text(
            json!({"type": "session.input_audio_buffer.append", "audio": audio}).to_string(),
        ))
        .await
        .unwrap();
        loop {
            let t: serde_json::Value = serde_json::from_str(&recv_text(ws).await).unwrap();
            assert_ne!(t["type"], "error", "{t}");
            if t["type"] == "session.output_audio.delta" {
                out += base64::engine::general_purpose::STANDARD
                    .decode(t["delta"].as_str().unwrap())
                    .unwrap()
                    .len();
                break;
            }
        }
    }
    out
}

fn translation_rows(rows: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    rows.iter().filter(|r| r["model"] == TRANSLATE).collect()
}

#[tokio::test]
async fn a_translation_session_is_charged_its_input_minutes_in_a_row_per_window() {
    let sim = sim(SimConfig::default()).await;
    let mut gw = Child::start(
        &sim.url(false),
        &translation_config(&sim, "[metering]\nflush_secs = 1\n"),
        &[],
    )
    .await;
    let path = format!("/v1/realtime/translations?model={TRANSLATE}");
    let mut ws = connect_translation(gw.addr, &path, CLIENT_KEY)
        .await
        .unwrap();
    let created: serde_json::Value = serde_json::from_str(&recv_text(&mut ws).await).unwrap();
    assert_eq!(created["type"], "session.created");
    assert_eq!(created["session"]["model"], TRANSLATE);

    // 3 s of speech, a pause past a window, 2 s more.
    let mut out = speak(&mut ws, 15).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    out += speak(&mut ws, 10).await;
    ws.send(Message::text(json!({"type": "session.close"}).to_string()))
        .await
        .unwrap();
    let (texts, _, _) = until_close(&mut ws).await;
    assert!(
        texts.iter().any(|t| kind(t) == "session.closed"),
        "{texts:?}"
    );
    assert_eq!(out, 25 * CHUNK_BYTES);

    tokio::time::sleep(Duration::from_millis(500)).await;
    gw.sigterm();
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = gw.stdout_rows();
    let rows = translation_rows(&rows);
    assert!(
        rows.len() >= 2,
        "a row per window that carried audio: {rows:?}"
    );
    let billed: f64 = rows
        .iter()
        .map(|r| r["audio_seconds"].as_f64().unwrap())
        .sum();
    let upstream_secs = sim.stats.translation_input_bytes.load(Ordering::Relaxed) as f64
        / TRANSLATION_BYTES_PER_SEC as f64;
    assert_eq!(upstream_secs, 5.0);
    assert!(
        (billed - upstream_secs).abs() / upstream_secs < 0.01,
        "{billed} vs {upstream_secs}"
    );
    let cost: f64 = rows.iter().map(|r| r["cost_usd"].as_f64().unwrap()).sum();
    let expected = upstream_secs / 60.0 * USD_PER_MINUTE;
    assert!(
        (cost - expected).abs() / expected < 0.01,
        "{cost} vs {expected}"
    );
    let output: f64 = rows
        .iter()
        .map(|r| r["output_audio_seconds"].as_f64().unwrap())
        .sum();
    assert!((output - 5.0).abs() < 0.01, "output measured: {output}");
    for r in &rows {
        assert_eq!(r["transport"], "websocket");
        assert!(r["cost_usd"].as_f64().unwrap() > 0.0, "{r}");
    }
}

#[tokio::test]
async fn a_spent_budget_ends_a_translation_within_a_window_and_a_drain_charges_the_last() {
    let sim = sim(SimConfig::default()).await;
    // $0.001 is 1.76 s of audio at $0.034 a minute.
    let keys = TempFile::new(
        "keys.toml",
        &(key_entry("small", "pb-small-budget", "budget_usd = 0.001")
            + &key_entry("plenty", "pb-plenty", "")),
    );
    let mut gw = Child::start(
        &sim.url(false),
        &translation_config(
            &sim,
            &format!(
                "[metering]\nflush_secs = 1\n[keys]\nfile = \"{}\"\n",
                keys.0.display()
            ),
        ),
        &[],
    )
    .await;
    let path = format!("/v1/realtime/translations?model={TRANSLATE}");
    let mut ws = connect_translation(gw.addr, &path, "pb-small-budget")
        .await
        .unwrap();
    recv_text(&mut ws).await;
    let audio = base64::engine::general_purpose::STANDARD.encode(vec![3u8; CHUNK_BYTES]);
    let started = tokio::time::Instant::now();
    let mut closed = None;
    // 4 s of audio in real time: the budget runs out half-way.
    'speaking: for _ in 0..20 {
        let sent = ws
            .send(Message::text(
                json!({"type": "session.input_audio_buffer.append", "audio": audio}).to_string(),
            ))
            .await;
        if sent.is_err() {
            break;
        }
        let pause = tokio::time::sleep(Duration::from_millis(200));
        tokio::pin!(pause);
        loop {
            tokio::select! {
                _ = &mut pause => break,
                r = recv(&mut ws) => match r {
                    Received::Text(t) if kind(&t) == "error" => assert!(t.contains("insufficient_quota"), "{t}"),
                    Received::Text(_) => {}
                    Received::Close(f) => { closed = f.map(|f| u16::from(f.code)); break 'speaking; }
                    Received::Ended => break 'speaking,
                },
            }
        }
    }
    assert_eq!(closed, Some(1008), "closed for the budget");
    assert!(
        started.elapsed() < Duration::from_millis(3500),
        "within a window of running out: {:?}",
        started.elapsed()
    );

    // A second session, ended by a drain mid-speech.
    let mut ws = connect_translation(gw.addr, &path, "pb-plenty")
        .await
        .unwrap();
    recv_text(&mut ws).await;
    speak(&mut ws, 3).await;
    gw.sigterm();
    let (_, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(1001));
    gw.wait_exit(Duration::from_secs(15)).await;
    let rows = gw.stdout_rows();
    let rows = translation_rows(&rows);
    let of = |key: &str| -> Vec<&&serde_json::Value> {
        rows.iter().filter(|r| r["key_id"] == key).collect()
    };
    let small: f64 = of("small")
        .iter()
        .map(|r| r["cost_usd"].as_f64().unwrap())
        .sum();
    assert!(
        small >= 0.001,
        "the spent budget's rows are charged: {small}"
    );
    let drained = of("plenty");
    let secs: f64 = drained
        .iter()
        .map(|r| r["audio_seconds"].as_f64().unwrap())
        .sum();
    assert!(
        (secs - 0.6).abs() < 0.01,
        "the drained session's audio is charged: {drained:?}"
    );
}

#[tokio::test]
async fn each_model_is_served_at_its_own_endpoint_only() {
    let sim = sim(SimConfig::default()).await;
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &translation_config(&sim, ""),
    ))
    .await;
    let bearer = format!("Bearer {CLIENT_KEY}");
    let (status, _, body) = refused(
        gw.addr,
        &format!("?model={TRANSLATE}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "wrong_endpoint");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/v1/realtime/translations"));
    let e = connect_translation(
        gw.addr,
        &format!("/v1/realtime/translations?model={MODEL}"),
        CLIENT_KEY,
    )
    .await
    .unwrap_err();
    match e {
        tokio_tungstenite::tungstenite::Error::Http(r) => assert_eq!(r.status().as_u16(), 400),
        other => panic!("{other}"),
    }
    assert_eq!(
        sim.stats.upgrades.load(Ordering::Relaxed),
        0,
        "nothing was dialled"
    );
}

#[tokio::test]
async fn a_translation_client_secret_mints_for_translation_models_only_and_connects() {
    let sim = sim(SimConfig::default()).await;
    let signing = TempFile::new(
        "signing.key",
        &format!("{}\n", "translation-signing-".repeat(3)),
    );
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &translation_config(
            &sim,
            &format!(
                "[client_secrets]\nsigning_key_files = [\"{}\"]\n",
                signing.0.display()
            ),
        ),
    ))
    .await;
    let addr = gw.addr;
    let post = |path: &'static str, body: serde_json::Value| async move {
        let bearer = format!("Bearer {CLIENT_KEY}");
        crate::client_secrets::post(addr, path, &[("Authorization", &bearer)], &body.to_string())
            .await
    };
    let (status, _, body) = post(
        "/v1/realtime/translations/client_secrets",
        json!({"session": {"model": MODEL}}),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["param"]),
        (404, &json!("session.model")),
        "{body}"
    );
    let (status, _, body) = post(
        "/v1/realtime/client_secrets",
        json!({"session": {"type": "realtime", "model": TRANSLATE}}),
    )
    .await;
    assert_eq!(
        status, 404,
        "a Realtime secret cannot name a translation model: {body}"
    );

    let (status, _, minted) = post(
        "/v1/realtime/translations/client_secrets",
        json!({"session": {"model": TRANSLATE, "audio": {"output": {"language": "fr"}}}}),
    )
    .await;
    assert_eq!(status, 200, "{minted}");
    assert_eq!(minted["session"]["model"], TRANSLATE);
    let secret = minted["value"].as_str().unwrap();
    let path = format!("/v1/realtime/translations?model={TRANSLATE}");
    let mut ws = connect_translation(gw.addr, &path, secret).await.unwrap();
    let created: serde_json::Value = serde_json::from_str(&recv_text(&mut ws).await).unwrap();
    assert_eq!(created["type"], "session.created");
    let updated: serde_json::Value = serde_json::from_str(&recv_text(&mut ws).await).unwrap();
    assert_eq!(
        updated["type"], "session.updated",
        "the minted config applied first"
    );
    assert_eq!(updated["session"]["audio"]["output"]["language"], "fr");
    assert_eq!(speak(&mut ws, 2).await, 2 * CHUNK_BYTES);
    // The secret is bound to its model.
    let e = connect_translation(gw.addr, &format!("/v1/realtime?model={MODEL}"), secret)
        .await
        .unwrap_err();
    match e {
        tokio_tungstenite::tungstenite::Error::Http(r) => assert_eq!(r.status().as_u16(), 403),
        other => panic!("{other}"),
    }
}
